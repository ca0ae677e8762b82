"""The box's GPUs as a local worker's slots: which GPUs each job holds (issue 63).

The worker knows the box's GPUs (`draftboard worker --gpus 0,1,2,3`, else DRAFTBOARD_GPUS, else the worker's
own CUDA_VISIBLE_DEVICES; none of them: jobs are not pinned, as before). A job holds `needed(job)` of them, its
own: the child's CUDA_VISIBLE_DEVICES names exactly those (an empty one for a job that holds none, so a CPU job
never touches a GPU). A job waits, first in first served, until its GPUs are free; a job that asks for more than
the worker has fails at claim in one line. No two jobs share a GPU.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence

from tracker.config import MAX_GPUS
from tracker.errors import DraftboardError

ENV = "CUDA_VISIBLE_DEVICES"  # what a job's process is told (CUDA reads it once, at its first use)
DECLARED_VAR = "DRAFTBOARD_GPUS"
# A GPU as CUDA_VISIBLE_DEVICES names one: its index, or its UUID (GPU-..., MIG-...).
_ID = re.compile(r"[0-9]{1,3}|(?:GPU|MIG)-[0-9A-Za-z-]{1,80}")


def parse(text: str, where: str = "--gpus") -> tuple[str, ...]:
    """`0,1,2,3` (or UUIDs) as a tuple of ids; DraftboardError in one line for anything else."""
    ids = [part.strip() for part in text.split(",")] if text.strip() else []
    bad = next((i for i in ids if not _ID.fullmatch(i)), None)
    if bad is not None:
        raise DraftboardError(f"{where}: {bad[:40]!r} is not a GPU index or UUID (e.g. 0,1,2,3)")
    if len(set(ids)) != len(ids):
        raise DraftboardError(f"{where}: a GPU is named twice in {text[:200]!r}")
    if len(ids) > MAX_GPUS:
        raise DraftboardError(f"{where}: at most {MAX_GPUS} GPUs, got {len(ids)}")
    return tuple(ids)


def box_gpus(declared: str | None, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPUs a worker hands out: `declared` (--gpus), else DRAFTBOARD_GPUS, else its CUDA_VISIBLE_DEVICES;
    None: none of them set (jobs are not pinned)."""
    for text, where in ((declared, "--gpus"), (env.get(DECLARED_VAR), DECLARED_VAR), (env.get(ENV), ENV)):
        if text is not None:
            return parse(text, where)
    return None


MEMORY_VAR = "DRAFTBOARD_GPU_MEMORY"
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}
_MEMORY = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?) ?([A-Za-z]{0,3})")


def memory_bytes(text: str, where: str = "--gpu-memory") -> int:
    """`80GiB`, `40 GB`, `81559MiB` or a byte count as bytes; DraftboardError in one line for anything else."""
    found = _MEMORY.fullmatch(text.strip())
    unit = found and _UNITS.get(found.group(2).lower())
    if not found or unit is None or float(found.group(1)) * unit < 2**20:
        raise DraftboardError(f"{where}: {text[:40]!r} is not a GPU's memory (e.g. 80GiB, 40GB, 81559MiB)")
    return int(float(found.group(1)) * unit)


def shards(params: Mapping) -> int:
    """How many shard processes a job's eval runs as (evaluators.shards; 1: one process)."""
    return max(1, int(params.get("shards") or 1))


def needed(params: Mapping) -> int:
    """The GPUs a job holds: its `gpus` param, else one for a job that may run on a GPU (one per shard of a sharded
    eval) and none on the CPU."""
    asked = params.get("gpus")
    if asked is not None:
        return int(asked)
    return 0 if params.get("device") == "cpu" else shards(params)


class Pool:
    """GPUs free and held; safe to share between the worker's threads."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = tuple(ids)
        self._free = list(ids)
        self._lock = threading.Lock()

    def take(self, n: int) -> tuple[str, ...] | None:
        """`n` free GPUs (the lowest listed first), now held; None while fewer are free."""
        with self._lock:
            if n > len(self._free):
                return None
            held, self._free = tuple(self._free[:n]), self._free[n:]
            return held

    def give(self, held: Sequence[str]) -> None:
        """GPUs a job held, free again (in the box's order)."""
        with self._lock:
            back = set(self._free) | set(held)
            self._free = [i for i in self.ids if i in back]

    @property
    def free(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._free)
