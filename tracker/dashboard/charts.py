"""Plotly figures for the dashboard's per-checkpoint charts (acceptance by draft position, DDTree against
its budget), built from the frames of `tracker.dashboard.compare`, and the run colours every chart shares
(curves over steps, training's and evals by checkpoint, are drawn on a canvas: `curve_chart`).

Axis titles carry units. The one dashing rule (`compare.series_reason`):
a series is dashed, with open markers, when it differs critically from what it must match (an eval its
training run's environment, everything the reference's protocol and, unless an eval of a known training
run, its environment); its `reason` (`≠ reference: dtype`, `≠ training: drafter precision`) follows its
name in the legend and shows in the tooltip. Each run
keeps one colour on every chart and page (`run_colors`, the only owner of the palette); an eval
takes its training run's colour. Legends sit under the plot, clear of Plotly's toolbar.

Series are named after runs, and Plotly renders a subset of HTML in names and annotations, so every
name is escaped (`escape.html_text`) and hover templates refer to it (`%{fullData.name}`) instead
of holding it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from tracker.dashboard.escape import html_text
from tracker.dashboard.index import RunIndex

PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D", "#BAB0AC",
           "#EECA3B"]
REFERENCE_COLOR = "#333333"


def run_colors(index: RunIndex) -> dict[str, str]:
    """Every run's colour: palette slots in the order runs started (a new run never recolours an
    older one); an eval or reference takes its training run's colour; a reference without one is
    drawn in REFERENCE_COLOR. Once per index (every chart of every page reads it)."""
    return index.memo(("run_colors",), lambda: _run_colors(index))


def _run_colors(index: RunIndex) -> dict[str, str]:
    slots: dict[str, str] = {}
    out = {}
    for run in sorted(index.runs.values(), key=lambda r: (r.start_time or 0, r.run_id)):
        owner = run.train_run_id if run.train_run_id in index.runs else run.run_id
        if owner == run.run_id and run.kind == "reference":
            out[run.run_id] = REFERENCE_COLOR
            continue
        if owner not in slots:
            slots[owner] = PALETTE[len(slots) % len(PALETTE)]
        out[run.run_id] = slots[owner]
    for run_id, color in list(out.items()):  # a training run listed after its evals (clock skew)
        owner = index.runs[run_id].train_run_id
        if owner in slots:
            out[run_id] = slots[owner]
    return out


def series_color(colors: Mapping[str, str] | None, owner: str, fallback: dict[str, str]) -> str:
    """`owner`'s colour from `colors` (`run_colors`), else the next palette slot, kept in `fallback`."""
    if colors and owner in colors:
        return colors[owner]
    return fallback.setdefault(owner, PALETTE[len(fallback) % len(PALETTE)])


def _layout(fig: go.Figure, x_title: str, y_title: str, height: int = 380) -> go.Figure:
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=30, b=10), hovermode="x unified",
                      legend=dict(orientation="h", yanchor="top", y=-0.22, x=0), xaxis_title=x_title,
                      yaxis_title=y_title)
    return fig


def _name(series: str, reason: str) -> str:
    return html_text(series) + (f" ⚠ {html_text(reason)}" if reason else "")


def _reason_hover(reason: str) -> str:
    """The tooltip line saying why a series is dashed (escaped: field names come from fingerprints)."""
    return f"<br>dashed: {html_text(reason)}" if reason else ""


def owner_of(part: pd.DataFrame, series: str) -> str:
    """The run whose colour one series' rows (`part`) take: their `owner`, else the series itself."""
    return str(part["owner"].iloc[0]) if "owner" in part.columns else series


def reason_of(part: pd.DataFrame) -> str:
    """Why one series' rows (`part`) are dashed (`compare.series_reason`); "" when they are not."""
    return str(part["reason"].iloc[0]) if "reason" in part.columns and len(part) else ""


def _per_checkpoint(frame: pd.DataFrame, x: str, y: str, hover: str, colors: Mapping[str, str] | None,
                    order_by: str | None = None, extra=None) -> go.Figure:
    """One line per series (the reference dotted, in REFERENCE_COLOR), its points in the order of `order_by`
    (default: x); `extra(part)` adds trace settings of the chart's own (error bars, hover data)."""
    fig = go.Figure()
    fallback: dict[str, str] = {}
    for series, part in frame.groupby("series", sort=False):
        ref = series.startswith("reference")
        reason = reason_of(part)
        part = part.sort_values(order_by or x, kind="stable")
        fig.add_trace(go.Scatter(
            x=part[x], y=part[y], mode="lines+markers", name=_name(series, reason),
            line=dict(color=REFERENCE_COLOR if ref else series_color(colors, owner_of(part, series), fallback),
                      dash="dash" if reason else ("dot" if ref else "solid"), width=3 if ref else 2),
            marker=dict(symbol="circle-open" if reason else "circle"),
            hovertemplate=f"%{{fullData.name}}<br>{hover}{_reason_hover(reason)}<extra></extra>",
            **(extra(part) if extra else {})))
    return fig


def accept_by_position(frame: pd.DataFrame, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Acceptance rate by draft position, one line per series (the reference in black)."""
    fig = _per_checkpoint(frame, "position", "rate", "draft position %{x}<br>accepted in %{y:.1%} of blocks", colors)
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return _layout(fig, "draft position k (1 = first token after the anchor)", "acceptance rate (fraction of blocks)")


def under_load(frame: pd.DataFrame, y: str, y_title: str, hover: str,
               colors: Mapping[str, str] | None = None) -> go.Figure:
    """A load sweep's `y` against requests in flight, one line per eval (`load_view.load_curves`), with its 95%
    interval over rounds (`{y}_ci_low` / `_ci_high`, where the frame has them) as error bars and a band; speedup
    gets the break-even line at 1."""
    drawn = frame.dropna(subset=[y])
    low, high = (f"{y}{end}" for end in ("_ci_low", "_ci_high"))
    spread = {low, high} <= set(drawn.columns) and drawn[[low, high]].notna().any().all()
    fig = _per_checkpoint(drawn, "concurrency", y, f"%{{x}} in flight<br>{hover}", colors, extra=(lambda part: dict(
        error_y=dict(type="data", symmetric=False, array=(part[high] - part[y]).fillna(0),
                     arrayminus=(part[y] - part[low]).fillna(0), thickness=1))) if spread else None)
    if spread:  # each line's interval over rounds as a band of its colour between the levels
        for line, (_, part) in zip(list(fig.data), drawn.groupby("series", sort=False)):
            part = part.dropna(subset=[low, high]).sort_values("concurrency")
            fig.add_trace(go.Scatter(x=[*part["concurrency"], *part["concurrency"][::-1]],
                                     y=[*part[high], *part[low][::-1]], fill="toself", fillcolor=line.line.color,
                                     opacity=0.15, line=dict(width=0), hoverinfo="skip", showlegend=False,
                                     legendgroup=line.name))
    fig.update_xaxes(type="log", dtick=0.30102999566)  # levels 1, 2, 4, 8, ... evenly spaced
    if y == "speedup":
        fig.add_hline(y=1.0, line=dict(color="#888", dash="dot", width=1), annotation_text="break-even",
                      annotation_position="bottom right")
    return _layout(fig, "requests in flight (concurrency)", y_title)


def by_context(frame: pd.DataFrame, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Acceptance length per context bucket, one line per eval (`context_view.context_curves`), buckets in order
    of their start, each bucket's 95% interval as an error bar."""
    fig = _per_checkpoint(
        frame, "bucket", "tau", "context %{x} tokens<br>tau %{y:.3f} tokens / block over %{customdata} blocks", colors,
        order_by="from", extra=lambda part: dict(
            customdata=part["blocks"],
            error_y=dict(type="data", symmetric=False, array=(part["high"] - part["tau"]).fillna(0),
                         arrayminus=(part["tau"] - part["low"]).fillna(0), thickness=1)))
    order = list(dict.fromkeys(frame.sort_values("from", kind="stable")["bucket"]))
    fig.update_xaxes(categoryorder="array", categoryarray=order)
    return _layout(fig, "context length bucket (tokens before the block's first drafted position)",
                   "tau in the bucket (tokens / block)")


def ddtree_vs_budget(frame: pd.DataFrame, colors: Mapping[str, str] | None = None,
                     span: tuple[int, int] | None = None) -> go.Figure:
    """DDTree acceptance length against node budget (log2 x axis), the axis over `span` when given
    (`compare.common_budgets`: the page names the points left outside)."""
    fig = _per_checkpoint(frame, "budget", "tau", "node budget %{x}<br>DDTree tau %{y:.3f} tokens / block", colors)
    fig.update_xaxes(type="log", dtick=0.30102999566)  # log2 ticks
    if span is not None:
        pad = 0.15  # in log10 units: the end points stay visible
        fig.update_xaxes(range=[math.log10(span[0]) - pad, math.log10(span[1]) + pad])
    return _layout(fig, "DDTree node budget B (nodes)", "ddtree_tau_b{B} (tokens / block)")
