"""A GGUF file's metadata fields, read by a bounded reader of draftboard's own: doctor reads one field of
a file anyone may hand it, and llama.cpp's `gguf.GGUFReader` builds one numpy view per array element
(a 2 MB drafter GGUF with one 2M-element array took 50 s and 1.6 GB).

The layout, as gguf-py writes and reads it (`gguf/constants.py`, `gguf/gguf_reader.py` of llama.cpp's
tree): `GGUF`, a uint32 version (2 or 3), uint64 tensor and field counts, then each field: its key (a
uint64 length + UTF-8 bytes), a uint32 value type and the value; a string is a length + bytes, an array
an item type + a uint64 count + the items. The byte order is gguf's rule: a version whose low 16 bits
read little-endian are zero is a big-endian file, and every number after it is big-endian too.

Bounds, each checked before anything is read or kept for it: at most MAX_METADATA_BYTES of the file
are read (once); the field and tensor counts; every length and count against the bytes left, so a
claimed 2^56 fields or a 2^60-element array ends at the end of those bytes; kept values (the fields
asked for) at most MAX_KEPT_ITEMS items. Skipping a string array walks its lengths, each at least 8
bytes: linear in the bytes read.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.untrusted import textlines

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_METADATA_BYTES = 64 << 20  # a drafter GGUF's metadata holds the target's vocabulary: a few MiB
MAX_FIELDS = 4096
MAX_TENSORS = 1 << 20
MAX_KEPT_ITEMS = 4096
MAX_KEPT_STRING = 1 << 16
MAX_NESTING = 3
STRING, ARRAY = 8, 9
# GGUFValueType -> struct format of one item
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Cursor:
    def __init__(self, data: bytes, order: str, where: str):
        self.data, self.order, self.where, self.at = data, order, where, 0

    def _need(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.data):
            cut = " (or its metadata is over the size read)" if len(self.data) == MAX_METADATA_BYTES else ""
            raise DraftboardError(f"{self.where}: truncated GGUF metadata at byte {self.at}{cut}")

    def number(self, fmt: str):
        size = struct.calcsize(fmt)
        self._need(size)
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.at)
        self.at += size
        return value

    def skip(self, n: int) -> None:
        self._need(n)
        self.at += n

    def string(self, limit: int) -> str:
        n = self.number("Q")
        if n > limit:
            raise DraftboardError(f"{self.where}: a GGUF string of {n} bytes at byte {self.at} (at most {limit})")
        self._need(n)
        text = self.data[self.at:self.at + n].decode("utf-8", errors="replace")
        self.at += n
        return text


def _value(c: _Cursor, kind: int, keep: bool, depth: int = 0):
    """The value of type `kind` at the cursor; None (skipped) unless `keep`."""
    if kind in SCALARS:
        value = c.number(SCALARS[kind])
        return value if keep else None
    if kind == STRING:
        if keep:
            return c.string(MAX_KEPT_STRING)
        c.skip(c.number("Q"))
        return None
    if kind != ARRAY:
        raise DraftboardError(f"{c.where}: unknown GGUF value type {kind} at byte {c.at}")
    if depth >= MAX_NESTING:
        raise DraftboardError(f"{c.where}: GGUF arrays nested deeper than {MAX_NESTING}")
    item, count = c.number("I"), c.number("Q")
    if keep and item == ARRAY:  # a kept field is a flat list: nested ones are refused before anything is built
        raise DraftboardError(f"{c.where}: a kept GGUF array must be a flat list of numbers or strings, not of arrays")
    if keep and count > MAX_KEPT_ITEMS:
        raise DraftboardError(f"{c.where}: a GGUF array of {count} items where at most {MAX_KEPT_ITEMS} were expected")
    if not keep and item in SCALARS:
        c.skip(count * struct.calcsize(SCALARS[item]))  # bounded by the bytes left, not allocated
        return None
    values = []
    for _ in range(count):  # each item takes at least one byte: the loop ends with the bytes read
        values.append(_value(c, item, keep, depth + 1))
    return values if keep else None


def read_fields(path: str | Path, wanted: Callable[[str], bool]) -> dict[str, object]:
    """{key: value} of the metadata fields whose key `wanted` accepts (ints, floats, bools, strings,
    lists of them); a one-line DraftboardError for a file that is not a GGUF within the bounds."""
    where = str(path)
    try:
        with textlines.open_regular(path) as f:  # a FIFO named as the drafter GGUF (`-md`) must not hang doctor
            data = f.read(min(os.fstat(f.fileno()).st_size, MAX_METADATA_BYTES))  # read(n) allocates n first
    except OSError as exc:
        raise DraftboardError(f"{where}: cannot read ({exc.strerror})") from None
    if len(data) < 24 or data[:4] != MAGIC:
        raise DraftboardError(f"{where}: not a GGUF file")
    order = ">" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF == 0 else "<"
    c = _Cursor(data, order, where)
    c.skip(4)
    version = c.number("I")
    if version not in VERSIONS:
        raise DraftboardError(f"{where}: GGUF version {version} (draftboard reads {', '.join(map(str, VERSIONS))})")
    tensors, count = c.number("Q"), c.number("Q")
    if tensors > MAX_TENSORS or count > MAX_FIELDS:
        raise DraftboardError(f"{where}: {tensors} tensors / {count} metadata fields is not a model GGUF")
    fields: dict[str, object] = {}
    for _ in range(count):
        key = c.string(MAX_KEPT_STRING)
        kind = c.number("I")
        keep = wanted(key)
        value = _value(c, kind, keep)
        if keep:
            fields[key] = value
    return fields
