"""The names draftboard writes into MLflow, built and parsed in one place.

Tags, artifact names and the eval metric families of docs/DESIGN.md ("Metric names", "MLflow
conventions", both fixed). Whoever writes a name builds it here, and whoever reads one parses it
here, so a family such as `ddtree_tau_b{B}` is spelled exactly once. Standard library only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

# --------------------------------------------------------------------------- tags
KIND = "draftboard.kind"
KINDS = ("train", "eval", "reference")
TARGET = "draftboard.target"
TRAIN_RUN_ID = "draftboard.train_run_id"
CHECKPOINT = "draftboard.checkpoint"
CHECKPOINT_STEP = "draftboard.checkpoint_step"
CHECKPOINT_SHA256 = "draftboard.checkpoint_sha256"
CHECKPOINT_DIGEST_PREFIX = "draftboard.checkpoint_digest."  # + a registered checkpoint's sha256, on its training run


def checkpoint_digest_tag(sha256: str) -> str:
    """The tag a training run carries for each checkpoint it registered (value: its step), so an eval of the same
    bytes finds its run and step with one indexed search."""
    return CHECKPOINT_DIGEST_PREFIX + sha256[:64]
CHECKPOINT_COUNT = "draftboard.checkpoints"
REFERENCE_NAME = "draftboard.reference_name"
DRAFTER_FAMILY = "draftboard.drafter_family"  # `dflash` | `dflash2` | `jetspec` (results `drafter.family`)
# A hub drafter's repository and commit (`tracker.store.checkpoints.hub_origin`; a published table's, where it
# says): z-lab retrains drafters in place under the same name, so a name alone is not one drafter.
DRAFTER_REPO = "draftboard.drafter_repo"
DRAFTER_REVISION = "draftboard.drafter_revision"
ERROR = "draftboard.error"
IMPORTED = "draftboard.imported"
PUBLISHED = "draftboard.published"
TOOL = "draftboard.tool"  # the training stack that wrote an adopted run (tracker/store/adoption.py)
STEP_UNIT = "draftboard.step_unit"  # what an adopted run's step counts: micro-batch or optimizer step
TOOL_VERSION = "draftboard.tool_version"  # the release of that stack (speculators' `eal` changed in 0.9.0)
DEMO = "draftboard.demo"
WATCH = "draftboard.watch"  # the checkpoint folder a watcher scans for this run (tracker/jobs/watch.py)
WATCH_REFUSED = "draftboard.watch_refused"  # why the worker refused this run's watch (it is never scanned)
# When a run's tags were last rewritten in place (ns since the epoch, 20 digits, so the largest sorts last
# as text): a rewrite of fixed-length tags (env.*) changes no count or length the store's change check
# reads (tracker.store.listing.store_version), so every rewrite writes this too.
CHANGED_AT = "draftboard.changed_at"


def changed_at() -> str:
    """A CHANGED_AT value: now."""
    return f"{time.time_ns():020d}"

ENV_HASH = "env.hash"
ENV_LINEAR_ATTN = "env.linear_attn"
ENV_DEVICE = "env.device"
ENV_DTYPE = "env.dtype"
ENV_TORCH = "env.torch"
ENV_TRANSFORMERS = "env.transformers"
ENV_GPU = "env.gpu"
# What a listing needs without reading fingerprint.json (fingerprint.env_tags): runs with equal critical keys
# and agreeing probe digests differ in nothing critical, with equal warning keys in nothing above info; the
# drafter's precision and the fingerprint's source, for the badges and kinds.
ENV_CRITICAL_KEY = "env.critical_key"
ENV_WARNING_KEY = "env.warning_key"
ENV_PROBE_DIGEST = "env.probe_digest"
ENV_DRAFTER_PRECISION = "env.drafter_precision"
ENV_SOURCE = "env.source"
# An imported run whose own files disagree (fingerprint source.contradictions): how many disagreements; set
# only on fingerprints read from evidence.
ENV_EVIDENCE_CONFLICTS = "env.evidence_conflicts"

# --------------------------------------------------------------------------- artifacts
FINGERPRINT_ARTIFACT = "fingerprint.json"
EVAL_RESULTS_ARTIFACT = "eval_results.json"
IMPORTED_RESULTS_ARTIFACT = "imported_results.json"  # an imported eval: {format, dataset, protocol, metrics, details}
CHECKPOINTS_DIR = "checkpoints"
WATCH_ARTIFACT = "watch.json"  # a watched run's watch state: folder, eval preset, checkpoints seen
DOCTOR_ARTIFACT = "doctor.json"  # `draftboard doctor --run`'s report on that run (Run detail's Doctor panel)
DOCTOR = "draftboard.doctor"  # its worst severity: critical | warning | info | ok
ALERTS_ARTIFACT = "alerts.json"  # an eval's regression alerts (tracker/measurement/regression.py)
ALERT = "draftboard.alert"  # their text, one line: the eval is worse than its previous checkpoint or a reference
KNOWN_BAD = "draftboard.known_bad"  # the known-bad table's rows that hold for the serving box an eval measured
MAX_TAG_CHARS = 4000  # a one-line tag's text is cut here, under MLflow's tag value limit


def checkpoint_artifact(step: int) -> str:
    return f"{CHECKPOINTS_DIR}/step_{step}.json"


# --------------------------------------------------------------------------- eval metrics
# The scalars `draftboard eval` logs under their own names.
EVAL_SCALARS = ("tau", "tau_pooled", "tau_all_anchors", "streak")
ENGINE_MEAN_AL = "engine_mean_acceptance_length"  # an engine eval's own number (DESIGN.md, "Engine evals")
# z-lab benchmark.py's "Decoding speedup" (mean TPOT alone / with the drafter, batch 1): `--scoring online`
# measures it, `import-results --format zlab-benchmark` keeps the one z-lab printed (DESIGN.md)
DECODING_SPEEDUP = "decoding_speedup"

_ACCEPT_RATE = "accept_rate_pos"
_DDTREE_TAU = "ddtree_tau_b"
_DDS = "dds"
_FAMILIES = {"accept_rate_pos": _ACCEPT_RATE, "ddtree_tau": _DDTREE_TAU, "dds": _DDS}
_PATTERN = re.compile(r"^(accept_rate_pos|ddtree_tau_b|dds)(\d+)$")


def accept_rate_metric(position: int) -> str:
    """`accept_rate_pos{k}`: fraction of walk blocks whose draft k was accepted."""
    return f"{_ACCEPT_RATE}{position}"


def ddtree_tau_metric(budget: int) -> str:
    """`ddtree_tau_b{B}`: DDTree acceptance length at node budget B."""
    return f"{_DDTREE_TAU}{budget}"


def dds_metric(budget: int) -> str:
    """`dds{B}` = `ddtree_tau_b{B}` - 1."""
    return f"{_DDS}{budget}"


def parse_metric(name: str) -> tuple[str, int] | None:
    """`("accept_rate_pos" | "ddtree_tau" | "dds", number)` for a family name, else None.

    >>> parse_metric("ddtree_tau_b8"), parse_metric("accept_rate_pos3"), parse_metric("tau")
    (('ddtree_tau', 8), ('accept_rate_pos', 3), None)
    """
    match = _PATTERN.match(name)
    if not match:
        return None
    family = next(k for k, prefix in _FAMILIES.items() if prefix == match.group(1))
    return family, int(match.group(2))


def family_values(metrics: dict[str, float], family: str) -> dict[int, float]:
    """{number: value} of one family (`accept_rate_pos`, `ddtree_tau`, `dds`) among logged metrics."""
    found = {}
    for name, value in metrics.items():
        parsed = parse_metric(name)
        if parsed and parsed[0] == family:
            found[parsed[1]] = value
    return dict(sorted(found.items()))


# A load sweep's numbers per level (results `load`, DESIGN.md "Load sweeps"): `load_c{C}_{field}`; the speedup's
# interval over rounds beside it as `load_c{C}_speedup_ci_low` / `_ci_high` (LOAD_CI_FIELDS, `ci_metrics`).
LOAD_FIELDS = ("engine_mean_acceptance_length", "tokens_per_s", "tokens_per_s_target_alone", "speedup", "step_cost")
_CI_LOW, _CI_HIGH = "_ci_low", "_ci_high"
LOAD_CI_FIELDS = (f"speedup{_CI_LOW}", f"speedup{_CI_HIGH}")


def load_metric(concurrency: int, field: str) -> str:
    """`load_c4_speedup`: a load sweep's `field` at `concurrency` requests in flight."""
    return f"load_c{concurrency}_{field}"


_LOAD_METRIC = re.compile(rf"load_c([1-9][0-9]{{0,3}})_({'|'.join((*LOAD_FIELDS, *LOAD_CI_FIELDS))})")


def load_levels(metrics: Mapping[str, float]) -> dict[int, dict[str, float]]:
    """{concurrency: {field: value}} of a load sweep's logged metrics, by level."""
    found: dict[int, dict[str, float]] = {}
    for name, value in metrics.items():
        m = _LOAD_METRIC.fullmatch(name) if name.startswith("load_c") else None
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return dict(sorted(found.items()))


# Acceptance by context length as MLflow metrics, one per non-empty bucket (its start): `ctx4096_tau` (the offline
# walk's, results `tau_by_context`) and `ctx4096_engine_tau` (an engine's steps, `engine_tau_by_context`): two
# definitions, two names.
_CONTEXT_METRIC = re.compile(r"ctx(\d{1,8})_(tau|engine_tau)")
CONTEXT_CURVES = {"tau_by_context": "tau", "engine_tau_by_context": "engine_tau"}


def context_metric(start: int, curve: str) -> str:
    """`ctx4096_tau`: the bucket starting at `start` tokens of `curve` (a key of CONTEXT_CURVES)."""
    return f"ctx{start}_{CONTEXT_CURVES[curve]}"


def parse_context_metric(name: str) -> tuple[int, str] | None:
    """(bucket start, `tau` | `engine_tau`) of a context metric, else None."""
    m = _CONTEXT_METRIC.fullmatch(name)
    return (int(m.group(1)), m.group(2)) if m else None


def ci_metrics(metric: str) -> tuple[str, str]:
    """The 95% bootstrap bounds of a metric: `tau` -> (`tau_ci_low`, `tau_ci_high`)."""
    return f"{metric}{_CI_LOW}", f"{metric}{_CI_HIGH}"


def dataset_metric(metric: str, dataset: str) -> str:
    """A number on one dataset, as a reference of published numbers logs it: (`tau`, `gsm8k`) ->
    `tau_gsm8k`, (`speedup`, `mt-bench`) -> `speedup_mt_bench`. Measured evals keep theirs in the
    results' `by_dataset`."""
    return f"{metric}_" + "".join(c if c.isalnum() else "_" for c in dataset.lower()).strip("_")


# --------------------------------------------------------------------------- protocol tags
# `protocol.<field>` for each field of tracker.measurement.protocol.Protocol (DESIGN.md, fixed).
PROTOCOL_PREFIX = "protocol."


def protocol_tag(field: str) -> str:
    return f"{PROTOCOL_PREFIX}{field}"


def parse_protocol_tag(tag: str) -> str | None:
    """The protocol field a tag holds, else None: `protocol.block_size` -> "block_size"."""
    return tag[len(PROTOCOL_PREFIX):] if tag.startswith(PROTOCOL_PREFIX) else None


# --------------------------------------------------------------------------- run names


def eval_run_name(train_name: str, step: int, settings: Mapping[str, Any], protocol: Sequence[str] = ()) -> str:
    """`<training run> @ step N · <settings>`: one name for an eval of a checkpoint wherever it is
    shown or logged. Settings: dtype, the drafter's precision where it is not a cast to that dtype,
    linear-attention mode where one was forced, device, the serving engine that measured it and, for a
    sampled eval, its temperature (what is unset is left out); then `protocol`, the words for whatever
    else differs from the defaults (tracker.jobs.eval_job.setting_words)."""
    dtype, precision = settings.get("dtype"), settings.get("drafter_precision")
    temperature = settings.get("temperature")
    # `auto` is left out: the environment badge beside the name says which implementation really ran, and
    # a name saying "auto" beside a badge saying "fallback" read as two answers. A forced mode is named.
    linear_attn = settings.get("linear_attn")
    parts = [dtype, f"drafter {precision}" if precision and precision != dtype else None,
             None if linear_attn == "auto" else linear_attn, settings.get("device"), settings.get("engine"),
             f"T={temperature:g}" if isinstance(temperature, (int, float)) and temperature > 0 else None]
    return " · ".join([f"{train_name} @ step {step}", *(str(p) for p in parts if p), *protocol])
