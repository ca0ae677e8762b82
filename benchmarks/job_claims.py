"""Job-queue claim throughput on SQLite and PostgreSQL: one worker process vs four.

Each worker process opens its own JobQueue (as `draftboard worker` processes do) and loops
claim -> finish until the queue is empty, so the numbers are the queue's own overhead per
job: two write transactions per job, under SQLite's single write lock, or on PostgreSQL row
locks (the claim's `FOR UPDATE SKIP LOCKED` lets claimers pass over each other's rows).
Ratios: the throughput of four contending workers against one, on each backend. On a box with
fewer cores than workers they share the CPU, so more workers cannot be faster; what a user needs is
that adding workers costs the queue little: four keep at least 75% of one worker's throughput (a
collapse into lock waits or busy-waiting reads far below that). Every run also checks that each job
was claimed exactly once.

PostgreSQL: DRAFTBOARD_TEST_PG_URI when set (scripts/services.sh exports it; a fresh schema per
measurement), else a throwaway cluster started with `scripts/services.sh start --postgres-only`.
Its fsync setting is printed: that cluster runs without fsync, like SQLite's `synchronous=NORMAL`
in WAL mode it measures the queue, not the disk.

    python benchmarks/job_claims.py [--jobs 2000] [--workers 4] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _services import postgres_schema, postgres_settings, services  # noqa: E402

from tracker.jobs.queue import SUCCEEDED, JobQueue  # noqa: E402

RATIO_TARGET = 0.75  # 4 workers vs 1 keep >= 75% of the throughput (see above)


def _drain(uri: str, name: str, start, results) -> None:
    queue = JobQueue(uri)
    queue.list(limit=1)  # connect before the clock starts
    start.wait()
    claimed = []
    while (job := queue.claim(name)) is not None:
        queue.finish(job.id, SUCCEEDED)
        claimed.append(job.id)
    results.put((claimed, time.monotonic()))
    queue.close()


def measure(uri: str, n_jobs: int, n_workers: int) -> dict:
    """Submit n_jobs to the empty queue at uri, drain them with n_workers processes."""
    queue = JobQueue(uri)
    t0 = time.monotonic()
    # Jobs are eval params (only their name differs); the drain claims and finishes them, runs nothing.
    submitted = [queue.submit("eval", {"target": "/m/t", "drafter": "/m/d", "prompts": "/m/p.jsonl",
                                       "name": f"bench-{i}"}).id for i in range(n_jobs)]
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


@contextlib.contextmanager
def _fresh_queue(backend: str, directory: Path, tag: str, pg_uri: str | None):
    if backend == "sqlite":
        yield f"sqlite:///{directory / f'jobs-{tag}.db'}"
    else:
        with postgres_schema(pg_uri) as uri:
            yield uri


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"sqlite", "postgresql"}
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(sorted(unknown))}")

    results: dict[str, tuple[dict, dict]] = {}
    with contextlib.ExitStack() as stack:
        pg_uri = None
        if "postgresql" in backends:
            pg_uri = stack.enter_context(services(postgres_only=True))["DRAFTBOARD_TEST_PG_URI"]
            print(f"postgresql: {postgres_settings(pg_uri)}")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for backend in backends:
            runs = []
            for n in (1, args.workers):
                with _fresh_queue(backend, tmp, f"{n}w", pg_uri) as uri:
                    runs.append(measure(uri, args.jobs, n))
            results[backend] = (runs[0], runs[1])

    ratios, targets, ok = {}, {}, True
    for backend, (single, multi) in results.items():
        for r in (single, multi):
            print(f"{backend}: {r['workers']} worker(s): {args.jobs} jobs submitted in {r['submit_s']:.2f} s "
                  f"({args.jobs / r['submit_s']:.0f}/s); claimed+finished in {r['drain_s']:.2f} s "
                  f"({r['jobs_per_s']:.0f} jobs/s); per worker {r['per_worker']}; exactly once: {r['exactly_once']}")
        name = f"{backend}_claim_throughput_{args.workers}w_vs_1w"
        ratios[name] = round(multi["jobs_per_s"] / single["jobs_per_s"], 3)
        targets[name] = RATIO_TARGET
        ok = ok and ratios[name] >= RATIO_TARGET and single["exactly_once"] and multi["exactly_once"]
    if "sqlite" in results and "postgresql" in results:
        # Informational (no target): PostgreSQL pays a round trip per statement that SQLite does not.
        pg, lite = results["postgresql"][1]["jobs_per_s"], results["sqlite"][1]["jobs_per_s"]
        print(f"{args.workers} workers: postgresql {pg:.0f} jobs/s vs sqlite {lite:.0f} jobs/s ({pg / lite:.2f}x)")
    print(json.dumps({"benchmark": "job_claims", "ratios": ratios, "targets": targets, "ok": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
