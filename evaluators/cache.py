"""On-disk cache of the target's work: greedy or sampled continuations and tapped-layer features.

Evaluating 20 checkpoints of one run against the same target and prompts must cost one target
pass, not 20. Keys include the numbers-relevant part of the fingerprint (linear-attention path,
dtype, device kind, library versions), so features computed on the fast kernels are never
served to an eval on the torch fallback, or the other way round. Features are stored per layer,
so drafters tapping different layers share what they have in common, in the dtype the target
computed them (bf16 for a bf16 eval: half the disk of fp32, and exact).

Memory stays bounded by the largest prompt, not the number of prompts: a layer file's header
(every prompt's shape and offset) is written before any data, the target pass then writes each
prompt's features at its offset as soon as they exist, and an eval reads one prompt's slice at a
time with plain reads (no mmap, whose touched pages would count towards the process's RSS).
The files are ordinary safetensors files; entries written by earlier versions (one `save_file`
per layer, fp32) read the same way, and a file that does not parse is a miss, recomputed.

The fingerprint's probe and the rest of what only a loaded target can tell (its linear-attention
resolution) are cached too, by (target digest, environment): a warm eval never loads the target.
So is what checking the target's files concluded (its config, where its heads are stored, its stop
tokens), by (target digest, transformers version): a warm eval builds no model, not even on the
meta device, and imports no modeling code.

The cache is bounded: after every write, entries are evicted least recently used first until the
whole cache fits `DRAFTBOARD_CACHE_MAX_GB` (tracker/config.py). Reading an entry touches its
file's mtime, which is what "last use" means here (atime is unreliable on relatime/noatime
mounts). An entry is one continuations file or one features folder (every layer of one key).

Layout under the root, and the only paths the cache ever deletes (draftboard writes exactly these
names; anything else someone puts in the folder is neither counted nor removed):
    continuations/<key>.json        continuations/<key>.meta.json
    samples/<key>.json              samples/<key>.meta.json   (sampled continuations, with each token's p)
    fingerprints/<key>.json         fingerprints/<key>.meta.json
    checks/<key>.json               checks/<key>.meta.json
    features/<key>/layer_<i>.safetensors   features/<key>/meta.json
`<key>` is the 24 hex digits of `evaluators.target.cache_key`; the meta file names the target's
content digest, when the writer gave it.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tracker import config

CONTINUATIONS, SAMPLES, FINGERPRINTS, FEATURES = "continuations", "samples", "fingerprints", "features"
CHECKS = "checks"  # what reading a target's files concluded (evaluators.target.CheckedTarget)
_JSON_KINDS = (CONTINUATIONS, SAMPLES, FINGERPRINTS, CHECKS)  # one `<key>.json` per entry
_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
_ST_CODES = {dtype: code for code, dtype in _ST_DTYPES.items()}
META_SCHEMA = "draftboard.cache/1"
_KEY = re.compile(r"[0-9a-f]{24}")
_JSON_FILE = re.compile(r"([0-9a-f]{24})\.json")
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

    def _json_path(self, kind: str, key: str) -> Path:
        return self.root / kind / f"{key}.json"

    def _features_path(self, key: str, layer: int) -> Path:
        return self.root / FEATURES / key / f"layer_{layer}.safetensors"

    def _get_json(self, kind: str, key: str):
        path = self._json_path(kind, key)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:  # never written, or evicted by another process a moment ago
            return None
        except (OSError, ValueError):  # damaged: a miss, and the eval writes it again
            return None
        _touch(path)
        return data

    def _put_json(self, kind: str, key: str, value, target: str | None) -> None:
        path = self._json_path(kind, key)
        _atomic_write(path.with_name(f"{key}.meta.json"), lambda tmp: tmp.write_text(_meta(kind, target)))
        _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(value)))
        self.enforce_cap(keep=(kind, key))

    def get_continuations(self, key: str) -> list[list[int]] | None:
        return self._get_json(CONTINUATIONS, key)

    def put_continuations(self, key: str, continuations: list[list[int]], *, target: str | None = None) -> None:
        """target: the target's content digest, shown by `draftboard cache ls`."""
        self._put_json(CONTINUATIONS, key, continuations, target)

    def get_samples(self, key: str) -> list[tuple[list[int], list[float]]] | None:
        """Sampled continuations as (tokens, the probability each was drawn with); a file of any
        other shape is a miss (the eval draws them again and replaces it)."""
        data = self._get_json(SAMPLES, key)
        if not isinstance(data, list) or not all(
                isinstance(d, dict) and isinstance(d.get("tokens"), list) and isinstance(d.get("probs"), list)
                and len(d["tokens"]) == len(d["probs"]) and all(type(t) is int for t in d["tokens"])
                and all(isinstance(p, float) and 0.0 < p <= 1.0 for p in d["probs"]) for d in data):
            return None
        return [(d["tokens"], d["probs"]) for d in data]

    def put_samples(self, key: str, samples: list[tuple[list[int], list[float]]], *,
                    target: str | None = None) -> None:
        self._put_json(SAMPLES, key, [{"tokens": t, "probs": p} for t, p in samples], target)

    def get_fingerprint(self, key: str) -> dict | None:
        """What a loaded target told the fingerprint (harness: probe, linear-attention resolution)."""
        data = self._get_json(FINGERPRINTS, key)
        return data if isinstance(data, dict) else None

    def put_fingerprint(self, key: str, part: dict, *, target: str | None = None) -> None:
        self._put_json(FINGERPRINTS, key, part, target)

    def get_checks(self, key: str) -> dict | None:
        """A target's checked config, head locations and stop tokens (evaluators.target.check_target)."""
        data = self._get_json(CHECKS, key)
        return data if isinstance(data, dict) else None

    def put_checks(self, key: str, checked: dict, *, target: str | None = None) -> None:
        self._put_json(CHECKS, key, checked, target)

    def open_features(self, key: str, layer: int, n: int) -> "LayerFile | None":
        """One layer's features for n sequences, read a sequence at a time; None if not cached
        (or unreadable: a damaged or foreign file is recomputed and replaced)."""
        path = self._features_path(key, layer)
        try:
            layer_file = LayerFile(path)
        except (OSError, ValueError):
            return None
        if len(layer_file) != n:
            layer_file.close()
            return None
        _touch(path)
        return layer_file

    def feature_writer(self, key: str, lengths: list[int], hidden: int, layers: list[int],
                       *, target: str | None = None) -> "FeatureWriter":
        """A writer for `layers` of n sequences of `lengths` tokens; `FeatureWriter.write` one
        sequence at a time (any order), then `close` publishes every layer at once."""
        meta = self._features_path(key, 0).with_name(_FEATURES_META)
        if target is not None or not meta.is_file():  # a later layer without a digest keeps the recorded one
            _atomic_write(meta, lambda tmp: tmp.write_text(_meta(FEATURES, target)))
        return FeatureWriter(self, key, {i: self._features_path(key, i) for i in layers}, [(t, hidden) for t in lengths])

    def put_features(self, key: str, layer: int, features: list[torch.Tensor], *, target: str | None = None) -> None:
        """One layer of n sequences at once (a writer's shortcut: everything in memory already)."""
        hidden = features[0].shape[-1] if features else 0
        with self.feature_writer(key, [f.shape[0] for f in features], hidden, [layer], target=target) as w:
            for n, f in enumerate(features):
                w.write(n, {layer: f})

    # ------------------------------------------------------------------ size, listing, eviction

    def entries(self) -> list[CacheEntry]:
        """Every entry draftboard wrote, least recently used first."""
        found = []
        for kind in _JSON_KINDS:
            folder = self.root / kind
            for path in _files(folder):
                m = _JSON_FILE.fullmatch(path.name)
                if m:
                    found.append(_entry(kind, m[1], [path], folder / f"{m[1]}.meta.json", ()))
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


# ---------------------------------------------------------------------- streamed safetensors


class FeatureWriter:
    """Streams the layer files of one features entry, one sequence at a time.

    Every shape is known before the target pass starts, so each file's safetensors header (all
    offsets) is written first and a sequence's features go straight to their offset: nothing is
    held beyond the sequence being written. A layer's dtype is that of its first features (the
    target's). Files appear under their names only on `close`, when every sequence has been
    written; a failed pass leaves nothing behind.
    """

    def __init__(self, cache: EvalCache, key: str, paths: dict[int, Path], shapes: list[tuple[int, int]]):
        self.cache, self.key, self.paths, self.shapes = cache, key, paths, shapes
        self.streams: dict[int, _LayerStream] = {}
        self.written: set[int] = set()

    def write(self, n: int, features: dict[int, torch.Tensor]) -> None:
        """Sequence n's features, {layer: [T_n, H]} for every layer of this writer."""
        for layer, path in self.paths.items():
            f = features[layer]
            if layer not in self.streams:
                self.streams[layer] = _LayerStream(path, self.shapes, f.dtype)
            self.streams[layer].write(n, f)
        self.written.add(n)

    def close(self) -> None:
        complete = len(self.written) == len(self.shapes)
        for layer, stream in self.streams.items():
            stream.close(self.paths[layer] if complete else None)
        self.streams = {}
        if complete:
            self.cache.enforce_cap(keep=(FEATURES, self.key))

    def __enter__(self) -> "FeatureWriter":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.written.clear()  # an error mid-pass: publish nothing
        self.close()


class _LayerStream:
    """One layer file being written: header first, then each sequence at its offset."""

    def __init__(self, path: Path, shapes: list[tuple[int, int]], dtype: torch.dtype):
        if dtype not in _ST_CODES:
            raise ValueError(f"features of dtype {dtype} cannot be cached")
        self.shapes, self.dtype = shapes, dtype
        size = dtype.itemsize
        self.offsets, end = [], 0
        for t, h in shapes:
            self.offsets.append((end, end + t * h * size))
            end = self.offsets[-1][1]
        header = {f"s{n}": {"dtype": _ST_CODES[dtype], "shape": list(shape), "data_offsets": list(span)}
                  for n, (shape, span) in enumerate(zip(shapes, self.offsets))}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.base = 8 + len(blob)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self.fh = self.tmp.open("wb")
        self.fh.write(struct.pack("<Q", len(blob)) + blob)
        self.fh.truncate(self.base + end)

    def write(self, n: int, f: torch.Tensor) -> None:
        if tuple(f.shape) != self.shapes[n] or f.dtype != self.dtype:
            raise ValueError(f"sequence {n}: got {tuple(f.shape)} {f.dtype}, expected {self.shapes[n]} {self.dtype}")
        self.fh.seek(self.base + self.offsets[n][0])
        self.fh.write(memoryview(f.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()))

    def close(self, publish_as: Path | None) -> None:
        self.fh.close()
        if publish_as is not None:
            os.replace(self.tmp, publish_as)
        else:
            self.tmp.unlink(missing_ok=True)


class LayerFile:
    """One layer file of a features entry, read a sequence at a time (`read(n)`: [T_n, H])."""

    def __init__(self, path: Path):
        self.fh = path.open("rb")
        try:
            size = os.fstat(self.fh.fileno()).st_size
            (length,) = struct.unpack("<Q", self.fh.read(8))
            if length > size - 8:
                raise ValueError(f"{path}: header runs past the end of the file")
            header = json.loads(self.fh.read(length))
            header.pop("__metadata__", None)
            base, self.spans = 8 + length, []
            for n in range(len(header)):
                entry = header[f"s{n}"]  # KeyError: not a features file
                begin, end = entry["data_offsets"]
                dtype, shape = _ST_DTYPES[entry["dtype"]], tuple(entry["shape"])
                if end - begin != torch.Size(shape).numel() * dtype.itemsize \
                        or base + end > size:
                    raise ValueError(f"{path}: sequence {n} does not fit the file")
                self.spans.append((base + begin, end - begin, dtype, shape))
        except (KeyError, TypeError, ValueError, struct.error) as exc:
            self.fh.close()
            raise ValueError(f"{path}: not a features file ({exc!r})") from None

    def __len__(self) -> int:
        return len(self.spans)

    def read(self, n: int) -> torch.Tensor:
        start, nbytes, dtype, shape = self.spans[n]
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        self.fh.seek(start)
        buf = bytearray(nbytes)
        self.fh.readinto(buf)
        return torch.frombuffer(buf, dtype=dtype).reshape(shape)

    def close(self) -> None:
        self.fh.close()
