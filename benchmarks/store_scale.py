"""A team's store after months of auto-evals: what a dashboard page costs as the store grows.

Builds two stores in one run (default 1,000 and 10,000 runs; `--sizes`) the way a team fills one:
training runs (10% of the runs), each with evals of its checkpoints every 100 steps, of which a
third ran on a CPU box (the torch fallback: a critical environment mismatch) and half of those were
re-evaluated in the training environment, a few engine evals and sampled evals, with fingerprints
that differ where environments differ. Every run is logged through `Tracker`, as `draftboard eval`
logs it (about 20 runs/s here: the 10,000-run store takes ~8 minutes to build).

Measured per size, in this process, as the dashboard's first visitor and the next one:
- index: `load_run_index` (every run, its tags, metrics and fingerprint.json), first read and the next
  (fingerprints kept, as the dashboard keeps them);
- runs table, first: `tables.runs_table` over every run plus the landing page's open-mismatch count
  on a fresh index (every eval diffed against its training run once);
- runs table, next read: the same on the next read of the store, whose diffs of logged-once
  fingerprints outlive the index (`RunIndex.lasting`);
- diffs: `fingerprint.diff` calls of the first (linear in the evals: at most one per eval).

Ratios: each cost's growth exponent between the two sizes, log(t2 / t1) / log(n2 / n1) (1.0:
linear); target <= 1.1 for every cost, and diffs per eval <= 1. Not measured here (left for the
browser benchmark this issue asks for): Chromium page times and MLflow UI's runs list on the same
store, and the PostgreSQL-backed server deployment.

    python benchmarks/store_scale.py [--sizes 1000 10000]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from tqdm import tqdm

from tracker import Tracker, fingerprint
from tracker.dashboard import lineage, tables
from tracker.dashboard.index import load_run_index, read_json_artifact

TARGET = "/models/Qwen3.5-4B"
TARGET_EXPONENT = 1.1
EVALS_PER_TRAIN = 9


def _fingerprint(fast: bool, run: int) -> dict:
    """A GPU box with the kernels, or a CPU box on the torch fallback; git commits differ per run."""
    return {
        "software": {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.24.0",
                     "flash-linear-attention": "0.4.1" if fast else None},
        "hardware": {"device": "cuda" if fast else "cpu", "gpu_name": "H100" if fast else None,
                     "gpu_count": 1 if fast else 0, "cpu": "Xeon"},
        "numerics": {"dtype": "bf16" if fast else "fp32", "linear_attention_path": "fast" if fast else "fallback",
                     "attn_implementation": "sdpa", "tf32_matmul": False},
        "code": {"git_commit": f"{run:040x}", "dirty": False},
    }


def build(uri: str, n_runs: int) -> None:
    tracker = Tracker(uri)
    n_train = max(1, n_runs // (EVALS_PER_TRAIN + 1))
    with tqdm(total=n_train * (EVALS_PER_TRAIN + 1), desc=f"store of {n_runs} runs", unit="run") as bar:
        for t in range(n_train):
            with tracker.training_run(f"drafter-v{t}", {"lr": 6e-4, "block_size": 16}, TARGET,
                                      fingerprint=_fingerprint(True, t)) as train:
                train.log_step(1000, loss=1.0 / (1 + t))
            bar.update()
            for e in range(EVALS_PER_TRAIN):
                step = 100 * (e // 2 + 1)
                on_cpu = e % 3 == 0
                scoring = "engine" if e == 8 else "offline"
                tags = {"protocol.scoring": scoring, "protocol.temperature": "0.7" if e == 7 else "0",
                        "protocol.prompt_digest": "d0", "protocol.max_new_tokens": "256"}
                params = {"drafter": f"/ck/{t}/{step}", "prompts": "gsm8k.jsonl", "max_new_tokens": "256"}
                with tracker.eval_run(f"drafter-v{t} @ {step}", target=TARGET, train_run_id=train.run_id,
                                      checkpoint=f"/ck/{t}/{step}", checkpoint_step=step, params=params, tags=tags,
                                      fingerprint=_fingerprint(not on_cpu, t)) as ev:
                    ev.log_metrics({"tau": 3.0 + e / 10, "streak": 2.0 + e / 10}, step=0)
                bar.update()


def measure(uri: str) -> dict:
    tracker = Tracker(uri)
    cached: dict = {}

    def fingerprints(run_id: str, artifact_uri: str):  # the dashboard's loader keeps what it read
        if run_id not in cached:
            cached[run_id] = read_json_artifact(tracker.client, run_id, artifact_uri, "fingerprint.json")
        return cached[run_id]

    calls = []
    real = fingerprint.diff
    fingerprint.diff = lambda a, b: calls.append(1) or real(a, b)
    try:
        out, lasting = {}, {}
        t = time.perf_counter()
        index = load_run_index(tracker, fingerprints, lasting)
        out["index_first_s"] = time.perf_counter() - t
        t = time.perf_counter()
        tables.runs_table(index, list(index.runs.values()))
        open_evals = sum(1 for ev in index.of_kind("eval") if lineage.mismatches(index, ev))
        out["runs_first_s"] = time.perf_counter() - t
        out["diffs"], out["evals"], out["open_mismatches"] = len(calls), len(index.of_kind("eval")), open_evals
        t = time.perf_counter()
        index = load_run_index(tracker, fingerprints, lasting)
        out["index_next_s"] = time.perf_counter() - t
        t = time.perf_counter()
        tables.runs_table(index, list(index.runs.values()))
        out["runs_next_s"] = time.perf_counter() - t
        out["runs"] = len(index)
    finally:
        fingerprint.diff = real
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[1000, 10_000])
    args = parser.parse_args()
    small, large = sorted(args.sizes)
    results = {}
    with tempfile.TemporaryDirectory(prefix="draftboard-scale-") as tmp:
        for n in (small, large):
            uri = f"sqlite:///{Path(tmp) / f'store-{n}.db'}"
            build(uri, n)
            results[n] = measure(uri)
            print(f"{results[n]['runs']} runs: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                             for k, v in results[n].items()), flush=True)
    a, b = results[small], results[large]
    growth = math.log(b["runs"] / a["runs"])
    exponents = {f"{k.removesuffix('_s')}_exponent": round(math.log(b[k] / a[k]) / growth, 2)
                 for k in ("index_first_s", "index_next_s", "runs_first_s", "runs_next_s")}
    per_eval = round(b["diffs"] / b["evals"], 2)
    ok = all(v <= TARGET_EXPONENT for v in exponents.values()) and per_eval <= 1
    print(json.dumps({
        "benchmark": "store_scale",
        "ratios": {**exponents, "diffs_per_eval": per_eval},
        "targets": {**{k: TARGET_EXPONENT for k in exponents}, "diffs_per_eval": 1},
        "ok": ok,
    }))


if __name__ == "__main__":
    main()
