"""A training run another tracker wrote (W&B, SwanLab, TensorBoard), logged as a draftboard training run.

One owner of what every such import does alike: the tool detected from the run's names
(tracker/store/adoption.py), config as params with secrets masked, steps as the tool counted them,
the fingerprint from the run's own files (tracker/environment/evidence), and those files kept on the
run as artifacts under `evidence/` beside `evidence.json` (every fact read, with file and line, and
where the files disagree), so a reader can check each environment field against its source.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tracker import redact
from tracker.environment.evidence import Fact, decide, files
from tracker.errors import DraftboardError
from tracker.store import adoption, names

EVIDENCE_ARTIFACT = "evidence.json"
EVIDENCE_FOLDER = "evidence"


@dataclass
class ForeignRun:
    """What one run folder holds, read before anything is written."""

    folder: str
    label: str  # the folder relative to the imported one ("." for itself)
    fmt: str
    params: dict[str, str]
    history: dict[int, dict[str, float]]  # step -> metrics
    summary: dict[str, float] = field(default_factory=dict)  # the tracker's final values (W&B's summary)
    facts: list[Fact] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)  # (file, its label) kept as evidence artifacts
    notes: list[str] = field(default_factory=list)  # what was read only in part, and why

    def view(self) -> adoption.RunView:
        """What adoption sees: the last value of each metric, params as they are."""
        last: dict[str, float] = {}
        for step in sorted(self.history):
            last.update(self.history[step])
        return adoption.RunView(self.folder, "", self.params, last, {}, self.label)


def run_folders(path: str | Path, is_run, what: str) -> list[Path]:
    """The run folders `path` names: itself when `is_run` says so, else the runs directly inside it
    (a `wandb/` or `swanlog/` folder), in name order (their names start with the date); `what`: the
    folder a user should give, for the error."""
    from tracker.errors import DraftboardError

    root = Path(path)
    if not root.is_dir():
        raise DraftboardError(f"{root}: not a folder; pass {what}")
    if is_run(root):
        return [root]
    runs = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and is_run(p))
    if not runs:
        raise DraftboardError(f"{root}: not {what.split(' (')[0]} (nor a folder holding runs)")
    return runs


def with_console(run: ForeignRun, console: str | Path | None) -> ForeignRun:
    """`run` with a console log given beside it (`--console FILE`) read as evidence and kept."""
    if console is not None:
        path = Path(console)
        run.facts += files.console_file(path, path.name)
        run.kept.append((path, path.name))
    return run


def evidence_json(run: ForeignRun, decision: decide.Decision) -> dict:
    return {"source": run.folder, "format": run.fmt, "files": [label for _, label in run.kept],
            "facts": [{"field": f.field, "value": f.value, "stated": f.stated, **f.cite()} for f in run.facts],
            "contradictions": decision.contradictions, "partial": run.notes}


def keep_evidence(train_run, run: ForeignRun, decision: decide.Decision) -> None:
    """`evidence.json` (every fact read, with its file and line; where the files disagree; what was read
    only in part) and the files read, on the run (a run being logged, or `_Existing`: one adopted)."""
    train_run.log_json(EVIDENCE_ARTIFACT, evidence_json(run, decision))
    for path, kept_as in run.kept:
        train_run.log_file(path, f"{EVIDENCE_FOLDER}/{Path(kept_as).parent}".rstrip("/."))


# Artifacts a tool logs beside an MLflow run that say what ran: read as evidence when adopting it.
ADOPTED_EVIDENCE = {"console": ("output.log", "console.log", "train.log", "stdout.log"),
                    "packages": ("requirements.txt", "environment.yml", "conda.yaml")}


@contextlib.contextmanager
def adopted(tracker, run_id: str, console: str | Path | None) -> Iterator[ForeignRun | None]:
    """An MLflow run another tool wrote, as the evidence of its own top-level artifacts (ADOPTED_EVIDENCE, copied
    into a folder made here and removed on leaving) and of `console`; None where there is nothing to read."""
    listed = {a.path for a in tracker.client.list_artifacts(run_id) if not a.is_dir}
    wanted = [(kind, name) for kind, names_ in ADOPTED_EVIDENCE.items() for name in names_ if name in listed]
    with tempfile.TemporaryDirectory(prefix="draftboard-adopt-") as folder:
        run = ForeignRun(f"mlflow run {run_id}", ".", "adopted", {}, {})
        for kind, name in wanted:
            local = Path(tracker.client.download_artifacts(run_id, name, folder))
            run.facts += (files.console_file if kind == "console" else files.package_file)(local, name)
        with_console(run, console)
        yield run if run.facts or console is not None else None


class _Existing:
    """An existing run as keep_evidence writes to one."""

    def __init__(self, tracker, run_id: str):
        self.tracker, self.run_id = tracker, run_id

    def log_json(self, artifact: str, obj) -> None:
        self.tracker.write_json(self.run_id, artifact, obj)

    def log_file(self, path: Path, artifact_path: str) -> None:
        self.tracker.client.log_artifact(self.run_id, str(path), artifact_path)


def attach(tracker, run_id: str, tool: str, run: ForeignRun) -> dict | None:
    """The adopted run's fingerprint from its evidence, stored with the evidence on it; None (nothing written)
    where the run holds a fingerprint captured in its own environment (fingerprint.evidence_may_replace)."""
    from tracker.environment import fingerprint

    try:
        current = tracker.fingerprint(run_id)
    except DraftboardError:
        current = None
    if not fingerprint.evidence_may_replace(current):
        return None
    decision = decide.decide(run.facts)
    fp = tracker.attach_fingerprint(run_id, fingerprint.imported(run.folder, f"adopted:{tool}", evidence=decision))
    keep_evidence(_Existing(tracker, run_id), run, decision)
    return fp


def _storable(run: ForeignRun) -> None:
    """The metrics MLflow can store, checked before any run is made (a tracker's keys hold what MLflow refuses:
    `loss (train)`): the others are left out and said, never a run half-written."""
    from tracker.store.steps import MetricChecker

    keys = {key for metrics in run.history.values() for key in metrics} | set(run.summary)
    checker, refused = MetricChecker(), set()
    for key in keys:
        try:
            checker.check({key: 0.0})
        except DraftboardError:
            refused.add(key)
    if refused:
        for metrics in (*run.history.values(), run.summary):
            for key in refused & set(metrics):
                del metrics[key]
        shown = ", ".join(repr(k[:40]) for k in sorted(refused)[:5])
        run.notes.append(f"{len(refused)} metric name(s) MLflow cannot store were left out ({shown})")


def log_runs(tracker, runs: list[ForeignRun], name: str, target: str | None = None) -> list[str]:
    """Each run as a draftboard training run (imported, tool detected, fingerprint from evidence)."""
    from tracker.environment import fingerprint

    for run in runs:  # all checked before the first run is made
        _storable(run)
    ids = []
    for run in runs:
        tool = adoption.detect(run.view()).tool
        tags = {names.IMPORTED: "1"}
        if tool is not None:
            tags[adoption.TOOL_TAG] = tool
            tags[adoption.STEP_UNIT_TAG] = adoption.TOOLS[tool].steps.unit
        decision = decide.decide(run.facts)
        params = {"import.source": run.folder, "import.format": run.fmt, **redact.mask_params(run.params)}
        if run.notes:
            params["import.partial"] = "; ".join(run.notes)[:500]
        label = name if len(runs) == 1 else f"{name} · {run.label}"
        fp = fingerprint.imported(run.folder, run.fmt, evidence=decision)
        with tracker.training_run(label, params, target, tags=tags, fingerprint=fp) as train_run:
            keep_evidence(train_run, run, decision)
            for step in sorted(run.history):
                train_run.log_step(step, **run.history[step])
            logged = {key for metrics in run.history.values() for key in metrics}
            only_summary = {k: v for k, v in run.summary.items() if k not in logged}
            if only_summary:  # set on the summary alone (W&B's run.summary[...] = ...): at the last step
                train_run.log_step(max(run.history, default=0), **only_summary)
        ids.append(train_run.run_id)
    return ids
