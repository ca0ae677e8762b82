"""`draftboard worker`: claims queued jobs and runs each one through a launcher.

A job is data: the worker checks its kind and params (`tracker.jobs.queue.KINDS`, the eval's
spec in `tracker.jobs.eval_job`), checks its paths against the allowed roots where it runs,
and builds the argv itself; a job it cannot build or whose paths it refuses fails with
`refused: ...` before anything starts. The launcher (`tracker.jobs.launchers`) decides where
that argv runs: `local` (the default) as
a subprocess of the worker, `ray` as a Ray job on a cluster (docs/RAY.md). Everything about
the queue stays here: one thread per running job supervises it, heartbeats, watches for a
cancel request, and records the outcome, while the job's output reaches its log file and its
progress lines (`tracker.events`) reach the queue. Local jobs run in their own process group
(session), so a cancel reaches whatever the eval started, and the worker, not the terminal's
Ctrl-C, decides how a job ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy.exc import SQLAlchemyError

from tracker import config
from tracker.errors import DraftboardError
from tracker.jobs import gpus as gpu_slots
from tracker.jobs.gpus import Pool as GpuPool
from tracker.jobs.inputs import inputs_problem
from tracker.jobs.launchers.base import Execution, JobOutput, LaunchError, Launcher
from tracker.jobs.launchers.local import LocalLauncher
from tracker.jobs.queue import CANCELLED, FAILED, KINDS, RUNNING, SUCCEEDED, Job, JobQueue, checked_params

log = logging.getLogger(__name__)

# How often a job's supervisor looks for its job ending or the worker stopping.
TICK_S = 0.05

# How a job's supervision ended.
_EXITED, _CANCELLED, _LOST, _ABORTED = "exited", "cancelled", "lost", "aborted"


def job_args(job: Job, environ: dict | None = None) -> list[str]:
    """The CLI arguments (`eval --target ...`) of a claimed job, built from its params alone.

    LaunchError (`refused: ...`) for a kind this worker does not run, params that do not
    validate, or a path outside DRAFTBOARD_ALLOWED_ROOTS: the same roots as the dashboard's
    Launch check (`tracker.config.allowed_roots`), applied again here at run time, so a job
    queued around the dashboard is held to them too, and a folder's contents (symlinks, shard
    indexes) are re-read as they are now. As on the Launch page, a drafter registered as a
    checkpoint of the job's training run (train_run_id) in this worker's own store is trusted. Without
    DRAFTBOARD_ALLOWED_ROOTS in the worker's environment no path is checked: a worker on a Ray
    head or a GPU box reads paths of the cluster, which its own home says nothing about.
    """
    try:
        if job.problem:
            raise DraftboardError(f"malformed job row: {job.problem}")
        params = checked_params(job.kind, job.params)
        spec = KINDS[job.kind]
        if config.roots_configured(environ):
            try:
                spec.check_paths(params, config.allowed_roots(environ),
                                 trusted=lambda drafter: _registered_checkpoint(job, params, drafter))
            except DraftboardError as exc:
                raise DraftboardError(f"{exc} of this worker's {config.ROOTS_VAR}") from None
            problem = inputs_problem(params)  # the paths are this box's: their contents are looked at too
            if problem:
                raise DraftboardError(problem)
        return spec.cli_args(params)
    except DraftboardError as exc:
        raise LaunchError(f"refused: {exc}; nothing was run") from exc


def _registered_checkpoint(job: Job, params: dict[str, Any], drafter: str) -> bool:
    """True if drafter is a checkpoint registered on the job's training run in this worker's store
    (a job names no store: the deployment chooses it, tracker/config.py)."""
    run_id = params.get("train_run_id")
    if not run_id:
        return False
    from tracker.store.tracker import Tracker  # MLflow: imported only for this case

    try:
        registered = Tracker().checkpoints(run_id)
    except DraftboardError as exc:
        log.warning("job %d: cannot read the checkpoints of run %s: %s", job.id, run_id, exc)
        return False
    wanted = Path(drafter).expanduser().resolve()
    return any(c.path == drafter or Path(c.path).expanduser().resolve() == wanted for c in registered)


def make_worker_id() -> str:
    """hostname:pid:random, unique even for two workers started in one process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def run_worker(
    queue_uri: str | None = None,
    slots: int = 1,
    poll_s: float = 1.0,
    heartbeat_s: float = 5.0,
    stale_s: float = 60.0,
    once: bool = False,
    stop_event: threading.Event | None = None,
    grace_s: float = 10.0,
    launcher: Launcher | None = None,
    watch_s: float | None = None,
    gpus: Sequence[str] | None = None,
    gpu_memory: int | None = None,
) -> int:
    """Run queued jobs, up to `slots` at a time, until stop_event is set; return how many ran.

    Each round fails jobs of other workers that stopped heartbeating for stale_s, then
    claims jobs for the free slots (unless the launcher reports it cannot take jobs now,
    e.g. its Ray cluster is unreachable). once=True returns as soon as no job is queued and
    none of this worker's jobs is running. launcher: where jobs run (default: a
    LocalLauncher, subprocesses of this process), closed when the worker stops. A cancel request stops a job (locally:
    SIGTERM to its process group, then SIGKILL after grace_s). When the worker stops
    (stop_event, SIGTERM in the main thread, Ctrl-C) its running jobs are stopped the same
    way and marked failed. watch_s: also scan the store's watched checkpoint folders
    (`tracker.jobs.watch.scan_all`) every watch_s seconds, so one process serves a team. Logs go to `config.logs_dir()` (<DRAFTBOARD_HOME>/logs) as job-<id>.log,
    the one folder the dashboard reads log tails from. gpus: the box's GPUs (`tracker.jobs.gpus`), each job
    given its own through CUDA_VISIBLE_DEVICES; a job whose GPUs are not free waits, first in first served.
    gpu_memory: each GPU's memory in bytes, as declared, recorded for Launch's submit check.
    """
    if slots < 1:
        raise DraftboardError(f"a worker needs at least one slot, got {slots}")
    if not 0 < heartbeat_s < stale_s:
        raise DraftboardError(
            f"heartbeat interval ({heartbeat_s} s) must be positive and shorter than the stale timeout "
            f"({stale_s} s), or healthy jobs would be failed as stale"
        )
    launcher = launcher or LocalLauncher()
    if gpus is not None and launcher.name != LocalLauncher.name:
        raise DraftboardError(f"--gpus pins a local worker's jobs to GPUs; on {launcher.describe()} a job's GPUs are "
                              "the cluster's to place (its `gpus` param)")
    pool = GpuPool(gpus) if gpus is not None else None
    queue = JobQueue(queue_uri)
    logs = config.logs_dir()
    logs.mkdir(parents=True, exist_ok=True)
    worker_id = make_worker_id()
    stop = stop_event or threading.Event()
    wake = threading.Event()  # set when a job ends, so its slot is refilled at once
    runners: list[_JobRunner] = []
    claimed = 0
    blocked: str | None = None  # why the launcher cannot take jobs, as last logged
    log.info("worker %s: %d slot(s) on %s, jobs run %s%s", worker_id, slots, queue.uri, launcher.describe(),
             f", GPUs {','.join(pool.ids) or 'none'}" if pool else "")
    # torch answers which devices jobs can use, but importing it takes seconds: the first claim need not wait.
    devices: list = []

    def probe() -> None:
        try:
            devices.append(launcher.devices())
        except DraftboardError as exc:  # registered without devices: the Launch form then checks none
            log.warning("devices unknown: %s", exc)
            devices.append(None)

    threading.Thread(target=probe, name="devices", daemon=True).start()
    next_register = time.monotonic()
    with _stop_on_sigterm(stop, wake):
        try:
            next_watch = time.monotonic()
            while not stop.is_set():
                wake.clear()
                if devices and time.monotonic() >= next_register:  # so the Launch form knows what can run
                    with contextlib.suppress(SQLAlchemyError):  # an outage is logged below, by the claim
                        queue.register_worker(worker_id, devices[0], launcher.describe(), pool and pool.ids, gpu_memory)
                    next_register = time.monotonic() + heartbeat_s
                if watch_s is not None and time.monotonic() >= next_watch:
                    _scan_watched(queue)
                    next_watch = time.monotonic() + watch_s
                runners = [r for r in runners if not r.done.is_set()]
                try:
                    for job in queue.fail_stale(stale_s):
                        log.warning("job %d failed: %s", job.id, job.error)
                    reason = launcher.unavailable() if len(runners) < slots else None
                    if reason != blocked:
                        if reason:
                            log.warning("not claiming jobs: %s", reason)
                        else:
                            log.info("%s is available again", launcher.describe())
                        blocked = reason
                    while not reason and len(runners) < slots and (job := queue.claim(worker_id)) is not None:
                        held = _gpus_for(queue, job, worker_id, pool)
                        if held is None:
                            break  # its GPUs are taken: it waits at the head of the queue
                        if held is _REFUSED:
                            continue
                        log.info("job %d (%s) claimed%s", job.id, job.kind,
                                 f" on GPUs {','.join(held) or 'none'}" if pool else "")
                        runner = _JobRunner(queue, job, worker_id, logs, heartbeat_s, grace_s, wake, launcher,
                                            pool, held)
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
            launcher.close()
            with contextlib.suppress(SQLAlchemyError):
                queue.unregister_worker(worker_id)
    return claimed


_REFUSED = ("refused",)  # a job that can never get its GPUs here: failed at claim


def _gpus_for(queue: JobQueue, job: Job, worker_id: str, pool: GpuPool | None) -> tuple[str, ...] | None:
    """The GPUs the claimed job holds (() without a pool); None: not free now, the job put back in the queue;
    _REFUSED: it asks for more than this worker has, failed in one line."""
    if pool is None:
        return ()
    need = gpu_slots.needed(job.params)
    if need > len(pool.ids):
        queue.finish(job.id, FAILED, error=f"the job asks for {need} GPUs; worker {worker_id} has {len(pool.ids)} "
                                           f"({','.join(pool.ids) or 'none'})")
        log.warning("job %d refused: it asks for %d GPUs, this worker has %d", job.id, need, len(pool.ids))
        return _REFUSED
    held = pool.take(need)
    if held is None:
        queue.unclaim(job.id, worker_id)
    return held


def _scan_watched(queue: JobQueue) -> None:
    """One scan of every watched run of the default store; a store outage is logged, not fatal."""
    from tracker.jobs import watch  # MLflow: imported only by workers that watch
    from tracker.store.tracker import Tracker

    try:
        watch.scan_all(Tracker(), queue)
    except (DraftboardError, SQLAlchemyError) as exc:
        log.warning("checkpoint watch failed this round: %s", exc)


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


class _JobRunner(threading.Thread):
    """Runs one claimed job to its end and records the outcome."""

    def __init__(self, queue: JobQueue, job: Job, worker_id: str, log_dir: Path, heartbeat_s: float,
                 grace_s: float, on_done: threading.Event, launcher: Launcher, pool: GpuPool | None = None,
                 gpus: tuple[str, ...] = ()) -> None:
        super().__init__(name=f"job-{job.id}")
        self._pool, self._gpus = pool, gpus  # the GPUs it holds, given back when it ends
        self._queue, self._job, self._worker_id = queue, job, worker_id
        self._log_path = (log_dir / f"job-{job.id}.log").resolve()
        self._heartbeat_s, self._grace_s = heartbeat_s, grace_s
        self._on_done = on_done
        self._launcher = launcher
        self._abort = threading.Event()
        self.done = threading.Event()  # set before the thread exits: its slot is free

    def abort(self) -> None:
        """Stop the job (as on a cancel request) and fail it."""
        self._abort.set()

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the job must not stay "running" because of a worker bug
            log.exception("job %d: worker error", self._job.id)
            self._finish(FAILED, error=f"worker {self._worker_id} error: {exc}")
        finally:
            if self._pool is not None:
                self._pool.give(self._gpus)
            self.done.set()
            self._on_done.set()

    def _run(self) -> None:
        job = self._job
        log_file = open(self._log_path, "w", encoding="utf-8")
        output = JobOutput(log_file, self._queue, job.id)
        try:
            argv = self._launcher.command(job_args(job))
            held = f" on GPUs {','.join(self._gpus) or 'none'}" if self._pool is not None else ""
            output.note(f"job {job.id} ({job.kind}) on worker {self._worker_id}{held}: {self._launcher.header(argv)}")
            execution = self._launcher.launch(job, argv, output,
                                              {gpu_slots.ENV: ",".join(self._gpus)} if self._pool is not None else None)
        except LaunchError as exc:
            output.note(str(exc))
            output.close()
            self._queue.attach_process(job.id, self._worker_id, None, str(self._log_path))
            self._finish(FAILED, error=str(exc))
            return
        try:
            self._queue.attach_process(job.id, self._worker_id, execution.pid, str(self._log_path),
                                       self._gpus if self._pool is not None else None)
            outcome, note = self._supervise(execution)
        except BaseException:
            execution.stop(self._grace_s)  # a job recorded as failed must not keep running
            raise
        execution.drain()
        self._record(outcome, note, execution, output)

    def _supervise(self, execution: Execution) -> tuple[str, str]:
        """Wait for the job to end while heartbeating; (outcome, note on how it was stopped)."""
        next_beat = time.monotonic() + self._heartbeat_s
        while True:
            if execution.wait(TICK_S):
                return _EXITED, ""
            if self._abort.is_set():
                return _ABORTED, execution.stop(self._grace_s)
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + self._heartbeat_s
            try:
                job = self._queue.heartbeat(self._job.id, self._worker_id)
            except SQLAlchemyError as exc:
                log.warning("job %d: heartbeat failed (%s)", self._job.id, exc)
                continue
            if job.state != RUNNING or job.worker_id != self._worker_id:
                return _LOST, execution.stop(self._grace_s)
            if job.cancel_requested:
                return _CANCELLED, execution.stop(self._grace_s)

    def _record(self, outcome: str, note: str, execution: Execution, output: JobOutput) -> None:
        job_id = self._job.id
        note = f"; {note}" if note else ""
        if outcome == _LOST:
            # Another worker failed it as stale; its record already says why.
            log.warning("job %d was taken from this worker; it was stopped%s", job_id, note)
        elif outcome == _CANCELLED:
            self._finish(CANCELLED, error=f"cancelled on request{note}")
        elif outcome == _ABORTED:
            self._finish(FAILED, error=f"worker {self._worker_id} stopped while the job ran{note}")
        else:
            state, why = execution.outcome()
            if state == SUCCEEDED:
                self._finish(SUCCEEDED, mlflow_run_id=output.run_id())
            elif state == CANCELLED:
                self._finish(CANCELLED, error=why)
            else:
                lines = "\n".join(output.tail())
                self._finish(FAILED, error=f"{why}; last output:\n{lines}")

    def _finish(self, state: str, error: str | None = None, mlflow_run_id: str | None = None) -> None:
        try:
            job = self._queue.finish(self._job.id, state, error=error, mlflow_run_id=mlflow_run_id)
        except (DraftboardError, SQLAlchemyError) as exc:  # e.g. failed as stale during a database outage
            log.warning("job %d: outcome %s not recorded: %s", self._job.id, state, exc)
            return
        log.info("job %d %s", job.id, job.state)
