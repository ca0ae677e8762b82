"""Acceptance by context length as the dashboard shows it (tracker/measurement/context.py): Run detail's table of an
eval's `tau_by_context` (the offline walk, or an engine's steps), the all-anchors curve beside it where the eval
has one, one row per bucket; Compare's "By context" chart, one line per chosen run's drawn eval (and the
reference's), each bucket's 95% interval as its error bar."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from tracker.dashboard.compare_deltas import scoring_note
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.measurement.context import DEFINITION, bucket_text

CURVES = {  # results key -> its column, in the order shown
    "tau_by_context": "tau (walk)",
    "engine_tau_by_context": "tau (engine steps)",
    "tau_all_anchors_by_context": "tau (every anchor)",
}
COLUMNS = {
    "context (tokens)": "prompt + completion tokens up to and including the block's anchor: [from, to)",
    "blocks": "blocks whose context lies in the bucket (the headline curve's)",
    **{column: DEFINITION for column in CURVES.values()},
    "95% CI": "percentile bootstrap over prompts of the headline curve's tau",
}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def context_frame(results: dict | None) -> pd.DataFrame | None:
    """One row per context bucket, or None when the eval has no curve by context."""
    curves = {key: rows for key in CURVES if isinstance(rows := (results or {}).get(key), list) and rows}
    if not curves:
        return None
    head = next(iter(curves.values()))
    out = []
    for i, row in enumerate(head):
        if not isinstance(row, dict):
            continue
        ci = row.get("ci") if isinstance(row.get("ci"), list) and len(row.get("ci")) == 2 else None
        out.append({
            "context (tokens)": bucket_text(row),
            "blocks": row.get("blocks"),
            **{CURVES[key]: _number(rows[i].get("tau")) if i < len(rows) and isinstance(rows[i], dict) else None
               for key, rows in curves.items()},
            "95% CI": f"{ci[0]:.3f}–{ci[1]:.3f}" if ci and all(_number(v) is not None for v in ci) else "–",
        })
    return pd.DataFrame(out, columns=["context (tokens)", "blocks", *(CURVES[k] for k in curves), "95% CI"])


def unavailable_line(results: dict | None) -> str | None:
    """Why an engine eval has no acceptance by context (the engine's replies give no steps in order), else None."""
    why = (results or {}).get("engine_tau_by_context_unavailable")
    return f"Acceptance by context length: not measured for this engine eval: {why}" if isinstance(why, str) else None


CURVE_COLUMNS = ["series", "owner", "bucket", "from", "tau", "low", "high", "blocks"]


def _headline(results: dict | None) -> list:
    """The eval's own curve: its walk's (offline) or its steps' (engine)."""
    for key in ("tau_by_context", "engine_tau_by_context"):
        rows = (results or {}).get(key)
        if isinstance(rows, list) and rows:
            return rows
    return []


def context_curves(index: RunIndex, picked: Mapping[str, str], reference: RunInfo | None,
                   results: Callable[[RunInfo], dict | None]) -> pd.DataFrame:
    """One row per (drawn eval, non-empty bucket): each chosen run's drawn eval (`picked`: run -> eval) and the
    reference, labelled by the eval (its scoring named), coloured by the run."""
    drawn = [(index.runs[ev], owner, "") for owner, ev in picked.items() if ev in index.runs]
    if reference is not None:
        drawn.append((reference, reference.run_id, "reference: "))
    rows = []
    for ev, owner, prefix in drawn:
        for row in _headline(results(ev)):
            tau = _number(row.get("tau")) if isinstance(row, dict) else None
            if tau is None:
                continue
            low, high = (row.get("ci") or [None, None]) if isinstance(row.get("ci"), list) else (None, None)
            rows.append({"series": prefix + index.eval_label(ev) + scoring_note(ev), "owner": owner,
                         "bucket": bucket_text(row),
                         "from": row.get("from"), "tau": tau, "low": _number(low), "high": _number(high),
                         "blocks": row.get("blocks")})
    frame = pd.DataFrame(rows, columns=CURVE_COLUMNS)
    return frame.sort_values(["from", "series"], kind="stable", ignore_index=True) if not frame.empty else frame
