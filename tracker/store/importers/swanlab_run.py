"""SwanLab run folders (`swanlog/run-<date>_<time>-<id>`, or the `swanlog/` folder holding several).

What a folder holds (swanlab 0.10.3, `mode="local"`; ../shared/research/trackers-2026-12-07.md):
`files/requirements.txt` (a pip freeze of the training Python), `files/swanlab-metadata.json`
(`runtime.python_version`; `hardware.accelerators`: per vendor, `devices` with their `name`),
`files/config.yaml` (each key's `value`), `console/<date>.log` (stdout and stderr as swanlab's terminal
proxy captured them), and `logs/<column id>/*.log`, the metrics as JSON lines `{"index": step, "data":
value}`. A column's metric name is not in those files: swanlab's local callback keeps it in swanboard's
database and the binary `run-<id>.swanlab` log, whose messages draftboard cannot load beside its own
protobuf (swanlab's generated code pins protobuf 6). So a metric is imported under `swanlab/column_<id>`
and the import says so (`import.partial`); the environment, the config and the console are read whole.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracker.environment.evidence import Fact, files
from tracker.store.importers import foreign_run
from tracker.store.importers.foreign_run import ForeignRun
from tracker.untrusted import textlines
from tracker.untrusted.digits import whole_number
from tracker.untrusted.jsonlines import MAX_SMALL_JSON, small_json

FORMAT = "swanlab"
MAX_COLUMNS = 10_000


def run_folders(path: str | Path) -> list[Path]:
    return foreign_run.run_folders(path, _is_run, "a SwanLab run folder (swanlog/run-...) or a swanlog/ folder")


def _is_run(folder: Path) -> bool:
    return folder.name.startswith("run-") and any((folder / sub).is_dir() for sub in ("files", "console", "logs"))


def _metadata_facts(path: Path, label: str) -> list[Fact]:
    meta = small_json(path)
    if not isinstance(meta, dict):
        return []
    facts = []
    runtime = meta.get("runtime") if isinstance(meta.get("runtime"), dict) else {}
    python = runtime.get("python_version")
    if isinstance(python, str) and python[:1].isdigit() and len(python) < 20:
        facts.append(Fact("software.python", python, label, None, f'"python_version": "{python}"', "swanlab metadata", 1))
    hardware = meta.get("hardware") if isinstance(meta.get("hardware"), dict) else {}
    accelerators = hardware.get("accelerators") if isinstance(hardware.get("accelerators"), list) else []
    nvidia = [a for a in accelerators if isinstance(a, dict) and a.get("vendor") == "nvidia"]
    devices = [d for a in nvidia if isinstance(a.get("devices"), list) for d in a["devices"] if isinstance(d, dict)]
    if devices:
        names = {str(d.get("name"))[:120] for d in devices if d.get("name")}
        text = f'"accelerators": nvidia, {len(devices)} device(s): {", ".join(sorted(names))[:200]}'
        facts.append(Fact("hardware.gpu_count", len(devices), label, None, text, "swanlab metadata", 1))
        if len(names) == 1:
            facts.append(Fact("hardware.gpu_name", names.pop(), label, None, text, "swanlab metadata", 1))
    return facts


def _config(path: Path) -> dict[str, str]:
    import yaml

    raw = textlines.read_small(path, MAX_SMALL_JSON)
    try:
        config = None if raw is None else yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError):
        return {}
    if not isinstance(config, dict):
        return {}
    out = {}
    for key, entry in config.items():
        value = entry.get("value") if isinstance(entry, dict) and "value" in entry else entry
        out[str(key)] = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)[:2000]
    return out


def _metrics(logs: Path, run: ForeignRun) -> None:
    columns = sorted((p for p in logs.iterdir() if p.is_dir() and whole_number(p.name) is not None),
                     key=lambda p: whole_number(p.name))[:MAX_COLUMNS]
    for column in columns:
        name = f"swanlab/column_{column.name}"
        for part in sorted(column.glob("*.log")):
            for number, text, cut in textlines.lines(part):
                try:
                    point = json.loads(text) if not cut else None
                except ValueError:
                    point = None
                step, value = (point.get("index"), point.get("data")) if isinstance(point, dict) else (None, None)
                if (isinstance(step, int) and not isinstance(step, bool) and step >= 0 and isinstance(value, (int, float))
                        and not isinstance(value, bool) and math.isfinite(value)):
                    run.history.setdefault(step, {})[name] = float(value)
    if columns:
        run.notes.append(f"{len(columns)} metric(s) imported as swanlab/column_<id>: their names are kept only in "
                         "swanlab's binary run log and swanboard's database")


def read_run(folder: Path, root: Path) -> ForeignRun:
    label = "." if folder == root else str(folder.relative_to(root))
    run = ForeignRun(str(folder), label, FORMAT, _config(folder / "files" / "config.yaml"), {})
    requirements = folder / "files" / "requirements.txt"
    if requirements.is_file():
        run.facts += files.package_file(requirements, "files/requirements.txt")
        run.kept.append((requirements, "files/requirements.txt"))
    run.facts += _metadata_facts(folder / "files" / "swanlab-metadata.json", "files/swanlab-metadata.json")
    console = folder / "console"
    for log in sorted(console.glob("*.log")) if console.is_dir() else []:
        run.facts += files.console_file(log, f"console/{log.name}")
        run.kept.append((log, f"console/{log.name}"))
    if (folder / "logs").is_dir():
        _metrics(folder / "logs", run)
    return run


def read_folder(path: str | Path) -> list[ForeignRun]:
    root = Path(path)
    return [read_run(folder, root) for folder in run_folders(root)]
