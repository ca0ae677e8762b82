"""The Ray launcher: a job's argv is submitted through the Ray Jobs API and followed there.

`RayLauncher` submits each job (`JobSubmissionClient`) requesting the GPUs its params ask for;
the worker polls its status and logs, and stopping it is `stop_job` (Ray sends SIGTERM, then
SIGKILL after its own RAY_JOB_STOP_WAIT_TIME_S). Ray runs entrypoints through `/bin/sh -c`, so
the argv is quoted with `shlex.join`: every argument stays one literal word. A job's
runtime_env is readable by anyone who reaches the Jobs API, so it never carries secrets: those
are set on the Ray nodes (docs/RAY.md). Ray is imported only when a RayLauncher is made, so the
local path never needs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shlex
import sys
import threading
import time
from typing import Any, Mapping, Sequence

from tracker import events, redact
from tracker.errors import DraftboardError
from tracker.jobs import gpus as gpu_slots
from tracker.jobs.launchers.base import DRAIN_S, Execution, JobOutput, LaunchError, Launcher, cli_entry, describe_exit
from tracker.jobs.queue import CANCELLED, FAILED, SUCCEEDED, Job

log = logging.getLogger(__name__)

DEFAULT_RAY_ADDRESS = "http://127.0.0.1:8265"
# Environment variables of the worker that a Ray job gets (runtime_env env_vars): where to log
# (MLFLOW_TRACKING_URI, DRAFTBOARD_HOME, ...). Prefixes, except secrets and the names below.
RAY_ENV_PREFIXES = ("MLFLOW_", "DRAFTBOARD_")
# A runtime_env is shown to anyone who reaches the Jobs API (`ray job list`, the Ray dashboard),
# so nothing that looks like a secret goes there (`tracker.redact`: by name, and a URL's password
# inside a value): such variables are set on the nodes instead.
# The queue's URL may hold a database password and means nothing to the eval; the MLflow user
# travels with its password, so both are set on the nodes (a node's own pair must not be split).
_RAY_ENV_EXCLUDED = frozenset({"DRAFTBOARD_JOBS_URI", "MLFLOW_TRACKING_USERNAME"})
_RAY_PENDING, _RAY_SUCCEEDED, _RAY_FAILED, _RAY_STOPPED = "PENDING", "SUCCEEDED", "FAILED", "STOPPED"
# Ray's terminal job states (a PENDING or RUNNING job can still change).
_RAY_TERMINAL = (_RAY_SUCCEEDED, _RAY_FAILED, _RAY_STOPPED)
_FINAL_LOG_READS, _FINAL_LOG_WAIT_S = 6, 0.5  # after a terminal status (see _RayExecution._follow)
# How long a stop request waits for a PENDING Ray job to react before giving up on it.
PENDING_STOP_WAIT_S = 3.0


def ray_gpus(params: Mapping[str, Any], gpus_per_job: float = 1) -> float:
    """GPUs a job asks Ray for: its `gpus` param where it says, else gpus_per_job when its params say
    device=cuda, else none. A sharded job's entrypoint asks for none: its shards are Ray tasks that ask for one
    GPU each (evaluators.shards)."""
    if gpu_slots.shards(params) > 1:
        return 0
    if params.get("gpus") is not None:
        return params["gpus"]
    return gpus_per_job if params.get("device") == "cuda" else 0


def refuse_secrets(names: Sequence[str], where: str) -> None:
    """DraftboardError naming the variables that look like secrets (`redact.is_secret_key`)."""
    secret = sorted(n for n in names if redact.is_secret_key(n) or n in _RAY_ENV_EXCLUDED)
    if secret:
        raise DraftboardError(
            f"{where} names {', '.join(secret)}: a Ray job's runtime_env is readable by anyone who reaches the "
            "Jobs API, so secrets are set on the Ray nodes instead (docs/RAY.md, Secrets)")


def ray_env(environ: Mapping[str, str] | None = None, extra: Sequence[str] = ()) -> dict[str, str]:
    """The worker's variables a Ray job gets: MLFLOW_* and DRAFTBOARD_* except secrets, the MLflow
    user and the queue's URL, each value with any URL password left out (`redact.text`), plus the names in extra that are set (RayLauncher refuses extra
    names that look like secrets); PYTHONUNBUFFERED=1 so lines reach the log as printed.
    """
    environ = os.environ if environ is None else environ
    env = {k: redact.text(v) for k, v in environ.items()
           if k.startswith(RAY_ENV_PREFIXES) and k not in _RAY_ENV_EXCLUDED and not redact.is_secret_key(k)}
    env.update({k: redact.text(environ[k]) for k in extra if k in environ})
    env["PYTHONUNBUFFERED"] = "1"
    env[events.ASKED] = "1"  # the job reports progress and its result in the log this launcher follows
    return env


class RayLauncher(Launcher):
    """Submits each job to a Ray cluster through the Jobs API and follows it there.

    address: the Jobs API (the head's dashboard port), e.g. http://head:8265; Ray also accepts
    a GCS address (head:6379), ray://head:10001 or "auto". An explicit address wins over the
    environment; without one: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS, http://127.0.0.1:8265.
    python: the interpreter that runs draftboard's CLI on the cluster (None: the worker's own
    sys.executable, for clusters that share the worker's image); entry: the whole command
    instead (default: `python -m tracker.cli`).
    gpus_per_job: GPUs a device=cuda job requests (entrypoint_num_gpus; others request none);
    cpus_per_job likewise. env: names of further variables of the worker's environment to pass
    (see `ray_env`). runtime_env: a Ray runtime_env for every job (e.g. {"pip": [...]}); its
    env_vars win over the passed ones, and must not name secrets either. poll_s: seconds between status/log polls.
    unreachable_s: how long the cluster may be unreachable before a running job is failed.
    stop_timeout_s: how long a stopped job may take to report STOPPED beyond the grace period.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        python: str | None = "python",
        entry: Sequence[str] | None = None,
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
        env_vars = (runtime_env or {}).get("env_vars") or {}
        if not isinstance(env_vars, Mapping):
            raise DraftboardError(f"the Ray runtime_env's env_vars must be a JSON object, got {env_vars!r}")
        refuse_secrets(list(env_vars), "the Ray runtime_env's env_vars")
        refuse_secrets(env, "--ray-env")
        super().__init__(entry or cli_entry(python or sys.executable))
        self.gpus_per_job, self.cpus_per_job = gpus_per_job, cpus_per_job
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

    def header(self, argv: Sequence[str]) -> str:
        # The shell command line Ray runs: `shlex.join` makes `;`, `$(...)`, quotes and spaces
        # in a name plain text, one word each.
        return redact.text(shlex.join(argv))

    def submit_kwargs(self, job: Job, argv: Sequence[str]) -> dict[str, Any]:
        """What `submit_job` gets for a job running argv (without the submission id)."""
        runtime_env = dict(self.runtime_env)
        runtime_env["env_vars"] = {**ray_env(extra=self.env), **dict(self.runtime_env.get("env_vars") or {})}
        return dict(
            entrypoint=self.header(argv),
            runtime_env=runtime_env,
            entrypoint_num_cpus=self.cpus_per_job,
            entrypoint_num_gpus=ray_gpus(job.params, self.gpus_per_job),
            metadata={"draftboard_job": str(job.id), "draftboard_kind": job.kind},
        )

    def launch(self, job: Job, argv: list[str], output: JobOutput, env: Mapping[str, str] | None = None) -> Execution:
        if env:  # Ray gives a job its GPUs (entrypoint_num_gpus); a worker's own list means nothing on its nodes
            raise LaunchError("a Ray job's GPUs are Ray's to place: start the worker without --gpus")
        submission_id = f"draftboard-job-{job.id}-{secrets.token_hex(4)}"
        kwargs = self.submit_kwargs(job, argv)
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
        final_reads, settled_len = 0, -1
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
                    # Ray's log agent can still be writing a finished job's last lines: read again
                    # until the log has content that stopped growing, a few reads at most.
                    settled = text and len(text) == settled_len
                    if settled or final_reads == _FINAL_LOG_READS:
                        self._message = info.message or ""
                        self._exit_code = getattr(info, "driver_exit_code", None)
                        return
                    final_reads, settled_len = final_reads + 1, len(text)
                    self._quit.wait(_FINAL_LOG_WAIT_S)
                    continue
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
