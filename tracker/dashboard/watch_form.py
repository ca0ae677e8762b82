"""Run detail's checkpoint watch: register a folder for a training run; `draftboard worker --watch` runs it.

The page only writes the watch state into the store (`tracker.jobs.watch.start`: the run's
`draftboard.watch` tag and `watch.json`); the worker scans every watched run, records each new
checkpoint once and queues its eval when the watch has a preset. Nothing watches inside the
dashboard process, so a restart of either side loses nothing. The folder and the preset's paths
are typed into a page, so they go through the allowed-roots check as the Launch form's do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from tracker.dashboard.index import RunIndex, RunInfo
from tracker.dashboard.launch_form import check_path, form_defaults
from tracker.errors import DraftboardError
from tracker.jobs import eval_job, watch

DEFAULT_SETTLE_S = watch.DEFAULT_SETTLE_S
SEEN_COLUMNS = ["entry", "step", "layout", "eval job", "sha256"]


def state(tracker, run_id: str) -> watch.WatchState | None:
    """The run's watch state; None when it is not watched."""
    return watch.state(tracker, run_id)


def default_preset(index: RunIndex, run: RunInfo) -> str:
    """The eval preset the form starts from: what the Launch form would evaluate this run's
    checkpoints with (its target, the project's usual prompts, the default budgets, its device)."""
    defaults = form_defaults(index, run)
    preset = {"target": defaults["target"], "prompts": defaults["prompts"],
              "budgets": [int(b) for b in defaults["budgets"].split(",")], "device": defaults["device"] or "cpu",
              "dtype": defaults["dtype"] or "fp32"}
    return json.dumps({k: v for k, v in preset.items() if v is not None}, indent=2)


def parse_preset(text: str, roots: Sequence[Path]) -> dict | None:
    """The preset typed into the form, validated as eval params with its paths under roots; None when blank."""
    if not text.strip():
        return None
    try:
        preset = json.loads(text)
    except ValueError as exc:
        raise DraftboardError(f"eval preset: not JSON ({exc})") from None
    checked = watch.check_preset(preset)
    try:
        eval_job.check_paths(checked, roots)
    except DraftboardError as exc:
        raise DraftboardError(f"eval preset: {exc}") from None
    return checked


def register(tracker, run_id: str, folder: str, preset_text: str, settle_s: float,
             roots: Sequence[Path]) -> watch.WatchState:
    """Start (or update) the watch of `folder` for `run_id`, evaluating each new checkpoint with
    the preset (blank: record only); DraftboardError says what is wrong."""
    path = check_path(folder, roots, "checkpoint folder")
    preset = parse_preset(preset_text, roots)
    if settle_s < 0:
        raise DraftboardError("settle time: must be 0 or more seconds")
    return watch.start(tracker, run_id, path, preset, settle_s=settle_s, keep_preset=False)


def seen_frame(state: watch.WatchState) -> pd.DataFrame:
    """The checkpoints the watch recorded, by step, with the eval it queued for each."""
    rows = [{"entry": name, "step": seen.get("step"), "layout": seen.get("layout"),
             "eval job": f"#{seen['job_id']}" if seen.get("job_id") is not None else "—",
             "sha256": (seen.get("sha256") or "")[:12]} for name, seen in state.seen.items()]
    frame = pd.DataFrame(rows, columns=SEEN_COLUMNS)
    return frame.sort_values("step", ignore_index=True) if not frame.empty else frame
