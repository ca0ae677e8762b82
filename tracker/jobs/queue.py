"""The job queue: evals submitted from the dashboard and run by `draftboard worker` processes.

The queue is one table, `jobs`, in its own database rather than the MLflow store: workers
write to it every few seconds, and MLflow's schema is not ours to extend. Every state change
is one conditional UPDATE (`... WHERE id = ? AND state IN (<legal sources>)`), so concurrent
workers, dashboards and CLI calls cannot move a job along an illegal edge or claim it twice,
and the same statements serve SQLite (WAL, shared by processes on one machine) and
PostgreSQL (shared across machines; the claim's FOR UPDATE SKIP LOCKED only renders there).

The tables, the states, how a queue's database is opened and how its schema is migrated are
`tracker.jobs.schema`'s; this module is the claim, heartbeat and state-change logic over them.

A job is data, never a command: its kind (one of KINDS) and its params, validated by that
kind's spec (`tracker.jobs.eval_job`) when submitted and again when a worker claims it. The
worker builds the argv itself from the params; revision 0002 dropped the argv column that older
queues stored, so no stored command is ever run.

Callers get `Job` dataclasses; rows and connections never leave this module and the schema's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from tracker import config
from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from tracker.jobs.schema import (
    CANCELLED,
    FAILED,
    FINISHED_STATES,
    QUEUED,
    RUNNING,
    STATES,
    SUCCEEDED,
    TRANSITIONS,
    dedup_where,
    engine_url,
    jobs,
    open_engine,
    schema_head,
    schema_revision,
    upgrade_schema,
    workers,
)

log = logging.getLogger(__name__)

# The kinds of job there are, each with the spec that validates its params and builds its
# arguments (`validate`, `cli_args`, `check_paths`). Nothing else is ever queued or run.
KINDS = {eval_job.KIND: eval_job}

# A worker that has not refreshed its row for this long is gone (as a job's stale timeout).
WORKER_MAX_AGE_S = 60.0


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker: the devices its jobs can use (None: its launcher cannot tell)."""

    id: str
    devices: tuple[str, ...] | None
    launcher: str
    heartbeat_at: datetime
    gpus: tuple[str, ...] | None = None  # the GPUs it hands out, one job each (None: it pins none)
    gpu_memory: int | None = None  # bytes of each of its GPUs, as declared (None: not declared)


@dataclass(frozen=True)
class Job:
    """One job as stored. Times are UTC-aware; progress is 0..1 within `stage`.

    `existing` is True only on the Job that `submit` returns when an equivalent job was
    already queued, running or succeeded (so the UI can say "already evaluated"). `problem`
    says why a row written around this module cannot be a job (params that are not an object,
    a time that is not a time): the worker fails such a job with it, pages show it.
    """

    id: int
    kind: str
    params: dict[str, Any]
    state: str
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    heartbeat_at: datetime | None
    pid: int | None
    log_path: str | None
    progress: float
    stage: str | None
    mlflow_run_id: str | None
    error: str | None
    cancel_requested: bool
    dedup_key: str
    gpus: tuple[str, ...] | None = None  # the GPUs a local worker gave its process (None: none pinned)
    existing: bool = False
    problem: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


_COLUMNS = [f.name for f in fields(Job) if f.name not in ("existing", "problem")]
_TEXTS = ("kind", "state", "worker_id", "log_path", "stage", "mlflow_run_id", "error", "dedup_key")


def _to_job(row: sa.Row) -> Job:
    """The row as a Job, whatever a writer around this module put there: what cannot be read
    becomes a default and is named in `problem`, so one bad row never breaks a reader."""
    values = {name: row._mapping[name] for name in _COLUMNS}
    problems = []
    if not isinstance(values["params"], dict):
        problems.append(f"params are not a JSON object ({type(values['params']).__name__})")
        values["params"] = {}
    if values["created_at"] is None:  # UTCDateTime reads a time that is not a time as None
        problems.append("created_at is not a time")
    for name in _TEXTS:
        if values[name] is not None and not isinstance(values[name], str):
            values[name] = str(values[name])
    if values["error"] is not None:
        values["error"] = config.bounded(values["error"])
    try:
        values["progress"] = float(values["progress"])  # SQLite's RETURNING hands back a whole REAL as int
    except (TypeError, ValueError):
        problems.append("progress is not a number")
        values["progress"] = 0.0
    if not isinstance(values["pid"], int) or isinstance(values["pid"], bool):
        values["pid"] = None
    values["cancel_requested"] = bool(values["cancel_requested"])
    gpus = values["gpus"]
    values["gpus"] = tuple(str(g) for g in gpus) if isinstance(gpus, list) else None
    return Job(**values, problem="; ".join(problems) or None)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _normalized(value: Any) -> Any:
    """Params as compared for dedup: keys sorted, None-valued keys dropped (None means default)."""
    if isinstance(value, Mapping):
        return {str(k): _normalized(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0])) if v is not None}
    if isinstance(value, (list, tuple)):
        return [_normalized(v) for v in value]
    return value


def dedup_key(kind: str, params: Mapping[str, Any]) -> str:
    """sha256 of kind + normalized params; equal for submissions that would do the same work."""
    try:
        text = json.dumps({"kind": kind, "params": _normalized(params)}, sort_keys=True,
                          separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DraftboardError(f"job params must be plain JSON (strings, numbers, lists, dicts): {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()


def checked_params(kind: str, params: Any) -> dict[str, Any]:
    """params validated by kind's spec; DraftboardError for an unknown kind or bad params."""
    spec = KINDS.get(kind)
    if spec is None:
        raise DraftboardError(f"unknown job kind {kind!r}; this draftboard runs {', '.join(KINDS)} jobs")
    return spec.validate(params)


def claim_statement(worker_id: str, now: datetime) -> sa.Update:
    """UPDATE the oldest queued job to running for worker_id, RETURNING it (no row: queue empty).

    The outer `state = 'queued'` makes the UPDATE a no-op if another claimer took the row
    between the subquery and the write. PostgreSQL renders the subquery's FOR UPDATE SKIP
    LOCKED, so concurrent claimers pass over each other's rows instead of queueing on them;
    SQLite drops it, the write lock serializing claims there.
    """
    oldest = (
        sa.select(jobs.c.id)
        .where(jobs.c.state == QUEUED)
        .order_by(jobs.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        sa.update(jobs)
        .where(jobs.c.id == oldest, jobs.c.state == QUEUED)
        .values(state=RUNNING, worker_id=worker_id, started_at=now, heartbeat_at=now)
        .returning(*jobs.c)
    )



class JobQueue:
    """The jobs table behind one database URL (see `tracker.config.jobs_uri`).

    Safe to share between threads; several processes (workers, dashboard) each open their own.
    readonly=True (a read-only dashboard) opens the database for reading only: it is never
    created or migrated, and the database refuses writes (DraftboardError when it is missing or
    at another revision than this code's).
    """

    def __init__(self, uri: str | None = None, readonly: bool = False) -> None:
        self.uri = config.jobs_uri(uri)
        self.readonly = readonly
        self._engine = open_engine(self.uri, readonly)
        self._display = engine_url(self.uri).render_as_string(hide_password=True)
        from alembic.util import CommandError

        try:
            if readonly:
                self._check_revision()
            else:
                upgrade_schema(self._engine)
        except SQLAlchemyError as exc:
            self._engine.dispose()
            raise DraftboardError(f"cannot open job queue {self._display}: {getattr(exc, 'orig', None) or exc}") from exc
        except CommandError as exc:  # e.g. a revision from a newer draftboard
            self._engine.dispose()
            raise DraftboardError(
                f"cannot migrate job queue {self._display}: {exc} (was it made by a newer draftboard?)"
            ) from exc

    def _check_revision(self) -> None:
        with self._engine.connect() as conn:
            current = schema_revision(conn)
        if current != schema_head():
            self._engine.dispose()
            raise DraftboardError(
                f"job queue {self._display} is at schema revision {current or 'none'}, this draftboard reads "
                f"{schema_head()}; a read-only dashboard does not migrate it (a worker or a writable dashboard does)"
            )

    def close(self) -> None:
        """Release the connections (the queue can still be used; it reconnects)."""
        self._engine.dispose()

    def submit(self, kind: str, params: Mapping[str, Any]) -> Job:
        """Queue a job of kind with params (validated by the kind's spec: DraftboardError if they
        are not valid), or return the queued/running/succeeded one with the same kind and params.

        The returned Job has existing=True in the second case.
        """
        params = checked_params(kind, params)
        key = dedup_key(kind, params)
        insert = (
            sa.insert(jobs)
            .values(kind=kind, params=params, state=QUEUED, created_at=_now(),
                    progress=0.0, cancel_requested=False, dedup_key=key)
            .returning(*jobs.c)
        )
        while True:
            found = self._first(sa.select(jobs).where(jobs.c.dedup_key == key, dedup_where))
            if found is not None:
                return replace(found, existing=True)
            try:
                with self._engine.begin() as conn:
                    return _to_job(conn.execute(insert).one())
            except IntegrityError:
                # A concurrent submit of the same params won the unique index: return its job
                # (or, if that one failed in the meantime, try again).
                continue

    def register_worker(self, worker_id: str, devices: Iterable[str] | None, launcher: str,
                        gpus: Iterable[str] | None = None, gpu_memory: int | None = None) -> None:
        """Record (or refresh) a live worker, the devices its jobs can use, the GPUs it hands out (None: it
        pins none) and each one's memory in bytes (None: not declared)."""
        row = {"id": worker_id, "devices": None if devices is None else sorted(devices), "launcher": launcher,
               "heartbeat_at": _now(), "gpus": None if gpus is None else list(gpus), "gpu_memory": gpu_memory}
        with self._engine.begin() as conn:  # delete + insert: one upsert on every backend
            conn.execute(sa.delete(workers).where(workers.c.id == worker_id))
            conn.execute(sa.insert(workers).values(**row))

    def unregister_worker(self, worker_id: str) -> None:
        with self._engine.begin() as conn:
            conn.execute(sa.delete(workers).where(workers.c.id == worker_id))

    def workers(self, max_age_s: float = WORKER_MAX_AGE_S) -> list[WorkerInfo]:
        """The workers that refreshed their row within max_age_s, by id."""
        since = _now() - timedelta(seconds=max_age_s)
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(workers).where(workers.c.heartbeat_at >= since)
                                .order_by(workers.c.id)).all()
        return [WorkerInfo(r.id, None if r.devices is None else tuple(r.devices), r.launcher, r.heartbeat_at,
                           None if r.gpus is None else tuple(r.gpus),
                           r.gpu_memory if isinstance(r.gpu_memory, int) and r.gpu_memory > 0 else None)
                for r in rows]

    def get(self, job_id: int) -> Job:
        job = self._first(sa.select(jobs).where(jobs.c.id == job_id))
        if job is None:
            raise DraftboardError(f"no job {job_id} in the job queue {self._display}")
        return job

    def list(self, states: Iterable[str] | None = None, limit: int = 100) -> list[Job]:
        """Jobs newest first, optionally only those in `states`."""
        query = sa.select(jobs).order_by(jobs.c.id.desc()).limit(limit)
        if states is not None:
            wanted = sorted(set(states))
            unknown = [s for s in wanted if s not in STATES]
            if unknown:
                raise DraftboardError(f"unknown job state(s) {', '.join(unknown)}; use {', '.join(STATES)}")
            query = query.where(jobs.c.state.in_(wanted))
        with self._engine.connect() as conn:
            return [_to_job(row) for row in conn.execute(query)]

    def claim(self, worker_id: str) -> Job | None:
        """Atomically move the oldest queued job to running for worker_id; None if none is queued."""
        with self._engine.begin() as conn:
            row = conn.execute(claim_statement(worker_id, _now())).one_or_none()
        return None if row is None else _to_job(row)

    def unclaim(self, job_id: int, worker_id: str) -> None:
        """Put a job worker_id claimed but cannot start yet (its GPUs are taken) back in the queue, where it keeps
        its place: claims take the oldest queued job first."""
        self._update(sa.update(jobs).where(jobs.c.id == job_id, jobs.c.worker_id == worker_id,
                                           jobs.c.state == RUNNING, jobs.c.pid.is_(None))
                     .values(state=QUEUED, worker_id=None, started_at=None, heartbeat_at=None))

    def attach_process(self, job_id: int, worker_id: str, pid: int | None, log_path: str,
                       gpus: Iterable[str] | None = None) -> None:
        """Record the process running the job (None: it could not start), where its output goes and the GPUs it
        was given (None: the worker pins none)."""
        self._update(sa.update(jobs).where(jobs.c.id == job_id, jobs.c.worker_id == worker_id,
                                           jobs.c.state == RUNNING)
                     .values(pid=pid, log_path=log_path, gpus=None if gpus is None else list(gpus)))

    def heartbeat(self, job_id: int, worker_id: str) -> Job:
        """Mark the job alive and return it as stored.

        Nothing is written unless the job is still running under worker_id: a worker seeing
        another state or owner has lost the job (e.g. failed as stale) and must stop it.
        The returned job also carries `cancel_requested`.
        """
        stmt = (
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.worker_id == worker_id, jobs.c.state == RUNNING)
            .values(heartbeat_at=_now())
            .returning(*jobs.c)
        )
        with self._engine.begin() as conn:
            row = conn.execute(stmt).one_or_none()
        return self.get(job_id) if row is None else _to_job(row)

    def update_progress(self, job_id: int, progress: float, stage: str | None = None) -> None:
        """Record progress (0..1 within stage) of a running job; ignored once it has finished."""
        if not 0.0 <= progress <= 1.0:
            raise DraftboardError(f"job progress must be between 0 and 1, got {progress}")
        self._update(sa.update(jobs).where(jobs.c.id == job_id, jobs.c.state == RUNNING)
                     .values(progress=progress, stage=stage))

    def finish(self, job_id: int, state: str, error: str | None = None, mlflow_run_id: str | None = None) -> Job:
        """Move a job to succeeded, failed or cancelled; an illegal transition raises DraftboardError."""
        if state not in FINISHED_STATES:
            raise DraftboardError(f"a job can finish as {', '.join(FINISHED_STATES)}, not {state!r}")
        values: dict[str, Any] = {"finished_at": _now(), "error": None if error is None else config.bounded(error)}
        if mlflow_run_id is not None:
            values["mlflow_run_id"] = mlflow_run_id
        if state == SUCCEEDED:
            values["progress"] = 1.0
        return self._transition(job_id, state, values)

    def request_cancel(self, job_id: int) -> Job:
        """Cancel a queued job at once; flag a running one for its worker to stop.

        Raises DraftboardError for a job that has already finished.
        """
        with self._engine.begin() as conn:
            # One transaction: a claim cannot slip between the two cases.
            row = conn.execute(
                sa.update(jobs).where(jobs.c.id == job_id, jobs.c.state == QUEUED)
                .values(state=CANCELLED, finished_at=_now(), error="cancelled before it started")
                .returning(*jobs.c)
            ).one_or_none()
            if row is None:
                row = conn.execute(
                    sa.update(jobs).where(jobs.c.id == job_id, jobs.c.state == RUNNING)
                    .values(cancel_requested=True).returning(*jobs.c)
                ).one_or_none()
        if row is not None:
            return _to_job(row)
        job = self.get(job_id)
        raise DraftboardError(f"job {job_id} already {job.state}; there is nothing to cancel")

    def fail_stale(self, timeout_s: float) -> list[Job]:
        """Fail running jobs whose last heartbeat is older than timeout_s, and return them.

        They are not requeued: the dead worker's process may still be running somewhere,
        and an eval must never run twice.
        """
        cutoff = _now() - timedelta(seconds=timeout_s)
        stale = sa.and_(jobs.c.state == RUNNING, jobs.c.heartbeat_at < cutoff)
        with self._engine.connect() as conn:
            candidates = conn.execute(sa.select(jobs.c.id, jobs.c.worker_id, jobs.c.heartbeat_at).where(stale)).all()
        failed = []
        for job_id, worker_id, beat in candidates:
            reason = f"worker {worker_id} stopped heartbeating at {beat:%Y-%m-%d %H:%M:%S} UTC"
            stmt = (
                sa.update(jobs).where(jobs.c.id == job_id, stale)  # a beat since the select wins
                .values(state=FAILED, finished_at=_now(), error=reason).returning(*jobs.c)
            )
            with self._engine.begin() as conn:
                row = conn.execute(stmt).one_or_none()
            if row is not None:
                failed.append(_to_job(row))
        return failed

    def log_tail(self, job: Job | int, n_lines: int = 50) -> str:
        """The last n_lines of the job's log file; "" before it has one or where it is not readable here.

        Only files inside this process's logs folder (`config.logs_dir()`) are read: for a row
        whose log_path points elsewhere (/etc/passwd, a `..` path, a symlink out), which anyone
        who can write to the queue could set, the tail is one line saying it is not shown (a
        line, not an exception: one such row must not break the queue's page for everyone).
        """
        if not isinstance(job, Job):
            job = self.get(job)
        if not job.log_path:
            return ""
        logs = config.logs_dir().resolve()
        try:
            path = Path(job.log_path).resolve()
        except (ValueError, OSError) as exc:  # a NUL byte, a loop of links
            return f"[draftboard] log not shown: its path is not a usable file name ({exc})"
        if not path.is_relative_to(logs):
            return f"[draftboard] log not shown: {job.log_path} is outside the logs folder {logs}"
        return tail_text(path, n_lines)

    def _first(self, query: sa.Select) -> Job | None:
        with self._engine.connect() as conn:
            row = conn.execute(query.limit(1)).first()
        return None if row is None else _to_job(row)

    def _update(self, stmt: sa.Update) -> None:
        with self._engine.begin() as conn:
            conn.execute(stmt)

    def _transition(self, job_id: int, state: str, values: dict[str, Any]) -> Job:
        sources = [s for s in STATES if state in TRANSITIONS[s]]
        stmt = (
            sa.update(jobs).where(jobs.c.id == job_id, jobs.c.state.in_(sources))
            .values(state=state, **values).returning(*jobs.c)
        )
        with self._engine.begin() as conn:
            row = conn.execute(stmt).one_or_none()
        if row is not None:
            return _to_job(row)
        current = self.get(job_id).state
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing, it has finished"
        raise DraftboardError(f"job {job_id} is {current} and cannot become {state} (from {current}: {allowed})")


def tail_text(path: Path, n_lines: int) -> str:
    """The last n_lines of a text file, read backwards in blocks so a huge log costs little."""
    if n_lines <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            data, pos = b"", end
            # n_lines + 1 newlines guarantee n whole lines even when the file ends with one.
            while pos > 0 and data.count(b"\n") <= n_lines:
                step = min(64 * 1024, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n_lines:])
