"""`draftboard doctor`: a handful of fast checks, each with a verdict, the evidence and the fix.

`report` (what a check says), one module per concern (`checkpoint`: tensors and config against the
target; `tokens`: mask and stop tokens, thinking; `serving`: a serving config against the drafter;
`environment`: this machine against the training run; `layers`: the hidden-state layer mapping),
and `run` (all of them in order)."""

from evaluators.doctor.report import Check, Report
from evaluators.doctor.run import DoctorSettings, run_doctor

__all__ = ["Check", "DoctorSettings", "Report", "run_doctor"]
