"""TensorBoard event folders (SpecForge / EAGLE `--report-to tensorboard`, speculators' handler).

Read through the `tensorboard` package's own reader (`EventAccumulator`), never by parsing the
record format here. Every folder below the given one that holds `*tfevents*` files is one run
(SpecForge writes `{output_dir}/runs`, speculators `{log_dir}/{run_name}`): its scalars by tag
and step, and the hyperparameters an `add_hparams` call stored (speculators logs its flattened
config that way). Each run is imported as a draftboard training run whose tool is detected from
those names exactly as for a run the tool wrote into MLflow (tracker/store/adoption.py), and logged
as every foreign run is (foreign_run.py), with the evidence of a console log given beside it.
"""

from __future__ import annotations

from pathlib import Path

from tracker.errors import DraftboardError
from tracker.store.importers.foreign_run import ForeignRun

FORMAT = "tensorboard"


def _hparams(accumulator) -> dict[str, str]:
    from tensorboard.plugins.hparams import metadata

    try:
        content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    except KeyError:  # a folder that logged scalars and no add_hparams
        return {}
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


def read_event_folder(path: str | Path) -> list[ForeignRun]:
    """Every run below `path`, by folder name; DraftboardError when there is none. A step that several
    files of one folder logged for the same tag keeps the value logged last (by wall time)."""
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
        history: dict[int, dict[str, float]] = {}
        for tag in accumulator.Tags()["scalars"]:
            for event in sorted(accumulator.Scalars(tag), key=lambda e: e.wall_time):
                history.setdefault(event.step, {})[tag] = event.value
        hparams = _hparams(accumulator)
        if history or hparams:
            runs.append(ForeignRun(str(folder), str(folder.relative_to(root)), FORMAT, hparams, history))
    if not runs:
        raise DraftboardError(f"{root}: no TensorBoard scalars found (no *tfevents* files with scalars below it)")
    return runs
