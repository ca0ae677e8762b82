"""The Launch page's logic: which paths may be evaluated, the eval job's params, the queue's view.

Evals launched from the dashboard run on the dashboard's machine (a local `draftboard
worker`), so the paths typed into the form are checked against allowed roots:
`DRAFTBOARD_ALLOWED_ROOTS` (os.pathsep-separated), default `DRAFTBOARD_HOME`. Checkpoints
registered on a training run are trusted (the store recorded them). The job itself is its
params only (`tracker.jobs.eval_job` validates them; the worker builds the command), submitted
to the `JobQueue`, whose dedup answers a second submission of the same checkpoint and settings
with the first job. Before queueing, an eval
for a tracking server is refused unless the dashboard's own credentials may write to its
experiment (`check_can_write`): an account with READ only would otherwise queue evals whose
results could never be logged (the worker usually logs with the same account).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tracker import config
from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from tracker.jobs.queue import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job, JobQueue

if TYPE_CHECKING:
    from tracker.store.tracker import Tracker

LINEAR_ATTN_CHOICES = (*config.LINEAR_ATTN_MODES, "match training run")
DEVICES, DTYPES = config.DEVICES, config.EVAL_DTYPES  # the form's choices (pages import only tracker.dashboard)
DEFAULT_BUDGETS = ",".join(map(str, config.DEFAULT_BUDGETS))
STATE_ICONS = {QUEUED: "⏳", RUNNING: "🏃", SUCCEEDED: "✅", FAILED: "❌", CANCELLED: "🚫"}


def check_path(path: str, roots: Sequence[Path], what: str) -> str:
    """The resolved path if it exists under one of `roots`, with nothing in a folder there leading
    outside them (`tracker.jobs.eval_job.check_path`); DraftboardError with a clear message otherwise."""
    if not path or not path.strip():
        raise DraftboardError(f"{what}: enter a path")
    try:
        resolved = eval_job.check_path(what + ":", path.strip(), roots)
    except DraftboardError as exc:
        raise DraftboardError(f"{exc}; the dashboard only evaluates files under them. Set DRAFTBOARD_ALLOWED_ROOTS "
                              f"(paths separated by '{os.pathsep}') to allow more.") from None
    if not resolved.exists():
        raise DraftboardError(f"{what}: {resolved} does not exist")
    return str(resolved)


def parse_budgets(text: str) -> list[int]:
    """`4,8,16` -> [4, 8, 16] (each at most config.MAX_BUDGET); DraftboardError on anything else."""
    try:
        return eval_job.parse_budgets(text)
    except ValueError as exc:
        raise DraftboardError(f"budgets: {exc}") from None


def training_linear_attn(fp: dict | None) -> tuple[str | None, str]:
    """(the `--linear-attn` value that reproduces a training run's path, explanation)."""
    path = ((fp or {}).get("numerics") or {}).get("linear_attention_path")
    if path in ("fast", "fallback"):
        return path, f"training run used the {path} path"
    if path is None:
        return None, "the training run's linear-attention path is unknown (no fingerprint, or imported)"
    return None, f"the training run's path is '{path}', which cannot be forced; choose auto, fast or fallback"


@dataclass
class LaunchForm:
    """What the Launch page collects."""

    target: str
    prompts: str
    drafter: str | None = None  # a path typed by the user (checked against the roots)
    checkpoint_path: str | None = None  # a registered checkpoint's path (trusted)
    train_run_id: str | None = None
    checkpoint_step: int | None = None
    budgets: str = DEFAULT_BUDGETS
    max_new_tokens: int = eval_job.FIELDS["max_new_tokens"].default
    device: str = "cpu"
    dtype: str = "fp32"
    linear_attn: str = "auto"
    training_fingerprint: dict | None = None
    reference: bool = False
    reference_name: str = ""


def eval_params(form: LaunchForm, tracking_uri: str, roots: Sequence[Path]) -> dict:
    """Validated eval job params (`tracker.jobs.eval_job.validate`); DraftboardError says what is wrong."""
    if form.checkpoint_path:
        drafter = form.checkpoint_path
    elif form.drafter:
        drafter = check_path(form.drafter, roots, "checkpoint")
    else:
        raise DraftboardError("choose a registered checkpoint or enter a checkpoint path")
    target = check_path(form.target, roots, "target")
    prompts = check_path(form.prompts, roots, "prompts file")
    linear = form.linear_attn
    if linear == "match training run":
        linear, why = training_linear_attn(form.training_fingerprint)
        if linear is None:
            raise DraftboardError(f"linear-attention path: {why}")
    if not isinstance(form.max_new_tokens, int) or form.max_new_tokens < 1:
        raise DraftboardError("max new tokens must be a positive integer")
    params = {
        "target": target,
        "drafter": drafter,
        "prompts": prompts,
        "max_new_tokens": int(form.max_new_tokens),
        "budgets": parse_budgets(form.budgets),
        "device": form.device,
        "dtype": form.dtype,
        "linear_attn": linear,
        "tracking_uri": tracking_uri,
    }
    if form.train_run_id:
        params["train_run_id"] = form.train_run_id
        if form.checkpoint_step is not None:
            params["checkpoint_step"] = int(form.checkpoint_step)
    if form.reference:
        name = form.reference_name.strip()
        if not name:
            raise DraftboardError("a reference needs a name (e.g. z-lab v1)")
        params["reference"] = name
    return eval_job.validate(params)  # the same checks the queue and the worker apply


# The experiment tag `check_can_write` sets: the last time (UTC, ISO 8601) a launch checked access.
WRITE_CHECK_TAG = "draftboard.write_check"


def check_can_write(tracking_uri: str | None, tracker: Tracker | None = None) -> None:
    """DraftboardError (one line) unless this process's MLflow credentials may write to the experiment.

    Only tracking servers (http, https) are checked, by the write an eval needs first: an
    update of the experiment (`set_experiment_tag` of WRITE_CHECK_TAG), which MLflow's
    basic-auth app allows from EDIT up, like creating a run. A server that says 401 or 403 is
    refused; an experiment not created yet is not (whoever logs first creates it). Local
    stores are left to the file system. `tracker`: one already open on tracking_uri.
    """
    if not tracking_uri or not tracking_uri.startswith(("http://", "https://")):
        return
    from mlflow.exceptions import MlflowException

    from tracker.store.tracker import Tracker, access_problem

    tracker = tracker if tracker is not None else Tracker(tracking_uri)
    experiment_id = tracker.find_experiment()  # DraftboardError on 401 / no server
    if experiment_id is None:
        return
    try:
        tracker.client.set_experiment_tag(experiment_id, WRITE_CHECK_TAG,
                                          datetime.now(timezone.utc).isoformat(timespec="seconds"))
    except MlflowException as exc:
        if exc.error_code == "PERMISSION_DENIED":
            user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(none set)"
            raise DraftboardError(
                f"not queued: MLflow user {user} may not write to experiment '{tracker.experiment_name}' on "
                f"{tracking_uri}; an MLflow admin must grant it EDIT there (docs/DEPLOY.md, Users and permissions)"
            ) from exc
        raise DraftboardError(
            f"not queued: cannot check write access to {tracking_uri}: {access_problem(exc) or exc.message}"
        ) from exc
    except Exception as exc:  # the server went away between the two requests
        raise DraftboardError(f"not queued: cannot reach tracking store {tracking_uri}: {exc}") from exc


def submit_eval(queue: JobQueue, params: dict, tracker: Tracker | None = None) -> Job:
    """Queue an eval job, or get back the queued/running/succeeded one with the same params (existing=True).

    Refused (DraftboardError) when params' tracking server would not accept its results from
    this process's credentials (`check_can_write`; `tracker`: one open on that URI).
    """
    params = eval_job.validate(params)  # bad params are refused before the store is asked
    check_can_write(params.get("tracking_uri"), tracker)
    return queue.submit(eval_job.KIND, params)


# --------------------------------------------------------------------------- queue view


@dataclass(frozen=True)
class JobView:
    id: int
    title: str  # "⏳ #3 eval v4 @ step 200 · queued"
    state: str
    progress: float
    progress_text: str
    when: str
    can_cancel: bool
    run_id: str | None
    error: str | None
    job: Job


def _ago(ts: datetime | None, now: datetime) -> str:
    if ts is None:
        return "—"
    seconds = max(0, int((now - ts).total_seconds()))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    if seconds < 86400:
        return f"{seconds // 3600}h ago"
    return ts.strftime("%Y-%m-%d %H:%M UTC")


def describe_job(job: Job, run_labels: dict[str, str] | None = None, now: datetime | None = None) -> JobView:
    """What the queue list shows for one job."""
    now = now or datetime.now(timezone.utc)
    p = job.params
    what = Path(str(p.get("drafter", "?"))).name
    train = (run_labels or {}).get(p.get("train_run_id") or "")
    if train and p.get("checkpoint_step") is not None:
        what = f"{train} @ step {p['checkpoint_step']}"
    if p.get("reference"):
        what = f"reference {p['reference']} ({what})"
    env = f"{p.get('linear_attn', 'auto')}/{p.get('device', '?')}/{p.get('dtype', '?')}"
    title = f"{STATE_ICONS.get(job.state, '')} #{job.id} eval {what} · {env} · {job.state}"
    stage = job.stage or ("waiting for a worker" if job.state == QUEUED else "")
    if job.state == RUNNING and job.cancel_requested:
        stage = f"cancelling… ({stage})" if stage else "cancelling…"
    progress = 1.0 if job.state == SUCCEEDED else min(max(job.progress, 0.0), 1.0)
    text = f"{stage} · {progress:.0%}" if stage else f"{progress:.0%}"
    when = (f"finished {_ago(job.finished_at, now)}" if job.finished_at else
            f"started {_ago(job.started_at, now)}" if job.started_at else f"queued {_ago(job.created_at, now)}")
    return JobView(job.id, title, job.state, progress, text, when,
                   can_cancel=job.state in (QUEUED, RUNNING) and not job.cancel_requested,
                   run_id=job.mlflow_run_id, error=job.error, job=job)
