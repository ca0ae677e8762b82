"""This machine against the training run's fingerprint, per Gated DeltaNet function, in plain words.

`tracker.environment.fingerprint.diff` gives every differing field with its severity; the doctor reads it the
way the linear-attention path makes it matter. On the torch fallback the transformers version is
what moves the numbers (its reference changed in transformers PR #47625: normalisation in fp32),
while fla's and causal-conv1d's versions do not run; on the kernels it is the other way round.
A per-function difference (say, fla's chunk rule beside the torch conv) is always critical, and
the probe's drift (the same fixed input through both targets) is put in words.
"""

from __future__ import annotations

from evaluators.doctor.report import CRITICAL, INFO, OK, WARNING, Check
from tracker.environment import fingerprint, linear_attn

ENVIRONMENT = "environment"
_LINEAR_ATTENTION = ("numerics.linear_attention", "software.flash-linear-attention", "software.fla-core",
                     "software.causal-conv1d")
_FUNCTIONS = "numerics.linear_attention.functions."
_KERNEL_PACKAGES = ("software.flash-linear-attention", "software.fla-core", "software.causal-conv1d")
_TRANSFORMERS = "software.transformers"


def _path(fp: dict) -> str | None:
    return (fp.get("numerics") or {}).get("linear_attention_path")


def _summary(fp: dict) -> str:
    """What ran each Gated DeltaNet piece (fingerprints from before the summary get one from their functions)."""
    la = (fp.get("numerics") or {}).get("linear_attention") or {}
    functions = la.get("functions") if isinstance(la.get("functions"), dict) else None
    return la.get("summary") or (linear_attn.summary(functions) if functions else f"path {_path(fp)}")


def _reweighed(row: fingerprint.DiffRow, paths: set) -> str:
    """A version row's severity given the paths that ran: only the code that ran can move the numbers."""
    if row.field.startswith(_KERNEL_PACKAGES):
        return row.severity if paths & {"fast", "partial"} else INFO
    if row.field == _TRANSFORMERS and paths <= {"fast"}:
        return WARNING if row.severity == CRITICAL else row.severity
    return row.severity


def _probe_words(trained: dict, here: dict) -> str:
    a, b = trained.get("probe"), here.get("probe")
    if not a or not b:
        return "no probe on " + ("either side" if not a and not b else "the training run" if not a else "this machine")
    if a.get("digest") == b.get("digest"):
        return "the probe's hidden states are identical"
    gap = fingerprint.probe_gap(a, b)
    if gap is None:
        return "the probes used other inputs: not comparable"
    worst, layer = gap
    beyond = "beyond" if worst > fingerprint.PROBE_RTOL else "within"
    return (f"the same probe input gives hidden states up to {worst:.1e} apart (relative, layer {layer}), {beyond} "
            f"the tolerance {fingerprint.PROBE_RTOL:.0e}")


_DRAFTER_PRECISION = "numerics.drafter_precision"


def check(here: dict, trained: dict | None, where: str = "the training run") -> Check:
    if trained is None:
        return Check(ENVIRONMENT, INFO, "no training fingerprint to compare with", f"this machine: {_summary(here)}",
                     "pass --run RUN_ID (its fingerprint: `draftboard fingerprint --attach` on the training box)")
    paths = {_path(trained), _path(here)}
    rows = [r._replace(severity=_reweighed(r, paths)) for r in fingerprint.diff(trained, here)]
    if "n/a" in paths:  # a target without linear-attention layers: what would run them does not apply
        rows = [r for r in rows if not r.field.startswith(_LINEAR_ATTENTION)]
    functions = [r for r in rows if r.field.startswith(_FUNCTIONS)]
    versions = [r for r in rows if r.field.startswith("software.") and r.severity != INFO]
    critical = [r for r in rows if r.severity == CRITICAL]
    parts = [f"{where}: {_summary(trained)}", f"this machine: {_summary(here)}"]
    parts += [f"{r.field[len(_FUNCTIONS):]}: {r.a_value} there, {r.b_value} here" for r in functions]
    parts += [f"{r.field[len('software.'):]} {r.a_value} there, {r.b_value} here ({r.severity})" for r in versions]
    parts.append(_probe_words(trained, here))
    evidence = "; ".join(parts)
    precision = [r for r in critical if r.field == _DRAFTER_PRECISION]
    features = [r for r in critical if r.field != _DRAFTER_PRECISION]
    if features:
        named = ", ".join(dict.fromkeys(r.field.split(".")[-1] for r in features))
        return Check(ENVIRONMENT, CRITICAL, f"this machine computes the target's features differently from {where} "
                     f"({named})", evidence, "evaluate under the training run's environment (Environments page: "
                     "Re-evaluate, or --linear-attn and the versions it names), or retrain where you serve")
    if precision:  # the target's features agree: what differs is how the drafter computes on them
        (row,) = precision
        return Check(ENVIRONMENT, CRITICAL, f"this machine runs the drafter in another precision than {where} "
                     f"({row.b_value} here, {row.a_value} there); the target's features agree", evidence,
                     f"rerun with --drafter-precision {row.a_value} (as trained), here and in `draftboard eval`")
    mixed = [side for side, fp in ((where, trained), ("this machine", here)) if _summary(fp).startswith("mixed")]
    if mixed:
        return Check(ENVIRONMENT, WARNING, f"{' and '.join(mixed)} ran a mixed kernel state: some Gated DeltaNet pieces "
                     "on kernels, others on the torch fallback (one transformers warning never says which)", evidence,
                     "install what the fallback pieces name (causal-conv1d, flash-linear-attention) where they run")
    if any(r.severity == WARNING for r in rows):
        return Check(ENVIRONMENT, WARNING, f"this machine differs from {where} in ways that can shift the numbers",
                     evidence)
    return Check(ENVIRONMENT, OK, f"this machine matches {where} where it matters", evidence)
