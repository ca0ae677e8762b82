"""The line protocol a job's subprocess uses to report progress and results to the worker.

A job writes ordinary log text on stdout; lines that start with `@@draftboard ` carry one
JSON object instead:

    @@draftboard {"event": "progress", "stage": "target", "done": 3, "total": 16}
    @@draftboard {"event": "result", "run_id": "<mlflow run id or null>", "out": "<path or null>"}

Only a job writes them: the launcher that starts it sets `DRAFTBOARD_JOB_EVENTS=1` (`ASKED`), so
a user's own `draftboard eval` or `doctor --json > file` gets its output and nothing of the worker's
channel. Standard library only, so the eval harness can import it without pulling in the queue.
"""

from __future__ import annotations

import json
import os
from typing import Any

PREFIX = "@@draftboard "
ASKED = "DRAFTBOARD_JOB_EVENTS"  # "1" in a job's environment: its launcher reads the protocol lines
PROGRESS = "progress"
RESULT = "result"


def emit(event: str, **fields: Any) -> None:
    """Print one protocol line on stdout, flushed at once so the worker sees it live; nothing unless
    a launcher asked for them."""
    if os.environ.get(ASKED) == "1":
        print(PREFIX + json.dumps({"event": event, **fields}), flush=True)


def parse_event(line: str) -> dict | None:
    """The event dict of a protocol line, or None for ordinary log text.

    A malformed protocol line is treated as log text too: a job must never fail because
    of how it reported progress.
    """
    text = line.strip()
    if not text.startswith(PREFIX):
        return None
    try:
        data = json.loads(text[len(PREFIX) :])
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        return None
    return data


def progress_fraction(event: dict) -> float | None:
    """done/total of a progress event, clamped to 0..1; None when the counts are unusable."""
    done, total = event.get("done"), event.get("total")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (done, total)):
        return None
    if total <= 0:
        return None
    return min(max(done / total, 0.0), 1.0)

