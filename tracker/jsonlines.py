"""One JSON-lines record, parsed with an error message a user can act on."""

from __future__ import annotations

import json

from tracker.errors import DraftboardError


def json_object(text: str) -> dict:
    """The JSON object on one line; the caller prefixes the error with `file:line`."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftboardError(f"malformed JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise DraftboardError(f"expected a JSON object, got {type(obj).__name__}")
    return obj
