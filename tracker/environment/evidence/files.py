"""Evidence read from files on disk: a console log, a package list.

Each is read through `tracker.untrusted.textlines` (a regular file only, bounded lines) and cited
under `label`: the file as the run's folder names it (`files/output.log`), so a citation reads the
same wherever the folder was imported from.
"""

from __future__ import annotations

from pathlib import Path

from tracker.environment.evidence import Fact, console, packages
from tracker.untrusted import textlines


def console_file(path: str | Path, label: str | None = None) -> list[Fact]:
    return console.read(textlines.lines(path), label or Path(path).name)


def package_file(path: str | Path, label: str | None = None) -> list[Fact]:
    return packages.read(textlines.lines(path), label or Path(path).name)
