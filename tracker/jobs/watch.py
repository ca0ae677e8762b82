"""Checkpoint watchers: record the checkpoints a training tool writes as they appear, and queue their evals.

`draftboard watch RUN_ID DIR [--auto-eval PRESET]` (and `draftboard worker --watch`, which scans
every watched run of the store) looks at the entries of DIR in each tool's layout
(../shared/research/training-stacks.md):

- SpecForge legacy `epoch_{e}_step_{s}/` (z-lab config.json + model.safetensors): step s;
- SpecForge runtime `{run_id}-step{N}/training_state.pt`: step N (the drafter loader reads the
  pickle with weights_only=True, or says how to `specforge export` it);
- speculators `{epoch}/` (config.json + model.safetensors + training_state.json): the
  global_step of training_state.json, else the epoch;
- TorchSpec `iter_{NNNNNNN}/` (its `training/checkpoint.py` `save`: `model/` as torch.distributed.checkpoint
  shards, `optimizer/`, `meta.json`): iteration N, the steps done. Recorded (digested as files, nothing loaded),
  never queued: a DCP checkpoint's `.metadata` is a pickle, and a checkpoint is data; its note says to export it
  with TorchSpec's `tools/convert_to_hf.py` and watch the exported folder;
- any other z-lab folder (config.json + model.safetensors) whose name ends in its step.

Symlinks (`-latest`, `-best`, `checkpoint_best`, `epoch{e}_step{N}`) are skipped: they name a
folder that is already listed. A folder is taken once none of its files changed for `settle_s`
seconds, so a checkpoint still being written is not digested half-way.

The training's own console and package list, where the folder holds them (`*.log` at its top, a W&B run's
`wandb/latest-run/files/` or a SwanLab run's `swanlog/run-*/` files), are read as evidence of the environment
the training really runs in (tracker/environment/evidence) whenever they grew since the last scan, with what the
newest checkpoint's config.json says saved it, and set the run's fingerprint, unless draftboard captured that
fingerprint itself (a live capture is never replaced).

The watch state lives in the store, on the watched run: the tag `draftboard.watch` (the folder,
so a worker finds the run) and the artifact `watch.json` {dir, preset, settle_s, seen: {entry:
{step, sha256, job_id}}}. An entry in `seen` is never digested again; its eval is queued once
(`job_id` set after `JobQueue.submit`, whose dedup covers a crash between the two). The preset
(`--auto-eval`) is a JSON object of eval params (target, prompts, budgets, device, ...) validated
by `tracker.jobs.eval_job.validate`; drafter, train_run_id and checkpoint_step are filled per
checkpoint.

Watch state is untrusted data: any MLflow writer can set the tag and write the artifact with plain
`MlflowClient` calls. So `draftboard worker --watch` (`scan_all`) scans only the runs of the
experiments this deployment owns (draftboard's own, plus DRAFTBOARD_WATCH_EXPERIMENTS), and only a
folder under its allowed roots, with a preset that passes the checks a queued job gets (no store,
no path outside the roots). A watch that fails one is marked refused on the run (tag
`draftboard.watch_refused`, the reason) and is not scanned again until `draftboard watch` (or the
dashboard's form) states it anew. No integrity mark (an HMAC) is needed: after these checks a
planted watch can do exactly what a dashboard user can (queue evals of files under the roots),
while a mark would put a deployment secret on every training machine that runs `draftboard watch`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tracker import config
from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from tracker.store import adoption, checkpoints, names

log = logging.getLogger(__name__)

SPECFORGE_LEGACY, SPECFORGE_RUNTIME, SPECULATORS, ZLAB = "specforge-legacy", "specforge-runtime", "speculators", "z-lab"
TORCHSPEC = "torchspec"
TORCHSPEC_NOTE = ("not queued: TorchSpec's iter_ folder holds torch.distributed.checkpoint shards, whose .metadata is a "
                  "pickle draftboard never loads; export it with TorchSpec's tools/convert_to_hf.py and watch the "
                  "exported folder")
DEFAULT_SETTLE_S = 30.0
# Set per checkpoint by the watcher, so a preset may not hold them.
PER_CHECKPOINT = ("drafter", "train_run_id", "checkpoint_step")

_LEGACY = re.compile(r"^epoch_(\d+)_step_(\d+)$")
_TORCHSPEC = re.compile(r"^iter_(\d{7})$")
_RUNTIME = re.compile(r"^.+-step(\d+)$")
_EPOCH = re.compile(r"^\d+$")
_TRAILING_STEP = re.compile(r"(\d+)$")
_ZLAB_FILES = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class Found:
    """A complete checkpoint entry of a watched folder."""

    name: str  # the entry's name in the folder (the key of watch.json's `seen`)
    path: Path
    step: int
    layout: str


def _settled(folder: Path, settle_s: float, now: float) -> bool:
    """True when no file under folder changed in the last settle_s seconds."""
    newest = max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=now)
    return now - newest >= settle_s


def _step_of_speculators(folder: Path, epoch: int) -> int:
    try:
        state = json.loads((folder / "training_state.json").read_text())
        step = state.get("global_step") if isinstance(state, dict) else None
    except (OSError, ValueError):
        step = None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else epoch


_TRAIN_COMMAND = "train_command.txt"  # speculators' save_train_command, in the folder it saves checkpoints to
_TRAIN_COMMAND_MAX_BYTES = 64 << 10
_SPECULATORS_LINE = re.compile(r"# speculators: (\S{1,64})")


def speculators_version(root: Path) -> str | None:
    """The speculators release a run was trained with, from the `# speculators: X` line speculators writes
    into `train_command.txt` beside its checkpoints (its `train/utils.py`); None when the file is missing,
    too large, or names no release (`not installed`, a bare commit)."""
    file = root / _TRAIN_COMMAND
    try:
        if not file.is_file() or file.stat().st_size > _TRAIN_COMMAND_MAX_BYTES:
            return None
        text = file.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        found = _SPECULATORS_LINE.fullmatch(line.strip())
        if found and adoption.parse_version(found.group(1)) is not None:
            return found.group(1)
    return None


def classify(entry: Path) -> Found | None:
    """The checkpoint a folder entry holds in one of the layouts above, else None."""
    if entry.is_symlink() or not entry.is_dir():
        return None
    name = entry.name
    zlab = all((entry / f).is_file() for f in _ZLAB_FILES)
    if (m := _LEGACY.match(name)) and zlab:
        return Found(name, entry, int(m.group(2)), SPECFORGE_LEGACY)
    if (m := _RUNTIME.match(name)) and (entry / "training_state.pt").is_file():
        return Found(name, entry, int(m.group(1)), SPECFORGE_RUNTIME)
    if (m := _TORCHSPEC.match(name)) and (entry / "model").is_dir() and (entry / "meta.json").is_file():
        return Found(name, entry, int(m.group(1)), TORCHSPEC)
    if _EPOCH.match(name) and zlab and (entry / "training_state.json").is_file():
        return Found(name, entry, _step_of_speculators(entry, int(name)), SPECULATORS)
    if zlab and (m := _TRAILING_STEP.search(name)):
        return Found(name, entry, int(m.group(1)), ZLAB)
    return None


def find_checkpoints(root: Path, settle_s: float = DEFAULT_SETTLE_S, now: float | None = None) -> list[Found]:
    """The settled checkpoints directly under root, by step."""
    if not root.is_dir():
        raise DraftboardError(f"{root}: not a folder (watch the folder the tool saves its checkpoints in)")
    now = time.time() if now is None else now
    found = [f for entry in sorted(root.iterdir()) if (f := classify(entry)) and _settled(f.path, settle_s, now)]
    return sorted(found, key=lambda f: (f.step, f.name))


def check_preset(preset: Any) -> dict[str, Any]:
    """The preset validated as an eval's params (without the per-checkpoint ones)."""
    if not isinstance(preset, Mapping):
        raise DraftboardError(f"an eval preset must be a JSON object of eval params, got {type(preset).__name__}")
    fixed = sorted(k for k in PER_CHECKPOINT if k in preset)
    if fixed:
        raise DraftboardError(f"an eval preset may not set {', '.join(fixed)}: the watcher sets them per checkpoint")
    checked = eval_job.validate({**preset, "drafter": "checkpoint"})
    del checked["drafter"]
    return checked


@dataclass
class WatchState:
    """watch.json of a watched run."""

    dir: str
    preset: dict[str, Any] | None
    settle_s: float
    seen: dict[str, dict[str, Any]]
    # evidence file (relative to dir) -> {offset, line} read up to; the facts read from them (Fact.to_dict)
    evidence: dict[str, dict[str, int]] = field(default_factory=dict)
    facts: list[dict] = field(default_factory=list)
    read_checkpoint: str | None = None  # the newest checkpoint whose config.json the facts hold

    def to_dict(self) -> dict:
        return {"dir": self.dir, "preset": self.preset, "settle_s": self.settle_s, "seen": self.seen,
                "evidence": self.evidence, "facts": self.facts, "read_checkpoint": self.read_checkpoint}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "WatchState":
        if not isinstance(data, dict) or not isinstance(data.get("dir"), str) or not isinstance(data.get("seen"), dict):
            raise DraftboardError(f"{where}: {names.WATCH_ARTIFACT} is not a watch state ({{dir, preset, seen}})")
        preset = data.get("preset")
        evidence = data.get("evidence") if isinstance(data.get("evidence"), dict) else {}
        evidence = {k: {"offset": v["offset"], "line": v["line"]} for k, v in evidence.items()
                    if isinstance(v, dict) and all(isinstance(v.get(n), int) and v[n] >= 0 for n in ("offset", "line"))}
        facts = data.get("facts") if isinstance(data.get("facts"), list) else []
        read = data.get("read_checkpoint") if isinstance(data.get("read_checkpoint"), str) else None
        return cls(data["dir"], None if preset is None else check_preset(preset),
                   float(data.get("settle_s", DEFAULT_SETTLE_S)), dict(data["seen"]), evidence, facts, read)


@dataclass(frozen=True)
class ScanResult:
    run_id: str
    recorded: list[Found]  # new checkpoints registered on the run
    queued: list[int]  # eval jobs queued (or found queued already) for them


def start(tracker, run_id: str, folder: str | Path, preset: Mapping[str, Any] | None = None,
          settle_s: float = DEFAULT_SETTLE_S, keep_preset: bool = True) -> WatchState:
    """Watch folder for run_id (state stored on the run); watching it again keeps what was seen.

    A new preset replaces the old one; without one the stored preset stays, unless keep_preset
    is False (the dashboard's form, which states the whole watch). Checkpoints already queued are
    not queued again.
    """
    run = tracker.run(run_id)
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise DraftboardError(f"{folder}: not a folder (watch the folder the tool saves its checkpoints in)")
    state = _state(tracker, run) if run.data.tags.get(names.WATCH) else None
    if state is not None and state.dir != str(root):
        raise DraftboardError(f"run {run_id} already watches {state.dir}; one folder per run")
    if state is None:
        state = WatchState(str(root), None, settle_s, {})
    state.settle_s = settle_s
    if preset is not None or not keep_preset:
        state.preset = None if preset is None else check_preset(preset)
    tracker.write_json(run_id, names.WATCH_ARTIFACT, state.to_dict())
    tracker.client.set_tag(run_id, names.WATCH, str(root))
    if names.WATCH_REFUSED in run.data.tags:  # stated anew by its owner: checked again at the next scan
        tracker.client.delete_tag(run_id, names.WATCH_REFUSED)
    return state


def _state(tracker, run) -> WatchState:
    run_id = run.info.run_id
    return WatchState.from_dict(tracker.read_json(run_id, names.WATCH_ARTIFACT), f"run {run_id}")


def state(tracker, run_id: str) -> WatchState | None:
    """The run's watch state; None when the run is not watched."""
    run = tracker.run(run_id)
    return _state(tracker, run) if run.data.tags.get(names.WATCH) else None


class Refused(DraftboardError):
    """A watch that fails the worker's checks: marked on the run, never scanned."""


def check_state(state: WatchState, roots) -> None:
    """Refused unless the watched folder and every path of the preset lie under roots."""
    try:
        eval_job.check_path("watched folder", state.dir, roots)
        if state.preset is not None:
            eval_job.check_paths(state.preset, roots)
    except DraftboardError as exc:
        raise Refused(str(exc)) from None


def scan(tracker, queue, run_id: str, now: float | None = None, roots=None) -> ScanResult:
    """Record the new checkpoints of a watched run's folder and queue their evals (with a preset).

    roots: the allowed roots the folder and the preset's paths must lie under (the worker's); None
    checks nothing (`draftboard watch RUN DIR`, run by whoever named the folder). The state is
    written after each checkpoint, so a crash loses at most the one in hand.
    """
    run = tracker.run(run_id)
    if not run.data.tags.get(names.WATCH):
        raise DraftboardError(f"run {run_id} is not watched; start with: draftboard watch {run_id} DIR")
    try:
        state = _state(tracker, run)
    except DraftboardError as exc:
        raise Refused(str(exc)) from None
    if roots is not None:
        check_state(state, roots)
    recorded, queued = [], []
    found_all = find_checkpoints(Path(state.dir), state.settle_s, now)
    if any(f.layout == SPECULATORS for f in found_all) and not run.data.tags.get(names.TOOL_VERSION):
        # speculators redefined `eal` in 0.9.0: the release keys the run's curves (tracker/store/adoption.py)
        version = speculators_version(Path(state.dir))
        if version is not None:
            tracker.client.set_tag(run_id, names.TOOL_VERSION, version)
    for found in found_all:
        seen = state.seen.get(found.name)
        if seen is None:  # digested once, here
            record = checkpoints.describe(found.path, found.step)
            tracker.record_checkpoint(run_id, record)
            seen = state.seen[found.name] = {"step": found.step, "sha256": record.sha256, "layout": found.layout,
                                             "job_id": None}
            recorded.append(found)
            tracker.write_json(run_id, names.WATCH_ARTIFACT, state.to_dict())
        if found.layout == TORCHSPEC:  # never an eval's input: say why once
            if state.preset is not None and seen.get("not_queued") != TORCHSPEC_NOTE:
                seen["not_queued"] = TORCHSPEC_NOTE
                log.info("run %s: checkpoint %s %s", run_id, found.path, TORCHSPEC_NOTE)
                tracker.write_json(run_id, names.WATCH_ARTIFACT, state.to_dict())
            continue
        if state.preset is not None and seen.get("job_id") is None:
            params = {**state.preset, "drafter": str(found.path),
                      "train_run_id": run_id, "checkpoint_step": seen["step"]}
            job = queue.submit(eval_job.KIND, params)
            seen["job_id"] = job.id
            queued.append(job.id)
            tracker.write_json(run_id, names.WATCH_ARTIFACT, state.to_dict())
    _read_evidence(tracker, run, state)
    return ScanResult(run_id, recorded, queued)


# Where a training folder keeps what its process printed and had installed (relative to the watched folder).
EVIDENCE_GLOBS = ("*.log", "wandb/latest-run/files/output.log", "wandb/latest-run/files/requirements.txt",
                  "swanlog/run-*/console/*.log", "swanlog/run-*/files/requirements.txt")
MAX_EVIDENCE_FILES = 16
MAX_WATCH_FACTS = 2_000  # facts kept in watch.json: a console states a few dozen


def evidence_files(root: Path) -> dict[str, Path]:
    """The watched folder's console logs and package lists (EVIDENCE_GLOBS), each a regular file inside it."""
    found: dict[str, Path] = {}
    for pattern in EVIDENCE_GLOBS:
        for path in sorted(root.glob(pattern)):
            real = path.resolve()
            if real.is_file() and real.is_relative_to(root) and len(found) < MAX_EVIDENCE_FILES:
                found.setdefault(str(path.relative_to(root)), real)
    return found


def _read_evidence(tracker, run, state: WatchState) -> None:
    """Read what the folder's evidence files gained since the last scan (a console from where the last read
    stopped; a package list whole, as it is written once) and set the run's fingerprint from every fact read so
    far; never over a fingerprint draftboard captured live. The reading position and the facts live in the
    watch state, so a long training's console is read once, not at every scan."""
    from tracker.environment import fingerprint
    from tracker.environment.evidence import Fact, console, decide, files, packages
    from tracker.untrusted import textlines

    found = evidence_files(Path(state.dir))
    where = state.evidence
    changed = {name: path for name, path in found.items()
               if path.stat().st_size != (where.get(name) or {}).get("offset", 0)}
    newest = max(state.seen.items(), key=lambda item: item[1].get("step") or 0, default=None)
    checkpoint = None if newest is None or state.read_checkpoint == newest[0] else newest[0]
    if not changed and checkpoint is None:
        return
    run_id = run.info.run_id
    try:
        current = tracker.fingerprint(run_id)
    except DraftboardError:
        current = None
    if not fingerprint.evidence_may_replace(current):
        return
    facts = [f for f in map(Fact.from_dict, state.facts) if f is not None]
    before = {name: dict(where.get(name) or {}) for name in changed}
    for name, path in changed.items():
        whole = path.name == "requirements.txt" or path.stat().st_size < (where.get(name) or {}).get("offset", 0)
        start = {"offset": 0, "line": 1} if whole else (where.get(name) or {"offset": 0, "line": 1})
        if whole:  # read anew: what it said before no longer stands
            facts = [f for f in facts if f.file != name]
        reader = textlines.Lines(path, start["offset"], start["line"])
        facts += (packages.read if path.name == "requirements.txt" else console.read)(reader, name)
        where[name] = {"offset": reader.offset, "line": reader.next_line}
    if checkpoint is not None:  # what saved the newest checkpoint, in place of what saved the one before
        facts = [f for f in facts if f.rule != "checkpoint config.json"]
        facts += files.checkpoint_config(Path(state.dir) / checkpoint, f"{checkpoint}/config.json")
        state.read_checkpoint = checkpoint
    elif all(where[name] == before[name] for name in changed):
        return  # only a line still being written: nothing new
    state.facts = [f.to_dict() for f in facts[-MAX_WATCH_FACTS:]]
    if facts:  # files that state nothing leave the run as it was (without a fingerprint, its fix offered)
        tracker.attach_fingerprint(run_id, fingerprint.imported(state.dir, "watch", evidence=decide.decide(facts)))
    tracker.write_json(run_id, names.WATCH_ARTIFACT, state.to_dict())


def owned_experiments(tracker, env=None) -> set[str]:
    """Ids of the experiments whose watches this deployment runs: draftboard's own, plus those
    named in DRAFTBOARD_WATCH_EXPERIMENTS."""
    wanted = set(config.watch_experiments(env))
    owned = {eid for eid, name in tracker.experiment_names().items() if name in wanted} if wanted else set()
    own = tracker.find_experiment()
    return owned | ({own} if own is not None else set())


def scan_all(tracker, queue, now: float | None = None, roots=None) -> list[ScanResult]:
    """Scan every watched run of the experiments this deployment owns (`owned_experiments`), each
    folder and preset checked against roots (default: this process's allowed roots). A watch that
    fails a check is marked refused on its run and skipped from then on; any other failure is
    logged and skipped, not fatal."""
    roots = config.allowed_roots() if roots is None else roots
    owned = owned_experiments(tracker)
    results = []
    for run in tracker.find_runs(filter=f"tags.`{names.WATCH}` LIKE '%'", foreign=True):
        run_id = run.info.run_id
        if run.info.experiment_id not in owned or names.WATCH_REFUSED in run.data.tags:
            continue
        try:
            result = scan(tracker, queue, run_id, now, roots=roots)
        except Refused as exc:
            log.warning("watch of run %s refused: %s", run_id, exc)
            tracker.client.set_tag(run_id, names.WATCH_REFUSED, config.bounded(str(exc)))
            continue
        except DraftboardError as exc:
            log.warning("watch of run %s: %s", run_id, exc)
            continue
        for found in result.recorded:
            log.info("run %s: checkpoint %s recorded (step %d, %s)", run_id, found.path, found.step, found.layout)
        results.append(result)
    return results
