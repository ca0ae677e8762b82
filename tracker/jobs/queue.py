"""The job queue: evals submitted from the dashboard and run by `draftboard worker` processes.

The queue is one table, `jobs`, in its own database rather than the MLflow store: workers
write to it every few seconds, and MLflow's schema is not ours to extend. Every state change
is one conditional UPDATE (`... WHERE id = ? AND state IN (<legal sources>)`), so concurrent
workers, dashboards and CLI calls cannot move a job along an illegal edge or claim it twice,
and the same statements serve SQLite (WAL, shared by processes on one machine) and
PostgreSQL (shared across machines; the claim's FOR UPDATE SKIP LOCKED only renders there).

The schema is versioned with Alembic (`tracker/jobs/migrations/`, version table
`draftboard_jobs_version`): opening a queue upgrades its database to the newest revision,
under a lock (SQLite's write lock, a PostgreSQL advisory lock) so that workers starting
together migrate once. A database made before migrations existed is adopted as revision 0001.

A job is data, never a command: its kind (one of KINDS) and its params, validated by that
kind's spec (`tracker.jobs.eval_job`) when submitted and again when a worker claims it. The
worker builds the argv itself from the params; revision 0002 dropped the argv column that older
queues stored, so no stored command is ever run.

Callers get `Job` dataclasses; rows and connections never leave this module.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError

from tracker import config
from tracker.errors import DraftboardError
from tracker.jobs import eval_job

log = logging.getLogger(__name__)

# Alembic's version table, named for this schema: it must not meet another tool's
# `alembic_version` (MLflow's, say) in a database pointed at by mistake.
VERSION_TABLE = "draftboard_jobs_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
FIRST_REVISION = "0001"  # the schema of queues made before migrations existed
# Key of the PostgreSQL advisory lock held while migrating ("draftbrd" as an int64).
_PG_MIGRATION_LOCK = int.from_bytes(b"draftbrd", "big") & 0x7FFF_FFFF_FFFF_FFFF
# Long enough to ride out a dashboard read or another worker's commit, short enough that a
# wedged process holding the write lock surfaces as an error instead of a silent hang.
BUSY_TIMEOUT_MS = 30_000

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
FINISHED_STATES = (SUCCEEDED, FAILED, CANCELLED)
TRANSITIONS: dict[str, frozenset[str]] = {
    QUEUED: frozenset({RUNNING, CANCELLED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}
# A job in one of these states stands for its params: submitting them again returns it.
# Failed and cancelled jobs do not, so the user can retry.
DEDUP_STATES = (QUEUED, RUNNING, SUCCEEDED)
# The kinds of job there are, each with the spec that validates its params and builds its
# arguments (`validate`, `cli_args`, `check_paths`). Nothing else is ever queued or run.
KINDS = {eval_job.KIND: eval_job}


class UTCDateTime(sa.types.TypeDecorator):
    """Timezone-aware UTC datetimes on every backend.

    SQLite has no timestamp type and SQLAlchemy stores naive text there, so values are
    converted to UTC before storing (text order then equals time order, which `fail_stale`'s
    comparison relies on) and get their UTC tzinfo back when read. On SQLite the stored text is
    parsed here, not by SQLAlchemy's processor: a row whose text is not a time (anyone who can
    write the file can put one there) reads as None instead of raising in every reader.
    PostgreSQL's timestamptz can hold nothing else.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)

    def result_processor(self, dialect, coltype):
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        def process(value):
            if isinstance(value, str):
                try:
                    value = datetime.fromisoformat(value)
                except ValueError:
                    return None
            return self.process_result_value(value if isinstance(value, datetime) else None, dialect)

        return process


class LenientJSON(sa.types.TypeDecorator):
    """JSON that reads back as stored: on SQLite (text underneath) a value that is not JSON reads
    as the text itself, for the row's reader to refuse, instead of raising in every reader."""

    impl = sa.JSON
    cache_ok = True

    def result_processor(self, dialect, coltype):
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        def process(value):
            try:
                return json.loads(value) if isinstance(value, (str, bytes)) else value
            except ValueError:
                return value

        return process


metadata = sa.MetaData()
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("params", LenientJSON, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("started_at", UTCDateTime),
    sa.Column("finished_at", UTCDateTime),
    sa.Column("worker_id", sa.String(255)),
    sa.Column("heartbeat_at", UTCDateTime),
    sa.Column("pid", sa.Integer),
    sa.Column("log_path", sa.Text),
    sa.Column("progress", sa.Float, nullable=False),
    sa.Column("stage", sa.String(255)),
    sa.Column("mlflow_run_id", sa.String(64)),
    sa.Column("error", sa.Text),
    sa.Column("cancel_requested", sa.Boolean, nullable=False),
    sa.Column("dedup_key", sa.String(64), nullable=False),
    sa.CheckConstraint("state IN (%s)" % ", ".join(f"'{s}'" for s in STATES), name="ck_jobs_state"),
)
# The claim scans queued jobs in id order.
sa.Index("ix_jobs_state_id", jobs.c.state, jobs.c.id)
# At most one queued/running/succeeded job per dedup key: the database, not a read-then-insert
# in Python, settles two dashboards submitting the same eval at once.
_dedup_where = jobs.c.state.in_(DEDUP_STATES)
sa.Index(
    "ux_jobs_dedup_active",
    jobs.c.dedup_key,
    unique=True,
    sqlite_where=_dedup_where,
    postgresql_where=_dedup_where,
)

# One row per worker, refreshed at every round of its loop (migration 0003).
workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("devices", sa.JSON),
    sa.Column("launcher", sa.Text, nullable=False),
    sa.Column("heartbeat_at", UTCDateTime, nullable=False),
)
# A worker that has not refreshed its row for this long is gone (as a job's stale timeout).
WORKER_MAX_AGE_S = 60.0


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker: the devices its jobs can use (None: its launcher cannot tell)."""

    id: str
    devices: tuple[str, ...] | None
    launcher: str
    heartbeat_at: datetime


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


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # busy_timeout first: switching to WAL itself needs the lock another process may hold.
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # WAL lets the dashboard read while a worker writes; NORMAL sync is crash-safe in WAL
    # and saves an fsync per heartbeat (a power cut can lose only the last beats).
    # Turning a new file to WAL takes an exclusive lock, and SQLite answers "database is
    # locked" at once, without its busy handler, while another connection holds the file
    # (workers and a dashboard opening a new queue together): wait for it here instead.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def engine_url(uri: str) -> sa.engine.URL:
    """The URL to connect with: `postgresql://` falls back to psycopg2 when psycopg 3 is absent.

    SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg (3); the `postgres` extra installs
    psycopg2, so without this the documented `DRAFTBOARD_JOBS_URI=postgresql://...` would fail.
    """
    url = sa.engine.make_url(uri)
    if (url.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None
            and importlib.util.find_spec("psycopg2") is not None):
        url = url.set(drivername="postgresql+psycopg2")
    return url


def _sqlite_busy_timeout(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.close()


def _postgres_read_only(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    cursor.close()
    dbapi_connection.commit()


def _open_engine(uri: str, readonly: bool = False) -> sa.Engine:
    """The queue's engine; readonly: a SQLite file is opened with mode=ro (never created) and a
    PostgreSQL session is READ ONLY, so the database itself refuses every write."""
    try:
        url = engine_url(uri)
        database = url.database if url.get_backend_name() == "sqlite" else None
        local_file = bool(database) and database != ":memory:" and not database.startswith("file:")
        if readonly and local_file:
            path = Path(database).expanduser().resolve()
            if not path.is_file():
                raise DraftboardError(f"no job queue at {path} yet; a read-only dashboard does not create one "
                                      "(a worker or a writable dashboard does)")
            url = url.set(database=f"file:{quote(str(path))}?mode=ro", query={"uri": "true"})
        engine = sa.create_engine(url)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise DraftboardError(f"cannot open job queue {uri}: {exc}") from exc
    if engine.dialect.name == "sqlite":
        if local_file and not readonly:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        sa.event.listen(engine, "connect", _sqlite_busy_timeout if readonly else _sqlite_pragmas)
    elif readonly and engine.dialect.name == "postgresql":
        sa.event.listen(engine, "connect", _postgres_read_only)
    if not engine.dialect.update_returning:
        raise DraftboardError(
            f"the job queue needs UPDATE ... RETURNING, which {engine.dialect.name} "
            f"{'.'.join(map(str, engine.dialect.server_version_info or ()))} lacks (SQLite >= 3.35)"
        )
    return engine


# --------------------------------------------------------------------------- schema migrations


def _alembic_config(connection: sa.Connection | None = None):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@functools.cache
def schema_head() -> str:
    """The newest revision in tracker/jobs/migrations."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def schema_revision(conn: sa.Connection) -> str | None:
    """The revision a queue database is at; None before any (empty, or made before migrations)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


@contextlib.contextmanager
def _migration_lock(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction that holds the database's migration lock until it ends."""
    if engine.dialect.name == "sqlite":
        # pysqlite would run DDL outside any transaction; take the write lock ourselves
        # (BEGIN IMMEDIATE waits busy_timeout for it), so that the schema and its version
        # row change together and a second process waits, then finds the work done.
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")
        return
    with engine.begin() as conn:  # PostgreSQL: DDL is transactional
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        yield conn


def upgrade_schema(engine: sa.Engine, revision: str = "head") -> None:
    """Migrate the queue database to `revision` (default: the newest); a no-op when it is there.

    A database with a `jobs` table but no version table was made before migrations existed:
    it is stamped FIRST_REVISION (its schema) and upgraded from there.
    """
    from alembic import command

    target = schema_head() if revision == "head" else revision
    with engine.connect() as conn:
        if schema_revision(conn) == target:
            return  # the common case: one SELECT, no lock
    # Alembic narrates every step at INFO ("Context impl SQLiteImpl." ...); in a worker's log
    # one line of ours says it all. An application that set alembic's level keeps it.
    alembic_log = logging.getLogger("alembic")
    if alembic_log.level == logging.NOTSET:
        alembic_log.setLevel(logging.WARNING)
    with _migration_lock(engine) as conn:
        config = _alembic_config(conn)
        current = schema_revision(conn)
        if current is None and sa.inspect(conn).has_table(jobs.name):
            command.stamp(config, FIRST_REVISION)
            current = FIRST_REVISION
        if current != target:
            command.upgrade(config, revision)
            log.info("job queue schema: %s -> %s", current or "empty", target)


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
        self._engine = _open_engine(self.uri, readonly)
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
            found = self._first(sa.select(jobs).where(jobs.c.dedup_key == key, _dedup_where))
            if found is not None:
                return replace(found, existing=True)
            try:
                with self._engine.begin() as conn:
                    return _to_job(conn.execute(insert).one())
            except IntegrityError:
                # A concurrent submit of the same params won the unique index: return its job
                # (or, if that one failed in the meantime, try again).
                continue

    def register_worker(self, worker_id: str, devices: Iterable[str] | None, launcher: str) -> None:
        """Record (or refresh) a live worker and the devices its jobs can use."""
        row = {"id": worker_id, "devices": None if devices is None else sorted(devices), "launcher": launcher,
               "heartbeat_at": _now()}
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
        return [WorkerInfo(r.id, None if r.devices is None else tuple(r.devices), r.launcher, r.heartbeat_at)
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

    def attach_process(self, job_id: int, worker_id: str, pid: int | None, log_path: str) -> None:
        """Record the process running the job (None: it could not start) and where its output goes."""
        self._update(sa.update(jobs).where(jobs.c.id == job_id, jobs.c.worker_id == worker_id,
                                           jobs.c.state == RUNNING).values(pid=pid, log_path=log_path))

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
