"""Runs that other training stacks wrote into MLflow: which tool wrote them, what their names mean.

Everything here is a pure function over a `RunView` (experiment name, params, latest metric
values, tags), so the dashboard, Compare and `draftboard adopt` read a foreign run the same way.
The names each tool writes were read from its sources (SpecForge legacy `scripts/train_dflash.py`
and unified runtime `specforge/tracker.py`, with its PR #810 renames from its training docs, vLLM
speculators `train/logger.py`, HF Trainer's `MLflowCallback`, NVIDIA Model-Optimizer's DFlash trainer,
NVIDIA Automodel's `recipes/llm/train_dflash*.py`); see ../shared/research/training-stacks.md.

- `detect(view)`: the tool, with the evidence that named it.
- `aliases(tool, metric_keys, version)`: the tool's metric names mapped to ours (both are shown); a metric
  the tool redefined between releases (speculators' `eal` in 0.9.0) takes its name from the version
  that wrote the run (`draftboard.tool_version`), so two definitions are never one series.
- `STEP_SEMANTICS[tool]`: what one logged step counts (micro-batch or optimizer step).
- `recipe(view)`: the recipe fields, from params or from config a tool logged as step-0 metrics.
- `Tool.step_metric`: the metric whose value is a run's step axis where the tool's MLflow step is
  not (SpecForge after PR #810 logs `train/optimizer_step` on every row).
- `recipe_diff(runs, reference)`: grouped, aliased recipe rows with severities, and lint rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from tracker.redact import mask_params
from tracker.store import names
from tracker.untrusted.digits import whole_number

# Tags that `draftboard adopt` writes next to `draftboard.kind=train` (move to names.py with the wiring).
TOOL_TAG, STEP_UNIT_TAG, TOOL_VERSION_TAG = names.TOOL, names.STEP_UNIT, names.TOOL_VERSION

SPECFORGE_LEGACY = "specforge-legacy"
SPECFORGE = "specforge"
SPECULATORS = "speculators"
HF_TRAINER = "hf-trainer"
MODELOPT = "modelopt"
AUTOMODEL = "automodel"
DRAFTBOARD = "draftboard"


@dataclass(frozen=True)
class RunView:
    """What adoption reads of one MLflow run."""

    run_id: str
    experiment: str
    params: Mapping[str, str]
    metrics: Mapping[str, float]  # latest value of each key (a step-0 config metric is logged once)
    tags: Mapping[str, str]
    name: str = ""

    @classmethod
    def of(cls, run, experiment: str) -> "RunView":
        """From an `mlflow.entities.Run` and the name of its experiment."""
        data = run.data
        return cls(run.info.run_id, experiment, dict(data.params), dict(data.metrics), dict(data.tags),
                   run.info.run_name or "")


@dataclass(frozen=True)
class StepSemantics:
    unit: str  # "micro-batch" | "optimizer step"
    first: int  # the first step the tool logs
    note: str

    @property
    def label(self) -> str:
        return f"step = {self.unit}"


@dataclass(frozen=True)
class Redefined:
    """A metric a tool redefined between releases. Our name depends on the release that wrote the run, so
    values of the two definitions never share a series; a run that does not say its release gets a third name."""

    since: tuple[int, ...]  # the first release with the current definition
    current: str  # our name from `since` on
    before: str  # our name for the releases before it
    unknown: str  # our name when the run does not say which release wrote it

    def name(self, version: str | None) -> str:
        found = parse_version(version)
        if found is None:
            return self.unknown
        return self.current if found >= self.since else self.before


_VERSION = re.compile(r"\s*v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?")


def parse_version(version: str | None) -> tuple[int, ...] | None:
    """`0.9.0`, `v0.8.1`, `0.9.0.dev3+g1a2b` -> (0, 9, 0); None when it does not start as a release number."""
    match = _VERSION.match(version or "")
    if match is None:
        return None
    return tuple(int(part or 0) for part in match.groups())


@dataclass(frozen=True)
class Tool:
    name: str
    label: str  # the badge
    steps: StepSemantics
    aliases: Mapping[str, str]  # the tool's metric name -> ours
    position_patterns: tuple[tuple[str, str], ...] = ()  # regex (group 1: a position or K) -> our template
    recipe_params: Mapping[str, str] = field(default_factory=dict)  # param key -> recipe key
    recipe_metrics: Mapping[str, str] = field(default_factory=dict)  # step-0 config metric -> recipe key
    config_metric_prefixes: tuple[str, ...] = ()  # metrics under these prefixes are config, not curves
    notes: Mapping[str, str] = field(default_factory=dict)  # metric name -> what it is not
    note_patterns: tuple[tuple[str, str], ...] = ()  # regex of metric names -> what they are not
    step_metric: str | None = None  # a metric on every row whose value is the step (the MLflow step is a row index)
    redefined: Mapping[str, Redefined] = field(default_factory=dict)  # metric name -> its names by release


_HF_RECIPE = {"learning_rate": "lr", "lr_scheduler_type": "lr_schedule", "warmup_ratio": "warmup_ratio",
              "warmup_steps": "warmup_steps", "num_train_epochs": "epochs",
              "gradient_accumulation_steps": "accumulation_steps", "per_device_train_batch_size": "batch_size",
              "max_steps": "steps", "seed": "seed"}
_HF_ALIASES = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "eval_loss": "val_loss"}
# SpecForge PR #810: two smooth acceptance proxies and the objective's composition, drawn under their own names.
_PROXY_NOTE = ("a smooth proxy of acceptance on recorded training blocks (SpecForge PR #810: the D-PACE surrogate, "
               "or against the teacher's distribution): not tau, not an acceptance length a serving engine reaches")
_LOSS_COMPOSITION_NOTE = "how SpecForge weighs its objective (PR #810's loss-composition telemetry): not an accuracy"
_SPECFORGE_NOTE_PATTERNS = ((r"(train/)?dflash2/(hard_label|teacher)/expected_accepted_length", _PROXY_NOTE),
                            (r"(train/)?(position_\d+/)?(dflash2?/)?objective/(loss_weight_share|lk_kl_weight)(/.*)?",
                             _LOSS_COMPOSITION_NOTE))
_SIMULATED_ACC_LEN_NOTE = ("SpecForge's eval/simulated_acc_len equals eval/avg_acc for DFlash: it is not an "
                           "acceptance length, so it is not shown as tau")

# SpecForge PR #810 (2026-09-02) renamed the DFlash diagnostics and stopped emitting the old names: old
# and new map to one name of ours, so runs from before and after share a chart. Aggregates are logged
# under train/ (docs/sections/basic_usage/training.md, "Dashboard migration").
_SPECFORGE_RENAMES = {
    "gold_chain_length": ("dflash/hard_label/unary_gold_probability_chain_length",
                          "dflash/hard_label/expected_accepted_length"),
    "overlap_chain_length": ("dflash/teacher/unary_overlap_chain_length", "dflash/teacher/expected_accepted_length"),
    "gold_probability": ("dflash/hard_label/unary_probability", "dflash/hard_label/expected_acceptance",
                         "target_probability", "expected_acceptance"),
    "candidate_recall": ("selector_coverage",),  # now dflash/hard_label/unary_top{K}_recall: a pattern below
    "base_accept_len": ("dflash/hard_label/unary_greedy_accepted_length",),
    "accept_len": ("dflash2/selector/greedy_accepted_length", "dflash2/selector/serving_accepted_length"),
    "selector_loss": ("dflash2/selector/loss", "selector_loss"),
    # PR #844 (2026-09-07) named the selector's two accuracies by what they condition on, and removed the
    # `selector_accuracy` / `selector_target_probability` aliases. Those were measured with the gold token
    # injected into the candidates (PR #772), so they are not these and keep their own names.
    "selector_covered_acc": ("dflash2/selector/teacher_forced_covered_accuracy",),
    "selector_marginal_acc": ("dflash2/selector/self_conditioned_marginal_accuracy",),
    "selector_gold_probability": ("dflash2/selector/teacher_forced_covered_gold_probability",),
}
_SPECFORGE_DFLASH = {f"train/{name}": ours for ours, logged in _SPECFORGE_RENAMES.items() for name in logged}

# Automodel's DFlash/DFlash2 recipes (nemo_automodel/recipes/llm/train_dflash*.py) log these to W&B and
# print them on the console (`draftboard import-log --format automodel`); validation as val/<name>.
_AUTOMODEL_TRAIN = {"loss": "loss", "accuracy": "acc", "lr": "lr", "accept_len": "accept_len",
                    "base_loss": "base_loss", "selector_loss": "selector_loss", "base_accuracy": "base_acc",
                    "base_accept_len": "base_accept_len", "candidate_recall": "candidate_recall"}
_AUTOMODEL_ALIASES = {**{f"train/{name}": ours for name, ours in _AUTOMODEL_TRAIN.items()},
                      **{f"val/{name}": f"val_{ours}" for name, ours in _AUTOMODEL_TRAIN.items() if name != "lr"}}

TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool(
        SPECFORGE_LEGACY, "SpecForge (train_dflash.py)",
        StepSemantics("micro-batch", 1, "global_step counts micro-batches (accumulation_steps of them per "
                                        "optimizer step), logged every --log-interval"),
        {"train/loss": "loss", "train/accuracy": "acc", "train/lr": "lr"},
        recipe_params={"block_size": "block_size", "num_draft_layers": "num_draft_layers",
                       "mask_token_id": "mask_token_id", "num_anchors": "num_anchors", "loss_type": "loss_type",
                       "loss_decay_gamma": "loss_decay_gamma", "learning_rate": "lr", "num_epochs": "epochs",
                       "max_length": "max_length", "warmup_ratio": "warmup_ratio",
                       "accumulation_steps": "accumulation_steps", "target_model_path": "target",
                       "random_anchor": "random_anchor", "dpace_alpha": "dpace_alpha",
                       "attention_backend": "attention_backend"},
    ),
    Tool(
        SPECFORGE, "SpecForge (runtime)",
        StepSemantics("optimizer step", 1, "optimizer steps; since PR #810 every row carries train/optimizer_step, "
                                           "the checkpoints' counter, and that is the step drawn"),
        {"train/loss": "loss", "train/acc": "acc", "train/lr": "lr", "train/grad_norm": "grad_norm",
         "eval/avg_loss": "val_loss", "eval/avg_acc": "val_acc", **_SPECFORGE_DFLASH},
        position_patterns=((r"position_(\d+)/selector/greedy_prefix_survival", "survival_pos{}"),
                           (r"position_(\d+)/hard_label/unary_greedy_prefix_survival", "base_survival_pos{}"),
                           (r"train/dflash/hard_label/unary_top(\d+)_recall", "candidate_recall")),
        notes={"eval/simulated_acc_len": _SIMULATED_ACC_LEN_NOTE},
        note_patterns=_SPECFORGE_NOTE_PATTERNS,
        step_metric="train/optimizer_step",
    ),
    Tool(
        SPECULATORS, "vLLM speculators",
        StepSemantics("optimizer step", 0, "global_step from 0; val/*_epoch once per epoch"),
        {"train/loss": "loss", "train/full_acc": "acc", "lr": "lr",
         "val/loss_epoch": "val_loss", "val/full_acc_epoch": "val_acc"},
        position_patterns=((r"train/position_(\d+)_acc", "acc_pos{}"),
                           (r"val/position_(\d+)_acc_epoch", "val_acc_pos{}")),
        recipe_metrics={"dflash/block_size": "block_size", "draft/num_layers": "num_draft_layers",
                        "draft/mask_token_id": "mask_token_id", "data/max_anchors": "num_anchors",
                        "optimizer/lr": "lr", "optimizer/weight_decay": "weight_decay",
                        "data/total_seq_len": "max_length", "loss/ttt_step_loss_decay": "loss_decay_gamma"},
        config_metric_prefixes=("dflash/", "draft/", "data/", "optimizer/", "scheduler/", "loss/", "verifier/",
                                "generation/", "training/"),
        # 0.9.0 (PR #1032) counts each block's accepted run plus the bonus token; 0.7.0-0.8.1 (PR #741) summed
        # products of per-position accuracies without it (speculators/models/dflash/metrics.py in each wheel).
        redefined={"train/eal": Redefined((0, 9, 0), "eal", "eal_marginal", "eal_unversioned"),
                   "val/eal_epoch": Redefined((0, 9, 0), "val_eal", "val_eal_marginal", "val_eal_unversioned")},
    ),
    Tool(MODELOPT, "NVIDIA Model-Optimizer",
         StepSemantics("optimizer step", 0, "HF Trainer global_step (optimizer steps)"),
         {**_HF_ALIASES, "estimated_training_ar": "eal"},
         position_patterns=((r"train_acc/parallel_(\d+)_step_0", "acc_pos{}"),),
         recipe_params=_HF_RECIPE),
    Tool(AUTOMODEL, "NVIDIA Automodel",
         StepSemantics("optimizer step", 1, "runtime.global_step, counted after each optimizer step and logged "
                                            "every log_every_steps; validation once per epoch"),
         _AUTOMODEL_ALIASES),
    Tool(HF_TRAINER, "HF Trainer",
         StepSemantics("optimizer step", 0, "HF Trainer global_step (optimizer steps)"),
         _HF_ALIASES, recipe_params=_HF_RECIPE),
    Tool(DRAFTBOARD, "draftboard",
         StepSemantics("optimizer step", 1, "the step the training loop passed to log_step"),
         {"loss": "loss", "acc": "acc", "lr": "lr", "streak": "streak", "dds8": "dds8"},
         recipe_params={"block_size": "block_size", "target_layer_ids": "target_layer_ids", "lr": "lr",
                        "gamma": "loss_decay_gamma", "layers": "num_draft_layers", "anchors_per_seq": "num_anchors",
                        "dtype": "dtype", "steps": "steps", "batch": "batch_size", "seed": "seed",
                        "mask_token_id": "mask_token_id", "num_target_layers": "num_target_layers"}),
)}


# --------------------------------------------------------------------------- detection


@dataclass(frozen=True)
class Detection:
    tool: str | None
    evidence: tuple[str, ...]

    @property
    def label(self) -> str:
        return tool_label(self.tool) if self.tool else "unknown"


def tool_label(tool: str) -> str:
    """The badge of a tool (`SpecForge (legacy)`); a name given to `adopt --tool` as it is."""
    return TOOLS[tool].label if tool in TOOLS else tool


def listing_tags(view: RunView) -> dict[str, str]:
    """The tags that list a run nobody adopted yet as a training run (the run index adds them in
    memory, nothing is written): kind, tool, step unit, and the target where the tool logged it
    (SpecForge's `target_model_path`); {} when no tool's names fit."""
    if view.tags.get(names.KIND):
        return {}
    tool = detect(view).tool
    if tool is None:
        return {}
    tags = {names.KIND: "train", TOOL_TAG: tool, STEP_UNIT_TAG: TOOLS[tool].steps.unit}
    target = recipe(view, tool).get("target")
    if target is not None and not view.tags.get(names.TARGET):
        tags[names.TARGET] = target.value
    return tags


_SPECFORGE_LEGACY_PARAMS = ("block_size", "num_anchors", "loss_decay_gamma", "mask_token_id", "target_model_path")
_SPECFORGE_TRACKING = re.compile(r"^(tracking\.)?(report_to|wandb_\w+|swanlab_\w+|mlflow_\w+)$")
_SPECULATORS_METRIC = re.compile(r"^train/(full_acc|eal|position_\d+_acc)$")
_HF_PARAMS = ("per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps", "output_dir")
# PR #810 keeps throughput and timing under perf/ (train/perf/ before it): both are SpecForge's
_SPECFORGE_RUNTIME_PREFIXES = ("perf/", "train/perf/", "train/dflash/", "train/dflash2/")
_AUTOMODEL_METRIC = re.compile(r"^train/(accept_len|base_accept_len|base_loss|selector_loss|candidate_recall)$")
_MODELOPT_METRIC = re.compile(r"^(train_acc/parallel_\d+_step_\d+|estimated_training_ar)$")


def detect(view: RunView) -> Detection:
    """The tool that wrote the run, from the names it writes; `Detection(None, ())` when none fits.

    A `draftboard.tool` tag (set by `draftboard adopt`) wins; then draftboard's own runs; then the
    most specific signature first (Model-Optimizer is an HF Trainer with extra metrics, SpecForge's
    legacy script may log into an experiment called `specforge`).
    """
    if view.tags.get(TOOL_TAG):
        return Detection(view.tags[TOOL_TAG], (f"tag {TOOL_TAG}={view.tags[TOOL_TAG]}",))
    if view.tags.get(names.KIND) and not view.tags.get(names.IMPORTED):
        return Detection(DRAFTBOARD, (f"tag {names.KIND}={view.tags[names.KIND]}",))
    keys, params = set(view.metrics), set(view.params)
    modelopt = sorted(k for k in keys if _MODELOPT_METRIC.match(k))
    if modelopt:
        return Detection(MODELOPT, (f"metrics {', '.join(modelopt[:3])}",))
    legacy = [p for p in _SPECFORGE_LEGACY_PARAMS if p in params]
    if len(legacy) >= 3 or (legacy and "train/accuracy" in keys):
        found = [f"params {', '.join(legacy)} (vars(args) of scripts/train_dflash.py)"]
        return Detection(SPECFORGE_LEGACY, tuple(found + (["metric train/accuracy"] if "train/accuracy" in keys else [])))
    runtime = sorted(k for k in keys if k.startswith(_SPECFORGE_RUNTIME_PREFIXES) or k == "eval/simulated_acc_len")
    axis = TOOLS[SPECFORGE].step_metric
    tracking = sorted(p for p in params if _SPECFORGE_TRACKING.match(p))
    if axis in keys or runtime or (view.experiment == "specforge" and ("train/acc" in keys or tracking)):
        evidence = [f"metric {axis} (every row since SpecForge PR #810)"] if axis in keys else []
        evidence += [f"metrics {', '.join(runtime[:3])}"] if runtime else []
        evidence += [f"experiment {view.experiment!r}"] if view.experiment == "specforge" else []
        evidence += [f"params {', '.join(tracking[:3])} (tracking.* only)"] if tracking else []
        return Detection(SPECFORGE, tuple(evidence))
    automodel = sorted(k for k in keys if _AUTOMODEL_METRIC.match(k))
    if automodel and "train/accuracy" in keys:
        return Detection(AUTOMODEL, (f"metrics train/accuracy, {', '.join(automodel[:2])}",))
    speculators = sorted(k for k in keys if _SPECULATORS_METRIC.match(k) or k in TOOLS[SPECULATORS].recipe_metrics)
    if speculators or (view.experiment == "speculators" and "train/loss" in keys):
        evidence = [f"metrics {', '.join(speculators[:3])}"] if speculators else []
        evidence += [f"experiment {view.experiment!r}"] if view.experiment == "speculators" else []
        return Detection(SPECULATORS, tuple(evidence))
    hf = [p for p in _HF_PARAMS if p in params]
    if len(hf) >= 2 or "train_runtime" in keys:
        return Detection(HF_TRAINER, (f"params {', '.join(hf)} (TrainingArguments)" if hf else "metric train_runtime",))
    return Detection(None, ())


# --------------------------------------------------------------------------- metric aliases


@dataclass(frozen=True)
class Alias:
    source: str  # the name the tool logged
    canonical: str | None  # ours; None: deliberately not mapped (see note)
    note: str = ""

    @property
    def label(self) -> str:
        """Both names, so nobody has to guess which curve is which."""
        if self.canonical is None or self.canonical == self.source:
            return self.source
        return f"{self.canonical} ({self.source})"


def canonical_metric(tool: str | None, key: str, version: str | None = None) -> Alias:
    """Our name for one of the tool's metric names (`canonical` None when there is none); `version` is the
    tool's release that wrote the run (`draftboard.tool_version`), for metrics it redefined."""
    spec = TOOLS.get(tool or "")
    if spec is None:
        return Alias(key, None)
    if key in spec.notes:
        return Alias(key, None, spec.notes[key])
    for pattern, note in spec.note_patterns:
        if re.fullmatch(pattern, key):
            return Alias(key, None, note)
    if key in spec.redefined:
        return Alias(key, spec.redefined[key].name(version))
    if key in spec.aliases:
        return Alias(key, spec.aliases[key])
    for pattern, template in spec.position_patterns:
        match = re.fullmatch(pattern, key)
        if match:
            return Alias(key, template.format(int(match.group(1))))
    return Alias(key, None)


def is_config_metric(tool: str | None, key: str) -> bool:
    """True for config a tool logged as a step-0 metric (speculators): a recipe field, not a curve."""
    spec = TOOLS.get(tool or "")
    return spec is not None and (key in spec.recipe_metrics or key.startswith(spec.config_metric_prefixes))


def step_metric(tool: str | None) -> str | None:
    """The metric whose value is the step of each row the tool logged (its MLflow step is not), else None."""
    spec = TOOLS.get(tool or "")
    return spec.step_metric if spec is not None else None


def is_curve(tool: str | None, key: str) -> bool:
    """False for config logged as a metric and for the step axis itself."""
    return not is_config_metric(tool, key) and key != step_metric(tool)


def aliases(tool: str | None, metric_keys: Iterable[str], version: str | None = None) -> list[Alias]:
    """The run's curves (config metrics and the step axis left out), each with our name where there is one."""
    return [canonical_metric(tool, key, version) for key in sorted(metric_keys) if is_curve(tool, key)]


# --------------------------------------------------------------------------- recipe


@dataclass(frozen=True)
class RecipeKey:
    group: str
    highlighted: bool  # one of the DFlash recipe keys
    why: str = ""  # what a difference means, for the reason column


RECIPE_KEYS: dict[str, RecipeKey] = {
    "block_size": RecipeKey("dflash", True, "the drafter fills block_size-1 positions per pass and acceptance "
                                            "is capped at block_size, so tau is not comparable"),
    "mask_token_id": RecipeKey("dflash", True, "masked positions are fed this token's embedding; another mask "
                                               "token means inputs the drafter never trained on"),
    "target_layer_ids": RecipeKey("dflash", True, "the drafter reads other target layers"),
    "num_anchors": RecipeKey("dflash", True, "anchors sampled per sequence change what one step trains on"),
    "noise": RecipeKey("dflash", True, "noise on the target features changes what the drafter is trained on"),
    "loss_type": RecipeKey("loss", True, "another training objective"),
    "loss_decay_gamma": RecipeKey("loss", True, "positions are weighted differently"),
    "position_weights": RecipeKey("loss", True, "positions are weighted differently"),
    "dtype": RecipeKey("numerics", True, "another compute dtype"),
    "lr": RecipeKey("optimizer", True, ""),
    "lr_schedule": RecipeKey("optimizer", True, ""),
    "warmup_ratio": RecipeKey("optimizer", True, ""),
    "num_draft_layers": RecipeKey("model", False),
    "num_target_layers": RecipeKey("model", False),
    "target": RecipeKey("model", False),
}
_CRITICAL_KEYS = ("block_size", "mask_token_id")


@dataclass(frozen=True)
class RecipeField:
    key: str  # ours (or the tool's own key where we have none)
    value: str
    source: str  # the tool's key: `block_size`, `dflash/block_size`, ...


def _text(value: object) -> str:
    """Config logged as a float metric (151669.0) reads as the integer it was."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def recipe(view: RunView, tool: str | None = None) -> dict[str, RecipeField]:
    """The run's recipe under our keys; unknown config keys keep the tool's name. Secrets masked."""
    spec = TOOLS.get(tool or detect(view).tool or "")
    out: dict[str, RecipeField] = {}
    params = mask_params(view.params)
    if spec is not None and spec.recipe_params:
        for key, value in params.items():
            ours = spec.recipe_params.get(key, key)
            out[ours] = RecipeField(ours, value, key)
    elif spec is None or spec.name != SPECFORGE:  # SpecForge runtime params are tracking.* only
        out.update({k: RecipeField(k, v, k) for k, v in params.items()})
    if spec is not None:
        for key, value in view.metrics.items():
            if is_config_metric(spec.name, key):
                ours = spec.recipe_metrics.get(key, key)
                out[ours] = RecipeField(ours, _text(value), key)
    target = view.tags.get(names.TARGET)
    if target and "target" not in out:
        out["target"] = RecipeField("target", target, f"tag {names.TARGET}")
    return out


def _layer_ids(value: str) -> list[int] | None:
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return None
    if isinstance(parsed, list) and all(isinstance(i, int) for i in parsed):
        return parsed
    return None


# --------------------------------------------------------------------------- diff and lint


@dataclass(frozen=True)
class Lint:
    run_id: str
    key: str
    severity: str  # critical | warning | info
    message: str


@dataclass(frozen=True)
class RecipeRow:
    key: str
    group: str
    highlighted: bool
    reference: str | None
    reference_source: str | None  # the reference tool's own key
    values: dict[str, str | None]  # run id -> value (None: not logged)
    sources: dict[str, str]  # run id -> the tool's own key
    severity: str  # critical | warning | info | same
    reason: str

    @property
    def differs(self) -> bool:
        return self.severity != "same"


@dataclass(frozen=True)
class RecipeDiff:
    reference_id: str
    run_ids: tuple[str, ...]
    rows: list[RecipeRow]
    lints: list[Lint]

    def shown(self, diff_only: bool = True) -> list[RecipeRow]:
        """Rows for the Config tab: differences only by default, highlighted keys first in each group."""
        return [row for row in self.rows if row.differs or not diff_only]


_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2, "same": 3}


def _row(key: str, reference: RecipeField | None, fields: dict[str, RecipeField | None]) -> RecipeRow:
    spec = RECIPE_KEYS.get(key, RecipeKey("other", False))
    ref_value = reference.value if reference else None
    values = {run_id: (f.value if f else None) for run_id, f in fields.items()}
    sources = {run_id: f.source for run_id, f in fields.items() if f}
    head = (key, spec.group, spec.highlighted, ref_value, reference.source if reference else None, values, sources)
    changed = [run_id for run_id, value in values.items() if value != ref_value]
    if not changed:
        return RecipeRow(*head, "same", "")
    missing = ref_value is None or all(values[r] is None for r in changed)
    if missing:
        severity, reason = "info", "logged by only some of the runs"
    elif key in _CRITICAL_KEYS:
        severity, reason = "critical", spec.why
    elif spec.highlighted:
        severity, reason = "warning", spec.why or "a DFlash recipe key differs"
    else:
        severity, reason = "info", ""
    return RecipeRow(*head, severity, reason)


def lint(view: RunView, fields: Mapping[str, RecipeField], tool: str | None) -> list[Lint]:
    """Rules on one recipe, each with its reason."""
    found = []
    ids = _layer_ids(fields["target_layer_ids"].value) if "target_layer_ids" in fields else None
    n_layers = fields.get("num_target_layers")
    n_target = whole_number(n_layers.value) if n_layers else None
    if ids and n_target is not None and n_target - 1 in ids:
        last = n_target - 1
        found.append(Lint(view.run_id, "target_layer_ids", "warning",
                          f"tapped layer {last} is the target's last layer: the drafter sees the very state that "
                          "feeds the lm_head, a shortcut that copies the next token instead of learning to draft "
                          "beyond it"))
    if "eval/simulated_acc_len" in view.metrics:
        found.append(Lint(view.run_id, "eval/simulated_acc_len", "info", _SIMULATED_ACC_LEN_NOTE))
    if tool == SPECFORGE:
        found.append(Lint(view.run_id, "recipe", "info",
                          "SpecForge's runtime logs only its tracking.* settings to MLflow; the DFlash settings "
                          "(dflash_*) are in the checkpoint's training_state.pt"))
    if tool == SPECULATORS and "target_layer_ids" not in fields:
        found.append(Lint(view.run_id, "recipe", "info",
                          "speculators drops list-valued config (target layer ids) from MLflow; read run.yaml "
                          "or the checkpoint's config.json (aux_hidden_state_layer_ids = target ids + 1)"))
    return found


def recipe_diff(runs: Sequence[RunView], reference: RunView) -> RecipeDiff:
    """Each chosen run's recipe next to the reference's, keys aliased across tools.

    Rows are ordered by group (DFlash keys first), then severity; `RecipeDiff.shown()` keeps
    the differences. Lints cover the reference and every run.
    """
    tools = {view.run_id: detect(view).tool for view in (reference, *runs)}
    ref_fields = recipe(reference, tools[reference.run_id])
    run_fields = {view.run_id: recipe(view, tools[view.run_id]) for view in runs}
    keys = set(ref_fields).union(*[set(f) for f in run_fields.values()]) if run_fields else set(ref_fields)
    rows = [_row(key, ref_fields.get(key), {run_id: f.get(key) for run_id, f in run_fields.items()})
            for key in keys]
    groups = ["dflash", "loss", "numerics", "optimizer", "model", "other"]
    rows.sort(key=lambda r: (groups.index(r.group), not r.highlighted, _SEVERITY_RANK[r.severity], r.key))
    lints = lint(reference, ref_fields, tools[reference.run_id])
    for view in runs:
        lints += lint(view, run_fields[view.run_id], tools[view.run_id])
    return RecipeDiff(reference.run_id, tuple(v.run_id for v in runs), rows, lints)
