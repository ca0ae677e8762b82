"""Step logging against an MLflow tracking server vs the embedded store, side by side.

The server is the deployment's: `mlflow server` on PostgreSQL with proxied artifacts and basic
auth (DRAFTBOARD_TEST_SERVER_URI and the admin credentials when set, scripts/services.sh exports
them; else a throwaway set started with scripts/services.sh). The embedded store is a fresh
sqlite file in a temp dir. In one process, with the same fingerprint and 4 metrics a step:

- a paced training loop (`--paced-steps` steps of ~1 ms of pure-Python work, which holds the
  GIL like a Python-heavy training step, + `log_step`): the flusher sends while the loop runs,
  so this is what training feels of each store; the same loop without logging is the baseline;
- a burst (`--steps` `log_step` calls as fast as possible, then the end-of-run flush): the
  loop's bare cost per call, and "delivered" = steps / (loop + flush), the store's intake;
- naive: `MlflowClient.log_metric` once per metric, synchronously, against the server
  (`--naive-steps` steps): what a training loop without the buffer would wait for.

Ratios (higher is better):
- `server_vs_embedded_paced_loop`: embedded ms/step / server ms/step of the paced loop; target
  0.8: logging to the server slows a step at most a quarter more than logging to a local file
  (seen on 2 idle cores: baseline 0.93 ms, embedded 1.02x, server 1.10x, ratio 0.93; the
  flusher's request building shares the GIL with the loop).
- `server_vs_embedded_delivered`: server steps/s delivered / embedded steps/s delivered; target
  0.2: the server takes buffered steps in at least a fifth of the sqlite file's rate.
- `log_step_vs_log_metric_on_server`: naive ms/step / burst log_step ms/step; target 100.

    python benchmarks/server_logging.py [--steps 10000] [--paced-steps 5000] [--naive-steps 200]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from _services import services  # noqa: E402

TARGETS = {"server_vs_embedded_paced_loop": 0.8, "server_vs_embedded_delivered": 0.2,
           "log_step_vs_log_metric_on_server": 100}
WORK_MS = 1.0  # per paced step


def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def calibrate(ms: float) -> int:
    """Iterations of _work that take about `ms` milliseconds here."""
    n = 1000
    while True:
        start = time.perf_counter()
        _work(n)
        took = (time.perf_counter() - start) * 1e3
        if took > 5:
            return max(1, int(n * ms / took))
        n *= 2


def paced_loop(tracker, fp: dict, steps: int, n: int) -> float:
    """ms per step of the paced loop, logging each step to tracker (None: no logging)."""
    if tracker is None:
        start = time.perf_counter()
        for step in range(steps):
            _work(n)
        return (time.perf_counter() - start) / steps * 1e3
    with tracker.training_run("bench-paced", {}, "bench", fingerprint=fp) as run:
        start = time.perf_counter()
        for step in range(steps):
            _work(n)
            run.log_step(step, **_metrics(step))
        elapsed = time.perf_counter() - start
    return elapsed / steps * 1e3


def _metrics(step: int) -> dict[str, float]:
    return {"loss": 1.0 / (step + 1), "acc": (step % 100) / 100, "streak": math.log1p(step), "lr": 1e-4}


def time_log_step(tracker, fp: dict, steps: int) -> dict:
    """Loop and flush seconds for `steps` log_step calls, and how many 'loss' values arrived."""
    from mlflow import MlflowClient

    with tracker.training_run("bench-log_step", {}, "bench", fingerprint=fp) as run:
        start = time.perf_counter()
        for step in range(steps):
            run.log_step(step, **_metrics(step))
        loop_end = time.perf_counter()
    flush_s = time.perf_counter() - loop_end
    loop_s = loop_end - start
    logged = len(MlflowClient(tracking_uri=tracker.uri).get_metric_history(run.run_id, "loss"))
    return {"loop_s": loop_s, "flush_s": flush_s, "loop_ms": loop_s / steps * 1e3,
            "delivered_steps_per_s": steps / (loop_s + flush_s), "logged": logged}


def time_log_metric(tracker, steps: int) -> float:
    """ms per step of one synchronous log_metric call per metric."""
    client = tracker.client
    run_id = client.create_run(tracker.experiment_id, run_name="bench-log_metric").info.run_id
    start = time.perf_counter()
    for step in range(steps):
        for key, value in _metrics(step).items():
            client.log_metric(run_id, key, value, step=step)
    elapsed = time.perf_counter() - start
    client.set_terminated(run_id)
    return elapsed / steps * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--paced-steps", type=int, default=5_000)
    parser.add_argument("--naive-steps", type=int, default=200)
    args = parser.parse_args()

    from tracker import Tracker
    from tracker.environment import fingerprint

    fp = fingerprint.capture()
    with services() as env, tempfile.TemporaryDirectory(prefix="draftboard-bench-") as home:
        os.environ["MLFLOW_TRACKING_USERNAME"] = env["DRAFTBOARD_TEST_ADMIN_USER"]
        os.environ["MLFLOW_TRACKING_PASSWORD"] = env["DRAFTBOARD_TEST_ADMIN_PASSWORD"]
        embedded = Tracker(f"sqlite:///{Path(home) / 'draftboard.db'}")
        server = Tracker(env["DRAFTBOARD_TEST_SERVER_URI"], experiment=f"bench-{int(time.time())}")
        for tracker in (embedded, server):
            tracker.experiment_id  # create the store / experiment outside the timed parts
        n = calibrate(WORK_MS)
        paced = {"baseline": paced_loop(None, fp, args.paced_steps, n),
                 "embedded": paced_loop(embedded, fp, args.paced_steps, n),
                 "server": paced_loop(server, fp, args.paced_steps, n)}
        results = {"embedded": time_log_step(embedded, fp, args.steps),
                   "server": time_log_step(server, fp, args.steps)}
        naive_ms = time_log_metric(server, args.naive_steps)

    for name, ms in paced.items():
        print(f"paced loop, {name:8}: {ms:.4f} ms/step ({args.paced_steps} steps of pure-Python work"
              f"{'' if name == 'baseline' else ' + log_step'}; {ms / paced['baseline']:.3f}x the baseline)")
    for name, r in results.items():
        print(f"{name:8} log_step: {r['loop_ms']:.4f} ms/step in the loop ({args.steps} steps x 4 metrics, "
              f"{r['loop_s']:.2f} s); flush at the end {r['flush_s']:.2f} s; delivered "
              f"{r['delivered_steps_per_s']:.0f} steps/s ({4 * r['delivered_steps_per_s']:.0f} metrics/s); "
              f"{r['logged']}/{args.steps} 'loss' values stored")
    print(f"server   log_metric: {naive_ms:.3f} ms/step ({args.naive_steps} steps x 4 synchronous calls)")
    e, s = results["embedded"], results["server"]
    ratios = {
        "server_vs_embedded_paced_loop": round(paced["embedded"] / paced["server"], 3),
        "server_vs_embedded_delivered": round(s["delivered_steps_per_s"] / e["delivered_steps_per_s"], 3),
        "log_step_vs_log_metric_on_server": round(naive_ms / s["loop_ms"], 1),
    }
    ok = all(ratios[k] >= TARGETS[k] for k in TARGETS) and all(r["logged"] == args.steps for r in results.values())
    print(json.dumps({"benchmark": "server_logging", "ratios": ratios, "targets": TARGETS, "ok": ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
