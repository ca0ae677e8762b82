"""The dashboard's tables, as DataFrames: the runs table and a run's params, metrics, fingerprint,
environment differences and checkpoints; and what the run pickers offer and start on (a deep link's ids, the
team's newest training runs).

Plain pandas over `RunIndex` / `RunInfo`; environment and protocol checks come from
`tracker.dashboard.lineage`.
Cells hold text as the user wrote it: st.dataframe shows cells as plain text, and CSV downloads go
through `tracker.dashboard.escape.csv_bytes`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pandas as pd

from tracker import redact
from tracker.environment import fingerprint
from tracker.measurement import protocol
from tracker.dashboard import lineage, metric_docs, recipe
from tracker.dashboard.index import LINEAR_ATTN_ICONS, RunIndex, RunInfo, no_cycle_collection, same_target
from tracker.dashboard.lineage import MISSING, summarize_rows
from tracker.store import names

_GPU_CHARS = 28


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# --------------------------------------------------------------------------- runs table


def tau_of(index: RunIndex, run: RunInfo) -> tuple[float | None, float | None]:
    """(latest, best) `tau`: an eval's own; for a training run, over its evals (latest checkpoint / max)."""
    if run.kind == "train":
        points = [(e.checkpoint_step or 0, e.start_time or 0, e.metrics["tau"])
                  for e in index.evals_of(run.run_id) if finite(e.metrics.get("tau"))]
        if not points:
            return None, None
        return max(points)[2], max(p[2] for p in points)
    tau = run.metrics.get("tau")
    return (tau, tau) if finite(tau) else (None, None)


def tau_text(index: RunIndex, run: RunInfo) -> str:
    """What the Runs table's tau says, with what makes it a number: `3.24 [2.19, 4.50] · 16 prompts · T=0 ·
    64 tok` (a training run: its latest evaluated checkpoint's, `@ 200` in front); a published reference
    without one tau, its per-dataset numbers (`gsm8k 6.53 · math500 7.84`); MISSING when there is none."""
    ev, at = run, ""
    if run.kind == "train":
        evals = [e for e in index.evals_of(run.run_id) if finite(e.metrics.get("tau"))]
        if not evals:
            return MISSING
        ev = max(evals, key=lambda e: (e.checkpoint_step or 0, e.start_time or 0))
        at = f"@ {ev.checkpoint_step} · " if ev.checkpoint_step is not None else ""
    tau = ev.metrics.get("tau")
    if not finite(tau):
        published = [(d, ev.metrics.get(names.dataset_metric("tau", d))) for d in lineage.datasets_of(ev)]
        shown = [f"{d} {v:.2f}" for d, v in published if finite(v)]
        return " · ".join(shown) if shown else MISSING
    low, high = ev.metrics.get("tau_ci_low"), ev.metrics.get("tau_ci_high")
    parts = [f"{tau:.2f}" + (f" [{low:.2f}, {high:.2f}]" if finite(low) and finite(high) else "")]
    proto = lineage.protocol_of(ev)
    if proto is not None:
        sizes = list(proto.datasets.values()) if isinstance(proto.datasets, dict) else []
        if sizes and all(isinstance(n, int) for n in sizes):
            parts.append(f"{sum(sizes)} prompts")
        parts.append(protocol.sampling_text(proto, draws=False))
        if isinstance(proto.max_new_tokens, int):
            parts.append(f"{proto.max_new_tokens} tok")
    return at + " · ".join(parts)


def filter_runs(index: RunIndex, kinds: Sequence[str] = (), targets: Sequence[str] = (),
                tags: Sequence[str] = (), search: str = "") -> list[RunInfo]:
    """Runs matching every given filter (empty filter: no restriction); search is over name and id."""
    needle = search.strip().lower()
    wanted_tags = [t.split("=", 1) for t in tags]
    out = []
    for run in index.runs.values():
        if kinds and run.kind not in kinds:
            continue
        if targets and run.target not in targets:
            continue
        if any(run.tags.get(k) != v for k, v in wanted_tags):
            continue
        if needle and needle not in run.name.lower() and not run.run_id.startswith(needle):
            continue
        out.append(run)
    return out


# st.dataframe wraps a cell's text only in rows taller than 4rem (64 px; Streamlit 1.67's grid): 68 px holds
# three lines, so a long run name, reason or verdict reads whole in a narrow column.
WRAP_ROW_HEIGHT = 68
RUNS_PAGE_ROWS = 200  # the Runs page shows this many rows at a time (what its browser is sent and lays out)
NOT_SET = "— (not set: the default)"  # a param logged as Python's None
# The run's name and its tau come right after the two checks, so that at 1280 px the number shows beside
# what says whether it can be compared; the rest scrolls.
RUNS_TABLE_COLUMNS = ["env check", "protocol check", "name", "tau", "kind", "drafter", "status", "target", "steps",
                      "tau latest", "tau best", "environment",
                      "linear-attn", "device", "dtype", "started", "detail", "critical", "run_id"]


PICKER_RUNS = 1000  # the most runs a page's run picker offers (and sends to the browser) at once


def picker_options(index: RunIndex, kinds: Sequence[str], keep: Sequence[str] = (),
                   limit: int = PICKER_RUNS) -> tuple[list[str], int]:
    """The run ids a picker offers: `keep` (what is chosen or linked), then the runs of `kinds`, training runs
    first (an eval is reached through its training run), newest first, up to `limit` in all; and how many
    were left out. Every option is sent to the browser on every visit and labelled on the server: a store of
    10,000 runs made a picker the page's largest cost. Left out is never lost: Runs' search finds any run."""
    ranked = [r.run_id for kind in ("train", *(k for k in kinds if k != "train")) if kind in kinds
              for r in index.of_kind(kind)]
    kept = [r for r in keep if r in index.runs]
    options = list(dict.fromkeys([*kept, *ranked]))
    return options[:max(limit, len(kept))], max(0, len(options) - max(limit, len(kept)))


def team_first(runs: Sequence[RunInfo]) -> list[RunInfo]:
    """The team's own runs (training, evals, measured references) first, published references last.

    Stable: each group keeps its order (the index's, newest first)."""
    return sorted(runs, key=lambda r: r.published)


def env_reason(index: RunIndex, run: RunInfo, found: Sequence[lineage.Lineage]) -> str:
    """The env cell: what differs, in a few words, without repeating the row's own run name.

    An eval's row names the fields that differ from its training run; a training run's row says
    at which of its evaluated steps."""
    if not found:
        if not run.has_fingerprint:
            return "⚪ no fingerprint"
        answered = lineage.resolutions(index, run)
        if answered:
            if run.kind != "train":
                return f"🟢 re-evaluated as {index.label(answered[0][1].run_id)}"
            return f"🟢 {len(answered)} re-evaluated to match"
        # Said, not left blank: an empty cell read as "not checked" (issue 52)
        if run.kind == "train":
            return "✓ evals as trained" if index.evals_of(run.run_id) else ""
        train = index.train_of(run)
        return "✓ as trained" if train is not None and train.has_fingerprint else ""
    parts = []
    for pair in found[:2]:
        reason = summarize_rows(pair.critical, "", "training", limit=2, probe=pair.probe)
        step = pair.eval.checkpoint_step
        parts.append(reason if run.kind != "train" else f"@ {step if step is not None else '?'}: {reason}")
    more = f" | {len(found) - 2} more" if len(found) > 2 else ""
    return "🔴 " + " | ".join(parts) + more


def protocol_reason(index: RunIndex, run: RunInfo) -> tuple[str, int]:
    """The protocol cell and its count of critical mismatches; never empty where there is a protocol
    to speak of. A protocol is compared only with the evals it is drawn and quoted against: those on
    its line (`lineage.drawn_with`: a greedy eval is never compared with a sampled one, which is drawn
    apart). A training run's row names the steps whose protocol differs critically from the latest
    eval on their line (🟢 when none does), and how many lines its protocols make; an eval's row, how
    its tokens were drawn (T=0: greedy; 🎲 sampled), 🔵 online where z-lab's cached loop scored it, and
    how it differs from the latest other eval on its line (🟢 when it does not). ⚪: an eval from
    before protocols were recorded."""
    if run.kind == "train":
        evals = index.evals_of(run.run_id)
        if len(evals) < 2:
            # an eval of its checkpoint promoted to a reference is still a measurement of it (issue 65 M4)
            refs = index.evals_of(run.run_id, kinds=("reference",))
            also = (f" · {len(refs)} reference{'s' if len(refs) > 1 else ''} of its checkpoints (@ "
                    f"{', '.join(str(_step(r)) for r in refs[:3])})") if refs else ""
            return ("1 eval" if evals else "no evals yet") + also, 0
        lines = lineage.lines_of(index, run.run_id)
        found = [(ev, line[-1], lineage.of_severity(lineage.protocol_diff(ev, line[-1]), "critical"))
                 for line in lines.values() for ev in line[:-1]]
        found = [(ev, latest, crit) for ev, latest, crit in found if crit]
        if not found:
            return (f"🟢 {len(evals)} evals, one protocol" if len(lines) == 1 else
                    f"🟢 {len(evals)} evals on {len(lines)} lines by protocol (drawn apart)"), 0
        parts = [f"@ {_step(ev)}: " + ", ".join(lineage.field_name(r.field) for r in crit) + f" ≠ @ {_step(latest)}"
                 for ev, latest, crit in found[:2]]
        more = f" | {len(found) - 2} more" if len(found) > 2 else ""
        return "🔴 " + " | ".join(parts) + more, len(found)
    proto = lineage.protocol_of(run)
    if proto is None:
        return "", 0
    if proto == protocol.Protocol():
        return "⚪ no protocol (evaluated before protocols were recorded)", 0
    notes = [protocol.sampling_text(proto) if protocol.is_greedy(proto) or proto.temperature == protocol.UNKNOWN
             else "🎲 " + protocol.sampling_text(proto)]
    if proto.scoring == "online":
        notes.append("🔵 online")
    others = lineage.drawn_with(index, run)
    crit = lineage.of_severity(lineage.protocol_diff(run, others[-1]), "critical") if others else []
    if crit:
        notes.insert(0, "🔴 " + summarize_rows(crit, "", f"@ {_step(others[-1])}", limit=2))
    elif others:
        notes.insert(0, f"🟢 as @ {_step(others[-1])}")
    elif index.train_of(run) is not None and len(index.evals_of(run.train_run_id)) > 1:
        notes.insert(0, "a line of its own")
    return " · ".join(notes), int(bool(crit))


def _step(run: RunInfo) -> int | str:
    return run.checkpoint_step if run.checkpoint_step is not None else "?"


def runs_table(index: RunIndex, runs: Sequence[RunInfo]) -> pd.DataFrame:
    """One row per run, the team's first; `critical` counts the run's critical lineage mismatches
    and protocol mismatches (`protocol_reason`), `env check` and `protocol check` name their fields.
    Missing text reads MISSING; missing numbers stay NaN (sortable), shown as MISSING by `runs_display`."""
    # The table of every run is derived once per index (one store state) and shared by every filter, page and
    # visitor: a page's filters pick its rows (building the frame of 10,000 rows again cost 0.2 s a visit).
    every = index.memo(("runs_table",), lambda: _every_runs_table(index))
    if len(runs) < len(index):
        every = every[every["run_id"].isin([run.run_id for run in runs])].reset_index(drop=True)
    return every.copy(deep=False)  # the caller's own frame: what it changes stays out of the shared one


def _every_runs_table(index: RunIndex) -> pd.DataFrame:
    with no_cycle_collection():
        lineage.read_for_listing(index)
        rows = [_runs_row(index, run) for run in team_first(list(index.runs.values()))]
    frame = pd.DataFrame(rows, columns=RUNS_TABLE_COLUMNS)
    frame["steps"] = frame["steps"].astype("Int64")
    frame["critical"] = frame["critical"].astype("int64")
    frame["tau latest"] = frame["tau latest"].astype("float64")
    frame["tau best"] = frame["tau best"].astype("float64")
    return frame


def _runs_row(index: RunIndex, run: RunInfo) -> dict:
    """One row of `runs_table` (see there)."""
    found = lineage.mismatches(index, run)
    proto_text, proto_critical = protocol_reason(index, run)
    latest, best = tau_of(index, run)
    gpu = run.gpu if run.gpu is None or len(run.gpu) <= _GPU_CHARS else run.gpu[:_GPU_CHARS - 1] + "…"
    device = f"{run.device} ({gpu})" if gpu and run.device == "cuda" else run.device
    linear = f"{LINEAR_ATTN_ICONS.get(run.linear_attn, '⚪')} {run.linear_attn}"
    return {
        "env check": env_reason(index, run, found),
        "protocol check": proto_text,
        "name": run.name,
        "kind": run.kind_label + recipe.step_unit_note(run),
        "drafter": run.drafter_family or "",
        # Title case, as MLflow UI shows it: `Finished` fits a narrow column where `FINISHED` broke mid-word
        "status": ("📉 " if run.alert else "") + ("⚠️ " if run.known_bad else "")
        + ("⁉️ " if run.evidence_conflicts else "")
        + (run.status.title() if run.status else MISSING),
        "target": run.target_name,
        "steps": run.steps,
        "tau": tau_text(index, run),
        "tau latest": latest,
        "tau best": best,
        # the three below in one cell, as the Run detail badges say it (the table fits 1600 px)
        "environment": f"{linear} · {device} · {run.dtype}",
        "linear-attn": linear,
        "device": device,
        "dtype": run.dtype,
        "started": run.started,
        "detail": f"run?run={run.run_id}",
        "critical": len(found) + proto_critical,
        "run_id": run.run_id,
    }


def runs_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs table as shown: numbers formatted as text and missing cells as MISSING (Streamlit's
    number columns print a missing value as "None" whatever the format)."""
    def text(value, fmt: str) -> str:
        return MISSING if value is None or pd.isna(value) else fmt.format(value)

    shown = frame.copy()
    for column, fmt in (("tau latest", "{:.3f}"), ("tau best", "{:.3f}"), ("steps", "{:d}")):
        shown[column] = [text(v, fmt) for v in frame[column]]
    shown["started"] = [MISSING if pd.isna(t) else t.strftime("%Y-%m-%d %H:%M") for t in frame["started"]]
    return shown


# --------------------------------------------------------------------------- run detail


def cells_text(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame whose rows fill different columns, as text to show: a missing cell blank (not Streamlit's `None`), a
    whole number as one (a step `200`, not `200.0`), any other number to 4 decimals (the CSV keeps every digit)."""
    def text(value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
            return ""
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else f"{value:.4f}"
        return str(value)

    return frame.map(text)


def mlflow_ui_url(run: RunInfo, base: str) -> str:
    """`<ui>/#/experiments/<exp_id>/runs/<run_id>`."""
    return f"{base.rstrip('/')}/#/experiments/{run.experiment_id}/runs/{run.run_id}"


def params_frame(run: RunInfo) -> pd.DataFrame:
    """The run's params; a Python None logged as text reads as what it meant."""
    shown = {k: NOT_SET if v == "None" else v for k, v in redact.mask_params(run.params).items()}
    return pd.DataFrame(sorted(shown.items()), columns=["param", "value"])


def metrics_frame(run: RunInfo) -> pd.DataFrame:
    """Latest metric values with their unit and definition."""
    rows = []
    for name in metric_docs.sort_metrics(run.metrics):
        doc = metric_docs.describe(name)
        rows.append({"metric": name, "value": run.metrics[name], "unit": doc.unit,
                     "step": run.metric_steps.get(name), "definition": doc.plain_definition})
    frame = pd.DataFrame(rows, columns=["metric", "value", "unit", "step", "definition"])
    frame["step"] = frame["step"].astype("Int64")
    return frame


def fingerprint_frame(fp: dict | None) -> pd.DataFrame:
    """The fingerprint as (section, field, value) rows; probe layers summarised."""
    rows = []
    if fp:
        probe = fp.get("probe")
        flat = fingerprint.flatten({k: v for k, v in fp.items() if k != "probe"})
        for key, value in flat.items():
            section, _, rest = key.partition(".")
            rows.append({"section": section, "field": rest or section,
                         "value": json.dumps(value) if isinstance(value, (list, dict)) else lineage.value_text(value)})
        if isinstance(probe, dict):
            layers = probe.get("layers") or {}
            rows.append({"section": "probe", "field": "digest", "value": lineage.value_text(probe.get("digest"))})
            rows.append({"section": "probe", "field": "layers", "value": ", ".join(sorted(layers)) or "none"})
    return pd.DataFrame(rows, columns=["section", "field", "value"])


def diff_frame(rows: Sequence | None, a_name: str = "this run", b_name: str = "other") -> pd.DataFrame:
    return pd.DataFrame(
        [{"severity": lineage.severity_label(r.severity), "field": r.field,
          "what": lineage.field_name(r.field), a_name: lineage.value_text(r.a_value),
          b_name: lineage.value_text(r.b_value)} for r in rows or ()],
        columns=["severity", "field", "what", a_name, b_name])


def checkpoints_frame(index: RunIndex, run: RunInfo, checkpoints: Sequence) -> pd.DataFrame:
    """Registered checkpoints (step, size, digest) and, per checkpoint, its evals.

    Evals of steps without a registered checkpoint get a row too (digest unknown).
    """
    by_step: dict[int | None, list[lineage.Lineage]] = {}
    for pair in lineage.lineage(index, run):
        by_step.setdefault(pair.eval.checkpoint_step, []).append(pair)
    answered = {pair.eval.run_id: by.name for pair, by in lineage.resolutions(index, run)}
    rows = []
    known = {c.step for c in checkpoints}
    for c in checkpoints:
        rows.append(_checkpoint_row(c.step, c.size_bytes, c.sha256, c.path, by_step.get(c.step, []), answered))
    for step in sorted((s for s in by_step if s not in known), key=lambda s: -1 if s is None else s):
        first = by_step[step][0].eval
        rows.append(_checkpoint_row(step, None, first.checkpoint_sha256, first.checkpoint, by_step[step], answered))
    frame = pd.DataFrame(rows, columns=["step", "size (MB)", "sha256", "path", "evals", "tau", "env check",
                                        "critical"])
    frame["step"] = frame["step"].astype("Int64")
    frame["critical"] = frame["critical"].astype("int64")
    return frame


def _checkpoint_row(step, size, sha, path, pairs: Sequence[lineage.Lineage], answered: dict[str, str]) -> dict:
    """`answered`: eval id -> the name of the re-evaluation that resolved its mismatch."""
    evals_text, taus, checks = [], [], []
    for pair in pairs:
        ev = pair.eval
        tau = ev.metrics.get("tau")
        evals_text.append(f"{ev.name} [{ev.env_badges}]" + (f" tau {tau:.3f}" if finite(tau) else ""))
        if finite(tau):
            taus.append(tau)
        if ev.run_id in answered:
            checks.append(f"🟢 {ev.name}: re-evaluated as {answered[ev.run_id]}")
        elif pair.critical:
            checks.append(f"🔴 {ev.name}: {pair.summary()}")
    return {
        "step": step,
        "size (MB)": None if size is None else round(size / 1e6, 3),
        "sha256": (sha or "")[:16] or "—",
        "path": path or "—",
        "evals": "\n".join(evals_text) or "not evaluated",
        "tau": max(taus) if taus else None,
        "env check": " | ".join(checks),
        "critical": sum(bool(p.critical) and p.eval.run_id not in answered for p in pairs),
    }


def team_training_runs(index: RunIndex) -> list[RunInfo]:
    """Training runs of the team's drafters, newest first: not a reference's own training run (one
    whose checkpoints were evaluated only as references, e.g. the reference drafter's)."""
    return [r for r in index.of_kind("train")
            if index.evals_of(r.run_id) or not index.evals_of(r.run_id, ("reference",))]


def default_selection(index: RunIndex, limit: int = 6) -> list[str]:
    """The team's newest training runs (at most `limit`) on the newest one's target, else the newest evals on
    the newest eval's: runs of two targets are never comparable, so the page starts on one. The closest
    reference comes with them (the Reference picker's default)."""
    runs = team_training_runs(index) or index.of_kind("eval")
    first = runs[0].target if runs else None
    return [r.run_id for r in runs if r.target == first or same_target(r.target, first)][:limit]


def ids_from_link(text: str | None, known) -> tuple[list[str], list[str]]:
    """A deep link's comma-separated run ids: (those in this store, in order; the unknown ones, which
    the page names instead of dropping them silently)."""
    ids = [r.strip() for r in (text or "").split(",") if r.strip()]
    return [r for r in ids if r in known], [r for r in ids if r not in known]
