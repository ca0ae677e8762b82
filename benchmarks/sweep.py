"""A sweep of 10 checkpoints through the worker, side by side in one run, on the tiny Qwen3 fixture.

The fixture is `demo.serving_pair` (a Qwen3 target trained briefly on local text and a block-8
DFlash drafter trained on its greedy completions); its drafter, perturbed with seeded noise, gives
the 10 checkpoints of one run. The target's work is made warm first (one eval fills the cache), as
it is for every checkpoint after a run's first. Timed as a user waits, whole processes included:

(a) the sweep through `draftboard worker --once` with evals in its warm eval process (the default),
    from the worker's start until all 10 results are logged; all 10 run in one process, and every
    eval after the first uses the target heads the first read (`timing.heads_held`);
(b) the same with DRAFTBOARD_WARM_EVALS=0: one fresh `draftboard eval` process per checkpoint;
(c) z-lab's way: its script run once per checkpoint, 10 processes, each loading the target and the
    drafter and running `dflash_generate` (z-lab's own code, dflash==0.1.0 from DRAFTBOARD_ZLAB_SITE,
    which scripts/test.sh installs) over the same prompts.
(d) one warm `draftboard eval` process against one z-lab process (alternating, the median of 3).

(a) and (b) must log identical tau per checkpoint. Targets: (c)/(a) >= 5, (c)/(d) one process >= 2.5.

Usage: python benchmarks/sweep.py [--prompts 16] [--tokens 160] [--checkpoints 10] [--noise 0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# z-lab's benchmark loop for one checkpoint (what its dflash/benchmark.py does around dflash_generate):
# load the target and the drafter, generate every prompt, print the mean acceptance length. Its timer
# synchronises CUDA; on these CPUs it is plain wall-clock time.
ZLAB_SCRIPT = """
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from transformers import AutoModelForCausalLM
import dflash.model
from dflash.model import DFlashDraftModel, dflash_generate
dflash.model._cuda_time = time.perf_counter
target = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32, trust_remote_code=False).eval()
drafter = DFlashDraftModel.from_pretrained(sys.argv[3], dtype=torch.float32).eval()
stops = [target.generation_config.eos_token_id or target.config.eos_token_id]
taus = []
with torch.no_grad():
    for line in open(sys.argv[4]):
        ids = torch.tensor([json.loads(line)["input_ids"]])
        out = dflash_generate(drafter, target, ids, int(sys.argv[5]), stops, return_stats=True)
        taus.append(sum(out.acceptance_lengths) / len(out.acceptance_lengths))
print(json.dumps({"tau": sum(taus) / len(taus)}))
"""


def checkpoints(drafter: Path, out: Path, n: int, noise: float) -> list[Path]:
    """n z-lab-format copies of `drafter`, checkpoint i with every weight moved by i x noise x its std."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(drafter / "model.safetensors"))
    paths = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        moved = {k: (v + i * noise * v.float().std() * torch.randn(v.shape, generator=g)).to(v.dtype)
                 if v.is_floating_point() and v.numel() > 1 else v for k, v in weights.items()}
        folder = out / f"step_{(i + 1) * 100}"
        folder.mkdir(parents=True)
        for f in drafter.iterdir():
            if f.name != "model.safetensors" and f.is_file():
                shutil.copy(f, folder / f.name)
        save_file(moved, str(folder / "model.safetensors"), metadata={"format": "pt"})
        paths.append(folder)
    return paths


def eval_argv(pair: Path, drafter: Path, args, home: Path) -> list[str]:
    return [sys.executable, "-m", "tracker.cli", "eval", "--target", str(pair / "target"), "--drafter", str(drafter),
            "--prompts", str(pair / "prompts.jsonl"), "--max-new-tokens", str(args.tokens), "--device", "cpu",
            "--cache-dir", str(home / "cache")]


def sweep(pair: Path, ckpts: list[Path], args, work: Path, warm: bool) -> tuple[float, dict[str, float], str]:
    """Seconds from the worker's start until it ran all jobs, tau per checkpoint as logged, and in how
    many processes the evals ran and how many used held heads."""
    from tracker.dashboard.index import read_json_artifact
    from tracker.jobs.queue import SUCCEEDED, JobQueue
    from tracker.store.names import EVAL_RESULTS_ARTIFACT
    from tracker.store.tracker import Tracker

    name = "warm" if warm else "fresh"
    jobs_uri, store = f"sqlite:///{work / f'{name}-jobs.db'}", f"sqlite:///{work / f'{name}-store.db'}"
    queue = JobQueue(jobs_uri)
    for ck in ckpts:
        queue.submit("eval", {"target": str(pair / "target"), "drafter": str(ck), "prompts": str(pair / "prompts.jsonl"),
                              "max_new_tokens": args.tokens, "device": "cpu", "name": ck.name})
    env = {**os.environ, "DRAFTBOARD_HOME": str(work), "MLFLOW_TRACKING_URI": store,
           "DRAFTBOARD_WARM_EVALS": "1" if warm else "0"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tracker.cli", "worker", "--once", "--poll", "0.05", "--jobs-uri", jobs_uri],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    jobs = queue.list(limit=len(ckpts))
    failed = [(j.id, j.error) for j in jobs if j.state != SUCCEEDED]
    if failed:
        raise SystemExit(f"{name} sweep: jobs failed: {failed}")
    client = Tracker(store).client
    runs = [client.get_run(j.mlflow_run_id) for j in jobs]
    held = sum(read_json_artifact(client, r.info.run_id, r.info.artifact_uri, EVAL_RESULTS_ARTIFACT)["timing"]
               ["heads_held"] for r in runs)
    return (seconds, {r.info.run_name: r.data.metrics["tau"] for r in runs},
            f"{len({j.pid for j in jobs})} process(es), {held} of {len(jobs)} evals used held heads")


def zlab_process(site: str, pair: Path, drafter: Path, tokens: int) -> tuple[float, float]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", ZLAB_SCRIPT, site, str(pair / "target"), str(drafter),
                          str(pair / "prompts.jsonl"), str(tokens)], check=True, capture_output=True, text=True)
    return time.perf_counter() - start, json.loads(out.stdout.strip().splitlines()[-1])["tau"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument("--pair", type=Path, help="a serving pair built before (demo.serving_pair) to reuse")
    args = parser.parse_args()
    site = os.environ.get("DRAFTBOARD_ZLAB_SITE")
    if not site:
        print("error: DRAFTBOARD_ZLAB_SITE is not set (scripts/test.sh installs z-lab's dflash==0.1.0 there)",
              file=sys.stderr)
        return 2
    from demo.serving_pair import build_serving_pair

    with tempfile.TemporaryDirectory(prefix="draftboard-sweep-") as tmp:
        work = Path(tmp)
        pair = args.pair or build_serving_pair(work / "pair", n_prompts=args.prompts).root
        ckpts = checkpoints((pair / "drafter").resolve(), work / "run", args.checkpoints, args.noise)
        subprocess.run([*eval_argv(pair, ckpts[0], args, work), "--no-log"], check=True, capture_output=True,
                       env={**os.environ, "DRAFTBOARD_HOME": str(work)})  # the target's work, warm

        warm_s, warm_tau, warm_how = sweep(pair, ckpts, args, work, warm=True)
        fresh_s, fresh_tau, fresh_how = sweep(pair, ckpts, args, work, warm=False)
        zlab = [zlab_process(site, pair, ck, args.tokens) for ck in ckpts]
        zlab_s = sum(s for s, _ in zlab)
        one_eval, one_zlab = [], []
        for _ in range(3):  # alternating, so a busy moment of the machine falls on both
            start = time.perf_counter()
            subprocess.run([*eval_argv(pair, ckpts[-1], args, work), "--no-log"], check=True, capture_output=True,
                           env={**os.environ, "DRAFTBOARD_HOME": str(work)})
            one_eval.append(time.perf_counter() - start)
            one_zlab.append(zlab_process(site, pair, ckpts[-1], args.tokens)[0])

    identical = warm_tau == fresh_tau and len(warm_tau) == args.checkpoints
    print(f"{args.checkpoints} checkpoints x {args.prompts} prompts x {args.tokens} tokens, target work warm:")
    print(f"  (a) worker, evals in its warm eval process:     {warm_s:.1f} s ({warm_how})")
    print(f"  (b) worker, one fresh process per eval:        {fresh_s:.1f} s ({fresh_how})")
    print(f"  (c) z-lab's script, one process per checkpoint: {zlab_s:.1f} s")
    print(f"  (d) one warm eval process {statistics.median(one_eval):.2f} s vs one z-lab process "
          f"{statistics.median(one_zlab):.2f} s (median of 3)")
    print("  tau per checkpoint (a) = (b): " + ("identical" if identical else f"DIFFER {warm_tau} vs {fresh_tau}"))
    print("  tau (a) / z-lab's loop: " + ", ".join(f"{warm_tau[ck.name]:.3f}/{t:.3f}" for ck, (_, t) in zip(ckpts, zlab)))
    ratios = {"sweep_zlab_processes_vs_warm_worker": round(zlab_s / warm_s, 2),
              "sweep_fresh_processes_vs_warm_worker": round(fresh_s / warm_s, 2),
              "one_zlab_process_vs_one_eval_process": round(statistics.median(one_zlab) / statistics.median(one_eval), 2)}
    targets = {"sweep_zlab_processes_vs_warm_worker": 5.0, "one_zlab_process_vs_one_eval_process": 2.5}
    print(json.dumps({"benchmark": "sweep", "ratios": ratios, "targets": targets,
                      "ok": identical and all(ratios[k] >= targets[k] for k in targets)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
