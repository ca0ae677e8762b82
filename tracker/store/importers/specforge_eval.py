"""SpecForge's `specforge evaluate-checkpoint` report, as one eval of the checkpoint it names.

The report (specforge/eval: `evaluate_cached_features` + `run_checkpoint_evaluation`, schema_version 1)
replays cached target features through one checkpoint: **teacher-forced diagnostics on a saved
continuation, not serving acceptance** (its own `metric_scope` says so, and is kept as protocol).
Its fields: `mean` (per-example means, and pooled ratios sum(num) / sum(den) for the names in
`ratio_totals`), `ratio_totals` {name: [num, den]}, `sum_totals`, `rows` (one per example: id, seed,
feature sha256, metrics), `checkpoint`, `feature_index` and its sha256, `recipe`, `draft_config`.

- Metrics keep SpecForge's names under `eval/`, as its docs log a report (`eval/{name}` for each mean):
  none of them is draftboard's `tau`, which needs the target's own decoding, so none is renamed to it.
- A ratio with no exposure (denominator 0) is left out, as SpecForge's `checkpoint_metrics` does: its
  raw 0 is not a measured rate. A mean that disagrees with its pooled counts refuses the file.
- The checkpoint's optimizer step comes from its folder name (`<run_id>-step<N>`, `epoch_<e>_step_<N>`).
- The recipe is not kept: it holds the run's tracking settings, credentials among them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.store.importers.results import ImportedEval, finite

FORMAT = "specforge-eval"
MAX_REPORT_BYTES = 256 << 20  # a report holds a few numbers per example; larger is not one
_STEP = re.compile(r"(?:-step|_step_)(\d+)$")
_RATIO_TOLERANCE = 1e-6  # SpecForge's own check (math.isclose rel_tol)


def parse_report(path: str | Path) -> list[ImportedEval]:
    """One record; DraftboardError naming the field for anything malformed."""
    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
    if file.stat().st_size > MAX_REPORT_BYTES:
        raise DraftboardError(f"{file}: {file.stat().st_size} bytes, more than a checkpoint report holds "
                              f"({MAX_REPORT_BYTES >> 20} MiB)")
    try:
        report = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftboardError(f"{file}: not JSON ({exc})") from None
    if not isinstance(report, dict) or report.get("schema_version") != 1 or "mean" not in report:
        raise DraftboardError(f"{file}: not a `specforge evaluate-checkpoint` report (schema_version 1 with `mean`)")
    if report.get("success") is not True:
        raise DraftboardError(f"{file}: the report says the evaluation did not succeed")
    examples = report.get("examples")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples <= 0:
        raise DraftboardError(f"{file}: examples must be a whole number > 0, got {examples!r:.40}")
    mean, ratios = _mapping(report, "mean", file), _mapping(report, "ratio_totals", file)
    metrics, unexposed = {}, []
    for name, value in mean.items():
        value = finite(value, f"{file} mean.{name}")
        if name in ratios:
            numerator, denominator = _pair(ratios[name], f"{file} ratio_totals.{name}")
            if denominator == 0:
                unexposed.append(name)
                continue
            if not math.isclose(value, numerator / denominator, rel_tol=_RATIO_TOLERANCE, abs_tol=1e-9):
                raise DraftboardError(f"{file}: mean.{name} = {value} disagrees with its pooled counts "
                                      f"{numerator} / {denominator}")
        metrics[f"eval/{name}"] = value
    draft_config = report.get("draft_config") if isinstance(report.get("draft_config"), dict) else {}
    checkpoint = str(report.get("checkpoint") or "")
    index = str(report.get("feature_index") or "")
    protocol = {"metric_scope": str(report.get("metric_scope") or "teacher-forced diagnostics"),
                "n_prompts": str(examples), "aggregation": "mean over examples; ratios pooled over examples",
                "feature_index_sha256": report.get("feature_index_sha256"),
                "block_size": _text(draft_config.get("block_size")), "target": _target(report)}
    details = {key: report.get(key) for key in ("examples", "seconds", "checkpoint", "checkpoint_format",
                                                "feature_index", "feature_index_sha256", "ratio_totals",
                                                "sum_totals", "draft_config")}
    details["unexposed"] = unexposed
    details["rows"] = [{k: row.get(k) for k in ("id", "seed", "sha256")} for row in report.get("rows") or []
                       if isinstance(row, dict)]
    dataset = Path(index).parent.name or Path(index).stem or "features"
    return [ImportedEval(dataset, metrics, {k: v for k, v in protocol.items() if v is not None}, details,
                         checkpoint_step=_checkpoint_step(checkpoint))]


def _mapping(report: dict, key: str, file: Path) -> dict:
    value = report.get(key, {})
    if not isinstance(value, dict):
        raise DraftboardError(f"{file}: {key} must be an object")
    return value


def _pair(value: object, what: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise DraftboardError(f"{what}: expected [numerator, denominator]")
    numerator, denominator = (finite(v, what) for v in value)
    if denominator < 0 or denominator == 0 and numerator != 0:
        raise DraftboardError(f"{what}: invalid ratio {value}")
    return numerator, denominator


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _target(report: dict) -> str | None:
    model = (report.get("recipe") or {}).get("model") if isinstance(report.get("recipe"), dict) else None
    target = model.get("target_model_path") if isinstance(model, dict) else None
    return str(target) if target else None


def _checkpoint_step(checkpoint: str) -> int | None:
    """The optimizer step in the checkpoint's folder name, else None."""
    match = _STEP.search(checkpoint.removeprefix("file://").rstrip("/"))
    return int(match.group(1)) if match else None
