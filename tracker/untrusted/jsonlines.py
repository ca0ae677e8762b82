"""JSON-lines records, parsed with an error message a user can act on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.untrusted import textlines


def json_object(text: str) -> dict:
    """The JSON object on one line; the caller prefixes the error with `file:line`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftboardError(f"malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise DraftboardError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


MAX_SMALL_JSON = 1 << 20  # a tracker's metadata or a model's config.json: a few KiB


def small_json(path: Path, max_bytes: int = MAX_SMALL_JSON) -> object:
    """The parsed value of a small JSON file someone else wrote; None where it is not a readable regular file
    of at most max_bytes, or not JSON."""
    data = textlines.read_small(path, max_bytes)
    try:
        return None if data is None else json.loads(data)
    except (ValueError, RecursionError):
        return None


def depth(value: object) -> int:
    """How deeply a parsed JSON value nests (a scalar: 0), counted without recursion: a caller that walks it
    recursively checks this first (900 levels parse, then overflow a recursive walk)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, level = pending.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def records(file: Path, max_bytes: int, what: str) -> Iterator[tuple[str, object]]:
    """(`file:line`, the parsed value) of each non-empty line, read one bounded line at a time: a line
    over max_bytes or not JSON is a DraftboardError naming it (`what`: the file a user should give)."""
    with file.open("rb") as handle:
        for number, line in enumerate(iter(lambda: handle.readline(max_bytes + 1), b""), 1):
            where = f"{file}:{number}"
            if len(line) > max_bytes:
                raise DraftboardError(f"{where}: line longer than {max_bytes} bytes")
            if not line.strip():
                continue
            try:
                yield where, json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise DraftboardError(f"{where}: not a JSON line ({what}?)") from None
