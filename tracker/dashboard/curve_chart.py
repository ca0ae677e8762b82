"""Training curves on a canvas: the data each chart draws, and the uPlot code that draws it.

Compare's and Run detail's training charts hold up to 20 runs x 4 metrics of decimated curves.
Plotly drew them as SVG: its 4.7 MB bundle took 1.7 s to parse and draw in every fresh tab on 2
cores, longer than the rest of the page. uPlot (vendored under `vendor/uplot/`, MIT, 51 kB) draws
the same lines on a canvas in milliseconds. `ui.training_chart` mounts `JS` as a Streamlit component;
this module only builds the JSON it draws (`spec`), so the rules (dashing, the faint raw curve,
smoothing, the log axis, the zoom window) are tested without a browser.

Text reaches the chart as data and uPlot writes it with `textContent` (legend) or on the canvas
(axes): a run name is shown as written and never parsed as HTML.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
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
