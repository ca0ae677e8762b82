"""Reconciliation on the dashboard: Run detail's engine eval beside the offline evals of the same
checkpoint and prompts, and Compare's Engines view (every engine eval of one checkpoint and prompt
set side by side), their gaps taken apart by `tracker.measurement.reconcile` (the reports `draftboard reconcile`
prints)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pandas as pd

from tracker import config
from tracker.environment import linear_attn
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.errors import DraftboardError
from tracker.measurement.reconcile import ENGINE_PARTS, reconcile, reconcile_engines
from tracker.store import names

SCORING_TAG = names.protocol_tag("scoring")
PART_MEANINGS = {
    "pooling": "definition: every block weighted equally instead of a per-prompt mean",
    "end_of_generation": "definition: the engine counts what its last step accepted past --max-new-tokens",
    "acceptance": "equal completions, other accepted counts: the drafter saw other features (layer mapping, "
                  "kernels, cache state)",
    "numerics": "the completions differ: the target decoded another token somewhere",
}


def is_engine_eval(run: RunInfo) -> bool:
    return run.tags.get(SCORING_TAG) == config.ENGINE_SCORING


def engine_eval_owners(index: RunIndex) -> list[str]:
    """The runs to choose on Compare to see the store's engine evals (each one's training run, else the eval),
    newest first, once each: where the Engines view sends a reader whose chosen runs have none."""
    def compute() -> list[str]:
        owners = [run.train_run_id if run.train_run_id in index.runs else run.run_id
                  for run in index.of_kind("eval") if is_engine_eval(run)]
        return list(dict.fromkeys(owners))
    return index.memo(("engine_eval_owners",), compute)


def _checkpoint_key(run: RunInfo) -> str | None:
    return run.checkpoint_sha256 or (str(Path(run.checkpoint).resolve()) if run.checkpoint else None)


def offline_partners(index: RunIndex, run: RunInfo) -> list[RunInfo]:
    """Offline evals (measured here, not imported) of the same checkpoint on the same prompts: the same
    checkpoint sha256 where both runs know theirs, else the same resolved checkpoint path. Read from
    `_offline_by_checkpoint`, built once per index (not a scan of every eval per engine eval)."""
    digest = run.tags.get(names.protocol_tag("prompt_digest"))
    if not digest:
        return []
    by_sha, by_path, order = _offline_by_checkpoint(index)
    found = list(by_sha.get((digest, run.checkpoint_sha256), [])) if run.checkpoint_sha256 else []
    if run.checkpoint:
        found += [r for r in by_path.get((digest, str(Path(run.checkpoint).resolve())), [])
                  if not (run.checkpoint_sha256 and r.checkpoint_sha256)]
    unique = {r.run_id: r for r in found if r.run_id != run.run_id}
    return sorted(unique.values(), key=lambda r: order[r.run_id])


def _offline_by_checkpoint(index: RunIndex) -> tuple[dict, dict, dict]:
    """The offline evals by (prompt digest, checkpoint sha256) and by (digest, resolved checkpoint path),
    and each one's place in the index's order."""
    def build() -> tuple[dict, dict, dict]:
        by_sha: dict[tuple, list[RunInfo]] = {}
        by_path: dict[tuple, list[RunInfo]] = {}
        order: dict[str, int] = {}
        for place, r in enumerate(index.of_kind("eval", "reference")):
            digest = r.tags.get(names.protocol_tag("prompt_digest"))
            if r.tags.get(SCORING_TAG) not in config.EVAL_SCORINGS or not digest:
                continue
            order[r.run_id] = place
            if r.checkpoint_sha256:
                by_sha.setdefault((digest, r.checkpoint_sha256), []).append(r)
            if r.checkpoint is not None:
                by_path.setdefault((digest, str(Path(r.checkpoint).resolve())), []).append(r)
        return by_sha, by_path, order

    return index.memo(("offline_by_checkpoint",), build)


def report(engine_run: RunInfo, offline_run: RunInfo, load: Callable[[RunInfo], dict | None]) -> dict | None:
    """The reconcile report, or None when either run's results cannot be read."""
    engine, offline = load(engine_run), load(offline_run)
    if engine is None or offline is None:
        return None
    return reconcile(engine, offline)


def parts_frame(r: dict) -> pd.DataFrame:
    rows = [{"part": k.replace("_", " "), "change of the pooled mean": v, "what it is": PART_MEANINGS[k]}
            for k, v in r["parts"].items()]
    rows.append({"part": "unexplained", "change of the pooled mean": r["unexplained"],
                 "what it is": "what is left once every offline walk has become the engine's"})
    return pd.DataFrame(rows)


def prompts_frame(r: dict) -> pd.DataFrame:
    return pd.DataFrame([{
        "prompt": p["id"], "completions equal": p["completions_equal"],
        "first differing token": p["first_token_difference"], "blocks (engine)": p["engine_blocks"],
        "blocks (offline)": p["offline_blocks"], "first differing block": p["first_block_difference"],
        "accepted there (engine)": p["engine_accepted"], "accepted there (offline)": p["offline_accepted"],
        "cause": p["cause"] or "every block agrees"} for p in r["prompts"]])


def gdn_frame(index: RunIndex, engine_run: RunInfo, offline_run: RunInfo) -> pd.DataFrame | None:
    """The hybrid target's Gated DeltaNet code per piece: training (where the eval names its training
    run and that run has a fingerprint), the offline eval, the serving engine; None without GDN layers."""
    train = index.train_of(engine_run)
    engine = (engine_run.fingerprint or {}).get("engine") or {}
    sides = [("training", train.fingerprint if train else None), ("offline eval", offline_run.fingerprint),
             (f"{engine.get('name') or 'engine'} serving", engine_run.fingerprint)]
    sides = [(label, fp) for label, fp in sides if fp]
    rows = linear_attn.side_by_side([fp for _, fp in sides])
    if not rows:
        return None
    return pd.DataFrame([{"piece": row.piece, **{label: "unknown" if value is None else value
                                                  for (label, _), value in zip(sides, row.values)},
                          "severity": row.severity} for row in rows])


def hybrid_words(r: dict) -> str:
    """One cell for Compare: the GDN pieces whose code differs, and the dtypes where they differ."""
    hybrid = r.get("hybrid")
    if not hybrid:
        return "no GDN layers"
    differ = [row["piece"] for row in hybrid["gdn"] if row["severity"] == "critical"]
    words = f"GDN code differs: {', '.join(differ)}" if differ else "same GDN code"
    dtypes = hybrid.get("dtypes") or {}
    if None not in dtypes.values() and len(set(dtypes.values())) > 1:
        words += f"; not the same protocol: engine {dtypes['engine']}, offline {dtypes['offline']}"
    return words


ENGINE_NUMBER = "1 + accepted / verify steps, pooled over the engine's steps (its own counters)"
OFFLINE_NUMBER = "tau: offline walk, mean per prompt, then over prompts"
GAP_COLUMNS = ["A", "B", "A − B", *(p.replace("_", " ") for p in ENGINE_PARTS), "unexplained",
               "settings that differ", "verdict"]


@dataclass(frozen=True)
class EnginesView:
    """One checkpoint on one prompt set, as Compare's Engines view draws it."""

    title: str
    numbers: pd.DataFrame  # measured by, run, number, value, definition
    gaps: pd.DataFrame  # GAP_COLUMNS: each pair of engine evals, through the offline eval where there is one
    offline: str | None  # the offline eval the gaps go through; None: none of these prompts and checkpoint


def engines_views(index: RunIndex, evals: Sequence[RunInfo], load: Callable[[RunInfo], dict | None]
                  ) -> list[EnginesView]:
    """The engine evals among `evals`, grouped by checkpoint and prompt set: each group's offline tau
    and engine numbers (two definitions, each named), and each pair's gap in parts with the settings
    that differ and one verdict (`tracker.measurement.reconcile.reconcile_engines`)."""
    groups: dict[tuple, dict[str, RunInfo]] = {}
    for ev in evals:
        key = (_checkpoint_key(ev), ev.tags.get(names.protocol_tag("prompt_digest")))
        if is_engine_eval(ev) and None not in key:
            groups.setdefault(key, {})[ev.run_id] = ev
    views = []
    for runs in (list(g.values()) for g in groups.values()):
        loaded = [(run, load(run)) for run in runs]
        loaded = [(run, r) for run, r in loaded if r is not None]
        if not loaded:
            continue
        partners = offline_partners(index, runs[0])
        offline_run = partners[0] if partners else None
        offline = load(offline_run) if offline_run is not None else None
        numbers = ([{"measured by": "offline", "run": index.label(offline_run.run_id), "number": "tau",
                     "value": offline.get("tau"), "definition": OFFLINE_NUMBER}] if offline else []) + [
            {"measured by": _engine_name(r), "run": index.label(run.run_id), "number": "engine mean acceptance length",
             "value": r.get("engine_mean_acceptance_length"), "definition": ENGINE_NUMBER} for run, r in loaded]
        rows = []
        for (run_a, a), (run_b, b) in combinations(loaded, 2):
            try:
                rep = reconcile_engines(a, b, offline)
            except DraftboardError as exc:  # other prompts, or results another tool wrote: said, not drawn
                rows.append({"A": index.label(run_a.run_id), "B": index.label(run_b.run_id), "verdict": str(exc)})
                continue
            rows.append({"A": f"{_engine_name(a)} · {index.label(run_a.run_id)}",
                         "B": f"{_engine_name(b)} · {index.label(run_b.run_id)}", "A − B": rep["gap"],
                         **{p.replace("_", " "): rep["parts"].get(p) for p in ENGINE_PARTS},
                         "unexplained": rep["unexplained"],
                         "settings that differ": "; ".join(f"{d['field']}: {d['a_value']} vs {d['b_value']}"
                                                           for d in rep["settings_diff"]) or "none",
                         "verdict": rep["verdict"]})
        views.append(EnginesView(f"{index.eval_label(runs[0])}", pd.DataFrame(numbers),
                                 pd.DataFrame(rows, columns=GAP_COLUMNS),
                                 index.label(offline_run.run_id) if offline else None))
    return views


def _engine_name(results: dict) -> str:
    return str((results.get("engine") or {}).get("name") or "engine")
