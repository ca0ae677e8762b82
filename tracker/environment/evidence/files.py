"""Evidence read from files on disk: a console log, a package list, a checkpoint's config.json.

Each is read through `tracker.untrusted.textlines` (a regular file only, bounded lines) and cited
under `label`: the file as the run's folder names it (`files/output.log`), so a citation reads the
same wherever the folder was imported from.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracker.environment.evidence import Fact, console, packages
from tracker.errors import DraftboardError
from tracker.untrusted import textlines

MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KiB


def console_file(path: str | Path, label: str | None = None) -> list[Fact]:
    return console.read(textlines.lines(path), label or Path(path).name)


def package_file(path: str | Path, label: str | None = None) -> list[Fact]:
    return packages.read(textlines.lines(path), label or Path(path).name)


def checkpoint_config(folder: str | Path, label: str | None = None) -> list[Fact]:
    """What saved a checkpoint: `config.json`'s `transformers_version` (the saving process's transformers).
    Read as JSON text only; nothing in the folder runs. [] where the folder has no readable config."""
    path = Path(folder) / "config.json"
    try:
        with textlines.open_regular(path) as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except DraftboardError:
        return []
    if len(raw) > MAX_CONFIG_BYTES:
        return []
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError):
        return []
    version = config.get("transformers_version") if isinstance(config, dict) else None
    if not isinstance(version, str) or not version[:1].isdigit() or len(version) > 40:
        return []
    return [Fact("software.transformers", version, label or str(path), None,
                 f'"transformers_version": "{version}"', "checkpoint config.json", rank=2)]
