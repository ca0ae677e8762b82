"""Job-queue claim throughput on SQLite: one worker process vs four on the same file.

Each worker process opens its own JobQueue (as `draftboard worker` processes do) and loops
claim -> finish until the queue is empty, so the numbers are the queue's own overhead per
job: two write transactions under SQLite's single write lock. The ratio checks that four
contending workers get through the queue at least as fast as one (no collapse into
busy-waiting), and every run also checks that each job was claimed exactly once.

    python benchmarks/job_claims.py [--jobs 2000] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracker.jobs import SUCCEEDED, JobQueue  # noqa: E402

RATIO_TARGET = 1.0


def _drain(uri: str, name: str, start, results) -> None:
    queue = JobQueue(uri)
    queue.list(limit=1)  # connect before the clock starts
    start.wait()
    claimed = []
    while (job := queue.claim(name)) is not None:
        queue.finish(job.id, SUCCEEDED)
        claimed.append(job.id)
    results.put((claimed, time.monotonic()))


def measure(n_jobs: int, n_workers: int, directory: Path) -> dict:
    """Submit n_jobs, drain them with n_workers processes; timings and an exactly-once check."""
    uri = f"sqlite:///{directory / f'jobs-{n_workers}.db'}"
    queue = JobQueue(uri)
    t0 = time.monotonic()
    submitted = [queue.submit("bench", {"i": i}, ["true"]).id for i in range(n_jobs)]
    submit_s = time.monotonic() - t0
    queue.close()

    ctx = mp.get_context("spawn")  # a fresh interpreter per worker, as separate worker processes
    start, results = ctx.Barrier(n_workers + 1), ctx.Queue()
    procs = [ctx.Process(target=_drain, args=(uri, f"w{k}", start, results)) for k in range(n_workers)]
    for proc in procs:
        proc.start()
    start.wait()
    t0 = time.monotonic()
    reports = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    drain_s = max(end for _, end in reports) - t0
    claimed = sorted(job_id for ids, _ in reports for job_id in ids)
    return {
        "workers": n_workers,
        "submit_s": submit_s,
        "drain_s": drain_s,
        "jobs_per_s": n_jobs / drain_s,
        "per_worker": [len(ids) for ids, _ in reports],
        "exactly_once": claimed == sorted(submitted),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        single = measure(args.jobs, 1, Path(tmp))
        multi = measure(args.jobs, args.workers, Path(tmp))
    for r in (single, multi):
        print(f"{r['workers']} worker(s): {args.jobs} jobs submitted in {r['submit_s']:.2f} s "
              f"({args.jobs / r['submit_s']:.0f}/s); claimed+finished in {r['drain_s']:.2f} s "
              f"({r['jobs_per_s']:.0f} jobs/s); per worker {r['per_worker']}; exactly once: {r['exactly_once']}")
    name = f"claim_throughput_{args.workers}w_vs_1w"
    ratios = {name: round(multi["jobs_per_s"] / single["jobs_per_s"], 3)}
    targets = {name: RATIO_TARGET}
    ok = all(ratios[k] >= targets[k] for k in ratios) and single["exactly_once"] and multi["exactly_once"]
    print(json.dumps({"benchmark": "job_claims", "ratios": ratios, "targets": targets, "ok": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
