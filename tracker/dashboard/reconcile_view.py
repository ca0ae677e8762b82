"""Run detail's reconciliation: an engine eval beside the offline evals of the same checkpoint and
prompts, its gap taken apart by `tracker.reconcile` (the same report `draftboard reconcile` prints)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from tracker import config, linear_attn
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.reconcile import reconcile
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


def offline_partners(index: RunIndex, run: RunInfo) -> list[RunInfo]:
    """Offline evals (measured here, not imported) of the same checkpoint on the same prompts."""
    digest = run.tags.get(names.protocol_tag("prompt_digest"))

    def same_checkpoint(other: RunInfo) -> bool:
        if run.checkpoint_sha256 and other.checkpoint_sha256:
            return run.checkpoint_sha256 == other.checkpoint_sha256
        return bool(run.checkpoint) and other.checkpoint is not None and \
            Path(other.checkpoint).resolve() == Path(run.checkpoint).resolve()

    return [r for r in index.of_kind("eval", "reference")
            if r.run_id != run.run_id and r.tags.get(SCORING_TAG) in config.EVAL_SCORINGS
            and digest and r.tags.get(names.protocol_tag("prompt_digest")) == digest and same_checkpoint(r)]


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
