"""On-disk cache of the target's work: greedy continuations and tapped-layer features.

Evaluating 20 checkpoints of one run against the same target and prompts must cost one target
pass, not 20. Keys include the numbers-relevant part of the fingerprint (linear-attention path,
dtype, device kind, library versions), so features computed on the fast kernels are never
served to an eval on the torch fallback, or the other way round. Features are stored per layer,
so drafters tapping different layers share what they have in common.

The cache is bounded: after every write, entries are evicted least recently used first until the
whole cache fits `DRAFTBOARD_CACHE_MAX_GB` (tracker/config.py). Reading an entry touches its
file's mtime, which is what "last use" means here (atime is unreliable on relatime/noatime
mounts). An entry is one continuations file or one features folder (every layer of one key).

Layout under the root, and the only paths the cache ever deletes (draftboard writes exactly these
names; anything else someone puts in the folder is neither counted nor removed):
    continuations/<key>.json        continuations/<key>.meta.json
    features/<key>/layer_<i>.safetensors   features/<key>/meta.json
`<key>` is the 24 hex digits of `evaluators.target.cache_key`; the meta file names the target's
content digest, when the writer gave it.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tracker import config

CONTINUATIONS, FEATURES = "continuations", "features"
META_SCHEMA = "draftboard.cache/1"
_KEY = re.compile(r"[0-9a-f]{24}")
_CONT_FILE = re.compile(r"([0-9a-f]{24})\.json")
_LAYER_FILE = re.compile(r"layer_(\d+)\.safetensors")
_FEATURES_META = "meta.json"


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary file and rename: a crash never leaves half a cache entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


@dataclass(frozen=True)
class CacheEntry:
    """One evictable unit of the cache, as `draftboard cache ls` lists it."""

    kind: str  # CONTINUATIONS or FEATURES
    key: str
    target: str | None  # the target's content digest; None when the writer did not record it
    size: int  # bytes, the meta file included
    last_used: float  # unix time of the last read or write
    layers: tuple[int, ...]  # features: the cached layers; () for continuations
    files: tuple[Path, ...]  # exactly the files draftboard wrote for this entry


class EvalCache:
    def __init__(self, root: str | Path | None = None, max_bytes: int | None = None):
        """max_bytes: the size cap; None reads DRAFTBOARD_CACHE_MAX_GB (tracker/config.py)."""
        self.root = Path(root) if root is not None else config.cache_dir()
        self.max_bytes = config.cache_max_bytes() if max_bytes is None else max_bytes

    def _continuations_path(self, key: str) -> Path:
        return self.root / CONTINUATIONS / f"{key}.json"

    def _features_path(self, key: str, layer: int) -> Path:
        return self.root / FEATURES / key / f"layer_{layer}.safetensors"

    def get_continuations(self, key: str) -> list[list[int]] | None:
        path = self._continuations_path(key)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:  # never written, or evicted by another process a moment ago
            return None
        _touch(path)
        return data

    def put_continuations(self, key: str, continuations: list[list[int]], *, target: str | None = None) -> None:
        """target: the target's content digest, shown by `draftboard cache ls`."""
        path = self._continuations_path(key)
        _atomic_write(path.with_name(f"{key}.meta.json"), lambda tmp: tmp.write_text(_meta(CONTINUATIONS, target)))
        _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(continuations)))
        self.enforce_cap(keep=(CONTINUATIONS, key))

    def get_features(self, key: str, layer: int, n: int) -> list[torch.Tensor] | None:
        """Features of one layer for n sequences ([T_i, H] each), or None if not cached."""
        path = self._features_path(key, layer)
        try:
            tensors = load_file(path)
        except FileNotFoundError:
            return None
        _touch(path)
        return [tensors[f"s{i}"] for i in range(n)]

    def put_features(self, key: str, layer: int, features: list[torch.Tensor], *, target: str | None = None) -> None:
        tensors = {f"s{i}": f.contiguous() for i, f in enumerate(features)}
        path = self._features_path(key, layer)
        meta = path.with_name(_FEATURES_META)
        if target is not None or not meta.is_file():  # a later layer without a digest keeps the recorded one
            _atomic_write(meta, lambda tmp: tmp.write_text(_meta(FEATURES, target)))
        _atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))
        self.enforce_cap(keep=(FEATURES, key))

    # ------------------------------------------------------------------ size, listing, eviction

    def entries(self) -> list[CacheEntry]:
        """Every entry draftboard wrote, least recently used first."""
        found = []
        cont = self.root / CONTINUATIONS
        for path in _files(cont):
            m = _CONT_FILE.fullmatch(path.name)
            if m:
                meta = cont / f"{m[1]}.meta.json"
                found.append(_entry(CONTINUATIONS, m[1], [path], meta, ()))
        for folder in _dirs(self.root / FEATURES):
            if not _KEY.fullmatch(folder.name):
                continue
            layers = sorted((int(m[1]), p) for p in _files(folder) if (m := _LAYER_FILE.fullmatch(p.name)))
            if layers:
                found.append(_entry(FEATURES, folder.name, [p for _, p in layers], folder / _FEATURES_META,
                                    tuple(i for i, _ in layers)))
        return sorted(found, key=lambda e: (e.last_used, e.kind, e.key))

    def size(self) -> int:
        """Bytes held by the entries draftboard wrote."""
        return sum(e.size for e in self.entries())

    def prune(self, max_bytes: int | None = None, keep: tuple[str, str] | None = None) -> list[CacheEntry]:
        """Remove entries, least recently used first, until the cache holds at most max_bytes.

        max_bytes None: the cap (self.max_bytes); 0 removes every entry. keep: (kind, key) of an
        entry never removed (the one just written, which its eval is about to use). Returns what
        was removed.
        """
        limit = self.max_bytes if max_bytes is None else max_bytes
        entries = self.entries()
        total = sum(e.size for e in entries)
        removed = []
        for entry in entries:
            if total <= limit:
                break
            if (entry.kind, entry.key) == keep:
                continue
            _remove(entry)
            total -= entry.size
            removed.append(entry)
        return removed

    def enforce_cap(self, keep: tuple[str, str] | None = None) -> list[CacheEntry]:
        return self.prune(None, keep=keep)


def _meta(kind: str, target: str | None) -> str:
    return json.dumps({"schema": META_SCHEMA, "kind": kind, "target": target, "written": time.time()})


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # evicted meanwhile, or a read-only cache: the read itself succeeded
        pass


def _files(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_file() and not p.is_symlink()]
    except OSError:
        return []


def _dirs(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


def _entry(kind: str, key: str, data: list[Path], meta: Path, layers: tuple[int, ...]) -> CacheEntry:
    files = [*data, meta] if meta.is_file() and not meta.is_symlink() else data
    size, last_used, target = 0, 0.0, None
    for path in files:
        try:
            st = path.stat()
        except OSError:  # removed by a concurrent prune
            continue
        size += st.st_size
        if path != meta:
            last_used = max(last_used, st.st_mtime)
    if len(files) > len(data):
        try:
            target = json.loads(meta.read_text()).get("target")
        except (OSError, ValueError, AttributeError):
            target = None
    return CacheEntry(kind, key, target if isinstance(target, str) else None, size, last_used, layers, tuple(files))


def _remove(entry: CacheEntry) -> None:
    for path in entry.files:
        path.unlink(missing_ok=True)
    if entry.kind == FEATURES:
        try:
            entry.files[0].parent.rmdir()  # only when empty: a file someone else put there stays
        except OSError:
            pass
