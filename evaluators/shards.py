"""`draftboard eval --shards N`: one eval's prompts split across N processes, each on its own device, merged into one.

Shard k of N scores the prompts k, k + N, k + 2N, ... (z-lab's benchmark.py gives rank r of a world of N the prompts
`range(r, n, N)`) with the same harness as a one-process eval (`harness.score_share`), and hands its share back as
JSON: every walk, and its own fingerprint. The parent puts the walks back in the prompts' order and pools them once
(evaluators.pooling), so every number is exactly the one process's on the same prompts. Shards whose environments
differ critically (another kernel path, dtype or GPU kind, a probe that disagrees) fail the eval with the difference
named: the mismatch draftboard exists to catch, inside one eval.

On `cuda`, shard k sees only the k-th GPU this process sees (its CUDA_VISIBLE_DEVICES); on the CPU the shards split
the cores. Each shard's target work is cached under its own prompts, so a repeated sharded eval is warm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from evaluators.harness import Progress, score_share
from evaluators.settings import EvalSettings
from evaluators.pooling import Share, pool
from tracker import lifecycle
from tracker.config import shards_problem
from tracker.environment import fingerprint
from tracker.errors import DraftboardError

RAY_JOB_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for a job's entrypoint (ray.runtime_env)
LINE = "@@shard "  # a shard's progress and error lines on its stdout; anything else there is ignored
POLL_S = 0.25
PROMPT_FIELDS = ("datasets", "prompt_digest", "prompt_lengths")  # what differs between shards' protocols by design


def shard_environments(shards: int, device: str, environ=None) -> list[dict[str, str]]:
    """Each shard's environment: on cuda its own GPU (the k-th this process sees), on the CPU its part of the cores."""
    environ = dict(os.environ if environ is None else environ)
    if device == "cpu":
        threads = max(1, (os.cpu_count() or 1) // shards)
        return [{**environ, "OMP_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": ""} for _ in range(shards)]
    visible = _visible_gpus(environ)
    if len(visible) < shards:
        raise DraftboardError(f"--shards {shards} on cuda needs {shards} GPUs, one per shard; this eval sees "
                              f"{len(visible)} (CUDA_VISIBLE_DEVICES {environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r})")
    return [{**environ, "CUDA_VISIBLE_DEVICES": gpu} for gpu in visible[:shards]]


def _visible_gpus(environ) -> list[str]:
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def evaluate_sharded(s: EvalSettings, shards: int, progress: Progress) -> dict:
    """The eval run as `shards` shard processes, merged (`merge`); a failed shard stops the others and fails the eval
    in one line that names it."""
    problem = shards_problem(shards, s.scoring)
    if problem:
        raise DraftboardError(problem)
    t0 = time.perf_counter()
    device = s.device or fingerprint.default_device()
    settings = {**asdict(s), "device": device, "gpus": None}  # a shard holds one GPU: the target is not spread
    if os.environ.get(RAY_JOB_VAR):  # this eval is a Ray job's entrypoint: its shards are tasks of that job
        shares = _on_ray(settings, shards, progress)
    else:
        environments = shard_environments(shards, device)
        with tempfile.TemporaryDirectory(prefix="draftboard-shards-") as tmp:
            spec = Path(tmp) / "settings.json"
            spec.write_text(json.dumps(settings))
            outs = [Path(tmp) / f"shard-{k}.json" for k in range(shards)]
            _run(spec, outs, environments, progress)
            shares = [Share.from_json(json.loads(out.read_text())) for out in outs]
    results = merge(s, shares)
    results["timing"]["total_s"] = time.perf_counter() - t0
    return results


def _on_ray(settings: dict, shards: int, progress: Progress) -> list[Share]:
    """The shards as tasks of the Ray job this eval runs as, spread over the cluster's nodes, one GPU each on cuda
    (Ray sets each task's CUDA_VISIBLE_DEVICES), one CPU each on the CPU. Each hands its share back as the task's
    value, so no path is shared but the inputs' (docs/RAY.md). The job's stop ends its driver, and Ray then ends
    the tasks the driver owns, on every node."""
    import ray

    ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
    task = ray.remote(_score_task).options(num_cpus=1, num_gpus=1 if settings["device"] == "cuda" else 0,
                                           scheduling_strategy="SPREAD", max_retries=0)
    refs = [task.remote(settings, k, shards) for k in range(shards)]
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        progress("shards (Ray tasks)", shards - len(pending), shards)
    shares = []
    for k, out in enumerate(ray.get(refs)):
        if "error" in out:
            raise DraftboardError(f"shard {k} of {shards}: {out['error']}")
        shares.append(Share.from_json(out))
    return shares


def _score_task(settings: dict, shard: int, of: int) -> dict:
    """One shard, run inside a Ray task: its share as JSON, or {"error"} for an error the eval states in one line."""
    import ray

    try:
        share, _ = score_share(_settings(settings), shard=shard, of=of)
    except DraftboardError as exc:
        return {"error": str(exc)}
    share.node = ray.get_runtime_context().get_node_id()
    return share.to_json()


def _settings(data: dict) -> EvalSettings:
    return EvalSettings(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})


def _run(spec: Path, outs: list[Path], environments: list[dict], progress: Progress) -> None:
    """Start every shard, relay their progress, wait for all; DraftboardError naming the first that failed of itself
    (the others it stopped are not the cause)."""
    procs, readers, errors, stages, lock = [], [], {}, {}, threading.Lock()
    failed = None
    try:
        for k, (out, env) in enumerate(zip(outs, environments)):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "evaluators.shards", str(spec), str(k), str(len(outs)), str(out)],
                env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                **lifecycle.child_popen_kwargs(signal.SIGKILL)))
            readers.append(threading.Thread(target=_read, args=(k, procs[-1].stdout, stages, errors, lock),
                                            daemon=True))
            readers[-1].start()
        while True:
            codes = [p.poll() for p in procs]  # every one polled: a failure anywhere stops the rest at once
            failed = next((k for k, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is not None or all(code == 0 for code in codes):
                break
            _report(stages, lock, len(procs), progress)
            time.sleep(POLL_S)
        _report(stages, lock, len(procs), progress)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    if failed is not None:
        readers[failed].join(timeout=5)  # its last line (the error) is read once its output is closed
        with lock:
            why = errors.get(failed) or f"exited with status {procs[failed].returncode}"
        raise DraftboardError(f"shard {failed} of {len(procs)}: {why}")


def _read(k: int, stream, stages: dict, errors: dict, lock: threading.Lock) -> None:
    for line in stream:
        if not line.startswith(LINE):
            continue
        try:
            event = json.loads(line[len(LINE):])
        except ValueError:
            continue
        with lock:
            if "error" in event:
                errors[k] = str(event["error"])[:500]
            elif {"stage", "done", "total"} <= set(event):
                stages.setdefault(str(event["stage"]), {})[k] = (int(event["done"]), int(event["total"]))


def _report(stages: dict, lock: threading.Lock, shards: int, progress: Progress) -> None:
    """The earliest stage some shard has not finished, its counts summed over the shards (all shards finished: the
    last stage)."""
    with lock:
        seen = [(stage, dict(by_shard)) for stage, by_shard in stages.items()]
    if not seen:
        return
    for stage, by_shard in seen:
        done, total = sum(d for d, _ in by_shard.values()), sum(t for _, t in by_shard.values())
        if len(by_shard) < shards or done < total:
            break
    progress(stage, done, total)


def merge(s: EvalSettings, shares: Sequence[Share]) -> dict:
    """One eval's results from its shards' shares, or DraftboardError naming how two shards differ critically."""
    shares = sorted(shares, key=lambda sh: sh.shard)
    first = shares[0]
    if [sh.shard for sh in shares] != list(range(first.of)) or any(sh.of != first.of for sh in shares):
        raise DraftboardError(f"shards {[sh.shard for sh in shares]} do not make up {first.of} shards")
    for sh in shares[1:]:
        rows = [r for r in fingerprint.diff(first.fingerprint, sh.fingerprint) if r.severity == "critical"]
        if rows:
            named = "; ".join(f"{r.field}: {r.a_value} vs {r.b_value}" for r in rows[:3])
            raise DraftboardError(f"shard {sh.shard}'s environment differs critically from shard 0's ({named}): "
                                  "its numbers are not comparable with the others', so the eval fails (see "
                                  "`draftboard env-diff`)")
        differ = sorted(k for k in first.protocol if k not in PROMPT_FIELDS and first.protocol[k] != sh.protocol[k])
        if differ:
            raise DraftboardError(f"shard {sh.shard} measured under another protocol than shard 0 "
                                  f"({', '.join(differ)})")
    results = pool(s, list(shares))
    hardware = results["fingerprint"]["hardware"]
    results["fingerprint"] = {**results["fingerprint"], "hardware": {
        **hardware, "gpus": [g for sh in shares for g in sh.fingerprint["hardware"].get("gpus") or []],
        "cuda_visible_devices": ",".join(str(sh.fingerprint["hardware"].get("cuda_visible_devices") or "")
                                         for sh in shares)}}
    results["shards"] = [{"shard": sh.shard, "prompts": [w.id for w in sh.walked[::_per_prompt(s)]],
                          "device": _device(sh.fingerprint), "env_hash": fingerprint.env_hash(sh.fingerprint),
                          "node": sh.node} for sh in shares]
    return results


def _per_prompt(s: EvalSettings) -> int:
    return 1 if s.sampling.greedy else s.samples


def _device(fp: dict) -> str:
    """Where a shard ran: `cpu`, or `cuda` with its GPU's name and the devices it was given."""
    hw = fp.get("hardware") or {}
    if hw.get("device") != "cuda":
        return str(hw.get("device"))
    return f"cuda {hw.get('gpu_name')} (CUDA_VISIBLE_DEVICES {hw.get('cuda_visible_devices')})"


# --------------------------------------------------------------------------- a shard's own process


def _line(event: dict) -> None:
    print(LINE + json.dumps(event), flush=True)


def main(argv: Sequence[str], say: Callable[[dict], None] = _line) -> int:
    """python -m evaluators.shards SETTINGS_JSON SHARD OF OUT_JSON: score one shard, write its share to OUT_JSON."""
    spec, shard, of, out = argv
    try:
        share, _ = score_share(_settings(json.loads(Path(spec).read_text())),
                               lambda stage, done, total: say({"stage": stage, "done": done, "total": total}),
                               int(shard), int(of))
    except DraftboardError as exc:
        say({"error": str(exc)})
        return 2
    tmp = Path(out).with_suffix(".part")
    tmp.write_text(json.dumps(share.to_json()))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
