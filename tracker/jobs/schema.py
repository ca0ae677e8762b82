"""The job queue's database: its tables, the states a job moves through, how a queue's database
is opened (SQLite pragmas, PostgreSQL read-only sessions) and migrated.

The schema is versioned with Alembic (`tracker/jobs/migrations/`, version table
`draftboard_jobs_version`): opening a queue upgrades its database to the newest revision,
under a lock (SQLite's write lock, a PostgreSQL advisory lock) so that workers starting
together migrate once. A database made before migrations existed is adopted as revision 0001.
`tracker.jobs.queue` is the one caller: rows and connections never leave the two modules.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from tracker import config
from tracker.errors import DraftboardError

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
    sa.Column("gpus", sa.JSON),  # the GPU ids its process was given (migration 0006); null: none pinned
    sa.CheckConstraint("state IN (%s)" % ", ".join(f"'{s}'" for s in STATES), name="ck_jobs_state"),
)
# The claim scans queued jobs in id order.
sa.Index("ix_jobs_state_id", jobs.c.state, jobs.c.id)
# At most one queued/running/succeeded job per dedup key: the database, not a read-then-insert
# in Python, settles two dashboards submitting the same eval at once.
dedup_where = jobs.c.state.in_(DEDUP_STATES)
sa.Index(
    "ux_jobs_dedup_active",
    jobs.c.dedup_key,
    unique=True,
    sqlite_where=dedup_where,
    postgresql_where=dedup_where,
)

# One row per worker, refreshed at every round of its loop (migration 0003; its GPUs: 0005, their memory: 0007).
workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("devices", sa.JSON),
    sa.Column("launcher", sa.Text, nullable=False),
    sa.Column("heartbeat_at", UTCDateTime, nullable=False),
    sa.Column("gpus", sa.JSON),  # the GPU ids it pins jobs to; null: none
    sa.Column("gpu_memory", sa.BigInteger),  # bytes of each of those GPUs, as declared (0007); null: not declared
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
    """The URL to connect with, its driver the installed one (config.sql_driver)."""
    return sa.engine.make_url(config.sql_driver(uri))


def _sqlite_busy_timeout(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cursor.close()


def _postgres_read_only(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    cursor.close()
    dbapi_connection.commit()


def open_engine(uri: str, readonly: bool = False) -> sa.Engine:
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


def quiet_alembic() -> None:
    """Alembic narrates every step at INFO ("Context impl SQLiteImpl.", "setup plugin ...": the queue's migrations
    and MLflow's own of a new store); in a worker's log one line of ours says it all. An application that set
    alembic's level keeps it."""
    alembic_log = logging.getLogger("alembic")
    if alembic_log.level == logging.NOTSET:
        alembic_log.setLevel(logging.WARNING)


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
    quiet_alembic()
    with _migration_lock(engine) as conn:
        config = _alembic_config(conn)
        current = schema_revision(conn)
        if current is None and sa.inspect(conn).has_table(jobs.name):
            command.stamp(config, FIRST_REVISION)
            current = FIRST_REVISION
        if current != target:
            command.upgrade(config, revision)
            log.info("job queue schema: %s -> %s", current or "empty", target)
