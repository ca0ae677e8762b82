"""On-disk cache of the target's work: greedy continuations and tapped-layer features.

Evaluating 20 checkpoints of one run against the same target and prompts must cost one target
pass, not 20. Keys include the numbers-relevant part of the fingerprint (linear-attention path,
dtype, device kind, library versions), so features computed on the fast kernels are never
served to an eval on the torch fallback, or the other way round. Features are stored per layer,
so drafters tapping different layers share what they have in common.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tracker import config


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file and rename: a crash never leaves half a cache entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


class EvalCache:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else config.cache_dir()

    def _continuations_path(self, key: str) -> Path:
        return self.root / "continuations" / f"{key}.json"

    def _features_path(self, key: str, layer: int) -> Path:
        return self.root / "features" / key / f"layer_{layer}.safetensors"

    def get_continuations(self, key: str) -> list[list[int]] | None:
        path = self._continuations_path(key)
        return json.loads(path.read_text()) if path.is_file() else None

    def put_continuations(self, key: str, continuations: list[list[int]]) -> None:
        _atomic_write(self._continuations_path(key), lambda tmp: tmp.write_text(json.dumps(continuations)))

    def get_features(self, key: str, layer: int, n: int) -> list[torch.Tensor] | None:
        """Features of one layer for n sequences ([T_i, H] each), or None if not cached."""
        path = self._features_path(key, layer)
        if not path.is_file():
            return None
        tensors = load_file(path)
        return [tensors[f"s{i}"] for i in range(n)]

    def put_features(self, key: str, layer: int, features: list[torch.Tensor]) -> None:
        tensors = {f"s{i}": f.contiguous() for i, f in enumerate(features)}
        _atomic_write(self._features_path(key, layer), lambda tmp: save_file(tensors, str(tmp)))
