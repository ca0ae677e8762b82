"""One eval as one process against the same eval as N shards (`draftboard eval --shards N`), side by side in one run.

On the demo's serving pair (a Qwen3 target and its trained block-8 drafter), the same prompts are evaluated cold
(nothing cached: the target's continuations and features computed) and warm (the target's work read back), as one
process and as N shard processes, the two interleaved over `--repeats` rounds. Every results key but the per-process
ones (timing, settings, fingerprint, shards) must be identical. Reported: each arm's median seconds and spread, and the
ratio one process / N shards (above 1: the shards are faster). On a box of C cores each of N CPU shards gets C / N
torch threads, so the gain here is the part of an eval that does not parallelise inside torch (Python per prompt,
interpreter and import start-up, which shards pay N times); on a GPU node each shard has its own GPU
(`benchmarks/gpu/shards.py`).

Usage: python benchmarks/shards.py [--prompts 32] [--shards 2] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PER_PROCESS = {"timing", "settings", "fingerprint", "shards"}


def _eval(pair: Path, prompts: Path, cache: Path, out: Path, device: str, max_new: int, shards: int) -> float:
    argv = [sys.executable, "-m", "tracker.cli", "eval", "--target", str(pair / "target"), "--drafter",
            str(pair / "drafter"), "--prompts", str(prompts), "--max-new-tokens", str(max_new), "--device", device,
            "--no-log", "--cache-dir", str(cache), "--out", str(out)]
    if shards > 1:
        argv += ["--shards", str(shards)]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _spread(times: list[float]) -> dict:
    return {"median_s": round(statistics.median(times), 2), "min_s": round(min(times), 2),
            "max_s": round(max(times), 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--root", default=None, help="keep the built pair here (default: a temporary folder)")
    args = parser.parse_args(argv)

    from demo.serving_pair import MAX_NEW_TOKENS, build_serving_pair
    from demo.target import make_prompts

    with tempfile.TemporaryDirectory(prefix="draftboard-shards-bench-") as tmp:
        root = Path(args.root or tmp)
        pair = root / "pair"
        if not (pair / "drafter").exists():
            build_serving_pair(pair)
        prompts = root / "prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"q{i}", "input_ids": p}) + "\n" for i, p in
                                   enumerate(make_prompts(args.prompts, seed=5, length=24, split="eval"))))
        arms = {"one": 1, "shards": args.shards}
        times = {f"{arm}_{kind}": [] for arm in arms for kind in ("cold", "warm")}
        results = {}
        for r in range(args.repeats):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))  # A B, then B A: drift hits both arms
            for arm in order:
                cache = root / f"cache-{arm}-{r}"
                for kind in ("cold", "warm"):
                    out = root / f"{arm}-{kind}-{r}.json"
                    times[f"{arm}_{kind}"].append(_eval(pair, prompts, cache, out, args.device, MAX_NEW_TOKENS,
                                                        arms[arm]))
                    results[arm] = json.loads(out.read_text())
        one, sharded = results["one"], results["shards"]
        identical = all(one[k] == sharded[k] for k in set(one) - PER_PROCESS) and set(one) - PER_PROCESS == \
            set(sharded) - PER_PROCESS
        ratios = {kind: round(statistics.median(times[f"one_{kind}"]) / statistics.median(times[f"shards_{kind}"]), 3)
                  for kind in ("cold", "warm")}
        print(json.dumps({"spread": {k: _spread(v) for k, v in times.items()}, "prompts": args.prompts,
                          "shards": args.shards, "device": args.device, "cores": os.cpu_count(),
                          "identical": identical, "tau": one["tau"]}))
        print(json.dumps({"benchmark": "shards", "ratios": {f"one_over_shards_{k}": v for k, v in ratios.items()},
                          "targets": {"identical": True}, "ok": identical}))


if __name__ == "__main__":
    main()
