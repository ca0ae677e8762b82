"""What every launcher shares: the Launcher and Execution interfaces, and a job's output.

The worker (`tracker.jobs.worker`) owns everything about the queue: claiming, heartbeats, cancel
requests, stale jobs, recording the outcome. A launcher only starts an argv the worker built
from the job's params (`tracker.jobs.eval_job`) somewhere and hands back an `Execution` the
worker can wait on, stop, and ask how it ended. Every launcher copies the job's output into its
log file through a `JobOutput`, which also records the progress and result lines of
`tracker.events`, so a Ray job's log, progress and MLflow run id land in the queue exactly as
a local job's do.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import IO, Mapping, Sequence

from sqlalchemy.exc import SQLAlchemyError

from tracker import events, redact
from tracker.errors import DraftboardError
from tracker.jobs.queue import Job, JobQueue

log = logging.getLogger(__name__)

# Output lines (protocol lines excluded) quoted in a failed job's error.
ERROR_TAIL_LINES = 20
# Progress writes per job are throttled to this interval, except stage changes and
# completion: a harness reporting every token must not keep the queue's write lock busy.
PROGRESS_MIN_INTERVAL_S = 0.25
# After a job ends, how long its output may take to reach the log before the worker moves on
# (locally: before leftover processes still holding the pipe are killed).
DRAIN_S = 5.0


def cli_entry(python: str) -> list[str]:
    """The command that runs `draftboard`'s CLI with the interpreter python."""
    return [python, "-m", "tracker.cli"]


class LaunchError(DraftboardError):
    """The job could not be started; the message says why (it becomes the job's error)."""


class JobOutput:
    """A job's log file plus what the worker reads from its output lines.

    Ordinary lines go to the log and to a short tail (quoted in a failed job's error); protocol
    lines (`tracker.events`) go to the log and update the queue's progress or the run id.
    """

    def __init__(self, log_file: IO[str], queue: JobQueue, job_id: int) -> None:
        self._log_file, self._queue, self._job_id = log_file, queue, job_id
        self._lock = threading.Lock()
        self._tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)
        self._run_id: str | None = None
        self._stage: str | None = None
        self._last_write = float("-inf")
        self._held: tuple[float, str | None] | None = None  # a throttled progress update

    def note(self, text: str) -> None:
        """A line of the worker's own (`[draftboard] ...`), in the log only."""
        with self._lock:
            if not self._log_file.closed:
                self._log_file.write(f"[draftboard] {text}\n")
                self._log_file.flush()

    def feed(self, line: str) -> None:
        """One line of the job's output (with or without its newline)."""
        if not line.endswith("\n"):
            line += "\n"
        with self._lock:
            if not self._log_file.closed:
                self._log_file.write(line)
                self._log_file.flush()  # the dashboard tails this file while the job runs
        # A protocol line can arrive glued to the end of a tqdm redraw: the eval's stdout and
        # stderr share the stream, and tqdm ends its bar with no newline.
        at = line.find(events.PREFIX)
        event = events.parse_event(line[at:]) if at >= 0 else None
        text = line if event is None else line[:at]
        if text.strip():
            with self._lock:
                self._tail.append(text.rstrip("\n"))
        if event is not None:
            self._record(event)

    def flush_progress(self) -> None:
        """Write the last progress update the throttle held back (after a batch of lines)."""
        held, self._held = self._held, None
        if held is not None:
            self._write_progress(*held)

    def close(self) -> None:
        with self._lock:
            self._log_file.close()

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
        if stage == self._stage and fraction < 1.0 and time.monotonic() - self._last_write < PROGRESS_MIN_INTERVAL_S:
            self._held = (fraction, stage)
            return
        self._write_progress(fraction, stage)

    def _write_progress(self, fraction: float, stage: str | None) -> None:
        self._stage, self._last_write, self._held = stage, time.monotonic(), None
        try:
            self._queue.update_progress(self._job_id, fraction, stage)
        except SQLAlchemyError as exc:
            log.warning("job %d: progress not recorded (%s)", self._job_id, exc)


class Execution(ABC):
    """One started job, as the worker's supervisor sees it."""

    #: the local process id recorded in the queue (None where the job runs elsewhere)
    pid: int | None = None

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait up to timeout seconds; True once the job has ended."""

    @abstractmethod
    def stop(self, grace_s: float) -> str:
        """Stop the job and wait for it to end; a note for the job's error ("" if nothing to add)."""

    @abstractmethod
    def drain(self) -> None:
        """After the job ended: let its remaining output reach the log, then close the log."""

    @abstractmethod
    def outcome(self) -> tuple[str, str | None]:
        """How a job that ended by itself ended: (SUCCEEDED | FAILED | CANCELLED, why, or None)."""


class Launcher(ABC):
    """Starts claimed jobs. One launcher serves all of a worker's slots (thread-safe)."""

    name: str

    def __init__(self, entry: Sequence[str] | None = None) -> None:
        self.entry = list(entry) if entry else cli_entry(sys.executable)

    def command(self, args: Sequence[str]) -> list[str]:
        """The argv that runs a job: this launcher's entry, then the job's arguments (`eval ...`)."""
        return [*self.entry, *args]

    def describe(self) -> str:
        return self.name

    def unavailable(self) -> str | None:
        """Why no job should be claimed now (e.g. the cluster is unreachable), or None."""
        return None

    def devices(self) -> list[str] | None:
        """The devices its jobs can use (`cpu`, `cuda`), for the Launch form; None: jobs run elsewhere."""
        return None

    def prepare(self) -> None:
        """Get ready for the first job now, before one is claimed (the local one's warm process)."""

    def close(self) -> None:
        """Release what the launcher keeps between jobs (the local one's warm process)."""

    def header(self, argv: Sequence[str]) -> str:
        """The first line of the job's log: what runs (credentials hidden: `tracker.redact`)."""
        return redact.text(json.dumps(list(argv)))

    @abstractmethod
    def launch(self, job: Job, argv: list[str], output: JobOutput, env: Mapping[str, str] | None = None) -> Execution:
        """Start argv (built by the worker from the job's params) for job, with `env` added to its environment
        (the GPUs a local worker gave it: tracker.jobs.gpus); raise LaunchError with the reason when it cannot
        start."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
