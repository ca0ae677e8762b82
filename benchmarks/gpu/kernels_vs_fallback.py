"""fla + causal-conv1d kernels against the torch fallback, on one GPU, in one run.

A random mid-size Qwen3.5-style target (hidden 2048, 8 layers, 3 linear : 1 full) in bf16:
the same weights and inputs run once on the kernels transformers resolved and once with the
torch reference forced (tracker.environment.linear_attn swaps the module globals, so both paths run in
one process). Reported: relative difference of the tapped features, the fraction of greedy
tokens that differ, the tau difference of one drafter evaluated on each path's features, and
the timing of both paths. Ends with one JSON line (DESIGN.md's benchmark format).

Prepared for a lent H200 (see docs/GPU.md); `--device cpu --small` runs the same code on a
CPU box, where both paths are the torch reference and every difference must be zero.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evaluators import scoring  # noqa: E402
from evaluators.drafter import DFlashDrafter, DrafterConfig  # noqa: E402
from evaluators.prompts import Prompt  # noqa: E402
from evaluators.target import Target, greedy_continuations, layer_hidden_states  # noqa: E402
from tracker import fingerprint, linear_attn  # noqa: E402



def build_target(small: bool, device: str, dtype: torch.dtype):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hidden, layers = (64, 4) if small else (2048, 8)
    cfg = Qwen3_5TextConfig(
        vocab_size=1024 if small else 32768, hidden_size=hidden, intermediate_size=hidden * 3,
        num_hidden_layers=layers, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
        num_attention_heads=4 if small else 16, num_key_value_heads=2 if small else 4, head_dim=16 if small else 128,
        linear_num_key_heads=2 if small else 16, linear_num_value_heads=2 if small else 32,
        linear_key_head_dim=16 if small else 128, linear_value_head_dim=16 if small else 128,
        max_position_embeddings=4096, eos_token_id=None, pad_token_id=0,
    )
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def run_path(mode: str, model, prompts, new_tokens: int, device: str, layers: list[int]) -> dict:
    res = linear_attn.apply(mode, device, linear_attn.module_of(model))
    target = Target(model, Path("."), device, "bf16", res, None)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    conts = greedy_continuations(target, prompts, new_tokens, 0, batch_size=len(prompts))
    sync()
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    feats = [layer_hidden_states(target, p + c, layers) for p, c in zip(prompts, conts)]
    sync()
    return {"path": res.path, "functions": res.functions, "continuations": conts, "features": feats,
            "generate_s": gen_s, "features_s": time.perf_counter() - t0}


def tau_on(features, prompts, conts, drafter, model, block: int, layers: list[int]) -> float:
    """Chain tau of one drafter along each prompt's walk, on the given path's features."""
    target = Target(model, Path("."), str(drafter.device), "bf16", None, None)
    walked = []
    loaded = type("Loaded", (), {"model": drafter, "own_lm_head": None})()
    for i, (p, c) in enumerate(zip(prompts, conts)):
        n = len(c) - (block - 1)  # every anchor has block-1 tokens after it
        w = scoring.Walked(Prompt(str(i), p), c, n, len(c), n)  # walked to n, the `full` rule
        ctx = torch.cat([features[i][layer] for layer in layers], -1)
        scoring.score_anchors(loaded, target, w, ctx, c, ())
        walked.append(w)
    return scoring.summarize(walked, block, (), "full")["tau"]


def fit_drafter(drafter, features, prompts, conts, model, steps: int, layers: list[int]) -> None:
    """A short fit on the fallback path's features, so the tau comparison is not about noise."""
    import torch.nn.functional as F

    embed, head = model.get_input_embeddings().weight.float(), model.get_output_embeddings().weight.float()
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-3)
    block = drafter.block_size
    drafter.train()
    for step in range(steps):
        i = step % len(prompts)
        seq = torch.tensor(prompts[i] + conts[i], device=drafter.device)
        ctx = torch.cat([features[i][layer] for layer in layers], -1)[None].to(drafter.device)
        anchors = torch.arange(len(prompts[i]), len(seq) - block + 1, device=drafter.device)
        labels = seq[anchors[:, None] + torch.arange(1, block, device=drafter.device)]
        hidden = drafter.forward_anchors(ctx, anchors, drafter.block_embeddings(seq[anchors], embed))
        loss = F.cross_entropy(drafter.logits(hidden, head).flatten(0, 1).float(), labels.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--fit-steps", type=int, default=300)
    args = ap.parse_args()
    dtype = torch.bfloat16
    model = build_target(args.small, args.device, dtype)
    vocab = model.config.vocab_size
    layers = [1, 3, 5] if model.config.num_hidden_layers >= 8 else [1, 2]
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, vocab, (args.prompts, 64), generator=gen).tolist()
    linear_attn.apply("auto", args.device, linear_attn.module_of(model))  # capture() only reads
    fp = fingerprint.capture(model, args.device, "bf16", probe_layers=layers)
    print(f"software: {json.dumps({k: fp['software'][k] for k in ('torch', 'transformers', 'flash-linear-attention', 'causal-conv1d', 'triton', 'cuda')})}")
    print(f"gpu: {fp['hardware']['gpu_name']}; auto resolves to {fp['numerics']['linear_attention_path']}")

    fast = run_path("auto", model, prompts, args.tokens, args.device, layers)
    slow = run_path("fallback", model, prompts, args.tokens, args.device, layers)
    linear_attn.apply("auto", args.device, linear_attn.module_of(model))

    # Features on the same token sequence (the fast path's), so only the kernels differ.
    same = [layer_hidden_states(Target(model, Path("."), args.device, "bf16", None, None), p + c, layers)
            for p, c in zip(prompts, fast["continuations"])]
    linear_attn.apply("fallback", args.device, linear_attn.module_of(model))
    ref = [layer_hidden_states(Target(model, Path("."), args.device, "bf16", None, None), p + c, layers)
           for p, c in zip(prompts, fast["continuations"])]
    linear_attn.apply("auto", args.device, linear_attn.module_of(model))
    rel = max(((a[i] - b[i]).norm() / b[i].norm()).item() for a, b in zip(same, ref) for i in layers)
    tokens = sum(len(c) for c in fast["continuations"])
    differ = sum(x != y for a, b in zip(fast["continuations"], slow["continuations"]) for x, y in zip(a, b))

    block = 16
    torch.manual_seed(2)
    hidden = model.config.hidden_size
    dcfg = DrafterConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=model.config.num_attention_heads,
                         num_key_value_heads=model.config.num_key_value_heads, head_dim=model.config.head_dim,
                         intermediate_size=hidden * 3, target_layer_ids=layers, block_size=block,
                         mask_token_id=vocab - 1, num_target_layers=model.config.num_hidden_layers, vocab_size=vocab)
    drafter = DFlashDrafter(dcfg).to(args.device)
    conts = fast["continuations"]
    fit_drafter(drafter, ref, prompts, conts, model, args.fit_steps, layers)
    tau_fast = tau_on(same, prompts, conts, drafter, model, block, layers)
    tau_slow = tau_on(ref, prompts, conts, drafter, model, block, layers)

    print(f"paths: auto={fast['path']} {fast['functions']}; fallback={slow['path']}")
    print(f"max relative feature difference (layers {layers}): {rel:.3e}")
    print(f"greedy tokens differing: {differ}/{tokens} ({differ / tokens:.2%})")
    print(f"tau (drafter fitted on fallback features, same sequences): kernels {tau_fast:.4f} vs fallback {tau_slow:.4f}")
    print(f"generate: kernels {fast['generate_s']:.2f} s, fallback {slow['generate_s']:.2f} s; "
          f"features: kernels {fast['features_s']:.2f} s, fallback {slow['features_s']:.2f} s")
    ratios = {"fallback_vs_kernels_generate": round(slow["generate_s"] / fast["generate_s"], 2),
              "fallback_vs_kernels_features": round(slow["features_s"] / fast["features_s"], 2)}
    print(json.dumps({"benchmark": "gpu_kernels_vs_fallback", "ratios": ratios,
                      "targets": {k: 1.0 for k in ratios}, "ok": all(v >= 1.0 for v in ratios.values())}))


if __name__ == "__main__":
    main()
