"""TensorBoard event folders (SpecForge / EAGLE `--report-to tensorboard`, speculators' handler).

Read through the `tensorboard` package's own reader (`EventAccumulator`), never by parsing the
record format here. Every folder below the given one that holds `*tfevents*` files is one run
(SpecForge writes `{output_dir}/runs`, speculators `{log_dir}/{run_name}`): its scalars by tag
and step, and the hyperparameters an `add_hparams` call stored (speculators logs its flattened
config that way). Each run is imported as a draftboard training run whose tool is detected from
those names exactly as for a run the tool wrote into MLflow (tracker/store/adoption.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracker import redact
from tracker.errors import DraftboardError
from tracker.store import adoption, names

FORMAT = "tensorboard"


@dataclass(frozen=True)
class ScalarPoint:
    step: int
    value: float
    wall_time: float


@dataclass(frozen=True)
class EventRun:
    """One event folder: scalars by tag, and hyperparameters."""

    folder: str
    name: str  # the folder relative to the imported one ("." for the folder itself)
    scalars: dict[str, list[ScalarPoint]]
    hparams: dict[str, str]

    def view(self) -> adoption.RunView:
        """What adoption sees of this run: the last value of each scalar, hparams as params."""
        last = {tag: points[-1].value for tag, points in self.scalars.items() if points}
        return adoption.RunView(self.folder, "", self.hparams, last, {}, self.name)


def _hparams(accumulator) -> dict[str, str]:
    from tensorboard.plugins.hparams import metadata

    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    start = content.get(metadata.SESSION_START_INFO_TAG)
    if start is None:
        return {}
    info = metadata.parse_session_start_info_plugin_data(start)
    out = {}
    for key, value in info.hparams.items():
        kind = value.WhichOneof("kind")
        raw = getattr(value, kind) if kind else None
        out[key] = "" if raw is None else str(int(raw) if isinstance(raw, float) and raw.is_integer() else raw)
    return out


def read_event_folder(path: str | Path) -> list[EventRun]:
    """Every run below `path`, by folder name; DraftboardError when there is none."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    root = Path(path)
    if not root.is_dir():
        raise DraftboardError(f"{root}: not a folder; pass the TensorBoard log folder (e.g. OUTPUT_DIR/runs)")
    folders = sorted({f.parent for f in root.rglob("*tfevents*") if f.is_file()})
    runs = []
    for folder in folders:
        accumulator = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
        try:
            accumulator.Reload()
        except Exception as exc:  # a truncated or foreign file; say which
            raise DraftboardError(f"{folder}: cannot read TensorBoard events ({exc})") from exc
        scalars = {tag: [ScalarPoint(e.step, e.value, e.wall_time) for e in accumulator.Scalars(tag)]
                   for tag in accumulator.Tags()["scalars"]}
        hparams = _hparams(accumulator)
        if scalars or hparams:
            runs.append(EventRun(str(folder), str(folder.relative_to(root)), scalars, hparams))
    if not runs:
        raise DraftboardError(f"{root}: no TensorBoard scalars found (no *tfevents* files with scalars below it)")
    return runs


def log_event_runs(tracker, runs: list[EventRun], name: str, target: str | None = None) -> list[str]:
    """Each event run as a draftboard training run (imported, tool detected); returns the run ids.

    Steps are logged as the tool counted them; the tool's step semantics go in a tag. A step
    that several files of one folder logged for the same tag keeps the value logged last.
    """
    from tracker.environment import fingerprint

    ids = []
    for run in runs:
        tool = adoption.detect(run.view()).tool
        tags = {names.IMPORTED: "1"}
        if tool is not None:
            tags[adoption.TOOL_TAG] = tool
            tags[adoption.STEP_UNIT_TAG] = adoption.TOOLS[tool].steps.unit
        params = {"import.source": run.folder, "import.format": FORMAT, **redact.mask_params(run.hparams)}
        by_step: dict[int, dict[str, float]] = {}
        for tag, points in run.scalars.items():
            for point in sorted(points, key=lambda p: p.wall_time):
                by_step.setdefault(point.step, {})[tag] = point.value
        label = name if len(runs) == 1 else f"{name} · {run.name}"
        with tracker.training_run(label, params, target, tags=tags,
                                  fingerprint=fingerprint.imported(run.folder, FORMAT)) as train_run:
            for step in sorted(by_step):
                train_run.log_step(step, **by_step[step])
        ids.append(train_run.run_id)
    return ids
