"""W&B run folders (`wandb/offline-run-*`, synced `wandb/run-*`, or the `wandb/` folder holding several).

What a folder holds (wandb 0.31.0; ../shared/research/trackers-2026-12-07.md): `run-<id>.wandb`, the
transaction log, LevelDB's log layout (tracker/untrusted/record_log.py) of protobuf `Record`s read
with wandb's own messages (`wandb.proto.wandb_internal_pb2`, the optional `wandb` extra): `run` and
`config` (the config: `update {key or nested_key, value_json}`), `history` (`item {nested_key,
value_json}` and `step {num}`), `summary` (`update`, the same items: the final values, those set on the
summary alone logged at the last step), `environment` (python, GPU type and count), `output_raw` (the console
lines). `files/` holds `output.log` (the console as the process wrote it), `requirements.txt` (a pip
freeze of the training Python) and, for synced runs, `wandb-metadata.json`, `config.yaml`.

History keeps its steps (`step.num`, else the `_step` item); keys starting with `_` (wandb's own
`_runtime`, `_timestamp`) and non-numbers are not metrics. A log cut short (a crashed run) is read up
to its last whole record and the import says so (`import.partial`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracker.environment.evidence import Fact, files
from tracker.errors import DraftboardError
from tracker.store.importers import foreign_run
from tracker.store.importers.foreign_run import ForeignRun
from tracker.untrusted import textlines
from tracker.untrusted.digits import whole_number
from tracker.untrusted.jsonlines import small_json
from tracker.untrusted.record_log import LogRecords

FORMAT = "wandb"
MAGIC, IDENT = b":W&B", 0xBEE1
MAX_CONSOLE_RECORDS = 100_000  # output_raw records read as console lines when files/output.log is missing


def _messages():
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError:
        raise DraftboardError("reading a W&B run log needs wandb's message definitions: pip install "
                              "'draftboard[wandb]' (or wandb) on the importing machine") from None
    return wandb_internal_pb2


def run_folders(path: str | Path) -> list[Path]:
    return foreign_run.run_folders(path, _is_run, "a W&B run folder (wandb/offline-run-...) or a wandb/ folder")


def _is_run(folder: Path) -> bool:
    named = folder.name.startswith(("offline-run-", "run-"))
    return named and (any(folder.glob("run-*.wandb")) or (folder / "files").is_dir())


def _value(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _key(item) -> str:
    return ".".join(item.nested_key) if item.nested_key else item.key


def _environment_facts(env, where: str) -> list[Fact]:
    facts = []
    text = f"environment record: python {env.python!r}, gpu {env.gpu_type!r} x {env.gpu_count}"
    if env.python.startswith("CPython "):
        facts.append(Fact("software.python", env.python.split()[1], where, None, text, "wandb environment record", 1))
    if env.gpu_type:
        facts.append(Fact("hardware.gpu_name", env.gpu_type, where, None, text, "wandb environment record", 1))
    if env.gpu_type or env.gpu_count:
        facts.append(Fact("hardware.gpu_count", int(env.gpu_count), where, None, text, "wandb environment record", 1))
    return facts


def _metadata_facts(path: Path, label: str) -> list[Fact]:
    """wandb-metadata.json of a synced run: python, GPU type and count (snake or camel case)."""
    meta = small_json(path)
    if not isinstance(meta, dict):
        return []
    facts = []
    gpu, count, python = meta.get("gpu") or meta.get("gpuType"), meta.get("gpu_count", meta.get("gpuCount")), meta.get("python")
    if isinstance(python, str) and python.startswith("CPython "):
        facts.append(Fact("software.python", python.split()[1], label, None, f'"python": "{python}"', "wandb metadata", 1))
    if isinstance(gpu, str) and gpu:
        facts.append(Fact("hardware.gpu_name", gpu[:120], label, None, f'"gpu": "{gpu[:120]}"', "wandb metadata", 1))
    gpus = whole_number(str(count), 4) if isinstance(count, (int, str)) else None
    if gpus is not None:
        facts.append(Fact("hardware.gpu_count", gpus, label, None, f'"gpu_count": {count}', "wandb metadata", 1))
    return facts


def read_run(folder: Path, root: Path) -> ForeignRun:
    label = "." if folder == root else str(folder.relative_to(root))
    run = ForeignRun(str(folder), label, FORMAT, {}, {})
    logs = sorted(folder.glob("run-*.wandb"))
    output_log, requirements = folder / "files" / "output.log", folder / "files" / "requirements.txt"
    console_records: list[tuple[str, str, bool]] = []
    if logs:
        console_records = _read_log(logs[0], run, want_console=not output_log.is_file())
    if output_log.is_file():
        run.facts += files.console_file(output_log, "files/output.log")
        run.kept.append((output_log, "files/output.log"))
    elif console_records:
        from tracker.environment.evidence import console

        run.facts += console.read(console_records, logs[0].name)
    if requirements.is_file():
        run.facts += files.package_file(requirements, "files/requirements.txt")
        run.kept.append((requirements, "files/requirements.txt"))
    metadata = folder / "files" / "wandb-metadata.json"
    if metadata.is_file() and not any(f.rule == "wandb environment record" for f in run.facts):
        run.facts += _metadata_facts(metadata, "files/wandb-metadata.json")
    if not logs and not run.facts:
        raise DraftboardError(f"{folder}: a W&B run folder with neither a run-*.wandb log nor files this import reads")
    return run


def _read_log(path: Path, run: ForeignRun, want_console: bool) -> list[tuple[str, str, bool]]:
    """Config, history and environment facts into `run`; the console's lines when `want_console`."""
    pb = _messages()
    log = LogRecords(path, MAGIC, IDENT)
    console_lines: list[tuple[str, str, bool]] = []
    where = path.name
    for number, data in enumerate(log, 1):
        record = pb.Record()
        try:
            record.ParseFromString(data)
        except Exception:  # protobuf's DecodeError: a record that passed its CRC yet is not a Record
            run.notes.append(f"{where}: record {number} is not a W&B record; read up to it")
            break
        kind = record.WhichOneof("record_type")
        if kind == "run":
            _config(record.run.config.update, run)
        elif kind == "config":
            _config(record.config.update, run)
        elif kind == "history":
            _history(record.history, run)
        elif kind == "summary":
            for item in record.summary.update:
                key, value = _key(item), _number(_value(item.value_json))
                if key and not key.startswith("_") and value is not None:
                    run.summary[key] = value
        elif kind == "environment":
            run.facts += _environment_facts(record.environment, where)
        elif kind == "output_raw" and want_console and len(console_lines) < MAX_CONSOLE_RECORDS:
            for line in record.output_raw.line.splitlines()[:64]:
                console_lines.append((f"record {number}", line[:textlines.MAX_LINE_BYTES], False))
    if log.stopped:
        run.notes.append(f"{where}: read up to {log.stopped}")
    return console_lines


def _config(updates, run: ForeignRun) -> None:
    for item in updates:
        key = _key(item)
        if key and not key.startswith("_"):
            value = _value(item.value_json)
            run.params[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)[:2000]


def _history(history, run: ForeignRun) -> None:
    values = {_key(item): _value(item.value_json) for item in history.item}
    step = history.step.num if history.HasField("step") else values.get("_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return
    metrics = {key: number for key, value in values.items()
               if not key.startswith("_") and (number := _number(value)) is not None}
    if metrics:
        run.history.setdefault(step, {}).update(metrics)


def read_folder(path: str | Path) -> list[ForeignRun]:
    root = Path(path)
    return [read_run(folder, root) for folder in run_folders(root)]
