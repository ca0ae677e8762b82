"""Curves over steps on a canvas: the data each chart draws, and the uPlot code that draws it.

Compare's and Run detail's training charts hold up to 20 runs x 4 metrics of decimated curves, and
Compare's first view draws each eval metric over checkpoint steps. Plotly drew them as SVG: its
4.7 MB bundle took 1.7 s to parse and draw in every fresh tab on 2 cores, longer than the rest of
the page. uPlot (vendored under `vendor/uplot/`, MIT, 51 kB) draws the same lines on a canvas in
milliseconds. `ui.canvas_chart` mounts `JS` as a Streamlit component; this module only builds the
JSON it draws (`spec` for training curves, `eval_spec` for evals by checkpoint), so the rules
(dashing, the faint raw curve, smoothing, the log axis, the zoom window, markers, intervals, the
reference line) are tested without a browser.

Text reaches the chart as data and is written with `textContent` (legend), as a `title` (tooltips)
or on the canvas (axes, the reference's label): a run name is shown as written and never parsed as HTML.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from tracker.dashboard import metric_docs
from tracker.dashboard.charts import owner_of, reason_of, series_color
from tracker.dashboard.compare import ema

_HERE = Path(__file__).resolve().parent
_VENDOR = _HERE / "vendor" / "uplot"
# One ES module: uPlot's build defines `var uPlot` at the module's top level, which our code uses.
JS = (_VENDOR / "uPlot.iife.min.js").read_text() + "\n" + (_HERE / "curve_chart.js").read_text()
CSS = (_VENDOR / "uPlot.min.css").read_text() + "\n" + (_HERE / "curve_chart.css").read_text()

RAW_BEHIND_MAX_SERIES = 6  # beyond this many series, smoothed curves are drawn alone
HEIGHT_PX = 300  # the plot; the legend below grows with the series
# Values travel as float32: 7 significant digits, past what a chart or its 4-digit legend shows; NaN
# where a series has no point. Steps as float64: integers stay exact up to 2^53.
Y_DTYPE, X_DTYPE = "<f4", "<f8"
STEP_TICKS = 12  # up to this many evaluated checkpoints, a tick at each one's step
# Series of one run drawn at the same checkpoint (an eval and its re-evaluation in another environment):
# each next one's marker smaller, so the first never hides the others.
MARKER_PX = (11, 8, 6, 5)


def pack(values: np.ndarray, dtype: str) -> str:
    """An array as base64 of its little-endian `dtype` bytes: a quarter of its JSON text, no NaN
    problem (JSON has none), decoded by the browser into a typed array without parsing numbers."""
    return base64.b64encode(np.ascontiguousarray(values, dtype=dtype).tobytes()).decode("ascii")


def unpack(packed: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(packed), dtype=dtype)


def spec(frame: pd.DataFrame, key: str, x_title: str = "training step", colors: Mapping[str, str] | None = None,
         smoothing: float = 0.0, log_x: bool = False, x_range: tuple[int, int] | None = None,
         zoomable: bool = False) -> dict:
    """What one chart draws: one line per series of `frame` (columns series, step, value, and
    optionally owner, reason) for metric `key`, on the union of their steps (`x`; each series' `y`
    NaN where it has no point, and lines span the gaps), both `pack`ed.

    A series with a `reason` is dashed and its legend says why (`compare.series_reason`).
    `smoothing` in [0, 1): the EMA weight (`compare.ema`) per series, over its own points; the raw
    curve stays behind it, faint and out of the legend, while at most RAW_BEHIND_MAX_SERIES series
    are drawn (more faint lines blur into a haze and double what is drawn). `log_x`: steps below 1
    have no place on a log axis and are left out. `x_range`: the steps the x axis spans (a zoom),
    else all of them. `zoomable`: a drag on the chart asks the page for that window at full detail.
    """
    doc = metric_docs.describe(key)
    sub = frame[frame["key"] == key]
    if log_x:
        sub = sub[sub["step"] >= 1]
    steps = np.unique(sub["step"].to_numpy(dtype=np.int64))
    raw_behind = smoothing > 0 and sub["series"].nunique() <= RAW_BEHIND_MAX_SERIES
    series, fallback = [], {}
    for name, part in sub.groupby("series", sort=False):
        part = part.sort_values("step")
        at = np.searchsorted(steps, part["step"].to_numpy(dtype=np.int64))
        reason = reason_of(part)
        # A series of one point has no line to draw: it is drawn as its point (an eval of one checkpoint,
        # a run that logged once), never left invisible.
        line = {"name": str(name), "color": series_color(colors, owner_of(part, name), fallback), "reason": reason,
                "dashed": bool(reason), "single": bool(part["value"].notna().sum() == 1)}
        raw = part["value"].to_numpy(dtype=float)
        drawn = np.asarray(ema(raw.tolist(), smoothing)) if smoothing > 0 else raw
        for values, faint in ((raw, True), (drawn, False)) if raw_behind else ((drawn, False),):
            column = np.full(len(steps), np.nan)
            column[at] = values
            series.append({**line, "faint": faint, "y": pack(column, Y_DTYPE)})
    return {
        "smoothing": smoothing,
        "x_title": x_title + (" (log scale)" if log_x else ""),
        "y_title": doc.label,
        "log_x": log_x,
        "x_range": list(x_range) if x_range is not None else None,
        "zoomable": zoomable,
        "height": HEIGHT_PX,
        "x": pack(steps, X_DTYPE),
        "series": series,
    }


def eval_spec(points: pd.DataFrame, key: str, colors: Mapping[str, str] | None = None,
              references: Sequence[Mapping] = ()) -> dict:
    """What one eval-by-checkpoint chart draws: `spec` over `points` (`compare.POINT_COLUMNS`: series,
    step, value, low, high, env, owner, reason) with a marker at each evaluated checkpoint (open when
    the series is dashed), each point's 95% bootstrap interval (`low`, `high`, packed like the values;
    NaN where a point has none: evals from before intervals, published numbers) as an error bar, the
    environment badges of each series, a tick at each checkpoint while there are at most STEP_TICKS,
    and each reference (`CompareData.references`: value, label, low, high, apart) as a labelled horizontal
    line with its interval, when it has one, as a faint band; one drawn apart (not the evals' prompts: shape
    only) grey and long-dashed."""
    out = spec(points, key, "checkpoint step", colors)
    steps = unpack(out["x"], X_DTYPE).astype(np.int64)
    sub = points[points["key"] == key]
    per_owner: dict[str, int] = {}
    for line, (name, part) in zip(out["series"], sub.groupby("series", sort=False)):
        part = part.sort_values("step")
        owner = owner_of(part, name)
        line["marker_px"] = MARKER_PX[min(per_owner.get(owner, 0), len(MARKER_PX) - 1)]
        per_owner[owner] = per_owner.get(owner, 0) + 1
        at = np.searchsorted(steps, part["step"].to_numpy(dtype=np.int64))
        for bound in ("low", "high"):
            column = np.full(len(steps), np.nan)
            if bound in part.columns:
                column[at] = pd.to_numeric(part[bound], errors="coerce").to_numpy(dtype=float)
            line[bound] = pack(column, Y_DTYPE)
        envs = part["env"].dropna().astype(str).unique() if "env" in part.columns else []
        line["env"] = "; ".join(envs)  # a tooltip, set as text
    refs = [{"value": float(r["value"]), "label": str(r["label"]), "low": r.get("low"), "high": r.get("high"),
             "apart": bool(r.get("apart"))} for r in references]
    return {**out, "markers": True, "references": refs,
            "ticks": [int(s) for s in steps] if 0 < len(steps) <= STEP_TICKS else None}
