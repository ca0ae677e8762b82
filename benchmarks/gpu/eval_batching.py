"""Batching that fits a GPU: the batched cold target pass, sizes from free memory, warm vs cold.

On one GPU, in bf16, with the Qwen3.5-shaped random target of benchmarks/eval_scale.py (default
hidden 2048, 24 layers, vocab 151936; prompts with fixed completions):
(a) the tapped-feature pass per prompt against batched (right-padded, evaluators.target),
    their time and the largest relative gap between their features;
(b) the sizes evaluators.sizing picks from torch.cuda.mem_get_info (target batch, anchor chunk)
    against pinned small ones (--batch-size 1 --anchor-chunk 16): time and peak GPU memory;
(c) a cold eval against a warm one (target work cached: only the embedding and lm_head are
    read), with the timing split.
Ends with one JSON line (DESIGN.md's benchmark format).

Prepared for a lent H200 (docs/GPU.md); `--device cpu --small` runs the same code on a CPU box.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval_scale import build, write_prompts  # noqa: E402
from evaluators import sizing  # noqa: E402
from evaluators.harness import evaluate  # noqa: E402
from evaluators.settings import EvalSettings  # noqa: E402
from evaluators.target import (layer_hidden_states, layer_hidden_states_batch, load_target,  # noqa: E402
                               text_config)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gb(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 1e9, 2) if device.startswith("cuda") else None


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def feature_pass(root: Path, completions: Path, layers: list[int], device: str, batch: int) -> dict:
    target = load_target(root / "target", device, "bf16", "auto")
    seqs = [json.loads(line)["input_ids"] + json.loads(line)["completion_ids"]
            for line in completions.read_text().splitlines()]
    layer_hidden_states(target, seqs[0], layers)  # warm-up: kernels compiled, allocator primed
    sync(device)
    t0 = time.perf_counter()
    ref = [layer_hidden_states(target, s, layers) for s in seqs]
    sync(device)
    per_prompt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = [f for start in range(0, len(seqs), batch)
               for f in layer_hidden_states_batch(target, seqs[start:start + batch], layers)]
    sync(device)
    batched_s = time.perf_counter() - t0
    gap = max(((a[i].float() - b[i].float()).norm() / b[i].float().norm()).item()
              for a, b in zip(batched, ref) for i in layers)
    del target
    return {"prompts": len(seqs), "batch": batch, "per_prompt_s": round(per_prompt_s, 3),
            "batched_s": round(batched_s, 3), "speedup": round(per_prompt_s / batched_s, 2), "max_rel_gap": gap}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a CPU-sized target (hidden 256, 4 layers, vocab 4096)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    hidden, layers_n, vocab = (256, 4, 4096) if args.small else (2048, 24, 151936)
    if args.small:
        args.prompts, args.prompt_len, args.new_tokens = min(args.prompts, 8), min(args.prompt_len, 32), 16
    root = Path(tempfile.mkdtemp(prefix="draftboard-gpu-batching-"))
    layers = build(root, hidden, layers_n, vocab)
    prompts, completions = write_prompts(root, args.prompts, args.prompt_len, args.new_tokens, vocab)
    print(f"target hidden {hidden}, {layers_n} layers, vocab {vocab}; {args.prompts} prompts of "
          f"{args.prompt_len} + {args.new_tokens} tokens; tapped {layers}", flush=True)

    batch = sizing.target_batch(args.device, text_config(root / "target"), args.prompt_len + args.new_tokens, 2)
    feats = feature_pass(root, completions, layers, args.device, batch)
    print(f"(a) features: per prompt {feats['per_prompt_s']} s, batched by {feats['batch']} {feats['batched_s']} s "
          f"({feats['speedup']}x); max relative gap {feats['max_rel_gap']:.1e}", flush=True)

    base = EvalSettings(str(root / "target"), str(root / "drafter"), str(prompts), str(completions),
                        max_new_tokens=args.new_tokens, budgets=(4, 16, 64), device=args.device, dtype="bf16")
    sized = {}
    for label, pinned in (("pinned", dict(batch_size=1, anchor_chunk=16)), ("auto", {})):
        reset_peak(args.device)
        cold = evaluate(replace(base, cache_dir=str(root / f"cache-{label}"), **pinned))
        peak = peak_gb(args.device)
        reset_peak(args.device)
        warm = evaluate(replace(base, cache_dir=str(root / f"cache-{label}"), **pinned))
        sized[label] = {"batch_size": cold["settings"]["batch_size"], "anchor_chunk": cold["settings"]["anchor_chunk"],
                        "cold": {k: round(v, 3) if isinstance(v, float) else v for k, v in cold["timing"].items()},
                        "warm": {k: round(v, 3) if isinstance(v, float) else v for k, v in warm["timing"].items()},
                        "cold_peak_gb": peak, "warm_peak_gb": peak_gb(args.device), "tau": cold["tau"],
                        "warm_equals_cold": warm["tau"] == cold["tau"] and warm["prompts"] == cold["prompts"]}
        print(f"(b/c) {label}: {json.dumps(sized[label])}", flush=True)

    free = sizing.free_bytes(args.device)
    print(f"{args.device}: {'?' if free is None else round(free / 1e9, 1)} GB free at the end; features {feats}")
    ratios = {"auto_vs_pinned_warm_drafter": round(sized["pinned"]["warm"]["drafter_s"]
                                                   / sized["auto"]["warm"]["drafter_s"], 2)}
    targets = {"auto_vs_pinned_warm_drafter": 1.0}
    ok = (all(ratios[k] >= v for k, v in targets.items()) and feats["max_rel_gap"] < 2e-2
          and all(v["warm_equals_cold"] and v["warm"]["loaded"] == "heads" for v in sized.values()))
    print(json.dumps({"benchmark": "gpu_eval_batching", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
