"""Checkpoint records: what was saved at which step, and a digest that identifies its content.

An eval run names the checkpoint it evaluated; the digest lets anyone check later
that the files on the eval box are the ones the training run wrote, even after
they were copied elsewhere. Each record is stored as the run artifact
`checkpoints/step_<N>.json` (written at once, so it survives a crash of the
trainer) and the run tag `draftboard.checkpoints` counts them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.store import names

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Checkpoint:
    """A saved checkpoint: absolute path, total size, sha256 content digest (see `digest`)."""

    step: int
    path: str
    size_bytes: int
    sha256: str

    @property
    def artifact_file(self) -> str:
        return names.checkpoint_artifact(self.step)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> "Checkpoint":
        """The record as written by `to_dict`; DraftboardError naming the first bad field.

        Strict on purpose: `int("7")` or `int(7.5)` would turn a damaged record into a
        checkpoint at a step nobody saved.
        """
        if not isinstance(data, dict):
            raise DraftboardError(f"expected a JSON object, got {type(data).__name__}")
        for key, kind in (("step", int), ("path", str), ("size_bytes", int), ("sha256", str)):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, kind) or (kind is int and value < 0):
                raise DraftboardError(f"field {key!r} must be {'an integer >= 0' if kind is int else 'a string'}, "
                                      f"got {value!r:.60}")
        return cls(step=data["step"], path=data["path"], size_bytes=data["size_bytes"], sha256=data["sha256"])


def describe(path: str | Path, step: int) -> Checkpoint:
    """Size and digest of a checkpoint file or directory; DraftboardError if it does not exist."""
    root = Path(path).expanduser().resolve()
    if not root.exists():
        raise DraftboardError(f"checkpoint {path} does not exist; save it before logging it")
    size, sha = digest(root)
    return Checkpoint(step=step, path=str(root), size_bytes=size, sha256=sha)


def digest(root: Path) -> tuple[int, str]:
    """(total bytes, sha256) of a file, or of every file under a directory.

    A file's digest is the sha256 of its bytes (what `sha256sum` prints). A
    directory's digest covers, for each file in sorted relative-path order, the
    relative POSIX path, a NUL byte, the file size as decimal text, a NUL byte and
    the content, so renaming or moving a file inside the checkpoint changes it too.
    """
    sha = hashlib.sha256()
    if root.is_file():
        return _feed(sha, root), sha.hexdigest()
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())
    total = 0
    for file in files:
        size = file.stat().st_size
        sha.update(f"{file.relative_to(root).as_posix()}\0{size}\0".encode())
        total += _feed(sha, file)
    return total, sha.hexdigest()


def _feed(sha: "hashlib._Hash", file: Path) -> int:
    size = 0
    with open(file, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size


@dataclass(frozen=True)
class HubOrigin:
    """The hub repository and commit a drafter folder was downloaded from."""

    repo: str  # `z-lab/Qwen3.5-27B-DFlash`
    revision: str  # the 40-hex commit


_COMMIT = re.compile(r"[0-9a-f]{40}")
_CACHE_REPO = re.compile(r"models--([^/]+?)--([^/]+)")


def hub_origin(path: str | Path) -> HubOrigin | None:
    """Where a drafter folder came from, read from the hub cache's layout (`hf download REPO` without
    `--local-dir`, huggingface_hub's `repo_folder_name`): `models--ORG--NAME/snapshots/COMMIT/`. None for
    any other folder (a local checkpoint: its digest identifies it)."""
    parts = Path(path).expanduser().resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and _COMMIT.fullmatch(parts[-1]):
        cached = _CACHE_REPO.fullmatch(parts[-3])
        if cached:
            return HubOrigin(f"{cached.group(1)}/{cached.group(2)}", parts[-1])
    return None
