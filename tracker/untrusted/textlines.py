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


def lines(path: str | Path, max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str, bool]]:
    """(1-based line number, its text without the newline, whether it was cut at `max_line` bytes)."""
    with open_regular(path) as fh:
        number = 0
        while True:
            raw = fh.readline(max_line)
            if not raw:
                return
            number += 1
            cut = not raw.endswith(b"\n") and len(raw) == max_line
            while cut:  # skip the rest of an overlong line, one bounded read at a time
                rest = fh.readline(max_line)
                if not rest or rest.endswith(b"\n"):
                    break
            yield number, raw.rstrip(b"\r\n").decode("utf-8", errors="replace"), cut
