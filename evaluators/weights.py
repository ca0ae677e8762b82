"""Weight files on disk: the files a model folder names, and tensor shapes without tensor data.

A model folder (a target, a z-lab drafter) names other files: a sharded index's weight_map, a
sidecar config, the weights themselves. Each must resolve inside the folder (no `../`, no
symlink out of it), so whoever checked the folder against the allowed roots has checked every
file read from it. Shapes come from safetensors headers (and `torch.load` onto the meta device),
so a config is checked against its weights before anything is allocated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tracker.errors import DraftboardError

Shapes = dict[str, tuple[int, ...]]

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
INDEX_SUFFIX = ".safetensors.index.json"


def one_line(e: BaseException) -> str:
    """`Type: message` on one line, at most 300 characters: the tail of an `error:` line."""
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text[:300]


def inside(folder: Path, name: str | Path, what: str) -> Path:
    """`folder / name`, resolved; refused when the name itself leaves `folder` (`..`, an absolute path).

    A name inside the folder may still be a symlink elsewhere: Hugging Face cache snapshots are
    folders of symlinks into `../../blobs`. Where the files may come from is the allowed roots'
    business, checked by the worker on every resolved file (tracker/jobs/eval_job.py).
    """
    base = os.path.normpath(os.path.abspath(folder))
    joined = os.path.normpath(os.path.join(base, name))
    if os.path.commonpath([base, joined]) != base:
        raise DraftboardError(
            f"{what} {str(name)!r} of {folder} points to {joined}, outside that folder: refused "
            "(files a model folder names must be inside it)"
        )
    return Path(joined).resolve()


def read_json(path: Path, what: str) -> dict:
    """A JSON object from `path`; a one-line DraftboardError otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DraftboardError(f"cannot read {what} {path}: {one_line(e)}") from None
    if not isinstance(data, dict):
        raise DraftboardError(f"{what} {path} is not a JSON object")
    return data


def safetensors_header(path: Path) -> tuple[Shapes, dict[str, str]]:
    """({tensor: shape}, metadata) from a safetensors header; no tensor data is read.

    safetensors checks that the header's offsets cover the file exactly, so a truncated file is
    refused here.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
            meta = fh.metadata() or {}
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise DraftboardError(
            f"cannot read {path}: truncated or corrupt safetensors file ({one_line(e)}); re-copy or re-save it"
        ) from None
    return shapes, meta


def read_safetensors(path: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """The tensors `keys` of a safetensors file whose header was already checked."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            return {k: fh.get_tensor(k) for k in keys}
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise DraftboardError(f"cannot read {path}: {one_line(e)}; re-copy or re-save it") from None


def index_shards(index_path: Path) -> dict[str, Path]:
    """{tensor: shard file} of a sharded checkpoint's index, every shard resolved inside its folder."""
    index = read_json(index_path, "weights index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise DraftboardError(f"{index_path}: empty or missing weight_map")
    files = {name: inside(index_path.parent, name, "shard") for name in set(map(str, weight_map.values()))}
    for name in sorted(files):
        if not files[name].is_file():  # a shard never copied is not a damaged file: say which one
            raise DraftboardError(f"missing: {name} (named by {index_path.name}) in {index_path.parent}")
    return {key: files[str(name)] for key, name in weight_map.items()}


def safetensors_shapes(files: list[Path]) -> tuple[Shapes, dict[str, Path]]:
    """({tensor: shape}, {tensor: file}) over the headers of several safetensors files."""
    shapes: Shapes = {}
    where: dict[str, Path] = {}
    for path in files:
        part, _ = safetensors_header(path)
        shapes.update(part)
        where.update(dict.fromkeys(part, path))
    return shapes, where
