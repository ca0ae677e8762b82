"""The demo's served evals: a Qwen3 pair an engine serves on a CPU (demo.serving_pair), its offline eval,
and the same prompts measured by each engine this deployment installed (llama.cpp, which `./scripts/run.sh`
installs with scripts/llamacpp.sh; vLLM where DRAFTBOARD_VLLM_PYTHON names one) with a load sweep, so a
newcomer's dashboard shows served evals for real: Run detail's Served vs offline, Compare's Engines and
Load views. Nothing here is made up: the engines run, and their counts are checked as any eval's are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from pathlib import Path

from demo.serving_pair import MAX_NEW_TOKENS, ServingPair, build_serving_pair
from tracker import config

# Requests in flight each engine's sweep measures: llama.cpp's build aborts now and then at 4 in flight on a
# busy box (tests/test_engines_llamacpp.py), vLLM's CPU build takes 4.
LEVELS = {"llamacpp": (1, 2), "vllm": (1, 4)}
REPEATS = 2  # rounds per level: the smallest that shows a spread, in a demo built in CI
PAIR_NAME = "qwen3-tiny-served"  # the target folder: the name the dashboard shows for these evals' target
DRAFTER_NAME = "served drafter (Qwen3 pair)"
# Seconds on 2 idle cores (measured 2026-12-06): the pair 14 s, its offline eval 2 s, llama.cpp's eval with its
# sweep 10 s (the GGUF conversion and the server's start included); vLLM's engine starts take 25-80 s alone.
COST_S = {"pair": 14.0, "offline": 2.0, "llamacpp": 10.0, "vllm": 90.0}


def installed(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engines the deployment names a Python for (llama.cpp with its converter), by name: their Python."""
    found = {name: config.engine_python(name, env) for name in LEVELS}
    if not config.llamacpp_converter(env):
        found.pop("llamacpp")
    return {name: python for name, python in found.items() if python}


def work_s(engines: Mapping[str, str]) -> float:
    """The stage's work on an idle machine (COST_S): nothing when no engine is installed."""
    return COST_S["pair"] + COST_S["offline"] + sum(COST_S[name] for name in engines) if engines else 0.0


def served_evals(root: Path, tracker, settings, engines: Mapping[str, str], record: Callable[[str], str],
                 report: Callable[[str], None], progress: Callable[[float], None]) -> dict:
    """Build the pair under `root`, evaluate it offline and with each engine in `engines`, and log every
    eval to `tracker` through `record` (the demo's manifest). `settings`: the demo's EvalSettings (device,
    dtype, cache). An engine that fails is reported and left out: what the other evals measured stays.
    Returns {"pair": ..., "offline": run id, "engines": {name: run id}, "failed": {name: reason}}."""
    from evaluators.engines.base import EngineError
    from evaluators.engines.run import EngineSettings, evaluate_engine
    from evaluators.harness import evaluate
    from evaluators.logging import log_eval
    from tracker.errors import DraftboardError
    from tracker.jobs import eval_job
    from tracker.store import names

    total = work_s(engines)
    done = 0.0

    def part(name: str) -> Callable[[float], None]:
        return lambda f: progress((done + f * COST_S[name]) / total)

    pair: ServingPair = build_serving_pair(root, tracker=tracker, target_name=PAIR_NAME, drafter_name=DRAFTER_NAME,
                                           link=False, progress=part("pair"))
    done += COST_S["pair"]
    s = replace(settings, target=str(pair.target), drafter=str(pair.drafter), prompts=str(pair.prompts),
                max_new_tokens=MAX_NEW_TOKENS)

    def logged(results: dict, params: dict) -> str:
        name = names.eval_run_name(DRAFTER_NAME, pair.step, params, eval_job.setting_words(params))
        return record(log_eval(tracker, results, s, train_run_id=pair.train_run_id, checkpoint_step=pair.step,
                               name=name, tags={names.DEMO: "1"}))

    results = evaluate(s)
    out = {"pair": str(pair.root), "offline": logged(results, asdict(s)), "engines": {}, "failed": {}}
    report(f"  offline: tau {results['tau']:.2f}")
    done += COST_S["offline"]
    for name, python in engines.items():
        engine = EngineSettings(name, python=python, concurrency=LEVELS[name], repeats=REPEATS)
        try:
            measured = evaluate_engine(s, engine, lambda stage, n, of, name=name: part(name)(n / max(of, 1)),
                                       log_dir=root / "logs")
        except (EngineError, DraftboardError) as exc:  # the demo stands without it; the reason is said
            out["failed"][name] = str(exc).splitlines()[0]
            report(f"  {name}: not measured: {out['failed'][name]}")
        else:
            out["engines"][name] = logged(measured, {**asdict(s), "engine": name, "concurrency": list(LEVELS[name]),
                                                     "repeats": REPEATS})
            speedups = ", ".join(f"{level['speedup']:.2f}x at {level['concurrency']}"
                                 for level in measured.get("load") or () if level["speedup"])
            report(f"  {name} {measured['engine']['version']}: mean acceptance length "
                   f"{measured['engine_mean_acceptance_length']:.2f}" + (f"; speedup {speedups}" if speedups else ""))
        done += COST_S[name]
    return out
