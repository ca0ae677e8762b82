"""Run detail's "Acceptance by context length": an eval's `tau_by_context` (the offline walk, or an engine's
steps), the all-anchors curve beside it where the eval has one, one row per bucket (tracker/measurement/context.py)."""

from __future__ import annotations

import pandas as pd

from tracker.measurement.context import DEFINITION

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
        low, high = row.get("from"), row.get("to")
        ci = row.get("ci") if isinstance(row.get("ci"), list) and len(row.get("ci")) == 2 else None
        out.append({
            "context (tokens)": f"[{low}, {'∞' if high is None else high})",
            "blocks": row.get("blocks"),
            **{CURVES[key]: _number(rows[i].get("tau")) if i < len(rows) and isinstance(rows[i], dict) else None
               for key, rows in curves.items()},
            "95% CI": f"{ci[0]:.3f}–{ci[1]:.3f}" if ci and all(_number(v) is not None for v in ci) else "–",
        })
    return pd.DataFrame(out, columns=["context (tokens)", "blocks", *(CURVES[k] for k in curves), "95% CI"])
