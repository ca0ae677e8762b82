"""What every command family of the CLI shares: its exit statuses and limits, a stage progress
printer, plain-text tables and JSON-valued flags."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tracker.errors import DraftboardError

EXIT_BAD_INPUT = 2
EXIT_CRITICAL_DIFF = 1
ENV_DIFF_MAX = 4  # fingerprints one env-diff compares (training, offline eval, serving and one more)


class StageProgress:
    """tqdm bars for people, `@@draftboard` event lines for the job queue."""

    def __init__(self):
        self.bar, self.stage = None, None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        from tracker.events import emit

        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=stage, unit="item", file=sys.stderr)
        self.bar.n = done
        self.bar.refresh()
        emit("progress", stage=stage, done=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_table(header: list[str], rows: list[tuple], width: int = 60) -> str:
    def cell(value) -> str:
        text = "unknown" if value is None else str(value)
        return text if len(text) <= width else text[: width - 1] + "…"

    table = [list(map(cell, header))] + [list(map(cell, r)) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def port_number(text: str) -> int:
    """argparse's `type` for a TCP port: 1..65535 in ASCII digits, else argparse's one error line."""
    import argparse

    from tracker.untrusted.digits import whole_number

    port = whole_number(text, 5)
    if port is None or not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a TCP port (1-65535)")
    return port


def json_argument(flag: str, text: str):
    """A flag's JSON value: the JSON itself (starting with `{`), or a file holding it."""
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise DraftboardError(f"{flag}: cannot read {text}: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftboardError(f"{flag} is not JSON: {exc}") from exc


def write_whole(out: Path, text: str) -> None:
    """A command's `--out` file, whole or not at all: written as a new file beside it (never opening one
    this process did not create), renamed over `out` once complete; on a failed write only that new file
    is removed, and the error is one line."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fh = open(tmp, "x", encoding="utf-8")
    except OSError as e:
        raise DraftboardError(f"cannot write --out {out}: {e.strerror or e}") from None
    try:
        with fh:
            fh.write(text)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)  # the file opened above with "x": this process made it
        raise DraftboardError(f"cannot write --out {out}: {e.strerror or e}") from None
