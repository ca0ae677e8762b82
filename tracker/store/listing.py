"""Every run of some experiments at once, read straight from the MLflow database.

`MlflowClient.search_runs` builds one ORM object per run, tag, param and metric and pages by 1,000:
at 10,000 runs it took ~8 s here, most of the dashboard's wait on a team's store. When the
tracking URI is a database this module reads the same rows MLflow's SQL store reads for a run
(`runs`, `tags`, `params`, `latest_metrics`: what `SqlRun.to_mlflow_entity` turns into a `Run`)
with four plain, read-only SELECTs (`history.readonly_engine`: sqlite `mode=ro`, PostgreSQL READ
ONLY) and builds the same `mlflow.entities.Run` objects, so everything downstream reads them as
search results. For an http store it returns None and the caller searches.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag

from tracker.store import names
from tracker.store.history import readonly_connection, readonly_engine, sqlite_file, sqlite_readonly_uri

_OF_RUNS = "run_uuid IN (SELECT run_uuid FROM runs WHERE lifecycle_stage = 'active' AND experiment_id IN :ids)"


def list_runs(uri: str, experiment_ids: Sequence[str]) -> list[Run] | None:
    """The active runs of the experiments, newest first (as search_runs orders them); None when the
    store is not a database this process can read directly."""
    engine = readonly_engine(uri)
    if engine is None:
        return None
    if not experiment_ids:
        return []
    ids = {"ids": [int(e) for e in experiment_ids]}

    def select(sql: str) -> list:
        stmt = sa.text(sql).bindparams(sa.bindparam("ids", expanding=True))
        return conn.execute(stmt, ids).all()

    with readonly_connection(engine) as conn:
        rows = select("SELECT run_uuid, name, experiment_id, user_id, status, start_time, end_time, lifecycle_stage, "
                      "artifact_uri FROM runs WHERE lifecycle_stage = 'active' AND experiment_id IN :ids")
        tags, params, metrics = ({} for _ in range(3))
        for run_id, key, value in select(f"SELECT run_uuid, key, value FROM tags WHERE {_OF_RUNS}"):
            tags.setdefault(run_id, []).append(RunTag(key, value))
        for run_id, key, value in select(f"SELECT run_uuid, key, value FROM params WHERE {_OF_RUNS}"):
            params.setdefault(run_id, []).append(Param(key, value))
        for run_id, key, value, timestamp, step, is_nan in select(
                f"SELECT run_uuid, key, value, timestamp, step, is_nan FROM latest_metrics WHERE {_OF_RUNS}"):
            metrics.setdefault(run_id, []).append(Metric(key, math.nan if is_nan else value, timestamp or 0, step))
    runs = [Run(RunInfo(run_id, str(experiment_id), user_id, status, start_time, end_time, stage, artifact_uri,
                        name),
                RunData(metrics=metrics.get(run_id, []), params=params.get(run_id, []), tags=tags.get(run_id, [])))
            for run_id, name, experiment_id, user_id, status, start_time, end_time, stage, artifact_uri in rows]
    runs.sort(key=lambda r: r.info.start_time or 0, reverse=True)
    return runs


# What changes when anything a listing reads changes: a run added, ended, deleted or restored, a tag,
# param or metric written. On a database server: counts and maxima over MLflow's own tables (about 30 ms
# at 10,000 runs, most of it the tags' lengths), so a cache keyed by it re-reads the store only when the
# store changed. A tag overwritten with a value of the same length changes no count or length:
# draftboard's rewrites (Tracker.set_tag, attaching a fingerprint) also write names.CHANGED_AT, and a digest
# of every run's CHANGED_AT is read beside (_CHANGED_SQL): any rewrite changes it, and no value anyone plants
# can hold it still (a MAX could be pinned by one planted tag `1`, which sorts after every real one).
_VERSION_SQL = (
    "SELECT (SELECT COUNT(*) FROM runs), (SELECT MAX(start_time) FROM runs), (SELECT MAX(end_time) FROM runs), "
    "(SELECT COUNT(*) FROM runs WHERE lifecycle_stage = 'active'), "
    "(SELECT COUNT(*) FROM tags), (SELECT SUM(LENGTH(key) + LENGTH(value)) FROM tags), "
    "(SELECT COUNT(*) FROM params), "
    "(SELECT COUNT(*) FROM latest_metrics), (SELECT MAX(timestamp) FROM latest_metrics), "
    "(SELECT SUM(step) FROM latest_metrics)"
)
_CHANGED_SQL = f"SELECT run_uuid, value FROM tags WHERE key = '{names.CHANGED_AT}' ORDER BY run_uuid"


def store_version(uri: str) -> tuple | None:
    """A value that changes when the runs a listing reads change; None when the store is not a database
    this process can read directly (the caller re-reads on a timer). A SQLite file says it itself, exactly
    and at no cost (`_sqlite_version`); a database server answers _VERSION_SQL."""
    file = sqlite_file(uri)
    if file is not None:
        return _sqlite_version(uri, file)
    engine = readonly_engine(uri)
    if engine is None:
        return None
    with readonly_connection(engine) as conn:
        counts = tuple(conn.execute(sa.text(_VERSION_SQL)).one())
        changed = hashlib.sha256()
        for run_id, value in conn.execute(sa.text(_CHANGED_SQL)):
            changed.update(f"{run_id}\0{value}\0".encode())
    return (*counts, changed.hexdigest())


# Per SQLite store: the file (device, inode), a read-only connection held open to ask it and that
# connection's serial number (a reopened one counts from its own start). A dashboard asks one store; a
# process that asks more keeps the WATCHED latest open.
_watchers: dict[str, tuple[tuple[int, int], sqlite3.Connection, int]] = {}
_watchers_lock = threading.Lock()
_serials = itertools.count()
WATCHED = 8


def _sqlite_version(uri: str, file: Path) -> tuple | None:
    """SQLite's `PRAGMA data_version` on a connection kept open for it, which changes with every commit any
    other connection makes to the file (every write MLflow makes; never a read), with the file's identity: a
    store replaced by another file is another version. About 10 µs, where _VERSION_SQL scanned every tag on
    every page visit. The connection runs in autocommit and only asks this, so it never holds a lock a writer
    waits for."""
    try:
        stat = file.stat()
    except OSError:  # gone since it was found: the caller re-reads on a timer until one is there again
        return None
    identity = (stat.st_dev, stat.st_ino)
    with _watchers_lock:
        held = _watchers.pop(uri, None)
        if held is None or held[0] != identity:
            if held is not None:
                held[1].close()
            if len(_watchers) >= WATCHED:
                _watchers.pop(next(iter(_watchers)))[1].close()  # the one asked least recently
            conn = sqlite3.connect(sqlite_readonly_uri(file), uri=True, check_same_thread=False, isolation_level=None)
            held = (identity, conn, next(_serials))
        _watchers[uri] = held  # the latest asked last
        return ("sqlite", *identity, held[2], held[1].execute("PRAGMA data_version").fetchone()[0])
