"""Evidence read from files on disk: a console log, a package list, a checkpoint's config.json.

Each is read through `tracker.untrusted.textlines` (a regular file only, bounded lines) and cited
under `label`: the file as the run's folder names it (`files/output.log`), so a citation reads the
same wherever the folder was imported from.
"""

from __future__ import annotations

import re
from pathlib import Path

from tracker.environment.evidence import Fact, console, packages
from tracker.untrusted import textlines
from tracker.untrusted.jsonlines import small_json

_VERSION = re.compile(r"\d{1,4}(?:\.\d{1,6}){1,3}(?:[\w.+-]{0,24})")
# What `torch_dtype` / `dtype` say a checkpoint's weights were saved in (transformers' spellings).
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def console_file(path: str | Path, label: str | None = None) -> list[Fact]:
    return console.read(textlines.lines(path), label or Path(path).name)


def package_file(path: str | Path, label: str | None = None) -> list[Fact]:
    return packages.read(textlines.lines(path), label or Path(path).name)


def checkpoint_config(folder: str | Path, label: str) -> list[Fact]:
    """What saved a checkpoint, from its `config.json` read as JSON text (nothing in the folder runs): the saving
    process's transformers (`transformers_version`) and the dtype its weights were saved in (`torch_dtype`, or
    `dtype` from transformers 5: `numerics.saved_dtype`, not what the training computed in). [] where there is no
    readable config."""
    config = small_json(Path(folder) / "config.json")
    if not isinstance(config, dict):
        return []
    facts = []
    version = config.get("transformers_version")
    if isinstance(version, str) and _VERSION.fullmatch(version):
        facts.append(Fact("software.transformers", version, label, None, f'"transformers_version": "{version}"',
                          "checkpoint config.json", rank=2, stated=False))
    saved = config.get("torch_dtype", config.get("dtype"))
    if isinstance(saved, str) and saved in _DTYPES:
        facts.append(Fact("numerics.saved_dtype", _DTYPES[saved], label, None, f'"torch_dtype": "{saved}"',
                          "checkpoint config.json", rank=2))
    return facts
