"""Records of a LevelDB-layout log file (W&B's `run-<id>.wandb`), read as untrusted bytes.

The layout (LevelDB's log format, as wandb writes it; measured on wandb 0.31.0 in
../shared/research/trackers-2026-12-07.md): a 7-byte file header (4-byte magic, 2-byte
little-endian ident, 1-byte version), then 32 KiB blocks counted from the file's start. Each
block holds chunks, each a 7-byte header `<uint32 crc, uint16 length, uint8 type>` and
`length` bytes; a block's last 1-6 bytes, too few for a header, are zero padding. Type 1 is
a whole record, 2/3/4 the first, middle and last pieces of one that spans chunks. The CRC is
zlib's CRC-32 of the data, seeded with the CRC-32 of the type byte.

Read in one pass over the file, one block in memory, each record bounded (MAX_RECORD_BYTES)
before it is assembled: time is linear in the file, memory in the largest record. A damaged
file (a bad CRC, a chunk past its block, a record past the bound) or a truncated one (a
process killed mid-write) ends the records there; `LogRecords.stopped` says where and why,
so a caller imports what came before and states the partial read.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from tracker.errors import DraftboardError

BLOCK = 32 * 1024
HEADER = 7  # both the file header and each chunk header
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
MAX_RECORD_BYTES = 16 << 20  # wandb splits big values into files; a larger record is damage, not data
_TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}


class LogRecords:
    """The records of one log file, iterated once; `stopped` is None after a whole read, else the
    reason reading ended early (`offset N: ...`)."""

    def __init__(self, path: str | Path, magic: bytes, ident: int, max_record: int = MAX_RECORD_BYTES):
        self.path = Path(path)
        self.magic, self.ident, self.max_record = magic, ident, max_record
        self.stopped: str | None = None

    def __iter__(self) -> Iterator[bytes]:
        try:
            fh = open(self.path, "rb")
        except OSError as exc:
            raise DraftboardError(f"{self.path}: cannot read ({exc.strerror or exc})") from None
        with fh:
            header = fh.read(HEADER)
            magic, ident, _version = (struct.unpack("<4sHB", header) if len(header) == HEADER else (b"", 0, 0))
            if magic != self.magic or ident != self.ident:
                raise DraftboardError(f"{self.path}: not a {self.magic.decode(errors='replace')} log "
                                      f"(its first bytes are not the {self.magic!r} header)")
            yield from self._records(header + fh.read(BLOCK - HEADER), fh)

    def _records(self, block: bytes, fh) -> Iterator[bytes]:
        pieces: list[bytes] = []
        size, base, pos = 0, 0, HEADER  # base: the block's offset in the file
        while block:
            while len(block) - pos >= HEADER:
                crc, length, kind = struct.unpack_from("<IHB", block, pos)
                at = base + pos
                if crc == 0 and length == 0 and kind == 0:  # zeroed rest of a block: nothing more was written
                    pos = len(block)
                    break
                if pos + HEADER + length > len(block):
                    self.stopped = (f"offset {at}: a chunk of {length} bytes runs past its block"
                                    + (" (the file ends there: truncated mid-write)" if len(block) < BLOCK else ""))
                    return
                data = block[pos + HEADER:pos + HEADER + length]
                if kind not in _TYPE_CRC or zlib.crc32(data, _TYPE_CRC[kind]) != crc:
                    self.stopped = f"offset {at}: bad checksum or chunk type {kind} (damaged)"
                    return
                pos += HEADER + length
                if (kind in (FULL, FIRST)) == bool(pieces):
                    self.stopped = f"offset {at}: a record's pieces out of order (damaged)"
                    return
                size += length
                if size > self.max_record:
                    self.stopped = f"offset {at}: a record over {self.max_record} bytes (damaged)"
                    return
                pieces.append(data)
                if kind in (FULL, LAST):
                    yield b"".join(pieces)
                    pieces, size = [], 0
            if any(block[pos:]):
                self.stopped = f"offset {base + pos}: {len(block) - pos} bytes too few for a chunk (truncated mid-write)"
                return
            if len(block) < BLOCK:
                break
            base, pos, block = base + BLOCK, 0, fh.read(BLOCK)
        if pieces:
            self.stopped = "the last record is incomplete (the file was truncated mid-write)"
