"""Metric histories of many runs at once, read straight from the MLflow database.

`MlflowClient.get_metric_history` costs one call (and one ORM object per point) per run and
metric: 20 runs x 4 metrics x 10,000 steps take tens of seconds. When the tracking URI is a
database (sqlite, PostgreSQL, MySQL) this module reads MLflow's `metrics` table with plain,
read-only SELECTs (sqlite is opened with `mode=ro`; PostgreSQL transactions are READ ONLY),
one indexed query per (run, metric) on MLflow's (run_uuid, key, step) index. For an http
store it falls back to `get_metric_history` calls issued from a thread pool.

Decimation (`decimate`, `window`): what Compare and Run detail draw. Shape-preserving: within each of
`buckets` equal step ranges the points holding the minimum and the maximum value are kept (and a
history's first and last point), so no spike is lost however many points are dropped; a history
or step window with at most 2 x buckets + 2 points is kept whole, so zooming in far enough shows
every logged point.

Step axes (`on_step_metric`): a tool whose MLflow step is a row index and whose rows carry the real
step as a metric (SpecForge after PR #810: `train/optimizer_step`) is redrawn on that metric.

Rows come back as a DataFrame with columns run_id, key, step, value, timestamp, sorted by
(run_id, key, step, timestamp); NaN values are NaN (MLflow stores them as 0 + a flag).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import sqlalchemy as sa

from tracker import config

COLUMNS = ["run_id", "key", "step", "value", "timestamp"]
CHART_BUCKETS = 300  # Compare's decimation: min and max per bucket, ~1 point per pixel of a ~650 px half-width chart
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")

_engines: dict[str, sa.Engine | None] = {}
_engines_lock = threading.Lock()


def is_database_uri(uri: str) -> bool:
    """True for MLflow database URIs (sqlite:///..., postgresql://..., mysql+pymysql://...)."""
    scheme = uri.split(":", 1)[0].lower()
    return scheme.split("+", 1)[0] in DATABASE_SCHEMES and "://" in uri


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI, or None (another store, in memory, or not created yet)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    file = Path(path).expanduser().resolve()
    return file if file.is_file() else None


def sqlite_readonly_uri(file: Path) -> str:
    """sqlite3's URI that opens `file` read-only (`mode=ro`: it never creates or writes the file); the path
    percent-encoded, so a space, `?`, `#` or `%` in it names the file and not a query."""
    return f"file:{quote(file.as_posix())}?mode=ro"


def _sqlite_readonly_url(uri: str) -> str | None:
    """SQLAlchemy's URL of `sqlite_readonly_uri`, or None when the file does not exist yet. SQLAlchemy
    decodes the URL's database part once before sqlite reads it as a URI: that URI is encoded once more
    (its path's escapes, not its syntax)."""
    file = sqlite_file(uri)
    return None if file is None else f"sqlite:///{quote(sqlite_readonly_uri(file), safe=':/?=')}&uri=true"


def readonly_engine(uri: str) -> sa.Engine | None:
    """A shared read-only engine for a database tracking URI; None for other URIs or a missing sqlite file."""
    if not is_database_uri(uri):
        return None
    with _engines_lock:
        engine = _engines.get(uri)
        if engine is not None:
            return engine
        if uri.startswith("sqlite"):
            url = _sqlite_readonly_url(uri)
            if url is None:
                return None  # not created yet; look again next time
            engine = sa.create_engine(url)
        else:
            engine = sa.create_engine(config.sql_driver(uri), pool_pre_ping=True)
        _engines[uri] = engine
        return engine


def readonly_connection(engine: sa.Engine) -> sa.Connection:
    """A connection of `readonly_engine` (PostgreSQL: a READ ONLY transaction)."""
    conn = engine.connect()
    if engine.dialect.name == "postgresql":
        conn.execute(sa.text("SET TRANSACTION READ ONLY"))
    return conn


def _chunks(items: Sequence[str], size: int = 500) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


# --------------------------------------------------------------------------- signature


def history_signature(uri: str, run_ids: Sequence[str], client=None) -> tuple:
    """A cheap value that changes when any of the runs logs a new latest step.

    From MLflow's `latest_metrics` table (one row per run and metric) on a database store;
    from each run's latest metrics otherwise. Used as a cache key, so new steps show up.
    """
    run_ids = sorted(set(run_ids))
    engine = readonly_engine(uri)
    if engine is not None:
        rows: list[tuple] = []
        stmt = sa.text("SELECT run_uuid, key, step, timestamp FROM latest_metrics WHERE run_uuid IN :ids")
        stmt = stmt.bindparams(sa.bindparam("ids", expanding=True))
        with readonly_connection(engine) as conn:
            for chunk in _chunks(run_ids):
                rows.extend(tuple(r) for r in conn.execute(stmt, {"ids": list(chunk)}))
        return tuple(sorted(rows))
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
    sig = []
    for run_id in run_ids:
        data = client.get_run(run_id).data
        sig.extend((run_id, m.key, m.step, m.timestamp) for m in data.to_proto().metrics)
    return tuple(sorted(sig))


def latest_metric_steps(data) -> dict[str, int]:
    """{metric: step of its latest value} of an `mlflow.entities.RunData`.

    `RunData.metrics` holds the values only; the steps are in its public protobuf form.
    """
    return {m.key: int(m.step) for m in data.to_proto().metrics}



# --------------------------------------------------------------------------- histories


def load_histories(
    uri: str,
    run_ids: Sequence[str],
    keys: Sequence[str] | None = None,
    client=None,
) -> pd.DataFrame:
    """Histories of `keys` (default: every metric each run has) for `run_ids`; see the module doc."""
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        return _frame([])
    engine = readonly_engine(uri)
    if engine is not None:
        return _frame(_sql_histories(engine, run_ids, keys))
    if is_database_uri(uri):
        return _frame([])  # sqlite file not created yet: nothing logged
    return _frame(_client_histories(uri, run_ids, keys, client))


Block = tuple[str, str, np.ndarray]  # run_id, key, [n, 4] array of step, value, is_nan, timestamp


def _frame(blocks: list[Block]) -> pd.DataFrame:
    """One DataFrame from per-(run, key) blocks, built column-wise (no per-row Python objects)."""
    blocks = sorted((b for b in blocks if len(b[2])), key=lambda b: (b[0], b[1]))
    if not blocks:
        return pd.DataFrame({"run_id": pd.Series([], dtype=object), "key": pd.Series([], dtype=object),
                             "step": pd.Series([], dtype="int64"), "value": pd.Series([], dtype="float64"),
                             "timestamp": pd.Series([], dtype="int64")})
    data = np.concatenate([b[2] for b in blocks])
    sizes = [len(b[2]) for b in blocks]
    value = np.where(data[:, 2] != 0, np.nan, data[:, 1])
    frame = pd.DataFrame({
        "run_id": np.repeat(np.array([b[0] for b in blocks], dtype=object), sizes),
        "key": np.repeat(np.array([b[1] for b in blocks], dtype=object), sizes),
        "step": data[:, 0].astype("int64"),
        "value": value,
        "timestamp": data[:, 3].astype("int64"),
    })
    # SQL returns each block ordered by (step, timestamp); the client fallback may not.
    if not all(np.all(np.diff(b[2][:, 0]) >= 0) for b in blocks):
        frame = frame.sort_values(["run_id", "key", "step", "timestamp"], kind="stable", ignore_index=True)
    return frame


def _array(rows: list[tuple]) -> np.ndarray:
    """[n, 4] float64 array; steps and millisecond timestamps are exact below 2**53."""
    return np.array(rows, dtype=np.float64).reshape(-1, 4)


_PAIRS = sa.text(
    "SELECT run_uuid, key FROM latest_metrics WHERE run_uuid IN :ids"
).bindparams(sa.bindparam("ids", expanding=True))
# ORDER BY step makes the planner use MLflow's (run_uuid, key, step) index; without it sqlite
# may scan the primary-key index (key first) across every run.
_ALL = sa.text(
    "SELECT step, value, is_nan, timestamp FROM metrics WHERE run_uuid = :run AND key = :key "
    "ORDER BY step, timestamp"
)
def _sql_histories(engine: sa.Engine, run_ids: list[str], keys: Sequence[str] | None) -> list[Block]:
    wanted = None if keys is None else set(keys)
    blocks: list[Block] = []
    with readonly_connection(engine) as conn:
        # latest_metrics has one row per (run, key): which histories exist.
        pairs = []
        for chunk in _chunks(run_ids):
            for run_id, key in conn.execute(_PAIRS, {"ids": list(chunk)}):
                if wanted is None or key in wanted:
                    pairs.append((run_id, key))
        raw = conn.connection.dbapi_connection if engine.dialect.name == "sqlite" else None
        for run_id, key in pairs:
            blocks.append((run_id, key, _array(_execute(conn, raw, _ALL, {"run": run_id, "key": key}))))
    return blocks


def _execute(conn: sa.Connection, raw, stmt: sa.TextClause, params: dict) -> list[tuple]:
    """Run a SELECT; on sqlite through the DB-API cursor (no per-row SQLAlchemy objects)."""
    if raw is not None:  # sqlite3 understands the same `:name` placeholders
        return raw.execute(stmt.text, params).fetchall()
    return [tuple(r) for r in conn.execute(stmt, params)]


def _client_histories(uri: str, run_ids: list[str], keys: Sequence[str] | None, client=None) -> list[Block]:
    if client is None:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
    pairs = []
    for run_id in run_ids:
        names = client.get_run(run_id).data.metrics.keys()
        pairs.extend((run_id, key) for key in names if keys is None or key in keys)

    def fetch(pair: tuple[str, str]) -> Block:
        run_id, key = pair
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        rows = [(m.step, m.value, float(m.value != m.value), m.timestamp) for m in history]
        return run_id, key, _array(rows)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(fetch, pairs))


# --------------------------------------------------------------------------- decimation


def decimate(steps: np.ndarray, values: np.ndarray, buckets: int) -> np.ndarray:
    """Indices (ascending) of the points of one history, sorted by step, to draw it `buckets` wide.

    The steps from first to last are cut into `buckets` equal ranges; each range keeps the point of
    its minimum and of its maximum value (NaN counts as neither, but a range of NaNs keeps one, so
    the gap shows); the first and last point are always kept. At most 2 x buckets + 2 points
    remain; a history with no more than that is kept whole.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    n = len(steps)
    if n <= 2 * buckets + 2:
        return np.arange(n)
    steps = np.asarray(steps, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    span = steps[-1] - steps[0]
    bucket = np.minimum(((steps - steps[0]) * buckets // span).astype(np.int64), buckets - 1) if span > 0 \
        else np.zeros(n, dtype=np.int64)
    nan = np.isnan(values)
    by_min = np.lexsort((np.where(nan, np.inf, values), bucket))  # within a bucket: smallest first
    by_max = np.lexsort((np.where(nan, -np.inf, values), bucket))  # within a bucket: largest last
    starts = np.flatnonzero(np.r_[True, np.diff(bucket[by_min]) != 0])
    ends = np.r_[starts[1:], n] - 1
    return np.unique(np.concatenate([[0, n - 1], by_min[starts], by_max[ends]]))


def window(steps: np.ndarray, lo: float | None = None, hi: float | None = None) -> slice:
    """The slice of a step-sorted history with lo <= step <= hi (None: unbounded)."""
    start = 0 if lo is None else int(np.searchsorted(steps, lo, side="left"))
    stop = len(steps) if hi is None else int(np.searchsorted(steps, hi, side="right"))
    return slice(start, max(start, stop))


def decimated(frame: pd.DataFrame, buckets: int, lo: float | None = None, hi: float | None = None) -> pd.DataFrame:
    """`load_histories`' frame cut to steps lo..hi, each (run, key) history `decimate`d to `buckets`."""
    if frame.empty:
        return frame
    steps = frame["step"].to_numpy()
    values = frame["value"].to_numpy()
    runs, keys = frame["run_id"].to_numpy(), frame["key"].to_numpy()
    # Rows are sorted by (run_id, key, step): each history is one contiguous block.
    edges = np.flatnonzero(np.r_[True, (runs[1:] != runs[:-1]) | (keys[1:] != keys[:-1]), True])
    keep = []
    for a, b in zip(edges[:-1], edges[1:]):
        part = window(steps[a:b], lo, hi)
        s, e = a + part.start, a + part.stop
        keep.append(s + decimate(steps[s:e], values[s:e], buckets))
    return frame.iloc[np.concatenate(keep)].reset_index(drop=True)


def on_step_metric(frame: pd.DataFrame, axes: Mapping[str, str], axis_rows: pd.DataFrame | None = None
                   ) -> pd.DataFrame:
    """`frame` with each point of a run in `axes` (run id -> metric) placed at the value that metric had
    on the same logged step: the step the tool counts, where its MLflow step counts rows.

    The axis metric's own rows go, and so does a point logged on a row without one (it has no step on
    that axis). A run that never logged the metric (written before its tool added it) keeps its steps.
    `axis_rows` holds the axis histories in full where `frame` was downsampled (default: `frame`).
    """
    if frame.empty or not axes:
        return frame
    source = frame if axis_rows is None else axis_rows
    parts = [frame[~frame["run_id"].isin(list(axes))]]
    for run_id, key in axes.items():
        rows = frame[frame["run_id"] == run_id]
        axis = source[(source["run_id"] == run_id) & (source["key"] == key)]
        if axis.empty:
            parts.append(rows)
            continue
        steps = pd.Series(axis["value"].to_numpy(), index=axis["step"].to_numpy())
        steps = steps[~steps.index.duplicated(keep="last") & steps.notna().to_numpy()]
        rows = rows[rows["key"] != key]
        mapped = rows["step"].map(steps)
        parts.append(rows[mapped.notna()].assign(step=mapped.dropna().astype("int64")))
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values(["run_id", "key", "step", "timestamp"], kind="stable").reset_index(drop=True)

