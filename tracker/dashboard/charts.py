"""Plotly figures for the dashboard, built from the frames of `tracker.dashboard.compare`.

Axis titles carry units, hovers carry the environment, and series whose environment differs
critically from the reference are dashed (points with open markers). Series are named after
runs, and Plotly renders a subset of HTML in names and annotations, so every name is escaped
(`escape.html_text`) and hover templates refer to it (`%{fullData.name}`) instead of holding it.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from tracker.dashboard import metric_docs
from tracker.dashboard.escape import html_text

PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D", "#BAB0AC",
           "#EECA3B"]
REFERENCE_COLOR = "#333333"


def _layout(fig: go.Figure, x_title: str, y_title: str, height: int = 360) -> go.Figure:
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=30, b=10), hovermode="x unified",
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), xaxis_title=x_title,
                      yaxis_title=y_title)
    return fig


def _name(series: str, dashed: bool) -> str:
    return html_text(series) + (" ⚠" if dashed else "")


def _colors(series: list[str]) -> dict[str, str]:
    return {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}


def step_curves(frame: pd.DataFrame, key: str, x_title: str = "training step") -> go.Figure:
    """One line per series of `frame` (columns series, step, value, dashed) for metric `key`."""
    doc = metric_docs.describe(key)
    fig = go.Figure()
    sub = frame[frame["key"] == key]
    colors = _colors(list(dict.fromkeys(frame["series"])))
    for series, part in sub.groupby("series", sort=False):
        dashed = bool(part["dashed"].any())
        fig.add_trace(go.Scattergl(
            x=part["step"], y=part["value"], mode="lines", name=_name(series, dashed),
            line=dict(color=colors[series], dash="dash" if dashed else "solid"),
            hovertemplate=f"%{{fullData.name}}<br>step %{{x}}<br>{key} %{{y:.4g}} {doc.unit}<extra></extra>"))
    return _layout(fig, x_title, doc.label)


def eval_curves(points: pd.DataFrame, key: str, reference_value: float | None = None,
                reference_label: str | None = None) -> go.Figure:
    """Eval metric over checkpoint step, one line per series; the reference as a labelled horizontal line."""
    doc = metric_docs.describe(key)
    fig = go.Figure()
    sub = points[points["key"] == key]
    colors = _colors(list(dict.fromkeys(points["series"])))
    for series, part in sub.groupby("series", sort=False):
        dashed = bool(part["dashed"].any())
        part = part.sort_values("step")
        fig.add_trace(go.Scatter(
            x=part["step"], y=part["value"], mode="lines+markers", name=_name(series, dashed),
            line=dict(color=colors[series], dash="dash" if dashed else "solid"),
            marker=dict(symbol="circle-open" if dashed else "circle", size=8),
            customdata=part[["env"]].map(html_text).to_numpy(),  # env badges come from tags
            hovertemplate=(f"%{{fullData.name}}<br>checkpoint step %{{x}}<br>{key} %{{y:.4f}} {doc.unit}"
                           "<br>env %{customdata[0]}<extra></extra>")))
    if reference_value is not None:
        fig.add_hline(y=reference_value, line=dict(color=REFERENCE_COLOR, dash="dot", width=2),
                      annotation_text=f"{html_text(reference_label or 'reference')}: {reference_value:.3f}",
                      annotation_position="top left")
    return _layout(fig, "checkpoint step", doc.label)


def accept_by_position(frame: pd.DataFrame) -> go.Figure:
    """Acceptance rate by draft position, one line per series (the reference in black)."""
    fig = go.Figure()
    colors = _colors([s for s in dict.fromkeys(frame["series"]) if not s.startswith("reference")])
    for series, part in frame.groupby("series", sort=False):
        ref = series.startswith("reference")
        dashed = bool(part["dashed"].any())
        fig.add_trace(go.Scatter(
            x=part["position"], y=part["rate"], mode="lines+markers", name=_name(series, dashed),
            line=dict(color=REFERENCE_COLOR if ref else colors[series], dash="dash" if dashed else
                      ("dot" if ref else "solid"), width=3 if ref else 2),
            hovertemplate="%{fullData.name}<br>draft position %{x}<br>accepted in %{y:.1%} of blocks<extra></extra>"))
    fig.update_yaxes(tickformat=".0%", range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return _layout(fig, "draft position k (1 = first token after the anchor)", "acceptance rate (fraction of blocks)")


def ddtree_vs_budget(frame: pd.DataFrame) -> go.Figure:
    """DDTree acceptance length against node budget (log2 x axis)."""
    fig = go.Figure()
    colors = _colors([s for s in dict.fromkeys(frame["series"]) if not s.startswith("reference")])
    for series, part in frame.groupby("series", sort=False):
        ref = series.startswith("reference")
        dashed = bool(part["dashed"].any())
        part = part.sort_values("budget")
        fig.add_trace(go.Scatter(
            x=part["budget"], y=part["tau"], mode="lines+markers", name=_name(series, dashed),
            line=dict(color=REFERENCE_COLOR if ref else colors[series], dash="dash" if dashed else
                      ("dot" if ref else "solid"), width=3 if ref else 2),
            hovertemplate="%{fullData.name}<br>node budget %{x}<br>DDTree tau %{y:.3f} tokens / block<extra></extra>"))
    fig.update_xaxes(type="log", dtick=0.30102999566)  # log2 ticks
    return _layout(fig, "DDTree node budget B (nodes)", "ddtree_tau_b{B} (tokens / block)")
