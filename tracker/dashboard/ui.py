"""Streamlit glue shared by the pages: settings from the environment, cached loaders, small widgets.

Only the dashboard imports this module (it imports Streamlit). The data work is in
`tracker.dashboard.views`, `tracker.dashboard.compare`, `tracker.dashboard.envmatrix`, `tracker.dashboard.launch_form` and
`tracker.store.history`; this module caches their results per store and draws the pieces every
page shares (store info, badges, banners, empty states).

Environment:
- `MLFLOW_TRACKING_URI` / `DRAFTBOARD_HOME`: the store (as `tracker.store.tracker.resolve_uri`).
- `DRAFTBOARD_JOBS_URI`: the job queue (default `<home>/jobs.db`).
- `DRAFTBOARD_READONLY=1`: hide launch, cancel, re-evaluate and promote controls.
- `DRAFTBOARD_MLFLOW_UI`: base URL of `mlflow ui` for run links (default http://127.0.0.1:5000).
- `DRAFTBOARD_ALLOWED_ROOTS`: where the Launch page may read checkpoints, targets and prompts.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from tracker import config
from tracker.store import history as metrics_sql
from tracker.dashboard.views import (
    DEFAULT_MLFLOW_UI,
    EVAL_RESULTS_ARTIFACT,
    FINGERPRINT_ARTIFACT,
    RunIndex,
    RunInfo,
    empty_store_message,
    load_run_index,
    read_json_artifact,
)

RUN_DETAIL_PAGE = "pages/run_detail.py"
COMPARE_PAGE = "pages/compare.py"
DEFAULT_MAX_POINTS = metrics_sql.PLOT_MAX_POINTS  # per curve on the Compare page
INDEX_TTL_S = 5


@dataclass(frozen=True)
class Settings:
    store_uri: str
    jobs_uri: str
    readonly: bool
    mlflow_ui: str
    allowed_roots: tuple[Path, ...]


def settings() -> Settings:
    """Read on every rerun, so a test (or a restart with other env vars) sees its own values."""
    return Settings(
        store_uri=config.store_uri(),
        jobs_uri=config.jobs_uri(),
        readonly=config.readonly(),
        mlflow_ui=os.environ.get("DRAFTBOARD_MLFLOW_UI") or DEFAULT_MLFLOW_UI,
        allowed_roots=tuple(config.allowed_roots()),
    )


# --------------------------------------------------------------------------- cached loaders


@st.cache_resource(show_spinner=False)
def tracker_for(uri: str):
    from tracker.store.tracker import Tracker

    return Tracker(uri)


@st.cache_resource(show_spinner=False)
def queue_for(uri: str):
    from tracker.jobs.queue import JobQueue

    return JobQueue(uri)


_fingerprints: dict[tuple[str, str], dict] = {}  # fingerprint.json never changes once logged
_fp_lock = threading.Lock()


def _fingerprint_loader(uri: str):
    tracker = tracker_for(uri)

    def load(run_id: str, artifact_uri: str) -> dict | None:
        key = (uri, run_id)
        with _fp_lock:
            if key in _fingerprints:
                return _fingerprints[key]
        fp = read_json_artifact(tracker.client, run_id, artifact_uri, FINGERPRINT_ARTIFACT)
        if fp is not None:  # a missing one is looked for again next time
            with _fp_lock:
                _fingerprints[key] = fp
        return fp

    return load


@st.cache_resource(ttl=INDEX_TTL_S, show_spinner="Reading runs…")
def run_index(uri: str) -> RunIndex:
    """Every run with its fingerprint; shared by all sessions, re-read after INDEX_TTL_S."""
    return load_run_index(tracker_for(uri), _fingerprint_loader(uri))


@st.cache_resource(max_entries=64, show_spinner=False)
def _eval_results(uri: str, run_id: str, artifact_uri: str) -> dict | None:
    return read_json_artifact(tracker_for(uri).client, run_id, artifact_uri, EVAL_RESULTS_ARTIFACT)


def eval_results_loader(uri: str):
    return lambda run: _eval_results(uri, run.run_id, run.artifact_uri)


@st.cache_data(max_entries=32, show_spinner="Loading metric histories…")
def _histories(uri: str, run_ids: tuple[str, ...], keys: tuple[str, ...] | None, max_points: int | None,
               signature: tuple) -> pd.DataFrame:
    del signature  # part of the cache key only: it changes when a run logs new steps
    return metrics_sql.load_histories(uri, list(run_ids), None if keys is None else list(keys), max_points)


def histories(uri: str, run_ids, keys=None, max_points: int | None = DEFAULT_MAX_POINTS,
              index: RunIndex | None = None) -> pd.DataFrame:
    """Metric histories, cached on (uri, runs, keys, max_points, latest steps of the runs).

    The latest steps come from MLflow's latest_metrics table on a database store; on an http
    store from the run index (re-read every INDEX_TTL_S), which saves a request per run.
    """
    run_ids = tuple(sorted(set(run_ids)))
    if not run_ids:
        return metrics_sql.load_histories(uri, [], None, max_points)
    if index is not None and not metrics_sql.is_database_uri(uri):
        sig = tuple((r, tuple(sorted(index.runs[r].metric_steps.items()))) for r in run_ids if r in index.runs)
    else:
        sig = metrics_sql.history_signature(uri, run_ids, client=tracker_for(uri).client)
    return _histories(uri, run_ids, None if keys is None else tuple(sorted(keys)), max_points, sig)


def refresh() -> None:
    """Forget cached runs and histories (after a change made from the dashboard, or on request)."""
    run_index.clear()
    _histories.clear()


# --------------------------------------------------------------------------- shared widgets


def store_sidebar(cfg: Settings, index: RunIndex | None = None) -> None:
    with st.sidebar:
        if st.button("Refresh", key="refresh", icon=":material/refresh:", help="re-read runs and histories now"):
            refresh()
            st.rerun()
        if cfg.readonly:
            st.badge("read-only", icon=":material/lock:", color="gray",
                     help="DRAFTBOARD_READONLY=1: launch, cancel, re-evaluate and promote are hidden")
        caption = f"Store: `{cfg.store_uri}`"
        if index is not None:
            caption += f" · {len(index)} runs"
        st.caption(caption)


def load_index_or_stop(cfg: Settings) -> RunIndex:
    """The run index; on a store error or an empty store, say so and stop the page."""
    from tracker.errors import DraftboardError

    try:
        index = run_index(cfg.store_uri)
    except DraftboardError as exc:
        st.error(f"Cannot read the store: {exc}")
        st.stop()
    if len(index) == 0:
        empty_state(cfg)
    return index


def empty_state(cfg: Settings) -> None:
    msg = empty_store_message(cfg.store_uri)
    st.info(f"**{msg.title}** {msg.hint}", icon=":material/inbox:")
    for line in msg.extra:
        st.caption(line)
    st.stop()


LINEAR_COLORS = {"fast": "green", "fallback": "orange", "partial": "yellow"}


def env_badges(run: RunInfo) -> None:
    """Badges for the environment that produced a run's numbers."""
    with st.container(horizontal=True):
        if run.published:
            st.badge("published", icon=":material/menu_book:", color="violet",
                     help=f"numbers from a publication, for target {run.target or 'unknown'}; "
                          "their environment is mostly unknown")
        st.badge(f"linear-attn {run.linear_attn}", color=LINEAR_COLORS.get(run.linear_attn, "gray"),
                 help="which implementation ran the Gated DeltaNet layers: fast = fla + causal-conv1d kernels, "
                      "fallback = transformers' torch code, partial = a mix")
        device = f"{run.device} · {run.gpu}" if run.gpu and run.device == "cuda" else run.device
        st.badge(device, icon=":material/memory:", color="blue", help="device kind (and GPU model)")
        st.badge(run.dtype, color="gray", help="dtype of the target's forward pass")
        if run.env_hash:
            st.badge(f"env {run.env_hash}", color="gray",
                     help="hash of the fingerprint fields that can change the numbers: equal hashes, comparable numbers")


def mismatch_banner(lines: list[str], title: str) -> None:
    if not lines:
        return
    shown = lines[:8]
    more = f"\n- … and {len(lines) - 8} more" if len(lines) > 8 else ""
    st.error(f"**{title}**\n" + "\n".join(f"- {line}" for line in shown) + more, icon=":material/warning:")


def run_option_label(index: RunIndex, run_id: str) -> str:
    run = index.get(run_id)
    if run is None:
        return run_id
    extra = f" · step {run.checkpoint_step}" if run.kind != "train" and run.checkpoint_step is not None else ""
    return f"{index.label(run_id)} — {run.kind_label}{extra} · {run.target_name}"
