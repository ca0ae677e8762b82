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

import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tracker import config, redact
from tracker.dashboard.envmatrix import environment_flags
from tracker.dashboard.escape import md, md_code
from tracker.dashboard.index import DRAFTER_FAMILY_LABELS, RunIndex, RunInfo
from tracker.dashboard.lineage import eval_settings_of
from tracker.errors import DraftboardError
from tracker.events import PREFIX as EVENT_PREFIX
from tracker.store import names
from tracker.jobs import eval_job
from tracker.jobs import gpus as gpu_slots
from tracker.jobs import inputs
from tracker.jobs.queue import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job, JobQueue, WorkerInfo

if TYPE_CHECKING:
    from tracker.store.tracker import Tracker

LINEAR_ATTN_CHOICES = (*config.LINEAR_ATTN_MODES, "match training run")
# the form's choices (pages import only tracker.dashboard)
DEVICES, DTYPES, DRAFTER_PRECISIONS = config.DEVICES, config.EVAL_DTYPES, config.DRAFTER_PRECISIONS
DEFAULT_BUDGETS = ",".join(map(str, config.DEFAULT_BUDGETS))
SAMPLING_PRESETS, MAX_DRAWS = config.SAMPLING_PRESETS, config.MAX_DRAWS
DEFAULT_REPEATS, MAX_REPEATS = config.DEFAULT_REPEATS, config.MAX_REPEATS
CUSTOM_SAMPLING = "custom"  # the sampling picker's own numbers
STATE_ICONS = {QUEUED: "⏳", RUNNING: "🏃", SUCCEEDED: "✅", FAILED: "❌", CANCELLED: "🚫"}
PROMPT_PATH = "__path__"  # the prompts picker's "a path under the allowed roots…" choice


def benchmark_spec(name: str) -> str:
    """`--prompts` for a named z-lab benchmark set: `gsm8k` -> `hf:openai/gsm8k:main:test`."""
    hub_id, subset, split = config.ZLAB_BENCHMARKS[name]
    return config.HF_DATASET_PREFIX + ":".join(p for p in (hub_id, subset, split) if p)


@dataclass(frozen=True)
class PromptChoice:
    value: str  # what `--prompts` gets (PROMPT_PATH: the path typed below the picker)
    label: str


def prompt_choices(index: RunIndex) -> list[PromptChoice]:
    """The prompts picker: the prompt files the project's evals used (most used first: a new eval
    on them is comparable with theirs), z-lab's benchmark sets by name (read by the worker's
    `datasets` library, with z-lab's column mapping; each prompt labelled with its set, so Compare
    meets the reference's number for it), then a path under the allowed roots."""
    used = Counter(m["prompts"] for m in map(eval_settings_of, index.of_kind("eval", "reference")) if m.get("prompts"))
    benchmarks = {benchmark_spec(name): name for name in config.ZLAB_BENCHMARKS}
    choices = [PromptChoice(spec, f"{Path(spec).name} · used by {n} eval(s) · {spec}")
               for spec, n in used.most_common() if spec not in benchmarks]
    choices += [PromptChoice(spec, f"{name} · z-lab benchmark set · {spec}") for spec, name in benchmarks.items()]
    return [*choices, PromptChoice(PROMPT_PATH, "a path under the allowed roots…")]


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
    if resolved is None:  # a hub dataset (`hf:NAME:SPLIT`): the worker's `datasets` fetches it
        return path.strip()
    if not resolved.exists():
        raise DraftboardError(f"{what}: {resolved} does not exist")
    return str(resolved)


def parse_budgets(text: str) -> list[int]:
    """`4,8,16` -> [4, 8, 16] (each at most config.MAX_BUDGET); DraftboardError on anything else."""
    try:
        return eval_job.parse_ints("budgets", text)
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


def form_defaults(index: RunIndex, run: RunInfo | None) -> dict:
    """What the Launch form starts from for a chosen training run: its environment (fingerprint)
    and target, the prompts and max new tokens most of its evals used (they define the
    measurement: a new eval with them is comparable; the most common, so one odd job never
    wins), and the project's default budgets (each budget is its own metric, so extra or
    fewer never change comparability). Never another visitor's last job."""
    defaults = {"prompts": None, "max_new_tokens": eval_job.FIELDS["max_new_tokens"].default,
                "budgets": DEFAULT_BUDGETS, "target": None, "device": None, "dtype": None, "drafter_precision": None}
    if run is None:
        return defaults
    defaults["target"] = run.target
    env = environment_flags(run.fingerprint)
    for key, choices in (("device", DEVICES), ("dtype", DTYPES), ("drafter_precision", DRAFTER_PRECISIONS)):
        defaults[key] = env[key] if env[key] in choices else None
    # This run's evals first; a run with none (a new run, a reference's own training run) takes
    # what the project's evals use most.
    for evals in (index.evals_of(run.run_id), index.of_kind("eval")):
        measured = [m for m in map(eval_settings_of, evals) if m.get("prompts")]
        if measured:
            for key in ("prompts", "max_new_tokens"):
                common = Counter(m[key] for m in measured if m.get(key)).most_common(1)
                if common:
                    defaults[key] = common[0][0]
            break
    return defaults


@dataclass
class LaunchForm:
    """What the Launch page collects. Its counts come as the page's number inputs give them (floats, so a
    fraction is seen): `eval_params` takes each as a whole number or refuses it."""

    target: str
    prompts: str
    drafter: str | None = None  # a path typed by the user (checked against the roots)
    checkpoint_path: str | None = None  # a registered checkpoint's path (trusted)
    train_run_id: str | None = None
    train_name: str | None = None  # the training run's label: names the eval (names.eval_run_name)
    drafter_family: str | None = None  # the training run's (`RunInfo.drafter_family`): DFlash2 runs no DDTree
    checkpoint_step: float | None = None
    budgets: str = DEFAULT_BUDGETS
    max_new_tokens: float = eval_job.FIELDS["max_new_tokens"].default
    device: str = "cpu"
    dtype: str = "fp32"
    drafter_precision: str | None = None  # None: the drafter cast to `dtype`
    linear_attn: str = "auto"
    training_fingerprint: dict | None = None
    reference: bool = False
    reference_name: str = ""
    limit_per_dataset: float | None = None  # at most N prompts per dataset (a fixed-seed sample)
    prompt_tokens: float | None = None  # a long-context set's prompts made N tokens long (evaluators/long_context.py)
    measured_by: tuple[str | None, str | None] = (None, None)  # (engine, url): measure_choices()
    temperature: float = 0.0  # T > 0: sampled acceptance (docs/DESIGN.md); with top_p, top_k as z-lab applies them
    top_p: float = 1.0
    top_k: float = 0
    samples: float = 1  # continuations drawn per prompt (T > 0)
    concurrency: str = ""  # a load sweep's levels ("1,4,8"; empty: none), with an engine
    repeats: float | None = None  # a sweep's rounds per level (None: config.DEFAULT_REPEATS)
    gpus: float | None = None  # GPUs the job holds on a worker that hands them out (None: tracker.jobs.gpus.needed)
    shards: float | None = None  # processes the prompts are split across, one GPU each on cuda (None: one)


OFFLINE = (None, None)


def measure_choices(env=None) -> list[tuple[str | None, str | None]]:
    """What may measure an eval: offline, an engine the worker starts (where the deployment names its
    Python, DRAFTBOARD_<ENGINE>_PYTHON), or a running server from DRAFTBOARD_ENGINE_URLS."""
    managed = [(e, None) for e in config.ENGINES if config.engine_python(e, env)]
    attached = [(e, url) for url in config.engine_urls(env) for e in config.ENGINES]
    return [OFFLINE, *managed, *attached]


def no_engine_note(env=None) -> str | None:
    """What the Launch form says under "Measured by" when the deployment names no engine (only offline
    is offered): how to get served numbers; None when an engine is configured."""
    if len(measure_choices(env)) > 1:
        return None
    pythons = ", ".join(f"`{config.engine_python_var(e)}`" for e in config.ENGINES)
    return (f"Only offline here: no serving engine is configured. For the numbers a served drafter gets, set "
            f"{pythons} (an engine's venv, started by the worker) or `{config.ENGINE_URLS_VAR}` (running servers) "
            "where the dashboard and its worker run; docs/DEPLOY.md.")


def measure_label(choice: tuple[str | None, str | None]) -> str:
    engine, url = choice
    if engine is None:
        return "offline (teacher-forced, exact)"
    name = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp"}.get(engine, engine)
    return f"{name} at {redact.shown_uri(url)}" if url else f"{name} (started by the worker)"


MAX_CONFIG_BYTES = 1 << 20  # a transformers config.json is a few KB


def _target_config(target: str) -> list[dict]:
    """The target's config.json sections (the top level, and the text_config a multimodal checkpoint
    nests); [] where the folder holds no readable config (the worker says why)."""
    file = Path(target) / "config.json"
    try:
        if file.stat().st_size > MAX_CONFIG_BYTES:
            return []
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [section for section in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None)
            if isinstance(section, dict)]


def target_context(target: str) -> int | None:
    """The target's context length (config.json's max_position_embeddings, or its text_config's)."""
    for section in _target_config(target):
        value = section.get("max_position_embeddings")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def target_is_hybrid(target: str) -> bool:
    """Whether the target has Gated DeltaNet (linear-attention) layers, as its config.json says: in
    `layer_types`, or as the Qwen3-Next / Qwen3.5 releases write it, `full_attention_interval` (every
    Nth layer full attention, the others GDN; transformers derives layer_types from it)."""
    return any((isinstance(section.get("layer_types"), list) and "linear_attention" in section["layer_types"])
               or (section.get("layer_types") is None and isinstance(section.get("full_attention_interval"), int))
               for section in _target_config(target))


def _whole(value, label: str) -> int:
    """A form's count as an int; a fraction is refused, never rounded."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value):
        raise DraftboardError(f"{label} must be a whole number, got {value!r:.20}")
    return int(value)


def unused_settings(form: LaunchForm) -> list[str]:
    """What the form holds that the eval it queues will not use, each with why (said on Launch when
    queued, never dropped in silence)."""
    sampled, engine = form.temperature != 0, form.measured_by[0]
    out = []
    if (sampled or engine) and form.budgets.strip():
        out.append("DDTree budgets (" + ("an engine drafts one chain" if engine else
                                          "DDTree verifies greedily: a sampled eval runs none") + ")")
    elif form.drafter_family == DRAFTER_FAMILY_LABELS["dflash2"] and form.budgets.strip():
        out.append("DDTree budgets (DDTree is not run for a DFlash2 drafter: its candidate selector walks one path)")
    if not sampled and form.samples not in (0, 1):
        out.append(f"Samples {form.samples:g} (T = 0 draws one greedy continuation per prompt)")
    elif sampled and engine and form.samples not in (0, 1):
        out.append(f"Samples {form.samples:g} (an engine eval sends each prompt once)")
    return out


# Launch's form fields (session-state keys) and the job params they hold, one to one.
FORM_FIELDS = {"launch_target": "target", "launch_max_new": "max_new_tokens", "launch_device": "device",
               "launch_dtype": "dtype", "launch_precision": "drafter_precision", "launch_linear": "linear_attn",
               "launch_limit": "limit_per_dataset", "launch_prompt_tokens": "prompt_tokens", "launch_gpus": "gpus",
               "launch_shards": "shards"}
# The params `edit_state` carries besides FORM_FIELDS' (the run's name is derived anew by `eval_params`); every
# other param a job may hold has no field in the form, and Edit names it (queued again, it takes the default).
_CARRIED = {*FORM_FIELDS.values(), "drafter", "prompts", "budgets", "checkpoint_step", "train_run_id", "concurrency",
            "repeats",
            "temperature", "top_p", "top_k", "samples", "engine", "engine_url", "reference", "name"}
_NOT_IN_FORM = tuple(f.name for f in eval_job.JOB_FIELDS if f.name not in _CARRIED)


def edit_state(params: dict, choices: Sequence[tuple[str | None, str | None]]) -> tuple[dict, list[str]]:
    """What Edit puts in Launch's form for a job's `params` (session-state key -> value), and one line for each
    setting it cannot put there, saying why, so that queueing again never silently changes the eval."""
    # Every field is set, from the job or, where the job holds no value, from what `draftboard eval` then ran (the
    # flag's default): never whatever the form held before (issue 65 M2).
    state = {key: params.get(field, eval_job.FIELDS[field].default) for key, field in FORM_FIELDS.items()}
    state["launch_step"] = params.get("checkpoint_step")
    notes = []
    # a sampled or engine job runs no DDTree: its budgets field is empty, as the job is
    state["launch_budgets"] = ",".join(str(b) for b in params.get("budgets") or ())
    state["launch_concurrency"] = ",".join(str(c) for c in params.get("concurrency") or ())
    state["launch_repeats"] = params.get("repeats")
    chosen = (float(params.get("temperature", 0.0)), float(params.get("top_p", 1.0)), int(params.get("top_k", 0)))
    state["launch_sampling"] = next((name for name, numbers in SAMPLING_PRESETS.items() if numbers == chosen),
                                    CUSTOM_SAMPLING)
    state.update(launch_temperature=chosen[0], launch_top_p=chosen[1], launch_top_k=chosen[2])
    state["launch_samples"] = params.get("samples", 1)  # an engine or greedy job draws one continuation per prompt
    measured = (params.get("engine"), params.get("engine_url"))
    if measured in choices:
        state["launch_measured_by"] = measured
    else:
        state["launch_measured_by"] = OFFLINE
        notes.append(f"measured by {measure_label(measured)}: this deployment no longer offers it (its Python or URL "
                     "is not configured here), so the form says offline")
    state["launch_reference"] = bool(params.get("reference"))
    state["launch_reference_name"] = params.get("reference") or ""
    for field in _NOT_IN_FORM:
        if params.get(field) not in (None, False, (), []):
            notes.append(f"{field} {params[field]!r}: the form has no field for it; queued from here it takes the "
                         "default (run `draftboard eval` to keep it)")
    return state, notes


def registered_step(params: Mapping, paths: Mapping[int, str]) -> int | None:
    """The registered checkpoint a job evaluated (`paths`: its training run's checkpoints, step -> path), so Edit picks
    that step again rather than the path typed out; None when the job's drafter is none of them."""
    step = params.get("checkpoint_step")
    drafter = params.get("drafter")
    if step in paths and drafter and os.path.realpath(paths[step]) == os.path.realpath(drafter):
        return step
    return None


def eval_params(form: LaunchForm, roots: Sequence[Path]) -> dict:
    """Validated eval job params (`tracker.jobs.eval_job.validate`); DraftboardError says what is wrong."""
    if form.checkpoint_path:
        drafter = form.checkpoint_path
    elif form.drafter:
        drafter = check_path(form.drafter, roots, "checkpoint")
    else:
        raise DraftboardError("choose a registered checkpoint or enter a checkpoint path")
    target = check_path(form.target, roots, "target")
    prompts = check_path(form.prompts, roots, "prompts file")
    # what the worker would refuse in its first second, refused now (tracker/jobs/inputs.py, the worker's own look)
    problem = inputs.inputs_problem({"target": target, "prompts": prompts,
                                     **({} if form.checkpoint_path else {"drafter": drafter})})
    if problem:
        raise DraftboardError(problem)
    linear = form.linear_attn
    engine, url = form.measured_by
    if linear == "match training run" and not engine:  # an engine runs its own kernels: the switch is not asked
        linear, why = training_linear_attn(form.training_fingerprint)
        if linear is None:
            raise DraftboardError(f"linear-attention path: {why}")
    max_new = _whole(form.max_new_tokens, "max new tokens")
    limit = None if form.limit_per_dataset is None else _whole(form.limit_per_dataset, "prompts per dataset")
    prompt_tokens = None if form.prompt_tokens is None else _whole(form.prompt_tokens, "prompt tokens")
    if max_new < 1:
        raise DraftboardError("max new tokens must be a positive integer")
    context = target_context(target)
    if context is not None and max_new >= context:
        raise DraftboardError(f"max new tokens {max_new} leaves no room for a prompt in the target's "
                              f"context of {context} tokens (max_position_embeddings)")
    if problem := config.hub_dataset_problem(prompts):
        raise DraftboardError(problem)
    if limit is not None and limit < 1:
        raise DraftboardError("prompts per dataset must be a positive integer (or empty: all of them)")
    if prompt_tokens is not None and not 1 <= prompt_tokens <= config.MAX_CONTEXT_EDGE:
        raise DraftboardError(f"prompt tokens must be a positive integer up to {config.MAX_CONTEXT_EDGE} (or empty: each "
                              "prompt at its own length)")
    if prompt_tokens is not None and context is not None and prompt_tokens + max_new >= context:
        raise DraftboardError(f"{prompt_tokens} prompt tokens + max new tokens {max_new} do not fit the "
                              f"target's context of {context} tokens (max_position_embeddings)")
    params = {
        "target": target,
        "drafter": drafter,
        "prompts": prompts,
        "max_new_tokens": max_new,
        # DDTree runs only offline and greedy: elsewhere an empty field is no budgets (unused_settings names others)
        "budgets": parse_budgets(form.budgets) if form.budgets.strip() or not (engine or form.temperature) else [],
        "device": form.device,
        "dtype": form.dtype,
        "drafter_precision": form.drafter_precision,
        "linear_attn": linear,
    }
    if limit is not None:
        params["limit_per_dataset"] = limit
    if prompt_tokens is not None:
        params["prompt_tokens"] = prompt_tokens
    if form.gpus is not None:
        gpus = _whole(form.gpus, "GPUs")
        if gpus and form.device == "cpu":
            raise DraftboardError(f"GPUs: a CPU eval holds none (device cpu), got {gpus}")
        params["gpus"] = gpus
    if form.shards is not None:
        shards = _whole(form.shards, "Shards")
        if problem := config.shards_problem(shards, "offline", form.measured_by[0], "Shards"):
            raise DraftboardError(problem)
        params["shards"] = shards
    if form.temperature != 0:  # greedy jobs keep the params they always had (the queue's dedup meets them)
        sampling = {"temperature": float(form.temperature), "top_p": float(form.top_p),
                    "top_k": _whole(form.top_k, "top_k")}
        if not form.measured_by[0]:  # an engine sends each prompt once
            sampling["samples"] = _whole(form.samples, "samples")
        # The queue's rule, said as the form's other errors are: by the field's name (the CLI says --top-p).
        if problem := config.sampling_problem(**sampling, say=str):
            raise DraftboardError(problem)
        params.update(sampling)
        params.pop("budgets")  # DDTree is greedy verification: a sampled eval runs none (unused_settings says so)
    if form.concurrency.strip():
        try:
            levels = eval_job.parse_ints("concurrency", form.concurrency)
        except ValueError as exc:
            raise DraftboardError(f"concurrency levels: {exc}") from None
        problem = config.load_problem(engine, levels, attached=bool(url))
        if problem:
            raise DraftboardError(problem)
        params["concurrency"] = levels
    repeats = None if form.repeats is None else _whole(form.repeats, "Rounds")
    if problem := config.repeats_problem(repeats, params.get("concurrency"), "Rounds"):
        raise DraftboardError(problem)
    if repeats is not None:
        params["repeats"] = repeats
    if engine:
        # The engine runs its own kernels and drafts one chain: DDTree budgets, the drafter's precision
        # and the linear-attention switch are offline settings, so the job claims none of them.
        for offline_only in ("budgets", "drafter_precision", "linear_attn"):
            params.pop(offline_only, None)
        params["engine"] = engine
        if url:
            params["engine_url"] = url
        elif target_is_hybrid(target) and (problem := config.engine_hybrid_problem(engine, form.device, form.dtype)):
            raise DraftboardError(problem)  # the worker's engine could not run it: said now, not after a start
    if form.train_run_id:
        params["train_run_id"] = form.train_run_id
        if form.checkpoint_step is not None:
            params["checkpoint_step"] = _whole(form.checkpoint_step, "checkpoint step")
            if form.train_name:
                params["name"] = names.eval_run_name(form.train_name, params["checkpoint_step"], params,
                                                     eval_job.setting_words(params))
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

    Refused (DraftboardError) when the deployment's tracking server (the workers log there too:
    a job names no store) would not accept its results from this process's credentials
    (`check_can_write`; `tracker`: one open on that store).
    """
    params = eval_job.validate(params)  # bad params are refused before the store is asked
    live = queue.workers()
    problem = (device_problem(live, params.get("device")) or gpus_problem(live, gpu_slots.needed(params))
               or memory_problem(live, params))
    if problem:
        raise DraftboardError(f"not queued: {problem}")
    check_can_write(tracker.uri if tracker is not None else config.store_uri(), tracker)
    return queue.submit(eval_job.KIND, params)


def device_problem(live: Sequence[WorkerInfo], device: str | None) -> str | None:
    """Why no live worker can run an eval on `device`; None when one can, or when no one can tell
    (no worker running yet, a launcher that cannot say, no device asked: each worker's default)."""
    if not live or device is None or any(w.devices is None or device in w.devices for w in live):
        return None
    offered = sorted({d for w in live for d in w.devices or ()})
    return (f"device {device}: no running worker can use it (their torch offers {', '.join(offered)}; a CPU-only "
            f"torch has no cuda)")


def gpus_problem(live: Sequence[WorkerInfo], needed: int) -> str | None:
    """Why no live worker could ever give a job `needed` GPUs; None when one can, or when no one can tell (no
    worker running, or one that pins no GPUs: its jobs are not held to a count)."""
    if not live or needed == 0 or any(w.gpus is None or len(w.gpus) >= needed for w in live):
        return None
    return f"the job asks for {needed} GPUs; the most any running worker has is {max(len(w.gpus) for w in live)}"


def memory_problem(live: Sequence[WorkerInfo], params: Mapping) -> str | None:
    """Why the GPUs a job asks for cannot hold its target's weights on any running worker that declares its GPUs'
    memory (`worker --gpu-memory`); None when one could, or when no one can tell. A bound from the weight files
    (`inputs.weights_bytes`): the eval's own plan (evaluators.sizing) decides the rest when it starts."""
    needed = gpu_slots.needed(params)
    able = [w for w in live if w.gpus is not None and len(w.gpus) >= needed]
    if needed == 0 or not able or any(w.gpu_memory is None for w in able):
        return None
    dtype = params.get("dtype") or eval_job.FIELDS["dtype"].default
    weights = inputs.weights_bytes(str(params.get("target")), dtype)
    most = max(w.gpu_memory for w in able)
    sharded = gpu_slots.shards(params) > 1  # each shard loads the whole target on its one GPU
    if weights is None or weights <= (1 if sharded else needed) * most:
        return None
    said = f"the target's weights are {weights / 2**30:.3g} GiB in {dtype}; "
    if sharded:
        return said + f"a shard's one GPU of {most / 2**30:.3g} GiB (the workers' --gpu-memory) cannot hold them"
    ask = math.ceil(weights / (most * (1 - config.GPU_HEADROOM)))
    return said + (f"{needed} GPU(s) of {most / 2**30:.3g} GiB (the workers' --gpu-memory) cannot hold them: ask for "
                   f"{ask} GPUs")


def workers_caption(live: Sequence[WorkerInfo]) -> str:
    """One line of Markdown on who runs queued evals, for the Launch page (the commands as code; what the
    workers reported escaped)."""
    if not live:
        return (f"No worker is running: queued evals wait until one starts ({md_code('draftboard worker')}, or "
                f"{md_code('draftboard ui')}, which starts one).")
    devices = sorted({d for w in live for d in (w.devices or ("devices unknown",))})
    return f"{len(live)} worker(s) running · devices: {md(', '.join(devices))}"


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


def _job_what(p: dict, run_labels: dict[str, str] | None) -> str:
    """What a job evaluates, in its card's title."""
    train = (run_labels or {}).get(p.get("train_run_id") or "")
    words = eval_job.setting_words(p)
    if train and p.get("checkpoint_step") is not None:
        what = names.eval_run_name(train, p["checkpoint_step"], p, words)
    else:
        env = " · ".join(str(p[k]) for k in ("dtype", "linear_attn", "device") if p.get(k))
        sampled = f"T={float(p['temperature']):g}" if p.get("temperature") else ""
        what = " · ".join(filter(None, [Path(str(p.get("drafter", "?"))).name, env, sampled, *words]))
        if p.get("engine"):
            what += f" · {measure_label((str(p['engine']), p.get('engine_url')))}"
    return f"reference {p['reference']} ({what})" if p.get("reference") else what


def describe_job(job: Job, run_labels: dict[str, str] | None = None, now: datetime | None = None) -> JobView:
    """What the queue list shows for one job."""
    now = now or datetime.now(timezone.utc)
    problem = job.problem
    p = job.params
    try:  # a row written around the queue may hold values of any type: shown, never trusted
        what = _job_what(p, run_labels)
    except (TypeError, ValueError, AttributeError) as exc:
        what, problem = "?", problem or f"params not readable ({exc})"
    title = f"{STATE_ICONS.get(job.state, '')} #{job.id} eval {what} · {job.state}"
    stage = job.stage or ("waiting for a worker" if job.state == QUEUED else "")
    if job.state == RUNNING and job.cancel_requested:
        stage = f"cancelling… ({stage})" if stage else "cancelling…"
    progress = 1.0 if job.state == SUCCEEDED else min(max(job.progress, 0.0), 1.0)
    # The fraction is the stage's (the eval's progress events count each stage's items): a one-item stage done
    # at the start ("load") must not read as the eval at 100%.
    if not stage:
        text = f"{progress:.0%}"
    elif job.state == RUNNING and job.stage:
        text = f"{stage} done · the next stage starting" if progress >= 1.0 else f"{stage} · {progress:.0%} of this stage"
    else:
        text = f"{stage} · {progress:.0%}"
    when = (f"finished {_ago(job.finished_at, now)}" if job.finished_at else
            f"started {_ago(job.started_at, now)}" if job.started_at else f"queued {_ago(job.created_at, now)}")
    if job.gpus is not None:  # which of the box's GPUs a local worker gave it
        when += f" · GPU{'s' if len(job.gpus) != 1 else ''} {','.join(job.gpus) or 'none'}"
    prompts = p.get("prompts") if isinstance(p, dict) else None
    if isinstance(prompts, str) and not eval_job.hub_dataset_name(prompts):  # a hub set is named in the title
        when += f" · prompts {Path(prompts).name}"
    return JobView(job.id, title, job.state, progress, text, when,
                   can_cancel=job.state in (QUEUED, RUNNING) and not job.cancel_requested,
                   run_id=job.mlflow_run_id,
                   error=job.error or (f"malformed job row: {problem}" if problem else None), job=job)


# tqdm redraws its bar with carriage returns; a line holding "NN%|" is one of its frames.
_PROGRESS = re.compile(r"\r|\d+%\|")
# The last line that says what went wrong: the CLI's `error: ...`, or a traceback's exception line.
_ERROR_LINE = re.compile(r"^(error: .+|[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: .*)?)$")


def shown_log(text: str, everything: bool = False) -> str:
    """A job's log tail without tqdm progress frames, `@@draftboard` protocol lines and blank lines
    (everything=False)."""
    if everything:
        return text
    return "\n".join(line for line in text.splitlines()
                     if line.strip() and not line.startswith(EVENT_PREFIX) and not _PROGRESS.search(line))


def error_line(error: str | None) -> str | None:
    """One line saying why a job failed: the last `error: ...` or exception line of the worker's
    message (which ends with the eval's last output), else its first line."""
    if not error:
        return None
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    cause = next((line for line in reversed(lines) if _ERROR_LINE.match(line)), None)
    return cause or (lines[0] if lines else None)


def result_line(run: RunInfo | None) -> str | None:
    """`τ 2.41 · ddtree_tau_b8 3.10` for a finished eval run (None: no run, or no τ logged)."""
    if run is None or "tau" not in run.metrics:
        return None
    parts = [f"τ {run.metrics['tau']:.3f}"]
    b8 = names.ddtree_tau_metric(8)
    if b8 in run.metrics:
        parts.append(f"{b8} {run.metrics[b8]:.3f}")
    return " · ".join(parts)
