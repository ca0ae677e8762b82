"""Import a training log written by another tool as a draftboard training run.

Three formats; the first two are recognised by the first non-blank line, the third is named:

- JSON lines (`jsonl`): one object per line, e.g. `{"step": 10, "loss": 2.3, "streak": 1.1}`.
  Every line must be an object with an integer `step`. Numeric fields become
  metrics; other fields (strings, booleans, null, lists, objects) are ignored.
- key=value text (`kv`): lines such as `step=10 loss=2.31 acc=0.4 lr=1e-4`, pairs
  separated by spaces, commas or semicolons; other words on the line (timestamps,
  log levels) are ignored, as are pairs whose value is not a number. Lines
  without a `step=` pair (banners, warnings) are skipped and counted.
- NVIDIA Automodel's console (`automodel`, `import-log --format automodel`), the lines its DFlash and
  DFlash2 recipes print (nemo_automodel/recipes/llm/train_dflash*.py): `epoch=E step=S loss= acc= lr=`
  every log_every_steps optimizer steps, DFlash2's `dflash2: base_loss= selector_loss= base_acc=
  accept_len= base_accept_len= candidate_recall=` right after it (same step), and `Finished epoch E/N
  completed_steps=C ... val_loss= ...` at each epoch's end, placed at the optimizer steps completed so
  far (the step the recipe's global_step holds there; at least the last logged step for a log of a
  resumed run). Metrics keep the names Automodel gives W&B (`train/selector_loss`, `val/accept_len`), and
  the run is tagged with the tool, so the dashboard reads them under ours (tracker/store/adoption.py).

The imported run's fingerprint is `tracker.environment.fingerprint.imported(...)` with the evidence the
log itself holds, read as the console it usually is (transformers' fallback lines, version banners,
`nvidia-smi`: tracker/environment/evidence), and that of a console log given beside it (`--console`);
a field no line states stays unknown.

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
from tracker.untrusted.jsonlines import json_object
from tracker.store import names

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


def scan_log(path: str | Path, fmt: str | None = None) -> LogSummary:
    """Check every line of a log; DraftboardError naming `file:line` for anything malformed."""
    file = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise DraftboardError(f"unknown log format {fmt!r}; known: {', '.join(FORMATS)} (jsonl and kv are recognised)")
    fmt = fmt or _format(file)
    records = skipped = 0
    for record in _records(file, fmt):
        if record is None:
            skipped += 1
        else:
            records += 1
    if not records:
        expected = ("Automodel's `epoch=0 step=10 loss=... acc=... lr=...` lines" if fmt == AUTOMODEL else
                    "JSON lines with a \"step\" field or lines like `step=10 loss=2.3`")
        raise DraftboardError(f"{file}: no step records found; expected {expected}")
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
    from tracker.store.steps import MetricChecker  # mlflow: not at import, the CLI's parser reads FORMATS

    parse_line = {"jsonl": _jsonl_line, "kv": _kv_line, AUTOMODEL: _AutomodelConsole().line}[fmt]
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


AUTOMODEL = "automodel"
FORMATS = (AUTOMODEL,)  # named with --format; jsonl and kv are recognised
_NUMBER = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_AUTOMODEL_STEP = re.compile(rf"\bepoch=(\d+) step=(\d+) loss={_NUMBER} acc={_NUMBER} lr={_NUMBER}")
_AUTOMODEL_DFLASH2 = re.compile(rf"\bdflash2: base_loss={_NUMBER} selector_loss={_NUMBER} base_acc={_NUMBER} "
                                rf"accept_len={_NUMBER} base_accept_len={_NUMBER} candidate_recall={_NUMBER}")
_AUTOMODEL_EPOCH = re.compile(r"\bFinished epoch (\d+)/(\d+) completed_steps=(\d+) skipped_short_micro_batches=\d+(.*)")
_DFLASH2_NAMES = ("train/base_loss", "train/selector_loss", "train/base_accuracy", "train/accept_len",
                  "train/base_accept_len", "train/candidate_recall")


class _AutomodelConsole:
    """Automodel's console lines -> step records; remembers the step a `dflash2:` line belongs to."""

    def __init__(self):
        self.step: int | None = None  # the last `step=` printed
        self.completed = 0  # optimizer steps completed by the epochs finished so far

    def line(self, text: str, number: int) -> StepRecord | None:
        if match := _AUTOMODEL_STEP.search(text):
            epoch, step, loss, acc, lr = match.groups()
            self.step = int(step)
            return StepRecord(self.step, {"train/loss": float(loss), "train/accuracy": float(acc),
                                          "train/lr": float(lr), "train/epoch": float(epoch)}, number)
        if match := _AUTOMODEL_DFLASH2.search(text):
            if self.step is None:
                raise DraftboardError("a `dflash2:` line before any `epoch=... step=...` line it belongs to")
            return StepRecord(self.step, dict(zip(_DFLASH2_NAMES, map(float, match.groups()))), number)
        if match := _AUTOMODEL_EPOCH.search(text):
            self.completed += int(match.group(3))
            # The recipe logs validation as W&B's val/<name> (name.replace("val_", "val/", 1)).
            val = {f"val/{key.removeprefix('val_')}": float(value)
                   for key, value in re.findall(rf"\b(val_\w+)={_NUMBER}", match.group(4))}
            step = max(self.completed, self.step or 0)
            return StepRecord(step, val, number) if val else None
        return None


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


def import_log(tracker, path: str | Path, name: str, target: str | None = None, fmt: str | None = None,
               console: str | Path | None = None) -> str:
    """Log the steps of a training log as a new train run of `tracker`; returns its run id. `fmt`:
    `automodel` for Automodel's console (jsonl and kv are recognised); `console`: the training process's
    console log, when the log is not it."""
    from tracker.environment import fingerprint
    from tracker.environment.evidence import decide, files
    from tracker.store import adoption
    from tracker.store.importers import foreign_run

    summary = scan_log(path, fmt)
    evidence = foreign_run.with_console(foreign_run.ForeignRun(
        str(Path(summary.path).resolve()), ".", summary.format, {}, {}, facts=files.console_file(summary.path)), console)
    decision = decide.decide(evidence.facts)
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
        tags={names.IMPORTED: "1", **({names.TOOL: summary.format,
                                        names.STEP_UNIT: adoption.TOOLS[summary.format].steps.unit}
                                       if summary.format in adoption.TOOLS else {})},
        fingerprint=fingerprint.imported(summary.path, summary.format, evidence=decision),
        max_pending_steps=MAX_PENDING_STEPS,
    ) as run:
        foreign_run.keep_evidence(run, evidence, decision)
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
