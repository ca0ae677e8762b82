"""Eval results that another tool measured, as draftboard eval runs that say where they come from.

Every importer of a results file (z-lab benchmark output, speculators `acceptance.csv` and
`spec_acceptance.py` outputs, DDTree benchmark files, SpecForge checkpoint reports) turns it into `ImportedEval` records: our metric names where the file's numbers
mean the same thing, the protocol the file states, and the rest kept as details. `log_imported`
writes each record as one eval run with `draftboard.imported=1` and the protocol as
`protocol.*` tags (names.protocol_tag), `protocol.scoring=imported` first among them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tracker.errors import DraftboardError
from tracker.measurement import known_bad
from tracker.store import names

IMPORTED_SCORING = "imported"


@dataclass(frozen=True)
class ImportedEval:
    """One dataset's numbers from a results file."""

    dataset: str
    metrics: dict[str, float]  # our names (names.py): tau, tau_pooled, streak, accept_rate_pos{k}, ...
    protocol: dict[str, str]  # what the file states about how it was measured
    details: dict[str, Any] = field(default_factory=dict)  # kept as the run's imported_results.json
    checkpoint_step: int | None = None  # the evaluated checkpoint's training step, where the file names it
    environment: dict[str, Any] = field(default_factory=dict)  # fingerprint fields the files state (dotted)
    serving: known_bad.Serving | None = None  # what the file states of the serving box (the known-bad table reads it)
    facts: list = field(default_factory=list)  # tracker.environment.evidence Facts: the serving box's own lines


def finite(value: object, what: str) -> float:
    """A finite float, or a DraftboardError naming the field."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise DraftboardError(f"{what}: not a number: {value!r:.60}") from None
    if not math.isfinite(number):
        raise DraftboardError(f"{what}: not a finite number: {value!r}")
    return number


def rates_above(fractions: Sequence[float], block_size: int) -> dict[str, float]:
    """`accept_rate_pos{k}` from the fraction of blocks per acceptance length (index = length).

    Draft k is accepted exactly in the blocks whose acceptance length is at least k + 1.
    """
    return {names.accept_rate_metric(k): sum(fractions[k + 1:]) for k in range(1, block_size)}


def protocol_tags(protocol: Mapping[str, str], fmt: str) -> dict[str, str]:
    stated = {k: str(v) for k, v in protocol.items() if v is not None and k != "scoring"}
    return {names.protocol_tag("scoring"): IMPORTED_SCORING, names.protocol_tag("source_format"): fmt,
            **{names.protocol_tag(k): v for k, v in stated.items()}}


def log_imported(tracker, evals: Sequence[ImportedEval], *, source: str | Path, fmt: str, name: str,
                 target: str | None = None, train_run_id: str | None = None) -> list[str]:
    """One eval run per record through `Tracker.eval_run`; returns the run ids.

    The target is the one given, else the one the file states, else the training run's, else
    `unknown`: an imported eval never pretends to know its target.
    """
    from tracker.environment import fingerprint
    from tracker.environment.evidence import decide

    if not evals:
        raise DraftboardError(f"{source}: no results to import")
    if target is None and train_run_id is not None:
        target = tracker.run(train_run_id).data.tags.get(names.TARGET)
    run_ids = []
    for record in evals:
        fp = fingerprint.imported(source, fmt, record.environment,
                                  evidence=decide.decide(record.facts) if record.facts else None)
        run_target = target or record.protocol.get("target") or "unknown"
        label = f"{name} · {record.dataset}" if len(evals) > 1 else name
        params = {"import.source": str(Path(source).resolve()), "import.format": fmt, "dataset": record.dataset}
        tags = {names.IMPORTED: "1", **protocol_tags({"dataset": record.dataset, **record.protocol}, fmt)}
        rows = known_bad.matches(record.serving) if record.serving is not None else []
        if rows:
            tags[names.KNOWN_BAD] = known_bad.tag_text(rows)[:names.MAX_TAG_CHARS]
        with tracker.eval_run(label, target=run_target, train_run_id=train_run_id, params=params,
                              checkpoint_step=record.checkpoint_step, fingerprint=fp, tags=tags) as run:
            run.log_metrics(record.metrics, step=0)
            run.log_json(names.IMPORTED_RESULTS_ARTIFACT, {"format": fmt, "dataset": record.dataset, "protocol": record.protocol,
                                            "metrics": record.metrics, "details": record.details})
            run_ids.append(run.run_id)
    return run_ids
