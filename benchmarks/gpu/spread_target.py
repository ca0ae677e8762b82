"""A target spread over several GPUs by accelerate's plan (`draftboard eval --device cuda --gpus N`), for a GPU node.

Builds the demo's serving pair (a Qwen3 target and its trained block-8 drafter) and evaluates the same prompts with
the target on one GPU and spread over every GPU this process sees (CUDA_VISIBLE_DEVICES, else torch's count), whole
CLI processes; prints each one's seconds, the plan (`evaluators.sizing.target_plan` over the GPUs' free memory:
which module went where) and whether every results key but timing, settings and fingerprint is identical. Then
the planner alone for a target larger than one GPU: Qwen3-32B's config in bf16 against each GPU's memory, the
number of GPUs it needs (no weights are read). On one GPU the spread arm is skipped and said so.

Usage: python benchmarks/gpu/spread_target.py [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PER_PROCESS = {"timing", "settings", "fingerprint"}
# Qwen3-32B's published config (the parts that size it), for the planner alone
QWEN3_32B = dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)


def _eval(pair: Path, out: Path, gpus: int) -> float:
    from demo.serving_pair import MAX_NEW_TOKENS

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tracker.cli", "eval", "--target", str(pair / "target"), "--drafter",
                    str(pair / "drafter"), "--prompts", str(pair / "prompts.jsonl"), "--max-new-tokens",
                    str(MAX_NEW_TOKENS), "--device", "cuda", "--gpus", str(gpus), "--no-log", "--out", str(out),
                    "--cache-dir", str(out.parent / f"cache-{gpus}")], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoConfig, Qwen3Config

    from demo.serving_pair import build_serving_pair
    from evaluators import sizing

    gpus = torch.cuda.device_count()
    free = [int(torch.cuda.mem_get_info(i)[0]) for i in range(gpus)]
    report = {"gpus": gpus, "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
              "free_gib": [round(f / 2**30, 1) for f in free]}
    with tempfile.TemporaryDirectory(prefix="draftboard-spread-") as tmp:
        pair = build_serving_pair(Path(tmp) / "pair", n_prompts=args.prompts).root
        one = Path(tmp) / "one.json"
        report["one_gpu_s"] = round(_eval(pair, one, 1), 2)
        if gpus > 1:
            spread = Path(tmp) / "spread.json"
            report["spread_s"] = round(_eval(pair, spread, gpus), 2)
            a, b = json.loads(one.read_text()), json.loads(spread.read_text())
            report["identical"] = all(a[k] == b[k] for k in set(a) - PER_PROCESS)
            plan = sizing.target_plan(AutoConfig.from_pretrained(pair / "target"), "fp32", free)
            report["plan"] = {k: v for k, v in plan.device_map.items()}
        else:
            report["spread"] = "skipped: one GPU"
    big = Qwen3Config(**QWEN3_32B)
    needed, plan = sizing.gpus_needed(big, "bf16", max(free) if free else 80 * 2**30)
    report["qwen3_32b_bf16"] = {"weights_gib": round(plan.weights / 2**30, 1), "gpus_needed": needed}
    print(json.dumps(report))
    ok = report.get("identical", True) and needed is not None
    print(json.dumps({"benchmark": "spread_target", "ratios": {"spread_over_one": round(
        report["spread_s"] / report["one_gpu_s"], 3)} if "spread_s" in report else {},
        "targets": {"identical": True}, "ok": bool(ok)}))


if __name__ == "__main__":
    main()
