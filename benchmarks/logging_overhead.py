"""What per-step metric logging costs the training loop: buffered `log_step` vs `log_metric`.

Both variants write to the same fresh sqlite store in a temp dir, in one process.
`log_step` (4 metrics a step, 20,000 steps) is timed as the loop sees it; the
end-of-run flush that follows is timed separately. The naive variant calls
`MlflowClient.log_metric` once per metric, synchronously, on fewer steps (300):
its cost per step does not depend on the step count.

    python benchmarks/logging_overhead.py
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout

from mlflow import MlflowClient  # noqa: E402

from tracker import Tracker  # noqa: E402
from tracker import fingerprint  # noqa: E402

BUFFERED_STEPS = 20_000
NAIVE_STEPS = 300
TARGET_RATIO = 20
STEP_MS_BOUND = 0.2  # what a loop step may cost on an idle box: said in words, not a pass/fail (seconds vary)


def _metrics(step: int) -> dict[str, float]:
    return {"loss": 1.0 / (step + 1), "acc": (step % 100) / 100, "streak": math.log1p(step), "lr": 1e-4}


def time_log_step(tracker: Tracker, fp: dict) -> tuple[float, float, str]:
    """(seconds in the log_step loop, seconds to flush and end the run, run id)."""
    with tracker.training_run("bench-log_step", {}, "bench", fingerprint=fp) as run:
        start = time.perf_counter()
        for step in range(BUFFERED_STEPS):
            run.log_step(step, **_metrics(step))
        loop_end = time.perf_counter()
    return loop_end - start, time.perf_counter() - loop_end, run.run_id


def time_log_metric(tracker: Tracker) -> float:
    """Seconds for NAIVE_STEPS steps of one synchronous log_metric call per metric."""
    client = tracker.client
    run_id = client.create_run(tracker.experiment_id, run_name="bench-log_metric").info.run_id
    start = time.perf_counter()
    for step in range(NAIVE_STEPS):
        for key, value in _metrics(step).items():
            client.log_metric(run_id, key, value, step=step)
    elapsed = time.perf_counter() - start
    client.set_terminated(run_id)
    return elapsed


def main() -> None:
    fp = fingerprint.capture()
    with tempfile.TemporaryDirectory(prefix="draftboard-bench-") as home:
        tracker = Tracker(f"sqlite:///{Path(home) / 'draftboard.db'}")
        tracker.experiment_id  # create the store (migrations) outside the timed parts
        naive_s = time_log_metric(tracker)
        loop_s, flush_s, run_id = time_log_step(tracker, fp)
        logged = len(MlflowClient(tracking_uri=tracker.uri).get_metric_history(run_id, "loss"))

    step_ms = loop_s / BUFFERED_STEPS * 1e3
    step_with_flush_ms = (loop_s + flush_s) / BUFFERED_STEPS * 1e3
    naive_ms = naive_s / NAIVE_STEPS * 1e3
    ratio = naive_ms / step_ms
    print(f"log_step   : {step_ms:.4f} ms/step in the loop ({BUFFERED_STEPS} steps x 4 metrics, {loop_s:.3f} s)")
    print(f"             end-of-run flush {flush_s:.3f} s; {step_with_flush_ms:.4f} ms/step including it")
    print(f"             {logged}/{BUFFERED_STEPS} 'loss' values in the store after the run")
    print(f"log_metric : {naive_ms:.4f} ms/step ({NAIVE_STEPS} steps x 4 metrics, {naive_s:.3f} s)")
    print(f"log_step is {ratio:.1f}x cheaper per step ({naive_ms / step_with_flush_ms:.1f}x counting the flush)")
    print(f"             {'within' if step_ms < STEP_MS_BOUND else 'above'} the {STEP_MS_BOUND} ms a step may cost "
          "on an idle box")
    ok = ratio >= TARGET_RATIO and logged == BUFFERED_STEPS
    print(json.dumps({"benchmark": "logging_overhead", "ratios": {"log_step_vs_log_metric": round(ratio, 1)},
                      "targets": {"log_step_vs_log_metric": TARGET_RATIO}, "ok": ok}))


if __name__ == "__main__":
    main()
