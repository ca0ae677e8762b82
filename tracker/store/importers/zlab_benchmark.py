"""The printed output of z-lab's `python -m dflash.benchmark` (a captured log), per dataset.

z-lab's benchmark saves no file: it prints a summary (dflash/benchmark.py, `_print_decode_summary`
for the transformers and mlx backends, the `=====` block of `_run_server` for sglang / vllm):

    Baseline throughput: 41.20 tok/s
    DFlash throughput:  160.11 tok/s
    Decoding speedup: 3.89
    Average Acceptance length: 6.52
    Acceptance length histogram: ['0.0%', '10.2%', ..., '31.0%']     (lengths 0..block_size)

    Backend:          sglang
    Dataset:          gsm8k
    Accept length:    6.480

`rich.print` wraps the histogram list over several lines when the output is not a terminal, so
continuation lines are joined. A log may hold several benchmark runs (a loop over datasets): a
result key seen a second time starts the next section. The dataset of a section comes from a
`Dataset:` line, the `[cached] .../NAME.jsonl` / `[download] NAME` lines, or an echoed
`--dataset NAME`; a log with one section and no dataset name is named after the file.

"Average Acceptance length" is the mean over responses of each response's mean acceptance
length, which is draftboard's `tau` (a macro average; DESIGN.md); the histogram gives the pooled
fraction of blocks per length, so `accept_rate_pos{k}` = the fraction with length >= k + 1 (to
the 0.1 % the log prints).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.importers.results import ImportedEval, finite, rates_above

FORMAT = "zlab-benchmark"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_VALUES = {
    "tau": re.compile(r"^Average Acceptance length:\s*(\S+)"),
    "server_accept_length": re.compile(r"^Accept length:\s*(\S+)"),
    "speedup": re.compile(r"^Decoding speedup:\s*(\S+)"),
    "baseline_tok_s": re.compile(r"^Baseline throughput:\s*(\S+)\s*tok/s"),
    "dflash_tok_s": re.compile(r"^DFlash throughput:\s*(\S+)\s*tok/s"),
    "throughput_tok_s": re.compile(r"^Throughput:\s*(\S+)\s*tok/s"),
    "num_prompts": re.compile(r"^Num prompts:\s*(\d+)"),
}
_STATED = {"backend": re.compile(r"^Backend:\s*(\S+)"), "concurrency": re.compile(r"^Concurrency:\s*(\d+)")}
_DATASET = (re.compile(r"^Dataset:\s*(\S+)"), re.compile(r"^\[cached\]\s+\S*?([\w.-]+)\.jsonl"),
            re.compile(r"^\[download\]\s+(\S+)"), re.compile(r"--dataset[= ]([\w.-]+)"))
_HISTOGRAM = "Acceptance length histogram:"


@dataclass
class _Section:
    dataset: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    stated: dict[str, str] = field(default_factory=dict)
    histogram: list[float] | None = None
    line: int = 0

    @property
    def has_results(self) -> bool:
        return bool(self.values) or self.histogram is not None


def _histogram(text: str, where: str) -> list[float]:
    try:
        items = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        raise DraftboardError(f"{where}: cannot read the acceptance length histogram {text.strip()[:80]!r}") from None
    if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.endswith("%") for i in items):
        raise DraftboardError(f"{where}: the histogram must be a list like ['0.0%', '12.5%', ...]")
    return [finite(i[:-1], where) / 100 for i in items]


def parse_benchmark_log(path: str | Path) -> list[ImportedEval]:
    """One record per benchmark section of the log, in file order."""
    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
    try:
        lines = [_ANSI.sub("", raw).strip() for raw in file.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise DraftboardError(f"{file}: not a UTF-8 text log ({exc.reason} at byte {exc.start})") from exc
    sections: list[_Section] = []
    current = _Section()
    i = 0
    while i < len(lines):
        text, number = lines[i], i + 1
        i += 1
        dataset = next((m.group(1) for p in _DATASET if (m := p.search(text))), None)
        if dataset is not None:
            if current.has_results and current.dataset not in (None, dataset):
                sections.append(current)
                current = _Section()
            current.dataset = dataset
            continue
        if text.startswith(_HISTOGRAM):
            body = text[len(_HISTOGRAM):]
            while "]" not in body and i < len(lines):  # rich wrapped the list
                body += " " + lines[i]
                i += 1
            if current.histogram is not None:
                sections.append(current)
                current = _Section()
            current.histogram = _histogram(body, f"{file}:{number}")
            current.line = current.line or number
            continue
        for key, pattern in {**_VALUES, **_STATED}.items():
            match = pattern.match(text)
            if not match:
                continue
            if key in current.values or key in current.stated:  # the next benchmark's summary
                sections.append(current)
                current = _Section()
            if key in _STATED:
                current.stated[key] = match.group(1)
            else:
                current.values[key] = finite(match.group(1), f"{file}:{number}")
            current.line = current.line or number
            break
    if current.has_results:
        sections.append(current)
    sections = [s for s in sections if s.has_results]
    if not sections:
        raise DraftboardError(f"{file}: no z-lab benchmark summary found (expected lines such as "
                              "'Average Acceptance length: 6.52' and 'Acceptance length histogram: [...]')")
    unnamed = [s for s in sections if s.dataset is None]
    if unnamed and len(sections) > 1:
        raise DraftboardError(f"{file}:{unnamed[0].line}: {len(sections)} benchmark summaries but this one names no "
                              "dataset; split the log per dataset (each file is named after its dataset) or keep "
                              "the '[cached] .../NAME.jsonl' lines")
    return [_record(s, s.dataset or file.stem, f"{file}:{s.line}") for s in sections]


def _record(section: _Section, dataset: str, where: str) -> ImportedEval:
    values = dict(section.values)
    tau = values.pop("tau", None)
    if tau is None:
        tau = values.pop("server_accept_length", None)
    metrics: dict[str, float] = {}
    if tau is not None:
        metrics = {"tau": tau, "streak": tau - 1}
    if "speedup" in values:  # benchmark.py's "Decoding speedup": the quantity `--scoring online` measures
        metrics[names.DECODING_SPEEDUP] = values["speedup"]
    protocol = dict(section.stated)
    details: dict = {"printed": values}
    if section.histogram is not None:
        block_size = len(section.histogram) - 1
        if block_size < 1:
            raise DraftboardError(f"{where}: a histogram needs lengths 0..block_size, got {len(section.histogram)} entries")
        metrics.update(rates_above(section.histogram, block_size))
        protocol["block_size"] = str(block_size)
        details["accept_len_fraction"] = section.histogram[1:]  # lengths 1..block_size, like accept_len_histogram
    if tau is None and section.histogram is None:
        raise DraftboardError(f"{where}: the summary has no acceptance length")
    return ImportedEval(dataset, metrics, protocol, details)
