"""Lines of a text file another tool wrote (a console log, a package list), read as untrusted bytes.

Only a regular file is opened (a FIFO or a device named as a log would block or never end), without
blocking. Each line is read at most MAX_LINE_BYTES at a time: a longer one keeps its first
MAX_LINE_BYTES and the rest is skipped as it is read, so one 1 GiB line costs one bounded buffer and
time linear in the file. Bytes that are not UTF-8 are replaced, never fatal: a console holds whatever
a process wrote.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from tracker.errors import DraftboardError

MAX_LINE_BYTES = 64 * 1024  # a console line a tool prints is far shorter; past this it is data, not a message


def open_regular(path: str | Path):
    """A binary handle on `path`, refused (DraftboardError) unless it is a regular file."""
    file = Path(path)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DraftboardError(f"{file}: no such file") from None
    except OSError as exc:
        raise DraftboardError(f"{file}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DraftboardError(f"{file}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_small(path: str | Path, max_bytes: int) -> bytes | None:
    """A small file's bytes (a tracker's metadata, a model's config), read at most max_bytes + 1 from a regular
    file; None where it is not one, cannot be read, or is larger than max_bytes."""
    try:
        with open_regular(path) as fh:
            data = fh.read(max_bytes + 1)
    except (DraftboardError, OSError):
        return None
    return data if len(data) <= max_bytes else None


def lines(path: str | Path, max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str, bool]]:
    """(1-based line number, its text without the newline, whether it was cut at `max_line` bytes)."""
    reader = Lines(path, max_line=max_line, whole=True)
    yield from reader


class Lines:
    """The lines of a file from `start` (a byte offset, line `first_line`), as `lines` gives them; after
    iterating, `offset` and `next_line` say where to go on from. Unless `whole`, a last line without its
    newline is left for the next read (a log still being written)."""

    def __init__(self, path: str | Path, start: int = 0, first_line: int = 1, max_line: int = MAX_LINE_BYTES,
                 whole: bool = False):
        self.path, self.max_line, self.whole = path, max_line, whole
        self.offset, self.next_line = start, first_line

    def __iter__(self) -> Iterator[tuple[int, str, bool]]:
        with open_regular(self.path) as fh:
            fh.seek(self.offset)
            while True:
                raw = fh.readline(self.max_line)
                if not raw:
                    return
                cut = not raw.endswith(b"\n") and len(raw) == self.max_line
                ended = raw.endswith(b"\n")
                while cut:  # skip the rest of an overlong line, one bounded read at a time
                    rest = fh.readline(self.max_line)
                    ended = rest.endswith(b"\n")
                    if not rest or ended:
                        break
                if not ended and not self.whole:
                    return  # still being written: read it whole next time
                self.offset, number = fh.tell(), self.next_line
                self.next_line += 1
                yield number, raw.rstrip(b"\r\n").decode("utf-8", errors="replace"), cut
