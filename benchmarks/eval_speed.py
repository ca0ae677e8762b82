"""Eval speed, side by side in one run, on the demo's tiny hybrid target on CPU.

(a) drafter stage: the harness (every anchor scored in a few batched calls, walks read off
    afterwards) against a hand-written per-block loop (one drafter forward per block along each
    walk: the chain walk and one walk per DDTree budget), on the same cached target features;
    the metrics must be identical.
(b) ten checkpoints of one run against one target: with the continuation/feature cache against
    without it (every eval redoes the target pass).
(c) what an eval costs beyond its target pass, as a fraction of the target pass.
(d) the bootstrap intervals as a fraction of a warm eval (issue 12: under 5%).
(h) acceptance by context length (tau_by_context and the all-anchors curve, their intervals) as a fraction of a
    warm eval (issue 50: under 5%).
(e) a warm eval in-process (the target's work cached: only its embedding and lm_head are read)
    against z-lab's way, measured in the same run: load the target and the drafter, then run
    z-lab's cached online speculative loop (evaluators.online, what `--scoring online` runs; its
    hybrid-cache handling is the one tests/test_online_equivalence.py checks) over the same
    prompts. Target: >= 5x.
(f) `check-lossless` (plain greedy and z-lab's cached online loop, one prompt at a time) against
    one cold and one warm eval on the same prompts: what the check costs (reported, no target).
(g) sampled tau (T=1, top_p 0.95, top_k 20, the DFlash2 model card's) of ten checkpoints: offline,
    one set of K continuations per prompt drawn once and shared by all ten (the exact expectation
    per checkpoint), against z-lab's way, K runs per prompt of the lossless sampled online loop for
    each checkpoint. On the demo target in its Qwen3 family (z-lab's cached loop is lossless there,
    so both estimate the same number). Target: >= 5x. Reported with both interval widths (the
    prompts held fixed), and how much narrower the paired Δτ of two checkpoints is on the same
    draws than on independent ones.

Usage: python benchmarks/eval_speed.py [--prompts 16] [--tokens 512] [--sampled-tokens 128] [--samples 8]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo import target as demo_target  # noqa: E402
from demo.train_dflash import TrainConfig, prepare_data, train  # noqa: E402
from evaluators import harness, metrics, scoring  # noqa: E402
from evaluators.settings import EvalSettings  # noqa: E402
from tracker.measurement.uncertainty import paired_comparison, prompt_score, results_uncertainty  # noqa: E402
from evaluators.cache import EvalCache  # noqa: E402
from evaluators.ddtree import ddtree_acceptance  # noqa: E402
from evaluators.online import online_generate  # noqa: E402
from evaluators.drafter import load_drafter  # noqa: E402
from evaluators.target import content_digest, load_target  # noqa: E402
from tracker import fingerprint  # noqa: E402
from tracker.store.tracker import Tracker  # noqa: E402


BUDGETS = (4, 8, 16, 32)


def per_block_loop(loaded, target, walked, contexts, conts, budgets) -> dict:
    """What a hand-written eval script does: walk, one drafter forward per visited block."""
    drafter, block = loaded.model, loaded.model.block_size
    embed, head = target.embed_weight, target.lm_head_weight
    walks = {"chain": [], **{b: [] for b in budgets}}
    with torch.no_grad():
        for w, ctx, cont in zip(walked, contexts, conts):
            P = len(w.input_ids)
            for kind in walks:
                lengths, a = [], 0
                while a < w.n_anchors:
                    p = P + a
                    hidden = drafter.forward_block(ctx[None, :p], torch.arange(p),
                                                   drafter.block_embeddings(torch.tensor([cont[a]]), embed),
                                                   p + torch.arange(block)[None])
                    logits = drafter.logits(hidden, head)[0]  # [block-1, V]
                    truth = torch.tensor(cont[a + 1: a + block])
                    if kind == "chain":
                        length = int(metrics.chain_acceptance(logits.argmax(-1)[None], truth[None])[0])
                    else:
                        length = ddtree_acceptance(logits, truth, kind)
                    lengths.append(length)
                    a += length
                walks[kind].append(lengths)
    return {"tau": metrics.summarize_walks(walks["chain"], block).tau,
            **{f"ddtree_tau_b{b}": metrics.summarize_walks(walks[b], block).tau for b in budgets}}


def harness_drafter_stage(loaded, target, walked, contexts, conts, budgets) -> dict:
    for w, ctx, cont in zip(walked, contexts, conts):
        scoring.score_anchors(loaded, target, w, ctx, cont, budgets)
    res = scoring.summarize(walked, loaded.model.block_size, budgets, "full")  # the per-block loop's rule
    return {"tau": res["tau"], **{f"ddtree_tau_b{b}": d["tau"] for b, d in res["ddtree"].items()}}


def prepared(settings: EvalSettings):
    """Target, drafter and the cached target pass, exactly as `evaluate` builds them."""
    from evaluators.datasets import load_benchmark

    target = load_target(settings.target, "cpu", "fp32", "auto")
    cfg = target.config
    loaded = load_drafter(settings.drafter, target_hidden_size=cfg.hidden_size, target_num_layers=target.num_layers,
                          target_vocab_size=cfg.vocab_size)
    prompts = load_benchmark(settings.prompts, target.tokenizer, cfg.vocab_size)
    fp = fingerprint.capture(target.model, "cpu", "fp32", with_probe=False)
    env, digest, cache = fingerprint.numbers_relevant(fp), content_digest(target.path), EvalCache(settings.cache_dir)
    block, layers = loaded.model.block_size, list(loaded.model.target_layer_ids)
    quiet = harness.quiet
    conts = harness._continuations(lambda: target, prompts, settings, block, cache, env, digest, quiet,
                                   settings.batch_size or 8)
    stops = set(target.stop_token_ids())
    walked = []
    for p, c in zip(prompts, conts):
        completion, n_anchors = scoring.completion_bounds(c, settings.max_new_tokens, stops)
        walked.append(scoring.Walked(p, completion, n_anchors, settings.max_new_tokens, n_anchors))  # `full` ends

    contexts = harness._features(lambda: target, walked, layers, cache, env, digest, quiet, settings.batch_size or 8,
                                 cfg.hidden_size)
    return loaded, target, walked, [contexts[i] for i in range(len(contexts))], conts


SAMPLING = dict(temperature=1.0, top_p=0.95, top_k=20)


def sampled_section(root: Path, args) -> tuple[dict, dict]:
    """(g): ten checkpoints' sampled tau, offline from shared draws vs z-lab's online runs."""
    from evaluators.drafter import open_drafter
    from evaluators.sampling import ONLINE, Sampling, draw_seed
    from tracker.measurement.uncertainty import draws_interval

    target_dir = demo_target.build_target(root / "qwen3-target", steps=150, family="qwen3")
    data = prepare_data(target_dir, demo_target.make_prompts(48, seed=1, length=24, split="drafter"), 96)
    tracker = Tracker(f"sqlite:///{root / 'sampled.db'}")
    run = train(TrainConfig(name="sampled", heads=2, steps=20 * args.checkpoints, ckpt_every=20), target_dir, data,
                tracker, root / "sampled-run")
    ckpts = [c.path for c in tracker.checkpoints(run)]
    prompts = demo_target.make_prompts(args.prompts, seed=2, length=24, split="eval")
    (root / "sampled-prompts.jsonl").write_text("".join(json.dumps({"id": i, "input_ids": p}) + "\n"
                                                        for i, p in enumerate(prompts)))
    base = EvalSettings(str(target_dir), ckpts[-1], str(root / "sampled-prompts.jsonl"),
                                max_new_tokens=args.sampled_tokens, device="cpu", cache_dir=str(root / "sampled-cache"),
                                samples=args.samples, **SAMPLING)
    t0 = time.perf_counter()
    offline = [harness.evaluate(replace(base, drafter=ckpt)) for ckpt in ckpts]
    offline_s = time.perf_counter() - t0

    sampling, target = Sampling(**SAMPLING), load_target(target_dir, "cpu", "fp32", "auto")
    stops = set(target.stop_token_ids())
    t0 = time.perf_counter()
    online_taus = []
    for ckpt in ckpts:
        loaded = open_drafter(ckpt).load()
        per_prompt = []
        for p in prompts:
            runs = []
            for k in range(args.samples):
                generator = torch.Generator().manual_seed(draw_seed(0, p, k, ONLINE))
                lengths = online_generate(target, loaded, p, args.sampled_tokens, stops, base.last_block,
                                          sampling=sampling, generator=generator).acceptance_lengths
                runs += [sum(lengths) / len(lengths)] if lengths else []
            per_prompt.append(runs)
        online_taus.append(per_prompt)
    online_s = time.perf_counter() - t0

    last = offline[-1]
    offline_ci = last["monte_carlo"]["tau_ci_given_prompts"]
    online_ci = draws_interval(online_taus[-1]).bounds()
    print(f"(g) sampled T=1 top_p 0.95 top_k 20, {len(ckpts)} checkpoints x {args.prompts} prompts x "
          f"{args.sampled_tokens} tokens, {args.samples} draws per prompt: offline from one cached set of draws "
          f"{offline_s:.1f} s, {len(ckpts)} x {args.samples} online runs per prompt {online_s:.1f} s")
    print(f"    last checkpoint: offline tau {last['tau']:.3f} [{offline_ci[0]:.3f}, {offline_ci[1]:.3f}] (width "
          f"{offline_ci[1] - offline_ci[0]:.3f}), online {draws_interval(online_taus[-1]).value:.3f} "
          f"[{online_ci[0]:.3f}, {online_ci[1]:.3f}] (width {online_ci[1] - online_ci[0]:.3f}); intervals over "
          "the draws, the prompts held fixed")
    print(f"    offline tau by checkpoint {[round(r['tau'], 3) for r in offline]}")
    print(f"    online tau by checkpoint {[round(draws_interval(t).value, 3) for t in online_taus]}")

    def scores(res):
        return {p["id"]: prompt_score(p) for p in res["prompts"]}

    reseeded = harness.evaluate(replace(base, seed=1))
    same = paired_comparison(scores(offline[-2]), scores(last)).delta
    other = paired_comparison(scores(offline[-2]), scores(reseeded)).delta
    print(f"    Δtau (last - previous checkpoint), paired over prompts: on the same draws {same.value:+.3f} "
          f"[{same.low:+.3f}, {same.high:+.3f}] (width {same.high - same.low:.3f}); on independent draws "
          f"{other.value:+.3f} [{other.low:+.3f}, {other.high:+.3f}] (width {other.high - other.low:.3f})")
    ratios = {"sampled_ten_checkpoints_vs_online_runs": round(online_s / offline_s, 2),
              "paired_interval_same_vs_independent_draws": round((other.high - other.low) / (same.high - same.low), 2)}
    # The paired target: sharing the draws must narrow Δτ's interval by at least a fifth.
    return ratios, {"sampled_ten_checkpoints_vs_online_runs": 5.0, "paired_interval_same_vs_independent_draws": 1.25}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--sampled-tokens", type=int, default=128, help="(g): tokens per sampled continuation")
    ap.add_argument("--samples", type=int, default=8, help="(g): draws per prompt (offline) and runs (online)")
    ap.add_argument("--only-sampled", action="store_true", help="run (g) alone")
    args = ap.parse_args()
    torch.set_num_threads(2)
    root = Path(tempfile.mkdtemp(prefix="draftboard-eval-speed-"))
    if args.only_sampled:
        ratios, targets = sampled_section(root, args)
        print(json.dumps({"benchmark": "eval_speed", "ratios": ratios, "targets": targets,
                          "ok": all(ratios[k] >= targets[k] for k in targets)}))
        return

    print("setup: demo target, training data, one drafter run with "
          f"{args.checkpoints} checkpoints", flush=True)
    target_dir = demo_target.build_target(root / "target", steps=demo_target.FULL_STEPS)
    data = prepare_data(target_dir, demo_target.make_prompts(64, seed=1, length=96, split="drafter"), 64)
    tracker = Tracker(f"sqlite:///{root / 'store.db'}")
    steps = 40 * args.checkpoints
    run = train(TrainConfig(name="bench", target_layer_ids=[1, 2], steps=steps, ckpt_every=40), target_dir, data,
                tracker, root / "run")
    ckpts = [c.path for c in tracker.checkpoints(run)]
    prompts = demo_target.make_prompts(args.prompts, seed=2, length=96, split="eval")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": i, "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    base = EvalSettings(str(target_dir), ckpts[-1], str(root / "prompts.jsonl"), max_new_tokens=args.tokens,
                                budgets=BUDGETS, device="cpu", cache_dir=str(root / "cache"))

    # (c) one cold eval: target pass vs everything else
    cold = harness.evaluate(replace(base, cache_dir=str(root / "cold")))
    t = cold["timing"]
    beyond = (t["total_s"] - t["target_s"]) / t["target_s"]
    print(f"(c) cold eval: target pass {t['target_s']:.2f} s, drafter {t['drafter_s']:.2f} s, "
          f"total {t['total_s']:.2f} s; beyond the target pass: {beyond:.2f} x the target pass")

    # (a) drafter stage, same cached target pass for both
    parts = prepared(replace(base, cache_dir=str(root / "cold")))
    t0 = time.perf_counter()
    fast = harness_drafter_stage(*parts, BUDGETS)
    harness_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = per_block_loop(*parts, BUDGETS)
    loop_s = time.perf_counter() - t0
    equal = fast == slow
    n_blocks = sum(len(w.chain) for w in parts[2])
    # Why every anchor is scored rather than only walk anchors: each DDTree budget walks its own
    # anchors, so the walks together visit about as many blocks as there are anchors.
    res = scoring.summarize(parts[2], parts[0].model.block_size, BUDGETS, "full")
    walk_blocks = sum(len(p["acceptance_lengths"]) + sum(len(v) for v in p["ddtree_acceptance_lengths"].values())
                      for p in res["prompts"])
    print(f"    blocks visited by the chain walk and the {len(BUDGETS)} DDTree walks: {walk_blocks} "
          f"({walk_blocks / n_blocks:.2f} x the number of anchors)")
    print(f"(a) {args.prompts} prompts x {args.tokens} tokens ({n_blocks} anchors), budgets {list(BUDGETS)}: "
          f"harness {harness_s:.2f} s, per-block loop {loop_s:.2f} s; metrics identical: {equal}")
    print(f"    harness {json.dumps(fast)}")
    print(f"    loop    {json.dumps(slow)}")

    # (b) ten checkpoints, with and without the cache
    t0 = time.perf_counter()
    for i, ckpt in enumerate(ckpts):
        harness.evaluate(replace(base, drafter=ckpt, cache_dir=str(root / f"nocache{i}")))
    nocache_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    taus = []
    for ckpt in ckpts:
        taus.append(harness.evaluate(replace(base, drafter=ckpt, cache_dir=str(root / "shared")))["tau"])
    cache_s = time.perf_counter() - t0
    # With the cache, only the first eval pays the target pass: N full evals vs 1 full + (N-1) without it.
    ideal = len(ckpts) * t["total_s"] / (t["total_s"] + (len(ckpts) - 1) * (t["total_s"] - t["target_s"]))
    print(f"(b) {len(ckpts)} checkpoints: without cache {nocache_s:.1f} s, with cache {cache_s:.1f} s "
          f"(ideal given the drafter's share: {ideal:.1f}x); tau by checkpoint {[round(x, 2) for x in taus]}")

    # (d) the bootstrap intervals (ci, by_dataset) against one warm eval, which includes them
    warm = harness.evaluate(replace(base, cache_dir=str(root / "shared")))
    t0 = time.perf_counter()
    results_uncertainty(warm["prompts"])
    intervals_s = time.perf_counter() - t0
    print(f"(d) intervals {intervals_s * 1000:.1f} ms vs a warm eval {warm['timing']['total_s']:.2f} s "
          f"({100 * intervals_s / warm['timing']['total_s']:.2f}%)")
    t0 = time.perf_counter()
    by_context = harness._by_context(parts[2], res["prompts"], ())
    context_s = time.perf_counter() - t0
    print(f"(h) acceptance by context ({len(by_context['context_buckets'])} octave buckets, the walk's and every "
          f"anchor's, each with its bootstrap) {context_s * 1000:.1f} ms vs a warm eval {warm['timing']['total_s']:.2f} "
          f"s ({100 * context_s / warm['timing']['total_s']:.2f}%; a warm eval includes it)")

    # (e) warm eval in-process vs z-lab's load + online loop, on the same prompts
    split = {k: round(v, 3) for k, v in warm["timing"].items() if k.endswith("_s")}
    print(f"(e) warm eval ({warm['timing']['loaded']} of the target read): {json.dumps(split)}")
    t0 = time.perf_counter()
    zlab_target = load_target(target_dir, "cpu", "fp32", "auto")
    cfg = zlab_target.config
    zlab_drafter = load_drafter(ckpts[-1], target_hidden_size=cfg.hidden_size, target_num_layers=zlab_target.num_layers,
                                target_vocab_size=cfg.vocab_size)
    zlab_load_s = time.perf_counter() - t0
    stops = set(zlab_target.stop_token_ids())
    t0 = time.perf_counter()
    for p in prompts:
        online_generate(zlab_target, zlab_drafter, p, args.tokens, stops, base.last_block)
    zlab_loop_s = time.perf_counter() - t0
    zlab_s = zlab_load_s + zlab_loop_s
    print(f"    z-lab: load {zlab_load_s:.2f} s + online loop {zlab_loop_s:.2f} s = {zlab_s:.2f} s; "
          f"warm eval {warm['timing']['total_s']:.2f} s ({zlab_s / warm['timing']['total_s']:.1f}x faster, "
          "and it also scores every anchor and the DDTree budgets)")

    # (f) check-lossless (greedy and z-lab's cached online loop, prompt by prompt) against one eval
    lossless = harness.check_lossless(base)
    lossless_s = lossless["timing"]["total_s"]
    print(f"(f) check-lossless {lossless_s:.2f} s ({lossless['n_diverged']}/{len(lossless['prompts'])} prompts leave "
          f"greedy) vs one eval: cold {t['total_s']:.2f} s ({lossless_s / t['total_s']:.1f}x), warm "
          f"{warm['timing']['total_s']:.2f} s ({lossless_s / warm['timing']['total_s']:.1f}x)")

    sampled_ratios, sampled_targets = sampled_section(root, args)
    ratios = {"harness_vs_per_block_loop": round(loop_s / harness_s, 2),
              "ten_checkpoints_cache_vs_none": round(nocache_s / cache_s, 2),
              "intervals_share_of_warm_eval": round(intervals_s / warm["timing"]["total_s"], 4),
              "context_share_of_warm_eval": round(context_s / warm["timing"]["total_s"], 4),
              "warm_eval_vs_zlab_load_and_loop": round(zlab_s / warm["timing"]["total_s"], 2),
              "check_lossless_vs_cold_eval": round(lossless_s / t["total_s"], 2), **sampled_ratios}
    # "close to 10x minus the drafter's share": within 70% of what the drafter's share allows
    targets = {"harness_vs_per_block_loop": 10.0, "ten_checkpoints_cache_vs_none": round(0.7 * ideal, 2),
               "warm_eval_vs_zlab_load_and_loop": 5.0, **sampled_targets}
    ok = (equal and all(ratios[k] >= targets[k] for k in targets) and ratios["intervals_share_of_warm_eval"] < 0.05
          and ratios["context_share_of_warm_eval"] < 0.05)
    print(f"metrics identical: {equal}; beyond the target pass: {beyond:.3f} of it")
    print(json.dumps({"benchmark": "eval_speed", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
