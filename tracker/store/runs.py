"""Training and eval runs: how a draftboard run starts, records, and ends in MLflow.

Every run is created with its kind, target and environment tags and its
`fingerprint.json` before anything else is logged, so even a run that crashes in
its first step says where it ran. Runs are context managers, started when created
(like `open()`): leaving the block ends the run FINISHED, an exception ends it
FAILED with the error in the `draftboard.error` tag and is re-raised.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag

from tracker.errors import DraftboardError
from tracker.store import checkpoints, names
from tracker.store.checkpoints import Checkpoint
from tracker.store.retry import RetryPolicy, call_with_retry
from tracker.store.steps import MAX_METRICS_PER_BATCH, MetricChecker, StepFlusher, check_step

log = logging.getLogger(__name__)

_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
_MAX_PARAM_VALUE = 6000  # MLflow's param value limit
_MAX_ERROR_CHARS = 1000


@dataclass(frozen=True)
class StoreContext:
    """What a run needs from its Tracker: the client, where to create runs, how to retry."""

    client: MlflowClient
    experiment_id: str
    where: str  # the tracking URI, for error messages
    retry: RetryPolicy


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts become dotted keys; values become strings cut to MLflow's 6000 characters."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, f"{name}."))
        else:
            text = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else str(value)
            out[name] = text if len(text) <= _MAX_PARAM_VALUE else text[: _MAX_PARAM_VALUE - 3] + "..."
    return out


def describe_error(exc: BaseException) -> str:
    """`Type: message` on one tag, cut to a readable length."""
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


class _Run:
    """A started MLflow run with draftboard's start and end protocol."""

    def __init__(
        self,
        store: StoreContext,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
        fp: dict | None,
        start_time: int | None = None,
    ) -> None:
        from tracker import fingerprint  # imported late: capture() pulls in torch

        if fp is None:
            fp = fingerprint.capture()
        self._store = store
        self._client = store.client
        self._closed = False
        all_tags = {**fingerprint.env_tags(fp), **tags}
        try:
            # start_time (ms): when the work began, for runs logged once it is done (an eval).
            run = self._client.create_run(store.experiment_id, run_name=name, tags=all_tags, start_time=start_time)
        except Exception as exc:
            raise DraftboardError(f"cannot create run {name!r} in {store.where}: {exc}") from exc
        self.run_id: str = run.info.run_id
        self.artifact_uri: str = run.info.artifact_uri
        try:
            flat = [Param(k, v) for k, v in flatten_params(params).items()]
            for i in range(0, len(flat), _MAX_PARAMS_PER_BATCH):
                self._client.log_batch(self.run_id, params=flat[i : i + _MAX_PARAMS_PER_BATCH], synchronous=True)
            self._client.log_dict(self.run_id, fp, names.FINGERPRINT_ARTIFACT)
        except BaseException as exc:  # Ctrl-C included: a created run never stays RUNNING
            self._end_failed(exc)
            if not isinstance(exc, Exception):
                raise
            raise DraftboardError(f"cannot start run {name!r} in {store.where}: {exc}") from exc

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(exc)
        return False

    def close(self, error: BaseException | None = None) -> None:
        """Flush, then end the run: FINISHED, or FAILED with `error` recorded. Idempotent."""
        if self._closed:
            return
        self._closed = True
        flush_error: DraftboardError | None = None
        try:
            self._flush()
        except DraftboardError as exc:
            flush_error = exc
        except BaseException as exc:  # a second Ctrl-C while flushing: still end the run, FAILED
            self._end_failed(error or exc)
            raise
        failure = error or flush_error
        try:
            self._end(RunStatus.FINISHED if failure is None else RunStatus.FAILED, failure)
        except Exception as exc:
            if failure is None:
                raise DraftboardError(f"cannot end run {self.run_id} in {self._store.where}: {exc}") from exc
            log.warning("could not mark run %s FAILED: %s", self.run_id, exc)
        if flush_error is not None:
            if error is None:
                raise flush_error
            log.warning("run %s: %s", self.run_id, flush_error)

    def _flush(self) -> None:
        """Send what the run buffers; subclasses without a buffer have nothing to do."""

    def _end(self, status: int, error: BaseException | None) -> None:
        def send() -> None:
            if error is not None:
                self._client.set_tag(self.run_id, names.ERROR, describe_error(error))
            self._client.set_terminated(self.run_id, RunStatus.to_string(status))

        call_with_retry(send, self._store.retry, f"ending run {self.run_id}")

    def _end_failed(self, error: BaseException) -> None:
        """End the run FAILED; if the store is gone by now, warn: `error` is the one to report."""
        try:
            self._end(RunStatus.FAILED, error)
        except Exception as exc:
            log.warning("could not mark run %s FAILED: %s", self.run_id, exc)

    def _check_open(self) -> None:
        if self._closed:
            raise DraftboardError(f"run {self.run_id} is closed; log inside its `with` block")

    def _send(self, fn, what: str) -> None:
        """fn under the store's retry policy; a failure becomes one DraftboardError saying what failed.

        (A raw OSError from a full disk or an unwritable artifact directory would otherwise
        reach the caller, e.g. `draftboard eval`, as a traceback instead of an `error:` line.)
        """
        try:
            call_with_retry(fn, self._store.retry, what)
        except DraftboardError:
            raise
        except Exception as exc:
            raise DraftboardError(f"{what} failed: {describe_error(exc)}") from exc

    def log_json(self, artifact_name: str, obj: Any) -> None:
        """Store obj as a JSON artifact (e.g. `eval_results.json`)."""
        self._check_open()
        try:
            text = json.dumps(obj, indent=2)
        except (TypeError, ValueError) as exc:
            raise DraftboardError(f"{artifact_name}: object is not JSON-serializable ({exc})") from exc
        self._send(lambda: self._client.log_text(self.run_id, text, artifact_name),
                   f"writing {artifact_name} to {self.artifact_uri}")

    def log_file(self, path: str | Path, artifact_path: str) -> None:
        """Keep a file as an artifact under `artifact_path` (an imported run's console, say)."""
        self._check_open()
        self._send(lambda: self._client.log_artifact(self.run_id, str(path), artifact_path),
                   f"copying {Path(path).name} to {self.artifact_uri}")


class TrainingRun(_Run):
    """A training run: `log_step` is buffered (see steps.py), `log_checkpoint` is written at once.

    `max_pending_steps` bounds the buffer: `log_step` then waits for the store instead of
    growing it. A training loop leaves it unbounded (it must never wait); a log import sets it,
    since it produces steps far faster than any store takes them.
    """

    def __init__(
        self,
        store: StoreContext,
        name: str,
        params: Mapping[str, Any],
        target: str | None,
        *,
        tags: Mapping[str, str] | None = None,
        fingerprint: dict | None = None,
        max_pending_steps: int | None = None,
    ) -> None:
        run_tags = {**(tags or {}), names.KIND: "train"}
        if target is not None:
            run_tags[names.TARGET] = str(target)
        super().__init__(store, name, run_tags, params, fingerprint)
        self._checker = MetricChecker()
        self._checkpoint_steps: set[int] = set()
        run_id = self.run_id
        client = self._client
        self._flusher = StepFlusher(
            lambda batch: client.log_batch(run_id, metrics=batch, synchronous=True),
            store.retry,
            where=store.where,
            max_pending=max_pending_steps,
        )

    def log_step(self, step: int, **metrics: float) -> None:
        """Queue the metrics of one training step; returns without touching the store."""
        self._checker.check(metrics)
        self._flusher.add(check_step(step), metrics)

    def log_checkpoint(self, path: str | Path, step: int) -> Checkpoint:
        """Digest the checkpoint file/directory and register it on the run durably."""
        self._check_open()
        record = checkpoints.describe(path, check_step(step))
        self._checkpoint_steps.add(record.step)
        count = str(len(self._checkpoint_steps))

        def send() -> None:
            self._client.log_dict(self.run_id, record.to_dict(), record.artifact_file)
            self._client.log_batch(self.run_id, tags=[
                RunTag(names.CHECKPOINT_COUNT, count),
                RunTag(names.checkpoint_digest_tag(record.sha256), str(record.step))], synchronous=True)

        self._send(send, f"registering checkpoint {record.path} in {self.artifact_uri}")
        return record

    def _flush(self) -> None:
        self._flusher.close()


class EvalRun(_Run):
    """An eval or reference run; everything it logs is sent at once (evals log little)."""

    def __init__(
        self,
        store: StoreContext,
        name: str,
        *,
        target: str,
        train_run_id: str | None = None,
        checkpoint: str | Path | Checkpoint | None = None,
        checkpoint_step: int | None = None,
        params: Mapping[str, Any] | None = None,
        fingerprint: dict | None = None,
        kind: str = "eval",
        reference_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        start_time: int | None = None,
    ) -> None:
        if kind not in ("eval", "reference"):
            raise DraftboardError(f"eval run kind must be 'eval' or 'reference', got {kind!r}")
        run_tags = {**(tags or {}), names.KIND: kind, names.TARGET: str(target)}
        if isinstance(checkpoint, Checkpoint):
            run_tags[names.CHECKPOINT_SHA256] = checkpoint.sha256
            checkpoint_step = checkpoint.step if checkpoint_step is None else checkpoint_step
            checkpoint = checkpoint.path
        optional = {
            names.TRAIN_RUN_ID: train_run_id,
            names.CHECKPOINT: None if checkpoint is None else str(checkpoint),
            names.CHECKPOINT_STEP: None if checkpoint_step is None else str(check_step(checkpoint_step)),
            names.REFERENCE_NAME: reference_name,
        }
        run_tags.update({k: v for k, v in optional.items() if v is not None})
        super().__init__(store, name, run_tags, params or {}, fingerprint, start_time)
        self._checker = MetricChecker()

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log summary metrics (at `step`, default 0)."""
        self._check_open()
        self._checker.check(metrics)
        at = 0 if step is None else check_step(step)
        timestamp = time.time_ns() // 1_000_000
        batch = [Metric(k, float(v), timestamp, at) for k, v in metrics.items()]
        for i in range(0, len(batch), MAX_METRICS_PER_BATCH):
            chunk = batch[i : i + MAX_METRICS_PER_BATCH]
            self._send(
                lambda: self._client.log_batch(self.run_id, metrics=chunk, synchronous=True),
                f"logging metrics to {self._store.where}",
            )

    def log_table(self, artifact_name: str, rows: list[dict]) -> None:
        """Store rows as an MLflow table artifact (viewable in the MLflow UI's evaluation tab)."""
        self._check_open()
        if not artifact_name.endswith(".json"):
            raise DraftboardError(f"table artifact name must end with .json, got {artifact_name!r}")
        if not all(isinstance(row, Mapping) for row in rows):
            raise DraftboardError(f"{artifact_name}: rows must be a list of dicts")
        import pandas as pd  # only needed here; it is slow to import

        frame = pd.DataFrame.from_records(list(rows))
        self._send(lambda: self._client.log_table(self.run_id, data=frame, artifact_file=artifact_name),
                   f"writing {artifact_name} to {self.artifact_uri}")
