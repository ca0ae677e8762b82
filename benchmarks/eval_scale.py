"""Eval cost at scale on CPU: time, peak RSS and cache size against the number of prompts.

A randomly initialised Qwen3.5-shaped target (hybrid: three Gated DeltaNet layers to one
full-attention layer; default hidden 1024, 16 layers, vocab 32768) and a one-layer DFlash drafter
tapping five of its layers. Prompts carry fixed completions (random tokens, no stop token), so
every prompt has the same length and the target only generates the block lookahead. For each
prompt count, one cold eval and one warm eval each run in a fresh process, so peak RSS
(ru_maxrss) is that eval's alone. Also measured: the batched cold feature pass against the
per-prompt one (and that their features agree), and the cache size against the prediction
docs/SCALE.md makes (tokens x tapped layers x hidden x bytes per element).

Usage: python benchmarks/eval_scale.py [--counts 8,32,128] [--hidden 1024] [--layers 16] [--vocab 32768]
       (small while developing: --counts 2,4 --hidden 128 --layers 4 --vocab 4096)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluators.cache import FEATURES, EvalCache  # noqa: E402
from evaluators.harness import evaluate  # noqa: E402
from evaluators.settings import EvalSettings  # noqa: E402
from evaluators.target import layer_hidden_states, layer_hidden_states_batch, load_target  # noqa: E402

TAPPED = 5
BLOCK = 4


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def build(root: Path, hidden: int, layers: int, vocab: int) -> list[int]:
    """The target and drafter under root; returns the tapped layers."""
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab

    heads = max(2, hidden // 128)
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 4), head_dim=128,
        linear_num_key_heads=heads // 2, linear_num_value_heads=heads, linear_key_head_dim=128,
        linear_value_head_dim=128, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        max_position_embeddings=4096, eos_token_id=vocab - 1, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(eos_token_id=vocab - 1, pad_token_id=0)
    model.save_pretrained(root / "target")
    tapped = sorted({round(i * (layers - 1) / (TAPPED - 1)) for i in range(TAPPED)})
    dcfg = DrafterConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads,
                         num_key_value_heads=max(1, heads // 4), head_dim=128, intermediate_size=3 * hidden,
                         target_layer_ids=tapped, block_size=BLOCK, mask_token_id=1, num_target_layers=layers,
                         vocab_size=vocab)
    save_zlab(DFlashDrafter(dcfg), dcfg, root / "drafter")
    return tapped


def write_prompts(root: Path, n: int, prompt_len: int, new_tokens: int, vocab: int) -> tuple[Path, Path]:
    gen = torch.Generator().manual_seed(n)
    ids = torch.randint(2, vocab - 1, (n, prompt_len + new_tokens), generator=gen).tolist()  # never the EOS
    prompts, completions = root / f"prompts{n}.jsonl", root / f"completions{n}.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "input_ids": s[:prompt_len]}) + "\n" for i, s in enumerate(ids)))
    completions.write_text("".join(json.dumps({"id": i, "input_ids": s[:prompt_len], "completion_ids": s[prompt_len:]})
                                   + "\n" for i, s in enumerate(ids)))
    return prompts, completions


def child(args) -> None:
    """One eval in this process: its timing, and its RSS before (imports only) and at its peak."""
    base = rss_bytes()
    res = evaluate(EvalSettings(args.root + "/target", args.root + "/drafter", args.prompts, args.completions,
                                max_new_tokens=args.new_tokens, budgets=(4, 16), device="cpu",
                                cache_dir=args.cache))
    print(json.dumps({"timing": res["timing"], "base_rss": base, "peak_rss": peak_rss_bytes(), "tau": res["tau"]}))


def run_child(root: Path, n: int, prompts: Path, completions: Path, cache: Path, new_tokens: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", "--root", str(root), "--prompts", str(prompts),
                          "--completions", str(completions), "--cache", str(cache), "--new-tokens", str(new_tokens)],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def batched_vs_per_prompt(root: Path, prompts: Path, completions: Path, layers: list[int]) -> dict:
    target = load_target(root / "target", "cpu", "fp32", "auto")
    seqs = [json.loads(line)["input_ids"] + json.loads(line)["completion_ids"]
            for line in completions.read_text().splitlines()]
    t0 = time.perf_counter()
    ref = [layer_hidden_states(target, s, layers) for s in seqs]
    per_prompt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = [f for start in range(0, len(seqs), 8)
               for f in layer_hidden_states_batch(target, seqs[start:start + 8], layers)]
    batched_s = time.perf_counter() - t0
    gap = max(((a[i] - b[i]).abs().max() / b[i].abs().max()).item() for a, b in zip(batched, ref) for i in layers)
    return {"prompts": len(seqs), "per_prompt_s": round(per_prompt_s, 2), "batched_s": round(batched_s, 2),
            "speedup": round(per_prompt_s / batched_s, 2), "max_rel_gap": gap, "equal": gap < 1e-5}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="8,32,128")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--root", "--prompts", "--completions", "--cache"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        torch.set_num_threads(2)
        child(args)
        return
    torch.set_num_threads(2)
    counts = [int(c) for c in args.counts.split(",")]
    root = Path(tempfile.mkdtemp(prefix="draftboard-eval-scale-"))
    layers = build(root, args.hidden, args.layers, args.vocab)
    weights = sum(p.stat().st_size for p in (root / "target").glob("*.safetensors"))
    print(f"target: hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, {weights / 1e9:.2f} GB fp32; "
          f"drafter taps {layers}; prompts {args.prompt_len} + {args.new_tokens} tokens", flush=True)

    rows = []
    for n in counts:
        prompts, completions = write_prompts(root, n, args.prompt_len, args.new_tokens, args.vocab)
        cache = root / f"cache{n}"
        cold = run_child(root, n, prompts, completions, cache, args.new_tokens)
        warm = run_child(root, n, prompts, completions, cache, args.new_tokens)
        features = sum(e.size for e in EvalCache(cache).entries() if e.kind == FEATURES)
        # docs/SCALE.md: every context position (prompt + anchors) x tapped layers x hidden x 4 bytes (fp32)
        predicted = n * (args.prompt_len + args.new_tokens) * len(layers) * args.hidden * 4
        rows.append({"prompts": n, "cold_s": round(cold["timing"]["total_s"], 2),
                     "warm_s": round(warm["timing"]["total_s"], 2), "warm_loaded": warm["timing"]["loaded"],
                     "warm_split": {k: round(v, 3) for k, v in warm["timing"].items() if k.endswith("_s")},
                     "cold_peak_rss_gb": round(cold["peak_rss"] / 1e9, 3),
                     "warm_peak_rss_gb": round(warm["peak_rss"] / 1e9, 3),
                     "cold_above_imports_gb": round((cold["peak_rss"] - cold["base_rss"]) / 1e9, 3),
                     "warm_above_imports_gb": round((warm["peak_rss"] - warm["base_rss"]) / 1e9, 3),
                     "cache_features_mb": round(features / 1e6, 2), "predicted_mb": round(predicted / 1e6, 2),
                     "cache_vs_predicted": round(features / predicted, 4)})
        print(json.dumps(rows[-1]), flush=True)

    mid = counts[len(counts) // 2]
    batching = batched_vs_per_prompt(root, *write_prompts(root, mid, args.prompt_len, args.new_tokens, args.vocab),
                                     layers)
    print(f"cold feature pass, {batching['prompts']} prompts: per prompt {batching['per_prompt_s']} s, "
          f"batched by 8 (right-padded) {batching['batched_s']} s ({batching['speedup']}x); "
          f"features equal to {batching['max_rel_gap']:.1e} relative", flush=True)

    first, last = rows[0], rows[-1]
    scale = last["prompts"] / first["prompts"]
    print(f"{scale:g}x the prompts: cold peak RSS {first['cold_peak_rss_gb']} -> {last['cold_peak_rss_gb']} GB, warm "
          f"{first['warm_peak_rss_gb']} -> {last['warm_peak_rss_gb']} GB; cache vs docs/SCALE.md's prediction "
          f"{[r['cache_vs_predicted'] for r in rows]}")
    # Each ratio: how many times better than the bound it guards, measured in this run (higher is better).
    ratios = {
        # peak RSS at the smallest count over the largest: 1.0 = flat however many prompts (streamed features)
        "cold_peak_rss_flatness": round(first["cold_peak_rss_gb"] / last["cold_peak_rss_gb"], 3),
        "warm_peak_rss_flatness": round(first["warm_peak_rss_gb"] / last["warm_peak_rss_gb"], 3),
        # time per prompt at the smallest count over the largest: 1.0 = linear in the prompts
        "warm_time_per_prompt_linearity": round((first["warm_s"] / first["prompts"]) / (last["warm_s"] / last["prompts"]), 3),
        "warm_drafter_per_prompt_linearity": round((first["warm_split"]["drafter_s"] / first["prompts"])
                                                   / (last["warm_split"]["drafter_s"] / last["prompts"]), 3),
        # the cache's size against the prediction, worst count: 1.0 = exactly as predicted
        "cache_prediction_accuracy": round(min(min(c, 1 / c) for c in (r["cache_vs_predicted"] for r in rows)), 3),
        "batched_vs_per_prompt_feature_pass": batching["speedup"],
    }
    # RSS may grow at most 1.3x over the prompt range; the cache within 10% of the prediction.
    targets = {"cold_peak_rss_flatness": round(1 / 1.3, 3), "warm_peak_rss_flatness": round(1 / 1.3, 3),
               "cache_prediction_accuracy": 0.9}
    ok = (all(ratios[k] >= v for k, v in targets.items()) and batching["equal"]
          and all(r["warm_loaded"] == "heads" for r in rows))
    print(f"prompt range {scale:g}x; batched features equal to the per-prompt pass: {batching['equal']}")
    print(json.dumps({"benchmark": "eval_scale", "ratios": ratios, "targets": targets, "ok": ok}))

if __name__ == "__main__":
    main()
