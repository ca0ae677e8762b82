"""Streamlit glue: the setup app.py runs before every page, cached loaders, widgets the pages share.

The only module of tracker/ that imports Streamlit. The data work is in `tracker.dashboard`'s
index, lineage, tables, compare, envmatrix and launch_form modules and in `tracker.store.history`;
this module caches their results per store and draws the pieces every page shares (store info,
badges, banners, empty states, errors). Pages reach the store, the queue and the settings only
through here.

Settings come from `tracker.config` (its module doc lists the variables): the store, the job
queue, read-only mode (no launch, cancel, re-evaluate or promote controls), the allowed roots,
and the optional `mlflow ui` URL for run links. Everything a user wrote goes through
`tracker.dashboard.escape` before it reaches Markdown.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import streamlit as st

from tracker import config, redact
from tracker.jobs import demo_progress
from tracker.dashboard import curve_chart, lineage, tables
from tracker.dashboard.envmatrix import pairs_table, reeval_plan
from tracker.dashboard.escape import md, md_badge, md_code
from tracker.dashboard.index import RunIndex, RunInfo, load_run_index, local_artifact_dir, read_json_artifact
from tracker.dashboard.launch_form import submit_eval
from tracker.errors import DraftboardError
from tracker.store import history, listing
from tracker.store.names import (
    DOCTOR,
    DOCTOR_ARTIFACT,
    EVAL_RESULTS_ARTIFACT,
    FINGERPRINT_ARTIFACT,
    IMPORTED_RESULTS_ARTIFACT,
)

RUN_DETAIL_PAGE = "pages/run_detail.py"
COMPARE_PAGE = "pages/compare.py"
ENVIRONMENTS_PAGE = "pages/environments.py"
CHART_BUCKETS = history.CHART_BUCKETS  # Compare: min and max of this many step ranges per curve
INDEX_TTL_S = 5


@dataclass(frozen=True)
class Settings:
    store_uri: str
    jobs_uri: str
    readonly: bool
    mlflow_ui: str | None  # None: no "Open in mlflow ui" links
    allowed_roots: tuple[Path, ...]


def settings() -> Settings:
    """Read on every rerun, so a test (or a restart with other env vars) sees its own values."""
    return Settings(
        store_uri=config.store_uri(),
        jobs_uri=config.jobs_uri(),
        readonly=config.readonly(),
        mlflow_ui=config.mlflow_ui_url(),
        allowed_roots=tuple(config.allowed_roots()),
    )


# --------------------------------------------------------------------------- cached loaders


@st.cache_resource(show_spinner=False)
def tracker_for(uri: str):
    from tracker.store.tracker import Tracker

    return Tracker(uri)


def queue_for(uri: str):
    # A read-only dashboard never creates or migrates the queue; the database refuses its writes.
    return _queue(uri, config.readonly())


@st.cache_resource(show_spinner=False)
def _queue(uri: str, readonly: bool):
    from tracker.jobs.queue import JobQueue

    return JobQueue(uri, readonly=readonly)


# Per (store, run, `index.fingerprint_version`): a file is kept until its run's env tags say it was replaced.
_fingerprints: dict[tuple[str, str, str], dict] = {}
_fp_lock = threading.Lock()


def _fingerprint_loader(uri: str):
    tracker = tracker_for(uri)

    def load(run_id: str, artifact_uri: str, version: str) -> dict | None:
        key = (uri, run_id, version)
        with _fp_lock:
            if key in _fingerprints:
                return _fingerprints[key]
        fp = read_json_artifact(tracker.client, run_id, artifact_uri, FINGERPRINT_ARTIFACT)
        if fp is not None:  # a missing one is looked for again next time
            with _fp_lock:
                _fingerprints[key] = fp
        return fp

    return load


_lasting: dict[str, dict] = {}  # per store: what logged-once artifacts decide (RunIndex.lasting)
BACKGROUND_READ_S = 1.0  # a store whose last read took longer is read again in the background ...
BACKGROUND_MIN_RUNS = 1000  # ... when it is a large store: a small one read slowly by a busy box is read at once


class _Read(NamedTuple):
    version: tuple
    index: RunIndex
    took_s: float
    at: float  # time.time() when the read began


_index_lock = threading.Lock()
_indexes: dict[str, _Read] = {}  # per store: the latest read
_reading: set[str] = set()  # stores being read again in the background


def run_index(uri: str) -> RunIndex:
    """Every run (its fingerprint read when first asked); shared by all sessions and pages. Read again
    only when the store changed (`listing.store_version`: a SQLite file's own change count) or, where the store can't
    say (an http store), after INDEX_TTL_S; diffs of fingerprints already read are kept across
    reads. A large store (BACKGROUND_MIN_RUNS or more) whose last read took longer than BACKGROUND_READ_S is
    read again in the background while visitors see the previous read (`index_age_s` says how old), so a
    store that changes while a team works never makes a visitor wait for the whole store again. A small
    store is always read at once, however slowly (a demo building on a busy box: the tables follow its
    banner, never "No runs yet" beside "2 runs so far")."""
    version = _version(uri)
    with _index_lock:
        latest = _indexes.get(uri)
        if latest is not None and latest.version == version:
            return latest.index
        if latest is not None and latest.took_s > BACKGROUND_READ_S and len(latest.index) >= BACKGROUND_MIN_RUNS:
            if uri not in _reading:
                _reading.add(uri)
                threading.Thread(target=_read_in_background, args=(uri,), name="draftboard-index", daemon=True).start()
            return latest.index
    return _read_index(uri)


def index_age_s(uri: str) -> float | None:
    """How old (s) the runs shown are while a newer read of the store is under way; None otherwise."""
    with _index_lock:
        latest = _indexes.get(uri)
        if latest is None or uri not in _reading:
            return None
    return time.time() - latest.at


def _version(uri: str) -> tuple:
    version = listing.store_version(uri)
    return version if version is not None else ("every", int(time.monotonic() // INDEX_TTL_S))


def _read_index(uri: str) -> RunIndex:
    version, at, start = _version(uri), time.time(), time.perf_counter()
    with _fp_lock:
        lasting = _lasting.setdefault(uri, {})
    index = load_run_index(tracker_for(uri), _fingerprint_loader(uri), lasting)
    with _index_lock:
        _indexes[uri] = _Read(version, index, time.perf_counter() - start, at)
    return index


def _read_in_background(uri: str) -> None:
    """`_read_index` on its thread; only it clears the store's mark, so a visitor's own read (after
    Refresh) never lets a second background read start beside one still under way."""
    try:
        _read_index(uri)
    finally:
        with _index_lock:
            _reading.discard(uri)


def _forget_indexes() -> None:
    with _index_lock:
        _indexes.clear()


@st.cache_resource(max_entries=64, show_spinner=False)
def _eval_results(uri: str, run_id: str, artifact_uri: str) -> dict | None:
    return read_json_artifact(tracker_for(uri).client, run_id, artifact_uri, EVAL_RESULTS_ARTIFACT)


def eval_results_loader(uri: str):
    return lambda run: _eval_results(uri, run.run_id, run.artifact_uri)


@st.cache_resource(max_entries=64, show_spinner=False)
def _imported_details(uri: str, run_id: str, artifact_uri: str) -> dict | None:
    found = read_json_artifact(tracker_for(uri).client, run_id, artifact_uri, IMPORTED_RESULTS_ARTIFACT)
    details = found.get("details") if isinstance(found, dict) else None
    return details if isinstance(details, dict) else None


def imported_details(uri: str, run) -> dict | None:
    """What an imported eval's file stated beyond its metrics (`details` of imported_results.json), else None."""
    return _imported_details(uri, run.run_id, run.artifact_uri)


@st.cache_resource(ttl=INDEX_TTL_S, max_entries=64, show_spinner=False)
def _doctor_report(uri: str, run_id: str, artifact_uri: str, severity: str | None) -> dict | None:
    return read_json_artifact(tracker_for(uri).client, run_id, artifact_uri, DOCTOR_ARTIFACT)


def doctor_report(uri: str, run: RunInfo) -> dict | None:
    """The run's doctor.json (`draftboard doctor --run`), None when it has none: only runs tagged with a
    report's severity are read."""
    severity = run.tags.get(DOCTOR)
    return None if severity is None else _doctor_report(uri, run.run_id, run.artifact_uri, severity)


def _run_signatures(uri: str, run_ids: tuple[str, ...], index: RunIndex | None) -> tuple[tuple[str, tuple], ...]:
    """(run, latest steps of its metrics) per run: what changes when a run logs a new step.

    From MLflow's latest_metrics table on a database store; on an http store from the run index
    (re-read every INDEX_TTL_S), which saves a request per run.
    """
    if index is not None and not history.is_database_uri(uri):
        return tuple((r, tuple(sorted(index.runs[r].metric_steps.items()))) for r in run_ids if r in index.runs)
    per_run: dict[str, list] = {r: [] for r in run_ids}
    for row in history.history_signature(uri, run_ids, client=tracker_for(uri).client):
        per_run[row[0]].append(row[1:])
    return tuple((r, tuple(rows)) for r, rows in per_run.items())


def _step_axes(run_ids, index: RunIndex | None) -> tuple[tuple[str, str], ...]:
    """(run, metric) for each run drawn on a step metric of its tool (`RunInfo.step_metric`)."""
    if index is None:
        return ()
    return tuple((r, index.runs[r].step_metric) for r in run_ids if r in index.runs and index.runs[r].step_metric)


# Every point of each run's metrics, kept once per (store, run) and replaced when the run logs a new
# step: the source of every zoom. Not st.cache_data, which would copy it out on every read. Bounded:
# beyond FULL_HISTORY_MAX_POINTS (about 75 bytes each in memory) the least recently read runs go.
FULL_HISTORY_MAX_POINTS = 4_000_000
_full: OrderedDict[tuple[str, str], tuple[tuple, pd.DataFrame]] = OrderedDict()
_full_lock = threading.Lock()


def _full_history(uri: str, run_id: str, signature: tuple, axis: str | None) -> pd.DataFrame:
    key = (uri, run_id)
    with _full_lock:
        hit = _full.get(key)
        if hit is not None and hit[0] == (signature, axis):
            _full.move_to_end(key)
            return hit[1]
    frame = history.load_histories(uri, [run_id])
    if axis:
        frame = history.on_step_metric(frame, {run_id: axis})
    signature = (signature, axis)
    with _full_lock:
        _full[key] = (signature, frame)
        _full.move_to_end(key)
        kept = sum(len(f) for _, f in _full.values())
        while kept > FULL_HISTORY_MAX_POINTS and len(_full) > 1:
            _, (_, dropped) = _full.popitem(last=False)
            kept -= len(dropped)
    return frame


@st.cache_data(max_entries=64, show_spinner="Loading metric histories…")
def _curves(uri: str, signature: tuple[tuple[str, tuple], ...], window: tuple | None, buckets: int,
            axes: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    lo, hi = window or (None, None)
    axis = dict(axes)
    return pd.concat([history.decimated(_full_history(uri, run_id, sig, axis.get(run_id)), buckets, lo, hi)
                      for run_id, sig in signature], ignore_index=True)


def curves(uri: str, run_ids, index: RunIndex | None = None, window: tuple[int, int] | None = None,
           buckets: int = CHART_BUCKETS) -> pd.DataFrame:
    """The runs' metric histories as Compare draws them: steps `window` (lo, hi; None: all), each
    curve `history.decimate`d to `buckets` (min and max per bucket; every point once few enough).

    Every point is read once per store version (the runs' latest steps) and kept server-side; the
    decimated frames are cached per (runs, version, window), shared by every session and rerun. Runs
    whose tool logs its step as a metric (`RunInfo.step_metric`) are placed on it before anything else.
    """
    run_ids = tuple(sorted(set(run_ids)))
    if not run_ids:
        return history.load_histories(uri, [])
    return _curves(uri, _run_signatures(uri, run_ids, index), window, buckets, _step_axes(run_ids, index))


_STEP_SPAN = "compare_step_span"  # the (first, last) step the window inputs were last drawn for
_STEP_FROM, _STEP_TO = "compare_step_from", "compare_step_to"  # the window inputs' keys


def _set_window(lo: int, hi: int) -> None:
    """Sets the From/To step inputs; from a callback, before they are drawn."""
    st.session_state[_STEP_FROM], st.session_state[_STEP_TO] = lo, hi


def step_window(curves: pd.DataFrame) -> tuple[int, int] | None:
    """From/To step inputs over the steps of `curves`: the zoom that is re-fetched at full detail.

    None while they span every step (the whole run, decimated)."""
    first, last = int(curves["step"].min()), int(curves["step"].max())
    state = st.session_state
    seen = state.get(_STEP_SPAN)
    if seen != (first, last):  # new steps (or runs): an input left at an end follows that end
        for key, old, new in ((_STEP_FROM, seen and seen[0], first), (_STEP_TO, seen and seen[1], last)):
            if state.get(key) in (None, old):
                state[key] = new
        state[_STEP_SPAN] = (first, last)

    def whole_run() -> None:
        _set_window(first, last)

    # A form: both ends change in one rerun (Enter in either box zooms).
    with st.form("compare_step_window", border=False), st.container(horizontal=True, vertical_alignment="bottom"):
        lo = st.number_input("From step", step=1, key=_STEP_FROM,
                             help=f"zoom: the curves between From and To step are read again, in full detail once "
                                  f"a curve has at most {2 * CHART_BUCKETS + 2} points there (every logged point)")
        hi = st.number_input("To step", step=1, key=_STEP_TO, help="the last training step shown")
        st.form_submit_button("Zoom", key="compare_step_zoom", icon=":material/zoom_in:")
        st.form_submit_button("Whole run", key="compare_step_all", on_click=whole_run, icon=":material/zoom_out_map:",
                              help=f"steps {first:,}–{last:,}")
    lo, hi = int(lo), int(hi)
    if hi < lo:
        st.warning(f"To step ({hi:,}) is before From step ({lo:,}): showing the whole run.")
        return None
    return None if lo <= first and hi >= last else (lo, hi)


@functools.cache
def _curve_component():
    # Not isolated in a shadow root: the page's tests and benchmarks find the drawn chart by its class.
    return st.components.v2.component("draftboard.curves", js=curve_chart.JS, css=curve_chart.CSS,
                                      isolate_styles=False)


def canvas_chart(spec: dict, key: str) -> None:
    """One chart on a canvas (`curve_chart.spec` or `eval_spec`). A zoomable one's dragged window (or a
    double click, the whole run) is set in the From/To step inputs of `step_window`, so the page
    reads those steps again at full detail."""

    def zoomed() -> None:
        _set_window(*(st.session_state[key].get("zoom") or st.session_state[_STEP_SPAN]))

    _curve_component()(key=key, data=spec, **({"on_zoom_change": zoomed} if spec["zoomable"] else {}))


def curves_caption(shown: pd.DataFrame, zoomable: bool) -> str:
    """What the training charts hold, in words (Compare and Run detail decimate alike); how to zoom where the
    page has From/To step inputs (Compare's `step_window`), else where to."""
    return (f"{len(shown):,} points shown. Each curve keeps the lowest and the highest value of each of "
            f"{CHART_BUCKETS} step ranges (spikes survive); where a curve has at most {2 * CHART_BUCKETS + 2} "
            "points in the shown steps, every logged point. "
            + ("Narrow From/To step to zoom in at full detail." if zoomable else
               "Compare's Training curves zoom into a step range at full detail."))


def warm(uri: str) -> str:
    """Read what a first visitor waits for before anyone asks: the run index, the landing page's rows (and
    the fingerprints of the evals that differ from their training runs, which they read), Environments'
    table where the runs' files are on this machine, and every point of the default Compare selection's
    histories. `draftboard ui` runs it beside the server as it starts; it only fills caches a page would
    fill, so a failure is said in one line and the page reads the store itself. An empty store is not
    cached as empty (a demo may be filling it), and a store the demo is building is not opened at all
    (`demo_banner` says why).
    -> what it did, in words."""
    from tracker.dashboard.compare import train_runs_for_histories
    from tracker.dashboard.tables import default_selection

    progress = demo_progress.read_progress(config.home_dir())
    if progress is not None and progress.store == uri and progress.building:
        return "warm: skipped (the demo is building the store)"
    start = time.perf_counter()
    try:
        index = run_index(uri)
        if not index.runs:
            _forget_indexes()
            return "warm: the store has no runs yet"
        chosen = train_runs_for_histories(index, default_selection(index))
        shown = curves(uri, chosen, index=index)
        tables.runs_table(index, list(index.runs.values()))  # the landing page's rows, derived once per index
        lineage.open_evals(index)
        if all(local_artifact_dir(run.artifact_uri) for run in index.of_kind("eval", "reference")):
            # Environments' table: it reads the fingerprints of pairs that differ in warnings too. Files here;
            # against a server each is a request, left to Environments' first visitor (issue 38).
            pairs_table(index)
    except Exception as exc:  # noqa: BLE001 - a cache warm-up: the page reports the same error itself
        return f"warm: skipped ({type(exc).__name__}: {exc})"
    return (f"warm: {len(index.runs)} runs, the histories of {len(chosen)} training runs ({len(shown):,} points "
            f"drawn) in {time.perf_counter() - start:.1f} s")


def refresh() -> None:
    """Forget cached runs and histories (after a change made from the dashboard, or on request)."""
    _forget_indexes()
    _curves.clear()
    with _full_lock:
        _full.clear()


# --------------------------------------------------------------------------- the shared setup


class Shared(NamedTuple):
    """What app.py sets up before every page: the settings and the run index."""

    cfg: Settings
    index: RunIndex


_SHARED = "draftboard_shared"


def setup(title: str | None, needs_runs: bool) -> Shared:
    """Settings, the run index and the store sidebar, for the page `title` about to run.

    A store that cannot be read stops the page with one error line; an empty store stops pages
    that `needs_runs` with how to start.
    """
    cfg = settings()
    if not demo_banner(cfg):
        st.stop()
    missing = config.missing_local_store(cfg.store_uri) if cfg.readonly else None
    if missing is not None:
        if title:
            st.title(title)
        st.info(f"No store at {md_code(missing)} yet. This dashboard is read-only, so it creates nothing: the "
                "store appears once a writable dashboard, a worker or a training run logs to it.",
                icon="🔒")
        st.stop()
    try:
        with st.spinner("Reading runs…"):
            index = run_index(cfg.store_uri)
    except DraftboardError as exc:
        st.error(f"Cannot read the store: {md(exc)}")
        st.stop()
    store_sidebar(cfg, index)
    if needs_runs and len(index) == 0:
        if title:
            st.title(title)
        empty_state(cfg)
    shared = Shared(cfg, index)
    st.session_state[_SHARED] = shared
    return shared


def shared(needs_runs: bool = True) -> Shared:
    """The setup app.py made for this run of the page.

    Taken out of the session state, so that every run gets its own. Streamlit runs a page without
    app.py when it was started in its `pages/` directory mode (until app.py's `st.navigation` has
    run once in the process, a deep link such as /compare runs pages/compare.py alone; AppTest
    resets that mode on every run): the page then makes the same setup itself.
    """
    made = st.session_state.pop(_SHARED, None)
    return made if made is not None else setup(None, needs_runs)


# --------------------------------------------------------------------------- shared widgets


def store_sidebar(cfg: Settings, index: RunIndex) -> None:
    with st.sidebar:
        if st.button("Refresh", key="refresh", icon=":material/refresh:", help="re-read runs and histories now"):
            refresh()
            st.rerun()
        if cfg.readonly:
            st.badge("read-only", icon=":material/lock:", color="gray",
                     help="DRAFTBOARD_READONLY=1: launch, cancel, re-evaluate and promote are hidden")
        st.caption(f"Store: {md_code(redact.short_uri(cfg.store_uri))} · {len(index)} runs",
                   help=f"the store's URI: {md_code(redact.shown_uri(cfg.store_uri))}")
        st.caption(alerts_caption(), help="an eval worse than its training run's previous checkpoint or than a "
                   "reference (paired bootstrap) raises a regression alert: 📉 on Runs, its Δτ on Run detail")
        age = index_age_s(cfg.store_uri)
        if age is not None:
            st.caption(f"Runs as read {age:.0f} s ago: the store changed and is being read again in the "
                       "background (a large store); the next visit shows the new runs, or Refresh waits for them.")


def alerts_caption() -> str:
    """Where regression alerts go, from the deployment's setting (its host only: the URL is a secret)."""
    try:
        url = config.alert_webhook()
    except DraftboardError as exc:
        return f"Regression alerts: on the runs only ({md(exc)})"
    if url is None:
        return f"Regression alerts: on the runs only (no `{config.ALERT_WEBHOOK_VAR}`)"
    return f"Regression alerts: on the runs and POSTed to {md_code(config.webhook_host(url))}"


DEMO_POLL_S = 2.0  # how often a page re-reads the demo's progress while it builds


def demo_banner(cfg: Settings) -> bool:
    """The demo build's progress while it runs in the background (`draftboard ui --demo`).

    Returns False while the build has not yet created the store's tables: the page must not open
    the store before then (tracker/jobs/demo_progress.py says why).
    """
    progress = demo_progress.read_progress(config.home_dir())
    if progress is None or progress.store != cfg.store_uri or progress.state == demo_progress.DONE:
        return True
    if progress.building:
        _live_demo_banner((progress.state, progress.stage, progress.runs, progress.store_ready))
        return progress.store_ready
    log = f" Its output: {md_code(progress.log)}." if progress.log else ""
    why = f": {md(progress.error)}" if progress.error else f" (process {progress.pid} is gone)"
    st.warning(f"**The demo build stopped** at stage {progress.stage}/{progress.stages}{why}.{log} "
               f"The runs it made so far are shown; `./scripts/run.sh` (or `draftboard demo --resume`) "
               "builds it again.", icon="🚫")
    return True


@st.fragment(run_every=DEMO_POLL_S)
def _live_demo_banner(seen: tuple) -> None:
    """Redrawn every DEMO_POLL_S; the whole page reruns when a stage or a run landed (new rows to show)."""
    progress = demo_progress.read_progress(config.home_dir())
    if progress is None or (progress.state, progress.stage, progress.runs, progress.store_ready) != seen:
        refresh()  # the run that landed is in the tables now, not after INDEX_TTL_S
        st.rerun(scope="app")

    stage = f"stage {progress.stage}/{progress.stages}: {md(progress.text)}" if progress.stage else "starting"
    st.progress(progress.fraction, text=f"**Building the demo store** · {stage} · {progress.runs} runs so far")
    log = f" Output: {md_code(progress.log)}." if progress.log else ""
    now = time.time()
    eta = progress.eta_s(now)
    left = f", about {_duration(eta)} left at this pace" if eta is not None else ""
    st.caption(f"{progress.fraction:.0%} of the build's work done (the target's training is most of it), started "
               f"{_duration(now - progress.started)} ago{left}. Runs appear in the tables as they land; this "
               f"refreshes every {DEMO_POLL_S:g} s.{log}")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def empty_state(cfg: Settings) -> None:
    progress = demo_progress.read_progress(config.home_dir())
    if progress is not None and progress.building and progress.store == cfg.store_uri:
        st.info("**No runs yet.** The demo's first runs land once its target is trained (the progress above).",
                icon="⏳")
        st.stop()
    st.info("**No runs yet.** Run `draftboard demo` to build a demo store, or log a training run with "
            "`tracker.Tracker().training_run(...)`, import one with `draftboard import-log FILE --name NAME`, "
            "or evaluate a checkpoint with `draftboard eval ...`.", icon="📭")
    st.caption(f"Store: {md_code(redact.shown_uri(cfg.store_uri))}")
    st.stop()


@contextmanager
def reported(show=st.error) -> Iterator[None]:
    """Run the block; a DraftboardError (bad input, an unreadable store) is shown as one line instead.

    The rest of the block is skipped, as after any exception.
    """
    try:
        yield
    except DraftboardError as exc:
        show(md(exc))


def checkpoints(cfg: Settings, run_id: str) -> list:
    """A training run's registered checkpoints; a warning and none when their records cannot be read."""
    with reported(st.warning):
        return tracker_for(cfg.store_uri).checkpoints(run_id)
    return []


def open_queue_or_stop(cfg: Settings):
    """The job queue; when it cannot be opened, say so in one line and stop the page."""
    with reported(lambda text: st.error(f"Cannot open the job queue: {text}")):
        return queue_for(cfg.jobs_uri)
    st.stop()


def queue_busy(queue) -> bool:
    """Whether any job is queued or running (the queue list then refreshes faster)."""
    from tracker.jobs.queue import QUEUED, RUNNING

    return bool(queue.list(states=[QUEUED, RUNNING], limit=1))


def allowed_roots_caption(cfg: Settings) -> str:
    return ("Paths must lie under the allowed roots: " + ", ".join(md_code(r) for r in cfg.allowed_roots) +
            f" ({config.ROOTS_VAR}, separated by {md_code(os.pathsep)}).")


LINEAR_COLORS = {"fast": "green", "fallback": "orange", "partial": "yellow"}


def env_badges(run: RunInfo) -> None:
    """Badges for the environment that produced a run's numbers."""
    with st.container(horizontal=True):
        if run.published:
            st.badge("published", icon=":material/menu_book:", color="violet",
                     help=f"numbers from a publication, for target {md(run.target or 'unknown')}; "
                          "their environment is mostly unknown")
        st.badge(f"linear-attn {md_badge(run.linear_attn)}", color=LINEAR_COLORS.get(run.linear_attn, "gray"),
                 help="which implementation ran the Gated DeltaNet layers: fast = fla + causal-conv1d kernels, "
                      "fallback = transformers' torch code, partial = a mix")
        device = f"{run.device} · {run.gpu}" if run.gpu and run.device == "cuda" else run.device
        st.badge(md_badge(device), icon=":material/memory:", color="blue", help="device kind (and GPU model)")
        st.badge(md_badge(run.dtype), color="gray", help="dtype of the target's forward pass")
        if run.drafter_precision:
            st.badge(f"drafter {md_badge(run.drafter_precision)}", color="orange",
                     help="how the drafter computed where it was not a cast to the dtype (bf16-autocast: fp32 weights "
                          "under bf16 autocast, as mixed-precision training computes)")
        if run.drafter_family:  # issue 65 LOW: which drafter family measured, as Compare's lines name it
            st.badge(md_badge(run.drafter_family), icon=":material/account_tree:", color="violet",
                     help="the drafter's family (DFlash, DFlash2, JetSpec), decided from its config: each is its "
                          "own line on Compare")
        if run.env_hash:
            st.badge(f"env {md_badge(run.env_hash)}", color="gray",
                     help="hash of the fingerprint fields that can change the numbers: equal hashes, comparable numbers")


def bullet_list(lines: list[str], title: str, alert=st.error, icon: str = "⚠️", limit: int = 8) -> None:
    """An alert with a bold title and the first `limit` of `lines` (user text, escaped) as bullets."""
    if not lines:
        return
    more = f"\n- … and {len(lines) - limit} more" if len(lines) > limit else ""
    alert(f"**{title}**\n" + "\n".join(f"- {md(line)}" for line in lines[:limit]) + more, icon=icon)


def run_option_label(index: RunIndex, run_id: str) -> str:
    """A run in a picker (plain text: options are not rendered as Markdown); made once per index."""
    def label() -> str:
        run = index.get(run_id)
        if run is None:
            return run_id
        extra = f" · step {run.checkpoint_step}" if run.kind != "train" and run.checkpoint_step is not None else ""
        return f"{index.label(run_id)} — {run.kind_label}{extra} · {run.target_name}"
    return index.memo(("option_label", run_id), label)


def picker_note(left_out: int) -> None:
    """Said under a run picker that offers only the newest runs (`tables.picker_options`)."""
    if left_out:
        st.caption(f"{left_out:,} older runs are not offered here: find any run on Runs (search by name or id) and "
                   "open it from there (Open run detail, Compare selected).")


def reevaluate(cfg: Settings, index: RunIndex, eval_run_id: str, key: str) -> None:
    """What a re-evaluation of the eval in its training run's environment would change, and the button that
    queues it (Environments and an eval's Run detail); disabled, with the reason, when there is nothing to do."""
    plan = reeval_plan(index, eval_run_id, eval_results_loader(cfg.store_uri))
    if plan.blocked:
        st.caption(f"Nothing to re-evaluate: {md(plan.blocked)}")
    elif plan.existing:
        st.caption(f"Already re-evaluated ({md(', '.join(plan.changes))}): {md(index.label(plan.existing))}")
        st.page_link(RUN_DETAIL_PAGE, label="Open the existing eval", query_params={"run": plan.existing},
                     icon=":material/science:")
    else:
        st.caption("Changes: " + md(", ".join(plan.changes)))
    if st.button("Re-evaluate under the training environment", key=key, disabled=plan.params is None,
                 icon=":material/replay:", type="primary",
                 help=md(plan.blocked) if plan.blocked else (
                     "an eval with these settings in this environment exists" if plan.existing
                     else "queue the same eval with the changes above")):
        with reported():
            job = submit_eval(queue_for(cfg.jobs_uri), plan.params)
            if job.existing:
                st.info(f"Already {job.state}: job #{job.id} has the same checkpoint and settings.")
            else:
                st.success(f"Queued job #{job.id}.")
            st.page_link("pages/launch.py", label="Follow it in the queue", icon=":material/list:")

