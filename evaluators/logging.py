"""Where an eval's results go: an MLflow run (`log_eval`) and the `--out` results file.

Metric names are built by `tracker.store.names`, which also parses them for the dashboard.
The `--out` file is checked before the eval runs (`check_out_path`) and written whole or not at
all (`write_results`), so a bad `--out` never leaves a logged run behind for a requeued job to
log twice.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from evaluators.settings import EvalSettings
from tracker.measurement import known_bad
from tracker.measurement.uncertainty import ci_metrics, prompt_score
from tracker.measurement.protocol import Protocol
from evaluators.weights import one_line
from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.checkpoints import hub_origin


def metric_values(results: dict) -> dict[str, float]:
    """The MLflow metrics of an eval, under the fixed names (DESIGN.md), with their intervals."""
    # tau_all_anchors is an offline statistic: an engine eval has none (evaluators/engines/run.py).
    out = {k: float(results[k]) for k in names.EVAL_SCALARS if results.get(k) is not None}
    if results.get("engine_mean_acceptance_length") is not None:
        out[names.ENGINE_MEAN_AL] = float(results["engine_mean_acceptance_length"])
    if results.get(names.DECODING_SPEEDUP) is not None:
        out[names.DECODING_SPEEDUP] = float(results[names.DECODING_SPEEDUP])
    if "ci" in results:  # results written before intervals existed have none
        out.update(ci_metrics(results["ci"]))
    for k, rate in enumerate(results["accept_rate_by_position"], 1):
        out[names.accept_rate_metric(k)] = float(rate)
    for budget, d in results["ddtree"].items():
        out[names.ddtree_tau_metric(int(budget))] = float(d["tau"])
        out[names.dds_metric(int(budget))] = float(d["dds"])
    out.update(load_metric_values(results))
    out.update(context_metric_values(results))
    return out


def context_metric_values(results: dict) -> dict[str, float]:
    """Each non-empty context bucket's tau and its interval: `ctx{from}_tau` (offline walk), `ctx{from}_engine_tau`
    (an engine's steps), so a bucket is a curve over checkpoints like any eval metric."""
    out = {}
    for key in names.CONTEXT_CURVES:
        for row in results.get(key) or ():
            if row.get("tau") is None:
                continue
            name = names.context_metric(int(row["from"]), key)
            out[name] = float(row["tau"])
            if row.get("ci"):
                out.update(zip(names.ci_metrics(name), map(float, row["ci"])))
    return out


def load_metric_values(results: dict) -> dict[str, float]:
    """A load sweep's MLflow metrics: `load_c{C}_{field}` per level and the speedup's interval over rounds
    (DESIGN.md, "Load sweeps")."""
    out = {}
    for level in results.get("load") or ():
        c = level["concurrency"]
        out.update({names.load_metric(c, field): float(level[field]) for field in names.LOAD_FIELDS
                    if level.get(field) is not None})
        if level.get("speedup_ci"):
            out.update(zip((names.load_metric(c, f) for f in names.LOAD_CI_FIELDS), map(float, level["speedup_ci"])))
    return out


def log_eval(tracker, results: dict, s: EvalSettings, *, train_run_id: str | None = None,
             checkpoint_step: int | None = None, reference: str | None = None, name: str | None = None,
             tags: dict[str, str] | None = None) -> str:
    """Log an eval (or, with `reference`, a reference) run: metrics, results JSON, per-prompt table.

    The protocol section becomes `protocol.*` tags, so the store can diff protocols without
    reading artifacts."""
    tags = {**Protocol.from_results(results).to_tags(), **(tags or {})}
    family = (results.get("drafter") or {}).get("family")
    if family:
        tags[names.DRAFTER_FAMILY] = family
    rows = [known_bad.ROW_BY_ID[r["id"]] for r in (results.get("engine") or {}).get("known_bad") or ()
            if r.get("id") in known_bad.ROW_BY_ID]
    if rows:
        tags[names.KNOWN_BAD] = known_bad.tag_text(rows)[:names.MAX_TAG_CHARS]
    origin = hub_origin(s.drafter)
    if origin is not None:
        tags.update({names.DRAFTER_REPO: origin.repo, names.DRAFTER_REVISION: origin.revision})
    drafter = Path(s.drafter)
    name = name or reference or (f"eval {drafter.parent.name}/{drafter.name}" if checkpoint_step is None
                                 else f"eval {drafter.parent.name} @ step {checkpoint_step}")
    params = {k: v for k, v in results["settings"].items() if v is not None and k != "cache_dir"}
    # The run is created once the eval is done; back-date its start by the eval's duration so the
    # run's start and end times in MLflow span the eval itself.
    started_ms = int((time.time() - float(results.get("timing", {}).get("total_s", 0.0))) * 1000)
    with tracker.eval_run(name, target=s.target, train_run_id=train_run_id, checkpoint=s.drafter,
                          checkpoint_step=checkpoint_step, params=params, fingerprint=results["fingerprint"],
                          kind="reference" if reference else "eval", reference_name=reference, tags=tags,
                          start_time=started_ms) as run:
        run.log_metrics(metric_values(results), step=checkpoint_step or 0)
        run.log_json(names.EVAL_RESULTS_ARTIFACT, results)
        run.log_table("per_prompt.json", [_per_prompt(p) for p in results["prompts"]])
        return run.run_id


def _per_prompt(record: dict) -> dict:
    """One row of the run's per-prompt table; a sampled prompt's blocks and tau are its means over
    its draws."""
    score = prompt_score(record)
    return {"id": record["id"], "prompt_tokens": len(record["input_ids"]),
            "completion_tokens": len(record["completion_ids"]), "draws": len(record.get("samples") or [None]),
            "blocks": score.blocks, "tau": score.mean if score.blocks else None}


def check_out_path(out: str | Path) -> Path:
    """Refuse an `--out` that cannot be written, before any work: a missing or unwritable folder, a directory."""
    out = Path(out)
    folder = out.parent
    if not folder.is_dir():
        raise DraftboardError(f"--out {out}: folder {folder} does not exist; create it first")
    if out.is_dir():
        raise DraftboardError(f"--out {out} is a directory; give a file name")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise DraftboardError(f"--out {out}: no permission to write there")
    return out


def write_results(out: str | Path, results: dict) -> None:
    """Write the results JSON whole: a new file next to `out`, renamed over it once complete."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fh = open(tmp, "x")  # "x": never truncate a file this process did not create
    except OSError as e:
        raise DraftboardError(f"cannot write --out {out}: {one_line(e)}") from None
    try:
        with fh:
            fh.write(json.dumps(results, indent=1) + "\n")
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise DraftboardError(f"cannot write --out {out}: {one_line(e)}") from None
