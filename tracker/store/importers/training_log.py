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
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.jsonlines import json_object
from tracker.store.runs import IMPORTED
from tracker.store.steps import MetricChecker

_PAIR = re.compile(r"(?<![\w.\-/])([A-Za-z_][\w.\-/]*)=([^\s,;]+)")


@dataclass(frozen=True)
class StepRecord:
    """Metrics of one step, with the 1-based line of the log they came from."""

    step: int
    metrics: dict[str, float]
    line: int


@dataclass(frozen=True)
class ParsedLog:
    path: str
    format: str  # "jsonl" or "kv"
    records: list[StepRecord]
    skipped_lines: int  # non-blank kv lines without a step


def parse_log(path: str | Path) -> list[StepRecord]:
    """The step records of a JSON-lines or key=value log, in file order."""
    return read_log(path).records


def read_log(path: str | Path) -> ParsedLog:
    """Parse a log; DraftboardError naming `file:line` for anything malformed."""
    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such log file")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DraftboardError(f"{file}: not a UTF-8 text log ({exc.reason} at byte {exc.start})") from exc
    numbered = [(n, text.strip()) for n, text in enumerate(lines, start=1) if text.strip()]
    fmt = "jsonl" if numbered and numbered[0][1].startswith("{") else "kv"
    parse_line = _jsonl_line if fmt == "jsonl" else _kv_line
    checker = MetricChecker()
    records: list[StepRecord] = []
    skipped = 0
    for number, text in numbered:
        try:
            record = parse_line(text, number)
            if record is not None:
                checker.check(record.metrics)
        except DraftboardError as exc:
            raise DraftboardError(f"{file}:{number}: {exc}") from None
        if record is None:
            skipped += 1
        else:
            records.append(record)
    if not records:
        raise DraftboardError(
            f"{file}: no step records found; expected JSON lines with a \"step\" field "
            "or lines like `step=10 loss=2.3`"
        )
    return ParsedLog(str(file), fmt, records, skipped)


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

    parsed = read_log(path)
    params = {
        "import.source": str(Path(parsed.path).resolve()),
        "import.format": parsed.format,
        "import.records": len(parsed.records),
        "import.skipped_lines": parsed.skipped_lines,
    }
    with tracker.training_run(
        name,
        params,
        target,
        tags={IMPORTED: "1"},
        fingerprint=fingerprint.imported(parsed.path, parsed.format),
    ) as run:
        for record in parsed.records:
            run.log_step(record.step, **record.metrics)
    return run.run_id
