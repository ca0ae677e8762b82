"""Import a training log written by another tool as a draftboard training run.

Two formats, recognised by the first non-blank line:

- JSON lines (`jsonl`): one object per line, e.g. `{"step": 10, "loss": 2.3, "streak": 1.1}`.
  Every line must be an object with an integer `step`. Numeric fields become
  metrics; other fields (strings, booleans, null, lists, objects) are ignored.
- key=value text (`kv`): lines such as `step=10 loss=2.31 acc=0.4 lr=1e-4`, pairs
  separated by spaces, commas or semicolons; other words on the line (timestamps,
  log levels) are ignored, as are pairs whose value is not a number. Lines
  without a `step=` pair (banners, warnings) are skipped and counted.

The imported run's fingerprint is `tracker.fingerprint.imported(...)`: the log does
not say where it was produced, so every environment field stays unknown.

The file is read line by line, twice: a first pass checks every line before anything is
written (a malformed log creates no run), the second streams the steps into the run with a
bounded buffer, so memory does not grow with the log. An interruption of the second pass
(Ctrl-C, SIGTERM, a store error) ends the run FAILED holding every step read before it.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.jsonlines import json_object
from tracker.store import names
from tracker.store.steps import MetricChecker

_PAIR = re.compile(r"(?<![\w.\-/])([A-Za-z_][\w.\-/]*)=([^\s,;]+)")
MAX_LINE_CHARS = 1 << 20  # bytes; a longer "line" is not a training log (and would defeat streaming)
MAX_PENDING_STEPS = 2000  # read but not yet sent: about 1 MB for any log; all a Ctrl-C waits for


@dataclass(frozen=True)
class StepRecord:
    """Metrics of one step, with the 1-based line of the log they came from."""

    step: int
    metrics: dict[str, float]
    line: int


@dataclass(frozen=True)
class LogSummary:
    """What the checking pass found: the import's params, known before the run starts."""

    path: str
    format: str  # "jsonl" or "kv"
    records: int
    skipped_lines: int  # non-blank kv lines without a step


def scan_log(path: str | Path) -> LogSummary:
    """Check every line of a log; DraftboardError naming `file:line` for anything malformed."""
    file = Path(path)
    fmt = _format(file)
    records = skipped = 0
    for record in _records(file, fmt):
        if record is None:
            skipped += 1
        else:
            records += 1
    if not records:
        raise DraftboardError(
            f"{file}: no step records found; expected JSON lines with a \"step\" field "
            "or lines like `step=10 loss=2.3`"
        )
    return LogSummary(str(file), fmt, records, skipped)


def _lines(file: Path) -> Iterator[tuple[int, str]]:
    """(line number, stripped text) of the non-blank lines, one at a time.

    Read as bytes and decoded per line, so a bad byte is reported at its own line (a text
    stream decodes ahead, by blocks).
    """
    try:
        with open(file, "rb") as fh:
            for number, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_CHARS + 1), b""), start=1):
                if len(raw) > MAX_LINE_CHARS:
                    raise DraftboardError(f"{file}:{number}: line longer than {MAX_LINE_CHARS} bytes")
                try:
                    text = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise DraftboardError(f"{file}:{number}: not a UTF-8 text log ({exc.reason})") from None
                if text:
                    yield number, text
    except FileNotFoundError:
        raise DraftboardError(f"{file}: no such log file") from None
    except IsADirectoryError:
        raise DraftboardError(f"{file}: is a directory, not a log file") from None


def _format(file: Path) -> str:
    first = next(_lines(file), (0, ""))[1]
    return "jsonl" if first.startswith("{") else "kv"


def _records(file: Path, fmt: str) -> Iterator[StepRecord | None]:
    """The log's step records in file order; None for a skipped line (kv without a step)."""
    parse_line = _jsonl_line if fmt == "jsonl" else _kv_line
    checker = MetricChecker()
    for number, text in _lines(file):
        try:
            record = parse_line(text, number)
            if record is not None:
                checker.check(record.metrics)
        except DraftboardError as exc:
            raise DraftboardError(f"{file}:{number}: {exc}") from None
        yield record


def _jsonl_line(text: str, number: int) -> StepRecord:
    obj = json_object(text)
    if "step" not in obj:
        raise DraftboardError('no "step" field; every JSON line needs one')
    step = _step(obj["step"])
    metrics = {
        key: float(value)
        for key, value in obj.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }
    return StepRecord(step, metrics, number)


def _kv_line(text: str, number: int) -> StepRecord | None:
    pairs = dict(_PAIR.findall(text))
    if "step" not in pairs:
        return None
    metrics = {}
    for key, value in pairs.items():
        if key == "step":
            continue
        try:
            metrics[key] = float(value)
        except ValueError:
            continue  # a non-numeric value (a name, a path): not a metric
    return StepRecord(_step(pairs["step"]), metrics, number)


def _step(value: object) -> int:
    """An integer step >= 0 from a JSON number or text; 10.0 is accepted, 10.5 is not."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or value != int(value)
    ):
        raise DraftboardError(f"step must be an integer >= 0, got {value!r}")
    return int(value)


def import_log(tracker, path: str | Path, name: str, target: str | None = None) -> str:
    """Log the steps of a training log as a new train run of `tracker`; returns its run id."""
    from tracker import fingerprint

    summary = scan_log(path)
    params = {
        "import.source": str(Path(summary.path).resolve()),
        "import.format": summary.format,
        "import.records": summary.records,
        "import.skipped_lines": summary.skipped_lines,
    }
    with _sigterm_as_interrupt(), tracker.training_run(
        name,
        params,
        target,
        tags={names.IMPORTED: "1"},
        fingerprint=fingerprint.imported(summary.path, summary.format),
        max_pending_steps=MAX_PENDING_STEPS,
    ) as run:
        for record in _records(Path(summary.path), summary.format):
            if record is not None:
                run.log_step(record.step, **record.metrics)
    return run.run_id


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile, so `kill` also ends the run FAILED, not RUNNING."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
