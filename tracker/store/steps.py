"""Per-step metric buffer with a background flusher.

The training loop must not wait on the tracking store: `StepFlusher.add` only
validates and appends to an in-memory queue, and one background thread turns the
queue into `MlflowClient.log_batch` calls of at most 1000 metrics (MLflow's limit).
A single thread sending batches strictly one after another keeps the logged order;
a failed batch is kept and retried (see `retry.py`) before anything later is sent.
MLflow's stores ignore an exact duplicate (key, step, timestamp, value), so a batch
resent after a lost response is not logged twice.
"""

from __future__ import annotations

import collections
import numbers
import posixpath
import re
import threading
import time
from typing import Callable, Mapping

from mlflow.entities import Metric

from tracker.errors import DraftboardError
from tracker.store.retry import RetryPolicy, call_with_retry, is_transient

MAX_METRICS_PER_BATCH = 1000

# MLflow's rule for metric names (mlflow.utils.validation): checked here, in the
# caller's frame, because a bad name found by the flusher could only fail later.
_NAME_CHARS = re.compile(r"^[/\w.\- :]+$")
_MAX_NAME_LENGTH = 250


def check_step(step: object) -> int:
    """The step as an int; DraftboardError unless it is a non-negative integer."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise DraftboardError(f"step must be an integer >= 0, got {step!r}")
    return int(step)


class MetricChecker:
    """Validates metric dicts; remembers names already accepted so the hot path is a set lookup."""

    def __init__(self) -> None:
        self._known: set[str] = set()

    def check(self, metrics: Mapping[str, object]) -> None:
        for name, value in metrics.items():
            if name not in self._known:
                self._check_name(name)
                self._known.add(name)
            if type(value) is not float and (
                isinstance(value, bool) or not isinstance(value, numbers.Real)
            ):
                hint = "; call .item() on tensors" if hasattr(value, "item") else ""
                raise DraftboardError(
                    f"metric {name!r} must be a number, got {type(value).__name__} {value!r:.60}{hint}"
                )

    @staticmethod
    def _check_name(name: object) -> None:
        if (
            not isinstance(name, str)
            or len(name) > _MAX_NAME_LENGTH
            or not _NAME_CHARS.match(name)
            or posixpath.normpath(name) != name
            or name.startswith(("/", ".."))
        ):
            raise DraftboardError(
                f"invalid metric name {name!r}: use letters, digits, '_', '-', '.', ' ', ':', '/' "
                f"(no leading '/', no '..', at most {_MAX_NAME_LENGTH} characters)"
            )


class StepFlusher:
    """Queue of (step, timestamp_ms, metrics) sent in order by one background thread.

    `send` receives lists of at most MAX_METRICS_PER_BATCH metrics. Once a batch has
    failed for longer than the retry window the flusher stops; `add` and `close`
    then raise DraftboardError saying how much was not sent. With `max_pending`, `add`
    waits while that many steps are queued, so memory stays bounded.
    """

    def __init__(
        self,
        send: Callable[[list[Metric]], None],
        retry: RetryPolicy,
        *,
        where: str,
        interval_s: float = 1.0,
        wake_after_steps: int = 1000,
        max_pending: int | None = None,
    ) -> None:
        self._send = send
        self._retry = retry
        self._where = where
        self._interval_s = interval_s
        self._wake_after = wake_after_steps if max_pending is None else min(wake_after_steps, max_pending)
        self._max_pending = max_pending
        self._queue: collections.deque[tuple[int, int, Mapping[str, float]]] = collections.deque()
        self._carry: list[Metric] = []  # metrics taken from the queue but not yet sent
        self._wake = threading.Event()
        self._sent = threading.Event()  # set after every batch, and when the thread stops
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="draftboard-flusher", daemon=True)
        self._thread.start()

    def add(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue one step; never blocks on the store."""
        if self._error is not None or self._closing:
            raise DraftboardError(self._closed_message())
        self._queue.append((step, time.time_ns() // 1_000_000, metrics))
        if len(self._queue) >= self._wake_after:
            self._wake.set()
        while self._max_pending is not None and len(self._queue) > self._max_pending and self._error is None:
            self._sent.wait(self._interval_s)
            self._sent.clear()

    def close(self) -> None:
        """Send everything queued, stop the thread; DraftboardError if some metrics were not sent."""
        self._closing = True
        self._wake.set()
        self._thread.join()
        if self._error is not None:
            raise DraftboardError(self._closed_message()) from self._error

    def _closed_message(self) -> str:
        if self._error is None:
            return "this run is closed; log steps inside its `with` block"
        unsent = len(self._carry) + sum(len(m) for _, _, m in self._queue)
        retried = f" (retried for {self._retry.window_s:g} s)" if is_transient(self._error) else ""
        return f"{unsent} metric values could not be sent to {self._where}{retried}: {self._error}"

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            closing = self._closing  # read before draining so nothing added before close is missed
            try:
                self._drain()
            except Exception as exc:  # reported to the training loop by add()/close()
                self._error = exc
                self._sent.set()
                return
            if closing:
                return

    def _drain(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                return
            call_with_retry(lambda: self._send(batch), self._retry, f"logging metrics to {self._where}")
            del self._carry[: len(batch)]
            self._sent.set()

    def _next_batch(self) -> list[Metric]:
        # A step with more metrics than fit in one batch is split; `_carry` keeps the rest
        # (and the batch in flight, so a failure leaves it there to be counted as unsent).
        while len(self._carry) < MAX_METRICS_PER_BATCH and self._queue:
            step, timestamp, metrics = self._queue.popleft()
            self._carry.extend(
                Metric(key, float(value), timestamp, step) for key, value in metrics.items()
            )
        return self._carry[:MAX_METRICS_PER_BATCH]
