"""Run detail's Doctor panel: the report `draftboard doctor --run` attached to the run.

The report is an artifact anyone who can write to the store could have written, so it is read as
untrusted data: only its known fields, each a string cut to a bound, a severity outside the known
ones shown as `?`, never run through markdown (the page shows it in a table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from tracker import config
from tracker.dashboard.index import RunInfo
from tracker.store import names

SEVERITIES = ("critical", "warning", "info", "ok")  # evaluators.doctor.report's, most severe first
ICONS = {"critical": "🔴", "warning": "🟡", "info": "⚪", "ok": "🟢"}
COLUMNS = ["", "check", "verdict", "evidence", "fix"]
FIELD_CHARS = 2000
Loader = Callable[[RunInfo], "dict | None"]  # the run's doctor.json, or None


def severity(run: RunInfo) -> str | None:
    """The worst severity of the run's doctor report (its tag), None when it has none."""
    value = run.tags.get(names.DOCTOR)
    return value if value in SEVERITIES else None if value is None else "?"


def _text(value) -> str:
    return config.bounded(value, FIELD_CHARS) if isinstance(value, str) else ""


def frame(report: Mapping | None) -> pd.DataFrame | None:
    """One row per check, most severe first; None when the report is missing or not a report."""
    checks = report.get("checks") if isinstance(report, Mapping) else None
    if not isinstance(checks, list):
        return None
    rows = []
    for c in checks:
        if not isinstance(c, Mapping):
            continue
        sev = c.get("severity") if c.get("severity") in SEVERITIES else "?"
        rows.append({"": f"{ICONS.get(sev, '❔')} {sev}", "check": _text(c.get("name")),
                     "verdict": _text(c.get("verdict")), "evidence": _text(c.get("evidence")),
                     "fix": _text(c.get("fix")), "_order": SEVERITIES.index(sev) if sev in SEVERITIES else 0})
    out = pd.DataFrame(rows, columns=[*COLUMNS, "_order"]).sort_values("_order", kind="stable")
    return out[COLUMNS].reset_index(drop=True)


def command(run: RunInfo) -> str:
    """How to attach a report to this run (its target where the run names one)."""
    return (f"draftboard doctor --target {run.target or 'TARGET'} --drafter CHECKPOINT --run {run.run_id}")
