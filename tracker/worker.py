"""`draftboard worker`: claims queued jobs and runs each one's argv as a local subprocess.

One thread per running job supervises its process: it heartbeats, watches for a cancel
request, and records the outcome; a second thread per job copies the output to the job's
log file line by line and records the progress lines of `tracker.events`. Jobs run in their
own process group (session), so a cancel reaches whatever the eval started, and the worker,
not the terminal's Ctrl-C, decides how a job ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Iterator

from sqlalchemy.exc import SQLAlchemyError

from tracker import events
from tracker.errors import DraftboardError
from tracker.jobs import CANCELLED, FAILED, RUNNING, SUCCEEDED, Job, JobQueue, home_dir

log = logging.getLogger(__name__)

# Output lines (protocol lines excluded) quoted in a failed job's error.
ERROR_TAIL_LINES = 20
# Progress writes per job are throttled to this interval, except stage changes and
# completion: a harness reporting every token must not keep the queue's write lock busy.
PROGRESS_MIN_INTERVAL_S = 0.25
# How often a job's supervisor looks for its process exiting or the worker stopping.
TICK_S = 0.05
# After a job's process exits, how long its output may take to drain before leftover
# processes still holding the pipe are killed.
DRAIN_S = 5.0

# How a job's supervision ended.
_EXITED, _CANCELLED, _LOST, _ABORTED = "exited", "cancelled", "lost", "aborted"


def make_worker_id() -> str:
    """hostname:pid:random, unique even for two workers started in one process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def run_worker(
    queue_uri: str | None = None,
    slots: int = 1,
    poll_s: float = 1.0,
    heartbeat_s: float = 5.0,
    stale_s: float = 60.0,
    log_dir: str | os.PathLike | None = None,
    once: bool = False,
    stop_event: threading.Event | None = None,
    grace_s: float = 10.0,
) -> int:
    """Run queued jobs, up to `slots` at a time, until stop_event is set; return how many ran.

    Each round fails jobs of other workers that stopped heartbeating for stale_s, then
    claims jobs for the free slots. once=True returns as soon as no job is queued and
    none of this worker's jobs is running. A cancel request stops a job's process group
    with SIGTERM, then SIGKILL after grace_s. When the worker stops (stop_event, SIGTERM
    in the main thread, Ctrl-C) its running jobs are stopped the same way and marked failed.
    Logs go to log_dir (default <DRAFTBOARD_HOME>/logs) as job-<id>.log.
    """
    if slots < 1:
        raise DraftboardError(f"a worker needs at least one slot, got {slots}")
    if not 0 < heartbeat_s < stale_s:
        raise DraftboardError(
            f"heartbeat interval ({heartbeat_s} s) must be positive and shorter than the stale timeout "
            f"({stale_s} s), or healthy jobs would be failed as stale"
        )
    queue = JobQueue(queue_uri)
    logs = Path(log_dir) if log_dir is not None else home_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    worker_id = make_worker_id()
    stop = stop_event or threading.Event()
    wake = threading.Event()  # set when a job ends, so its slot is refilled at once
    runners: list[_JobRunner] = []
    claimed = 0
    log.info("worker %s: %d slot(s) on %s", worker_id, slots, queue.uri)
    with _stop_on_sigterm(stop, wake):
        try:
            while not stop.is_set():
                wake.clear()
                runners = [r for r in runners if not r.done.is_set()]
                try:
                    for job in queue.fail_stale(stale_s):
                        log.warning("job %d failed: %s", job.id, job.error)
                    while len(runners) < slots and (job := queue.claim(worker_id)) is not None:
                        log.info("job %d (%s) claimed", job.id, job.kind)
                        runner = _JobRunner(queue, job, worker_id, logs, heartbeat_s, grace_s, wake)
                        runner.start()
                        runners.append(runner)
                        claimed += 1
                except SQLAlchemyError as exc:
                    # A locked or restarting database must not take the worker down with its jobs.
                    log.warning("job queue unavailable (%s); retrying in %.1f s", exc, poll_s)
                if once and not runners:
                    break
                wake.wait(poll_s)
        finally:
            for runner in runners:
                runner.abort()
            for runner in runners:
                runner.join()
    return claimed


@contextlib.contextmanager
def _stop_on_sigterm(stop: threading.Event, wake: threading.Event) -> Iterator[None]:
    """Turn SIGTERM (systemd, docker stop) into a clean stop; only the main thread can."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum, _frame) -> None:
        stop.set()
        wake.set()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: the previous handler was not installed from Python; the default is the closest.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


class _OutputPump(threading.Thread):
    """Copies a job's output into its log file and records the protocol lines it carries."""

    def __init__(self, stream: IO[str], log_file: IO[str], queue: JobQueue, job_id: int) -> None:
        # Daemon: a pipe held open by a process that escaped the job's group must not keep
        # the worker alive at exit.
        super().__init__(name=f"job-{job_id}-output", daemon=True)
        self._stream, self._log_file, self._queue, self._job_id = stream, log_file, queue, job_id
        self._lock = threading.Lock()
        self._tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)
        self._run_id: str | None = None
        self._stage: str | None = None
        self._last_write = float("-inf")

    def run(self) -> None:
        with self._log_file, self._stream:
            for line in self._stream:
                self._log_file.write(line)
                self._log_file.flush()  # the dashboard tails this file while the job runs
                event = events.parse_event(line)
                if event is None:
                    with self._lock:
                        self._tail.append(line.rstrip("\n"))
                else:
                    self._record(event)

    def tail(self) -> list[str]:
        with self._lock:
            return list(self._tail)

    def run_id(self) -> str | None:
        with self._lock:
            return self._run_id

    def _record(self, event: dict) -> None:
        if event["event"] == events.RESULT:
            run_id = event.get("run_id")
            with self._lock:
                self._run_id = run_id if isinstance(run_id, str) and run_id else None
            return
        if event["event"] != events.PROGRESS:
            return
        fraction = events.progress_fraction(event)
        if fraction is None:
            return
        stage = str(event.get("stage") or "") or None
        now = time.monotonic()
        if stage == self._stage and fraction < 1.0 and now - self._last_write < PROGRESS_MIN_INTERVAL_S:
            return
        self._stage, self._last_write = stage, now
        try:
            self._queue.update_progress(self._job_id, fraction, stage)
        except SQLAlchemyError as exc:
            log.warning("job %d: progress not recorded (%s)", self._job_id, exc)


class _JobRunner(threading.Thread):
    """Runs one claimed job to its end and records the outcome."""

    def __init__(self, queue: JobQueue, job: Job, worker_id: str, log_dir: Path,
                 heartbeat_s: float, grace_s: float, on_done: threading.Event) -> None:
        super().__init__(name=f"job-{job.id}")
        self._queue, self._job, self._worker_id = queue, job, worker_id
        self._log_path = (log_dir / f"job-{job.id}.log").resolve()
        self._heartbeat_s, self._grace_s = heartbeat_s, grace_s
        self._on_done = on_done
        self._abort = threading.Event()
        self.done = threading.Event()  # set before the thread exits: its slot is free

    def abort(self) -> None:
        """Stop the job's process (SIGTERM, then SIGKILL after the grace period) and fail the job."""
        self._abort.set()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the job must not stay "running" because of a worker bug
            log.exception("job %d: worker error", self._job.id)
            self._finish(FAILED, error=f"worker {self._worker_id} error: {exc}")
        finally:
            self.done.set()
            self._on_done.set()

    def _run(self) -> None:
        job = self._job
        log_file = open(self._log_path, "w", encoding="utf-8")
        log_file.write(f"[draftboard] job {job.id} ({job.kind}) on worker {self._worker_id}: "
                       f"{json.dumps(job.command)}\n")
        log_file.flush()
        try:
            proc = subprocess.Popen(
                job.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                encoding="utf-8",
                errors="replace",
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # lines reach the log as printed
            )
        except (OSError, ValueError) as exc:
            message = f"cannot start {job.command[0]}: {exc}"
            log_file.write(f"[draftboard] {message}\n")
            log_file.close()
            self._queue.attach_process(job.id, self._worker_id, None, str(self._log_path))
            self._finish(FAILED, error=message)
            return
        pump = _OutputPump(proc.stdout, log_file, self._queue, job.id)
        pump.start()
        try:
            self._queue.attach_process(job.id, self._worker_id, proc.pid, str(self._log_path))
            outcome, killed = self._supervise(proc)
        except BaseException:
            _terminate(proc, self._grace_s)  # a job recorded as failed must not keep running
            raise
        pump.join(DRAIN_S)
        if pump.is_alive():
            _signal_group(proc, signal.SIGKILL)
            pump.join(DRAIN_S)
        self._record(outcome, killed, proc.returncode, pump)

    def _supervise(self, proc: subprocess.Popen) -> tuple[str, bool]:
        """Wait for the process while heartbeating; (outcome, whether SIGKILL was needed)."""
        next_beat = time.monotonic() + self._heartbeat_s
        while True:
            try:
                proc.wait(timeout=TICK_S)
                return _EXITED, False
            except subprocess.TimeoutExpired:
                pass
            if self._abort.is_set():
                return _ABORTED, _terminate(proc, self._grace_s)
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + self._heartbeat_s
            try:
                job = self._queue.heartbeat(self._job.id, self._worker_id)
            except SQLAlchemyError as exc:
                log.warning("job %d: heartbeat failed (%s)", self._job.id, exc)
                continue
            if job.state != RUNNING or job.worker_id != self._worker_id:
                return _LOST, _terminate(proc, self._grace_s)
            if job.cancel_requested:
                return _CANCELLED, _terminate(proc, self._grace_s)

    def _record(self, outcome: str, killed: bool, returncode: int, pump: _OutputPump) -> None:
        job_id = self._job.id
        kill_note = f"; killed with SIGKILL after {self._grace_s:g} s grace" if killed else ""
        if outcome == _LOST:
            # Another worker failed it as stale; its record already says why.
            log.warning("job %d was taken from this worker; its process was stopped", job_id)
        elif outcome == _CANCELLED:
            self._finish(CANCELLED, error=f"cancelled on request{kill_note}")
        elif outcome == _ABORTED:
            self._finish(FAILED, error=f"worker {self._worker_id} stopped while the job ran{kill_note}")
        elif returncode == 0:
            self._finish(SUCCEEDED, mlflow_run_id=pump.run_id())
        else:
            lines = "\n".join(pump.tail())
            self._finish(FAILED, error=f"{_describe_exit(returncode)}; last output:\n{lines}")

    def _finish(self, state: str, error: str | None = None, mlflow_run_id: str | None = None) -> None:
        try:
            job = self._queue.finish(self._job.id, state, error=error, mlflow_run_id=mlflow_run_id)
        except (DraftboardError, SQLAlchemyError) as exc:  # e.g. failed as stale during a database outage
            log.warning("job %d: outcome %s not recorded: %s", self._job.id, state, exc)
            return
        log.info("job %d %s", job.id, job.state)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    # The job leads its own session, so its process group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _terminate(proc: subprocess.Popen, grace_s: float) -> bool:
    """SIGTERM the job's process group, SIGKILL it after grace_s; True if SIGKILL was needed."""
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
        return False
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
        return True
