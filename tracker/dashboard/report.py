"""A shareable Compare: one self-contained HTML file (`draftboard report RUN... --out report.html`, and
Compare's "Download report").

Everything the file needs is inside it: the vendored uPlot and the chart code (`curve_chart.JS`, its
module export made a global), the charts' data as JSON blocks, the styles. A Content-Security-Policy
allows no request at all, so it opens offline and asks nothing of any network. Every string a user
wrote (run names, reasons, fingerprint values) is escaped (`escape.html_text`); the JSON blocks escape
`<`, so no text can end its script.

What it holds: the runs and the reference, every warning Compare gives (environment, protocol,
lineage, re-evaluations), the training curves and the eval curves over checkpoints (each chart with
its metric's definition), the environment and protocol differences of each chart's runs from the
reference, and the vs-reference, vs-previous and per-dataset tables; a glossary of every metric shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import pandas as pd

from tracker import redact
from tracker.dashboard import charts, curve_chart, lineage, metric_docs, recipe
from tracker.dashboard.compare import (TITLES, CompareData, EvalTables, compare_data, eval_tables,
                                      reference_label)
from tracker.dashboard.compare_deltas import ResultsLoader
from tracker.dashboard.escape import html_text
from tracker.dashboard.index import RunIndex
from tracker.dashboard.lineage import MISSING

_EXPORT = "export default function"  # curve_chart.js's one export, the chart's entry point
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #31333F; margin: 2rem auto; max-width: 1200px; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #E6E9EF; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 1.5rem; }
.definition { color: #555; font-size: 0.9em; }
.warning { background: #fde2b0; padding: .5rem .8rem; border-radius: 4px; }
.critical { background: #f8c7c3; padding: .5rem .8rem; border-radius: 4px; }
table { border-collapse: collapse; font-size: 0.9em; margin: .5rem 0 1rem; }
th, td { border: 1px solid #E6E9EF; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f5f8; } code { background: #f4f5f8; padding: 0 3px; }
"""
_RUN = """
for (const el of document.querySelectorAll(".db-chart")) {
  const data = JSON.parse(document.getElementById(el.dataset.spec).textContent);
  window.draftboardChart({ data, parentElement: el, setTriggerValue: () => {} });
}
"""


def _text(value) -> str:
    """A user-written value as HTML text: escaped, MISSING for nothing; a float to 3 decimals, as Compare
    shows it (not the 16 digits its repr has)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return MISSING
    if isinstance(value, float):
        return f"{value:.3f}"
    return html_text(value)


def _definition(text: str) -> str:
    """A metric definition (Markdown with `code`) as HTML: escaped, code spans kept as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html_text(text))


def _json_block(block_id: str, obj) -> str:
    payload = json.dumps(obj, allow_nan=False).replace("<", "\\u003c")
    return f'<script type="application/json" id="{block_id}">{payload}</script>'


def _chart_code() -> str:
    if curve_chart.JS.count(_EXPORT) != 1 or "</script" in curve_chart.JS.lower():
        raise RuntimeError("curve_chart.JS must have exactly one default export and no </script: the report "
                           "inlines it")
    return curve_chart.JS.replace(_EXPORT, "window.draftboardChart = function")


def _table(frame: pd.DataFrame, drop: Sequence[str] = ("run_id",)) -> str:
    shown = frame.drop(columns=[c for c in drop if c in frame.columns])
    if shown.empty:
        return "<p>None.</p>"
    head = "".join(f"<th>{_text(c)}</th>" for c in shown.columns)
    rows = "".join("<tr>" + "".join(f"<td>{_text(v)}</td>" for v in row) + "</tr>"
                   for row in shown.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _list(lines: Sequence[str], css: str, title: str) -> str:
    """A warning box as Compare words it: its title, then each line."""
    items = "".join(f"<li>{_text(x)}</li>" for x in lines)
    return f'<div class="{css}"><b>{_text(title)}</b><ul>{items}</ul></div>' if lines else ""


def _charts(keys: Sequence[str], spec: Callable[[str], dict], prefix: str) -> tuple[str, list[str]]:
    """(the charts' HTML, their JSON blocks) for each metric in `keys`, each drawn from `spec(key)`."""
    cells, blocks = [], []
    for i, key in enumerate(keys):
        doc = metric_docs.describe(key)
        block = f"{prefix}-{i}"
        blocks.append(_json_block(block, spec(key)))
        cells.append(f'<figure><figcaption><b>{_text(key)}</b> · {_text(doc.title)}'
                     f'{" (" + _text(doc.unit) + ")" if doc.unit else ""}</figcaption>'
                     f'<div class="db-chart" data-spec="{block}"></div>'
                     f'<p class="definition">{_definition(doc.definition)}</p></figure>')
    return '<div class="charts">' + "".join(cells) + "</div>", blocks


def _differences(index: RunIndex, data: CompareData) -> str:
    """Each drawn eval's (and chosen run's) environment and protocol rows against the reference."""
    ref = data.reference
    if ref is None:
        return "<p>No reference chosen: nothing to compare environments with.</p>"
    parts = []
    shown = {run.run_id: run for run in (index.runs[data.picked[r.run_id]] if r.run_id in data.picked else r
                                         for r in data.runs)}
    for run in shown.values():
        rows = lineage.vs_reference(run, ref)
        label = index.eval_label(run) if run.kind != "train" else index.label(run.run_id)
        if not rows:
            parts.append(f"<p><b>{_text(label)}</b>: no difference from the reference.</p>")
            continue
        frame = pd.DataFrame([{"field": lineage.field_name(r.field), "this run": lineage.value_text(r.a_value),
                               "reference": lineage.value_text(r.b_value), "severity": r.severity} for r in rows])
        parts.append(f"<p><b>{_text(label)}</b> against the reference:</p>" + _table(frame))
    return "".join(parts)


def build(index: RunIndex, data: CompareData, tables: EvalTables, *, store: str, colors=None,
          x_title: str = "training step", generated: datetime | None = None) -> str:
    """The report as one HTML document."""
    generated = generated or datetime.now(timezone.utc)
    ref = data.reference
    runs = ", ".join(index.label(r.run_id) for r in data.runs)
    train_html, train_blocks = _charts(data.train_metrics, lambda key: curve_chart.spec(
        data.train_curves, key, x_title, colors=colors), "train")
    eval_keys = [k for k in ("tau", "streak") if k in data.eval_metrics] or list(data.eval_metrics[:2])
    ref_label = reference_label(index, ref) if ref is not None else None
    eval_html, eval_blocks = _charts(eval_keys, lambda key: curve_chart.eval_spec(
        data.eval_points, key, colors, data.references(key, ref_label) if ref_label else ()), "eval")
    shown_keys = dict.fromkeys([*data.train_metrics, *eval_keys])
    glossary = "".join(f"<dt><b>{_text(k)}</b> · {_text(metric_docs.describe(k).title)}</dt>"
                       f"<dd>{_definition(metric_docs.describe(k).definition)}</dd>" for k in shown_keys)
    sections = [
        f"<h1>draftboard report: {_text(runs)}</h1>",
        f"<p>Reference: <b>{_text(reference_label(index, ref) if ref is not None else 'none')}</b>. "
        # a file meant for sharing names the store, never where it lies on this machine
        f"Store: <code>{_text(redact.short_uri(store))}</code>. Generated {generated:%Y-%m-%d %H:%M} UTC.</p>",
        _list([data.target_note] if data.target_note else [], "critical", "Another target"),
        *(_list(getattr(data, name), "critical" if name == "banner" else "warning", title)
          for name, title in TITLES.items()),
        f"<p>{_text(data.reference_note)}</p>" if data.reference_note else "",
        "<h2>Training curves</h2>" + (train_html if data.train_metrics else "<p>No training steps logged.</p>"),
        "<h2>Evals over checkpoints</h2>" + (eval_html if eval_keys else "<p>No eval results.</p>"),
        "<p class='definition'>Dashed, with open markers: the series differs critically from the reference or its "
        "training run (the legend says which, as on Compare). Error bars: the 95% bootstrap interval over prompts "
        "of each eval; the dotted line: the reference, its interval a faint band.</p>",
        "<h2>Environment and protocol against the reference</h2>" + _differences(index, data),
        "<h2>vs reference</h2>" + _table(tables.vs_reference),
        "<h2>vs previous checkpoint</h2>" + _table(tables.vs_previous),
        "<h2>Per-dataset results</h2>" + _table(tables.by_dataset),
        "<h2>Definitions</h2><dl>" + glossary + "</dl>",
    ]
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f"<title>draftboard report: {_text(runs)}</title><style>{curve_chart.CSS}{_STYLE}</style></head><body>"
            + "".join(sections) + "".join(train_blocks + eval_blocks)
            + f"<script>{_chart_code()}</script><script>{_RUN}</script></body></html>")


def compare_report(index: RunIndex, run_ids: Sequence[str], reference_id: str | None, histories: pd.DataFrame,
                   results: ResultsLoader | None, store: str, step: int | None = None) -> str:
    """What Compare shows for `run_ids` against `reference_id`, as a report (`histories`: the training
    runs' decimated curves, as Compare reads them; `step`: Compare's checkpoint drawn)."""
    data = compare_data(index, run_ids, reference_id, histories, results, step)
    return build(index, data, eval_tables(index, data, results), store=store, colors=charts.run_colors(index),
                 x_title=recipe.step_axis_title(index, run_ids))
