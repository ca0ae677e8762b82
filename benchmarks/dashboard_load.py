"""How fast the Compare page loads its data: draftboard's loaders vs a naive get_metric_history loop.

Builds a fresh sqlite store in a temp dir with 20 training runs x 10,000 steps x 4 metrics
(800,000 metric rows), then, in one process:

- naive: `MlflowClient.get_metric_history` for every run and metric (what a dashboard
  written against the MLflow client does);
- compare load: what the Compare page calls, uncached: `load_run_index` (runs, lineage,
  fingerprints), `history_signature` (its cache key), `load_histories` of every point (read-only
  SQL on MLflow's `metrics` table; kept server-side per store version) `decimated` to
  CHART_BUCKETS per curve, and `compare_data`;
- full history: `load_histories` of every point alone (what a zoom re-cuts).

Store build: `--build api` logs every run through `Tracker.training_run` + `log_step`
(MLflow's log_batch inserts ~10k rows/s here, so this takes ~1.5 min on 2 cores). The default
`--build copy` logs the first run that way and creates the other 19 with
`Tracker.training_run` too, then copies the first run's metric rows to them with one SQL
INSERT ... SELECT each (values shifted per run), giving the same tables in seconds. The read
side cannot tell the difference.

    python benchmarks/dashboard_load.py [--build copy|api]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from mlflow import MlflowClient

from tracker import Tracker
from tracker.dashboard.compare import compare_data, train_runs_for_histories
from tracker.dashboard.index import load_run_index
from tracker.store.history import CHART_BUCKETS, decimated, history_signature, load_histories

RUNS, STEPS = 20, 10_000
METRICS = ("loss", "acc", "streak", "dds8")
TARGET_RATIO = 5.0


def _fingerprint() -> dict:
    """A fixed fingerprint (capturing one would import torch; the numbers do not depend on it)."""
    return {
        "software": {"python": "3.11", "torch": "2.6.0", "transformers": "5.2.0"},
        "hardware": {"device": "cuda", "gpu_name": "H100", "gpu_count": 1},
        "numerics": {"dtype": "bf16", "linear_attention_path": "fast", "attn_implementation": "sdpa"},
        "code": {"git_commit": None, "dirty": None},
    }


def _metrics(run: int, step: int) -> dict[str, float]:
    return {"loss": 3.0 / (1 + step / 500) + 0.01 * run, "acc": min(0.95, step / 12_000),
            "streak": 1 + math.log1p(step) / 4, "dds8": 1.5 + step / 8_000}


def _log_run(tracker: Tracker, i: int, fp: dict, steps: int = STEPS) -> str:
    with tracker.training_run(f"bench-{i:02d}", {"lr": 3e-4}, "/models/Qwen3.5-4B", fingerprint=fp) as run:
        for step in range(steps):
            run.log_step(step, **_metrics(i, step))
    return run.run_id


def build_store(home: Path, mode: str, runs: int = RUNS, steps: int = STEPS) -> tuple[str, list[str], float]:
    """`runs` training runs of `steps` steps x METRICS in home/draftboard.db (the module doc says how)."""
    uri = f"sqlite:///{home / 'draftboard.db'}"
    tracker = Tracker(uri)
    fp = _fingerprint()
    start = time.perf_counter()
    first = _log_run(tracker, 0, fp, steps)
    one_run_s = time.perf_counter() - start
    run_ids = [first]
    if mode == "api":
        run_ids += [_log_run(tracker, i, fp, steps) for i in range(1, runs)]
    else:
        for i in range(1, runs):
            with tracker.training_run(f"bench-{i:02d}", {"lr": 3e-4}, "/models/Qwen3.5-4B", fingerprint=fp) as run:
                pass
            run_ids.append(run.run_id)
        with sqlite3.connect(home / "draftboard.db") as db:
            for i, run_id in enumerate(run_ids[1:], 1):
                for table in ("metrics", "latest_metrics"):
                    db.execute(f"INSERT INTO {table} (key, value, timestamp, step, is_nan, run_uuid) "
                               f"SELECT key, value + ?, timestamp, step, is_nan, ? FROM {table} WHERE run_uuid = ?",
                               (0.01 * i, run_id, first))
    print(f"store      : {runs} runs x {steps:,} steps x {len(METRICS)} metrics built in "
          f"{time.perf_counter() - start:.1f} s (--build {mode}; one run via log_step: {one_run_s:.1f} s)")
    return uri, run_ids, one_run_s


def naive_load(uri: str, run_ids: list[str]) -> tuple[float, int]:
    client = MlflowClient(tracking_uri=uri)
    start = time.perf_counter()
    points = sum(len(client.get_metric_history(r, key)) for r in run_ids for key in METRICS)
    return time.perf_counter() - start, points


def compare_load(uri: str, run_ids: list[str]) -> tuple[float, dict[str, float], int]:
    """The Compare page's calls, uncached, timed step by step."""
    parts = {}
    t0 = time.perf_counter()
    index = load_run_index(Tracker(uri))
    parts["run index"] = time.perf_counter() - t0
    t = time.perf_counter()
    chosen = train_runs_for_histories(index, run_ids)
    history_signature(uri, chosen)
    parts["signature"] = time.perf_counter() - t
    t = time.perf_counter()
    hist = decimated(load_histories(uri, chosen), CHART_BUCKETS)
    parts["histories"] = time.perf_counter() - t
    t = time.perf_counter()
    data = compare_data(index, run_ids, None, hist)
    parts["compare_data"] = time.perf_counter() - t
    return time.perf_counter() - t0, parts, len(data.train_curves)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=["copy", "api"], default="copy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftboard-bench-") as tmp:
        uri, run_ids, _ = build_store(Path(tmp), args.build)
        load_s, parts, shown = compare_load(uri, run_ids)
        t = time.perf_counter()
        full = load_histories(uri, run_ids)
        full_s = time.perf_counter() - t
        naive_s, naive_points = naive_load(uri, run_ids)

    assert len(full) == naive_points == RUNS * STEPS * len(METRICS), (len(full), naive_points)
    ratio = naive_s / load_s
    full_ratio = naive_s / full_s
    print(f"naive      : get_metric_history x {RUNS * len(METRICS)} calls: {naive_s:.2f} s ({naive_points:,} points)")
    print(f"compare    : {load_s:.3f} s for {shown:,} plotted points (min and max of {CHART_BUCKETS} step ranges per curve): " +
          ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))
    print(f"full       : load_histories of all {len(full):,} points: {full_s:.3f} s")
    print(f"compare load is {ratio:.1f}x faster than the naive loop; the full history {full_ratio:.1f}x "
          f"(store built by {args.build})")
    # Ratios only: both sides are measured in this run, so a loaded box slows them alike; the absolute
    # seconds above say what a user waits on this machine, and are not a pass/fail line.
    ok = ratio >= TARGET_RATIO and full_ratio >= TARGET_RATIO
    print(json.dumps({
        "benchmark": "dashboard_load",
        "ratios": {"compare_load_vs_naive": round(ratio, 1), "full_history_vs_naive": round(full_ratio, 1)},
        "targets": {"compare_load_vs_naive": TARGET_RATIO, "full_history_vs_naive": TARGET_RATIO},
        "ok": ok,
    }))


if __name__ == "__main__":
    main()
