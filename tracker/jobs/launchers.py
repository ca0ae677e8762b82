"""How `draftboard worker` runs a claimed job: as a local subprocess, or as a Ray job.

The worker (`tracker.jobs.worker`) owns everything about the queue: claiming, heartbeats, cancel
requests, stale jobs, recording the outcome. A launcher only starts the job's argv somewhere
and hands back an `Execution` the worker can wait on, stop, and ask how it ended; both kinds
copy the job's output into its log file through a `JobOutput`, which also records the
progress and result lines of `tracker.events`. So a Ray job's log, progress and MLflow run id
land in the queue exactly as a local job's do.

- `LocalLauncher`: the argv runs as a subprocess of the worker (never through a shell) in its
  own session; stopping it is SIGTERM to its process group, then SIGKILL after the grace period.
- `RayLauncher`: the argv is submitted through the Ray Jobs API (`JobSubmissionClient`) as a
  job requesting the GPUs its params ask for; the worker polls its status and logs, and
  stopping it is `stop_job` (Ray sends SIGTERM, then SIGKILL after its own
  RAY_JOB_STOP_WAIT_TIME_S). Ray runs entrypoints through `/bin/sh -c`, so the argv is quoted
  with `shlex.join`: every argument stays one literal word. See docs/RAY.md.

Ray is imported only when a RayLauncher is made, so the local path never needs it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import IO, Any, Mapping, Sequence

from sqlalchemy.exc import SQLAlchemyError

from tracker import events
from tracker.errors import DraftboardError
from tracker.jobs.queue import CANCELLED, FAILED, SUCCEEDED, Job, JobQueue

log = logging.getLogger(__name__)

LAUNCHERS = ("local", "ray")

# Output lines (protocol lines excluded) quoted in a failed job's error.
ERROR_TAIL_LINES = 20
# Progress writes per job are throttled to this interval, except stage changes and
# completion: a harness reporting every token must not keep the queue's write lock busy.
PROGRESS_MIN_INTERVAL_S = 0.25
# After a job ends, how long its output may take to reach the log before the worker moves on
# (locally: before leftover processes still holding the pipe are killed).
DRAIN_S = 5.0

DEFAULT_RAY_ADDRESS = "http://127.0.0.1:8265"
# Environment variables of the worker that a Ray job gets (runtime_env env_vars): where to
# log and the MLflow credentials. Prefixes, except the names in _RAY_ENV_EXCLUDED.
RAY_ENV_PREFIXES = ("MLFLOW_", "DRAFTBOARD_")
# The queue's URL may hold a database password and means nothing to the eval.
_RAY_ENV_EXCLUDED = frozenset({"DRAFTBOARD_JOBS_URI"})
# Ray's terminal job states.
_RAY_PENDING, _RAY_SUCCEEDED, _RAY_FAILED, _RAY_STOPPED = "PENDING", "SUCCEEDED", "FAILED", "STOPPED"
# How long a stop request waits for a PENDING Ray job to react before giving up on it.
PENDING_STOP_WAIT_S = 3.0
_RAY_TERMINAL = (_RAY_SUCCEEDED, _RAY_FAILED, _RAY_STOPPED)
# argv[0] of a job built by `tracker.jobs.queue.eval_command` is the submitting host's interpreter.
_PYTHON_NAME = re.compile(r"python[0-9.]*")


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

    def describe(self) -> str:
        return self.name

    def unavailable(self) -> str | None:
        """Why no job should be claimed now (e.g. the cluster is unreachable), or None."""
        return None

    def header(self, job: Job) -> str:
        """The first line of the job's log: what runs."""
        return json.dumps(job.command)

    @abstractmethod
    def launch(self, job: Job, output: JobOutput) -> Execution:
        """Start the job; raise LaunchError with the reason when it cannot start."""


# --------------------------------------------------------------------------- local


class LocalLauncher(Launcher):
    """Runs the job's argv as a subprocess of the worker, in its own session, never via a shell."""

    name = "local"

    def launch(self, job: Job, output: JobOutput) -> Execution:
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
                preexec_fn=_die_with_parent_hook(),
            )
        except (OSError, ValueError) as exc:
            raise LaunchError(f"cannot start {job.command[0]}: {exc}") from exc
        return _LocalExecution(proc, output, job.id)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent_hook():
    """A preexec_fn that has the kernel SIGKILL the job when its worker dies (Linux; else None).

    The job leads its own session, so a worker killed with SIGKILL (or OOM-killed) would leave it
    running as an orphan: still holding the GPU, and logging an MLflow run that its job, failed
    as stale by another worker, never links. The "parent" of PR_SET_PDEATHSIG is the thread that
    started the job, the job's runner thread, which lives until the job has ended. The hook only
    calls functions resolved before the fork (a preexec_fn must not import or take locks).
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent, sigkill = os.getpid(), int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        if os.getppid() != parent:  # the worker died between the fork and the prctl
            os.kill(os.getpid(), sigkill)

    return hook


@functools.cache
def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


class _OutputPump(threading.Thread):
    """Copies a local job's output, line by line, into its JobOutput."""

    def __init__(self, stream: IO[str], output: JobOutput, job_id: int) -> None:
        # Daemon: a pipe held open by a process that escaped the job's group must not keep
        # the worker alive at exit.
        super().__init__(name=f"job-{job_id}-output", daemon=True)
        self._stream, self._output = stream, output

    def run(self) -> None:
        try:
            with self._stream:
                for line in self._stream:
                    self._output.feed(line)
        finally:
            self._output.flush_progress()
            self._output.close()


class _LocalExecution(Execution):
    def __init__(self, proc: subprocess.Popen, output: JobOutput, job_id: int) -> None:
        self._proc, self.pid = proc, proc.pid
        self._pump = _OutputPump(proc.stdout, output, job_id)
        self._pump.start()

    def wait(self, timeout: float) -> bool:
        try:
            self._proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, grace_s: float) -> str:
        """SIGTERM the job's process group, SIGKILL it after grace_s."""
        _signal_group(self._proc, signal.SIGTERM)
        try:
            self._proc.wait(timeout=grace_s)
            return ""
        except subprocess.TimeoutExpired:
            _signal_group(self._proc, signal.SIGKILL)
            self._proc.wait()
            return f"killed with SIGKILL after {grace_s:g} s grace"

    def drain(self) -> None:
        self._pump.join(DRAIN_S)
        if self._pump.is_alive():
            _signal_group(self._proc, signal.SIGKILL)
            self._pump.join(DRAIN_S)

    def outcome(self) -> tuple[str, str | None]:
        returncode = self._proc.returncode
        return (SUCCEEDED, None) if returncode == 0 else (FAILED, describe_exit(returncode))


def describe_exit(returncode: int) -> str:
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


# --------------------------------------------------------------------------- Ray


def ray_entrypoint(argv: Sequence[str], python: str | None = "python") -> str:
    """The shell command line Ray runs for argv: every argument quoted, so it stays one literal word.

    The Jobs API runs entrypoints with `/bin/sh -c`; `shlex.join` makes `;`, `$(...)`, quotes
    and spaces in a name plain text. When python is given and argv[0] is a Python interpreter
    (`tracker.jobs.queue.eval_command` puts the submitting host's there), it is replaced by python:
    the cluster's interpreter, by default the first `python` on the node's PATH.
    """
    argv = [os.fspath(a) for a in argv]
    if not argv:
        raise DraftboardError("a job needs a command")
    if python and _PYTHON_NAME.fullmatch(os.path.basename(argv[0])):
        argv[0] = python
    return shlex.join(argv)


def ray_gpus(params: Mapping[str, Any], gpus_per_job: float = 1) -> float:
    """GPUs a job asks Ray for: gpus_per_job when its params say device=cuda, else none."""
    return gpus_per_job if params.get("device") == "cuda" else 0


def ray_env(environ: Mapping[str, str] | None = None, extra: Sequence[str] = ()) -> dict[str, str]:
    """The worker's variables a Ray job gets: MLFLOW_* and DRAFTBOARD_* (not the queue's URL),
    plus the names in extra that are set; PYTHONUNBUFFERED=1 so lines reach the log as printed.
    """
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith(RAY_ENV_PREFIXES) and k not in _RAY_ENV_EXCLUDED}
    env.update({k: environ[k] for k in extra if k in environ})
    env["PYTHONUNBUFFERED"] = "1"
    return env


class RayLauncher(Launcher):
    """Submits each job to a Ray cluster through the Jobs API and follows it there.

    address: the Jobs API (the head's dashboard port), e.g. http://head:8265; Ray also accepts
    a GCS address (head:6379), ray://head:10001 or "auto". An explicit address wins over the
    environment; without one: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS, http://127.0.0.1:8265.
    python: the interpreter that replaces a job's argv[0] on the cluster (None: keep argv[0]).
    gpus_per_job: GPUs a device=cuda job requests (entrypoint_num_gpus; others request none);
    cpus_per_job likewise. env: names of further variables of the worker's environment to pass
    (see `ray_env`). runtime_env: a Ray runtime_env for every job (e.g. {"pip": [...]}); its
    env_vars win over the passed ones. poll_s: seconds between status/log polls.
    unreachable_s: how long the cluster may be unreachable before a running job is failed.
    stop_timeout_s: how long a stopped job may take to report STOPPED beyond the grace period.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        python: str | None = "python",
        gpus_per_job: float = 1,
        cpus_per_job: float = 1,
        env: Sequence[str] = (),
        runtime_env: Mapping[str, Any] | None = None,
        poll_s: float = 1.0,
        unreachable_s: float = 300.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise DraftboardError(
                f"the ray launcher needs Ray's job client: pip install 'ray[default]' ({exc})"
            ) from exc
        explicit = bool(address)
        address = address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS") \
            or DEFAULT_RAY_ADDRESS
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise DraftboardError(f"the Ray runtime_env must be a JSON object, got {runtime_env!r}")
        self.python, self.gpus_per_job, self.cpus_per_job = python, gpus_per_job, cpus_per_job
        self.env, self.runtime_env = tuple(env), dict(runtime_env or {})
        self.poll_s, self.unreachable_s, self.stop_timeout_s = poll_s, unreachable_s, stop_timeout_s
        try:
            # Checks the connection and the cluster's Ray version. Requests are independent
            # (requests.request per call), so one client serves every slot's thread.
            # Ray lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override an explicit address; here
            # --address wins. Also accepted: a GCS address (head:6379), ray://..., "auto".
            with _without_env(_RAY_ADDRESS_VARS if explicit else ()):
                self.client = JobSubmissionClient(address)
        except Exception as exc:  # ConnectionError, RuntimeError, AuthenticationError, ValueError ...
            raise DraftboardError(f"cannot reach the Ray Jobs API at {address}: {exc}") from exc
        # The resolved Jobs API URL (http://head:8265), for messages and `ray job` commands.
        self.address = str(getattr(self.client, "_address", None) or address)
        self._last_check = (float("-inf"), None)

    def describe(self) -> str:
        return f"ray at {self.address}"

    def unavailable(self) -> str | None:
        """Checked before claiming (at most every poll_s): a job claimed while the cluster is down
        could only fail, and the queue never runs a job twice."""
        checked_at, reason = self._last_check
        if time.monotonic() - checked_at < self.poll_s:
            return reason
        try:
            self.client.get_version()
            reason = None
        except Exception as exc:
            reason = f"Ray Jobs API at {self.address} unreachable: {exc}"
        self._last_check = (time.monotonic(), reason)
        return reason

    def header(self, job: Job) -> str:
        return self.entrypoint(job)

    def entrypoint(self, job: Job) -> str:
        return ray_entrypoint(job.command, self.python)

    def submit_kwargs(self, job: Job) -> dict[str, Any]:
        """What `submit_job` gets for a job (without the submission id)."""
        runtime_env = dict(self.runtime_env)
        runtime_env["env_vars"] = {**ray_env(extra=self.env), **dict(self.runtime_env.get("env_vars") or {})}
        return dict(
            entrypoint=self.entrypoint(job),
            runtime_env=runtime_env,
            entrypoint_num_cpus=self.cpus_per_job,
            entrypoint_num_gpus=ray_gpus(job.params, self.gpus_per_job),
            metadata={"draftboard_job": str(job.id), "draftboard_kind": job.kind},
        )

    def launch(self, job: Job, output: JobOutput) -> Execution:
        submission_id = f"draftboard-job-{job.id}-{secrets.token_hex(4)}"
        try:
            kwargs = self.submit_kwargs(job)
        except DraftboardError as exc:
            raise LaunchError(f"cannot submit job {job.id} to Ray: {exc}") from exc
        try:
            self.client.submit_job(submission_id=submission_id, **kwargs)
        except Exception as exc:
            raise LaunchError(f"cannot submit to Ray at {self.address}: {exc}") from exc
        gpus = kwargs["entrypoint_num_gpus"]
        output.note(f"ray job {submission_id} submitted to {self.address} "
                    f"({kwargs['entrypoint_num_cpus']:g} CPU, {gpus:g} GPU); stop it with "
                    f"`ray job stop --address {self.address} {submission_id}`")
        return _RayExecution(self, submission_id, output)


class _RayExecution(Execution):
    """Follows one Ray job: a thread polls its status and logs every poll_s."""

    def __init__(self, launcher: RayLauncher, submission_id: str, output: JobOutput) -> None:
        self._launcher, self._client = launcher, launcher.client
        self.submission_id, self._output = submission_id, output
        self._ended = threading.Event()
        self._quit = threading.Event()  # stop following (the worker gave up waiting)
        self._wake = threading.Event()  # poll now (after a stop request)
        self._status: str | None = None
        self._message = ""
        self._exit_code: int | None = None
        self._error: str | None = None
        self._follower = threading.Thread(target=self._follow, name=f"{submission_id}-follow", daemon=True)
        self._follower.start()

    def wait(self, timeout: float) -> bool:
        return self._ended.wait(timeout)

    def stop(self, grace_s: float) -> str:
        if self._ended.is_set():
            return ""
        sid = self.submission_id
        error: list[BaseException] = []
        # requests has no timeout here: a cluster that accepts the connection and never answers
        # must not hang the worker's shutdown, so the call runs in a thread of its own.
        limit = grace_s + self._launcher.stop_timeout_s
        deadline = time.monotonic() + limit
        call = threading.Thread(target=lambda: _capture(error, self._client.stop_job, sid), daemon=True)
        call.start()
        call.join(limit)
        self._wake.set()  # poll at once instead of after poll_s
        if error:
            self._output.note(f"ray job {sid}: stop request failed: {error[0]}")
        # Ray cannot stop a job still PENDING (waiting for resources; ray-project/ray#58353):
        # stop_job answers True, the job stays PENDING, and once it gets its resources it
        # starts and is stopped at once. Waiting for that could take hours.
        pending_until = time.monotonic() + max(2 * self._launcher.poll_s, PENDING_STOP_WAIT_S)
        while not self._ended.wait(0.1):
            now = time.monotonic()
            if self._status == _RAY_PENDING and now > pending_until:
                self._quit.set()  # nothing more will come from it here
                self._wake.set()
                return (f"Ray job {sid} was still PENDING; Ray stops it as soon as it gets its resources "
                        f"(or run `ray job stop {sid}`)")
            if now > deadline:
                return f"Ray job {sid} had not reported stopping {limit:g} s after the stop request"
        return ""

    def drain(self) -> None:
        if not self._ended.wait(DRAIN_S):
            self._quit.set()
            self._wake.set()
            self._ended.wait(DRAIN_S)
        self._follower.join(DRAIN_S)

    def outcome(self) -> tuple[str, str | None]:
        sid = self.submission_id
        if self._error is not None:
            return FAILED, self._error
        if self._status == _RAY_SUCCEEDED:
            return SUCCEEDED, None
        if self._status == _RAY_STOPPED:
            return CANCELLED, f"Ray job {sid} was stopped on the cluster"
        if self._exit_code is not None:
            return FAILED, f"{describe_exit(self._exit_code)} (Ray job {sid})"
        first = (self._message.strip().splitlines() or ["no message"])[0][:300]
        return FAILED, f"Ray job {sid} failed: {first}"

    def _follow(self) -> None:
        sid, output = self.submission_id, self._output
        offset, partial = 0, ""
        last_ok, warned = time.monotonic(), False
        try:
            while not self._quit.is_set():
                try:
                    # Status first: logs read after a terminal status are complete.
                    info = self._client.get_job_info(sid)
                    text = self._client.get_job_logs(sid)
                except Exception as exc:
                    if "does not exist" in str(exc):
                        self._error = f"Ray job {sid} no longer exists on {self._launcher.address}"
                        return
                    down_s = time.monotonic() - last_ok
                    if down_s > self._launcher.unreachable_s:
                        self._error = (f"lost contact with Ray job {sid} at {self._launcher.address} "
                                       f"for {down_s:.0f} s: {exc}")
                        return
                    if not warned:
                        log.warning("ray job %s: cannot poll %s (%s); retrying", sid, self._launcher.address, exc)
                        output.note(f"cannot reach {self._launcher.address} ({exc}); retrying")
                        warned = True
                    self._wake.wait(self._launcher.poll_s)
                    self._wake.clear()
                    continue
                last_ok, warned = time.monotonic(), False
                if len(text) < offset:  # the log was replaced: start over rather than lose lines
                    offset = 0
                chunk, offset = partial + text[offset:], len(text)
                # Lines end at \n, \r\n or \r, as the local launcher's pipe reads them (universal
                # newlines): tqdm's \r redraws on stderr must not glue themselves to the
                # protocol lines on stdout. A trailing \r waits in case its \n comes next.
                held = "\r" if chunk.endswith("\r") else ""
                lines = chunk[: len(chunk) - len(held)].replace("\r\n", "\n").replace("\r", "\n").split("\n")
                partial = lines.pop() + held
                for line in lines:
                    output.feed(line)
                output.flush_progress()
                status = str(getattr(info.status, "value", info.status))
                if status != self._status:
                    self._status = status
                    output.note(f"ray job {sid}: {status}" + (f" ({info.message})" if info.message else ""))
                if status in _RAY_TERMINAL:
                    self._message = info.message or ""
                    self._exit_code = getattr(info, "driver_exit_code", None)
                    return
                self._wake.wait(self._launcher.poll_s)
                self._wake.clear()
        finally:
            if partial.rstrip("\r"):
                output.feed(partial.rstrip("\r"))
            output.flush_progress()
            output.close()
            self._ended.set()


_RAY_ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


@contextlib.contextmanager
def _without_env(names: Sequence[str]):
    """Hide these environment variables for the duration (the worker's startup, one thread)."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _capture(errors: list[BaseException], fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:
        errors.append(exc)


def make_launcher(name: str = "local", address: str | None = None, **ray_options: Any) -> Launcher:
    """The launcher called name (`local` or `ray`); address and ray_options go to RayLauncher."""
    if name == "local":
        return LocalLauncher()
    if name == "ray":
        return RayLauncher(address, **ray_options)
    raise DraftboardError(f"unknown launcher {name!r}; use {' or '.join(LAUNCHERS)}")
