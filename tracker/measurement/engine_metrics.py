"""What serving engines report about speculative decoding, and how they name it: one module owns
the names, so the engine clients (evaluators/engines/) and the importer of production numbers
(tracker/store/importers/served.py) read the same ones.

Read from the engines' own sources (vLLM 0.32.0, SGLang 0.5.23, llama.cpp as the llama-cpp-python
0.3.36 sdist and xllamacpp 2026.10.11549 ship it):
- vLLM `v1/spec_decode/metrics.py`: counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
  `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}` (exported with `_total`, plus
  `_created` timestamps), and the periodic log line `SpecDecoding metrics: Mean acceptance length: %.2f,
  Accepted throughput: %.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted:
  %d tokens, Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%`;
  `v1/worker/gpu_model_runner.py` logs "Using auxiliary layers from speculative config: (...)".
- SGLang `srt/managers/scheduler_components/metrics_reporter.py` (`scheduler_metrics_mixin.py` before
  0.5.2x): the log line `Decode batch[ [ITER]], #running-req: N, ..., accept len: {:.2f}, accept rate:
  {:.2f}, ...`, where accept len = accepted tokens / verify steps of the last log interval (the bonus
  token included) and accept rate = correct drafts / proposed drafts; `srt/observability/
  metrics_collector.py`: gauges `sglang:spec_accept_length`, `sglang:spec_accept_rate`.
- llama.cpp `tools/server/server-task.cpp` (`/metrics`, with --metrics): counters
  `llamacpp:spec_decode_num_drafts_total` (verify steps), `..._num_draft_tokens_total`,
  `..._num_accepted_tokens_total`, `llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position}`
  (from 0); `server-context.cpp` logs per request `draft acceptance = %0.5f (%5d accepted / %5d
  generated), mean len = %5.2f`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tracker.errors import DraftboardError
from tracker.untrusted.digits import whole_number

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# vLLM's prefix cache (`v1/metrics/loggers.py`): prompt tokens looked up, and found cached
VLLM_PREFIX_QUERIES, VLLM_PREFIX_HITS = "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"
LLAMACPP_DRAFTS = "llamacpp:spec_decode_num_drafts"
LLAMACPP_DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens"
LLAMACPP_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens"
LLAMACPP_ACCEPTED_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"
VLLM_AUX_LAYERS_LOG = "Using auxiliary layers from speculative config: "
# vLLM's logger (`vllm/logger.py`): "(APIServer pid=28989) INFO 12-04 09:36:37 [metrics.py:120] " before the
# message, the process part absent in older versions and the fields wrapped in colour codes by its
# ColoredFormatter. Anchored there, so a request's text that merely contains "SpecDecoding metrics:"
# counts nothing; every repeat is bounded, so one long line costs linear time.
_COLOUR = r"(?:\x1b\[[0-9;]{0,12}m){0,2}"


def _vllm_prefix(level: str) -> str:
    return (rf"{_COLOUR}(?:\([\w.:-]{{1,64}} pid=\d{{1,10}}\){_COLOUR} )?{_COLOUR}{level}{_COLOUR} {_COLOUR}"
            rf"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{{1,6}})?{_COLOUR} {_COLOUR}\[[\w./-]{{1,120}}:\d{{1,7}}\]{_COLOUR} ")


_VLLM_PREFIX = _vllm_prefix("INFO")
# What a vLLM server logs at start of the box it is, anchored the same way: its version (`v1/engine/core.py`,
# INFO), and the V1 runner where V2 cannot run (`config/vllm.py`, a WARNING: without one, 0.32 runs V2 where
# Triton is).
VLLM_ENGINE_LINE = re.compile(_VLLM_PREFIX + r"Initializing a V\d LLM engine \(v([\w.+-]{1,40})\)")
VLLM_RUNNER_LINE = re.compile(_vllm_prefix("WARNING") + r"Model Runner V2 [^;]{0,400}; using the (V\d) model runner")
# The attention backend the platform chose (`platforms/cuda.py`: logger.info("Using %s backend.", selected_backend),
# an AttentionBackendEnum printed as `AttentionBackendEnum.FLASH_ATTN`).
VLLM_BACKEND_LINE = re.compile(_VLLM_PREFIX + r"Using ([\w.]{1,80}) backend\.")
VLLM_LOG_LINE = re.compile(
    _VLLM_PREFIX +
    r"SpecDecoding metrics: Mean acceptance length: (?P<mean>[\d.]{1,24}|nan), Accepted throughput: [\d.]{1,24} "
    r"tokens/s, Drafted throughput: [\d.]{1,24} tokens/s, Accepted: (?P<accepted>\d{1,18}) tokens, "
    r"Drafted: (?P<drafted>\d{1,18}) tokens, Per-position acceptance rate: (?P<positions>[\d., ]{0,8192}?), "
    r"Avg Draft acceptance rate")
# The scheduler's line vLLM logs beside it while busy (`v1/metrics/loggers.py` LoggingStatLogger.log): the
# requests running and waiting, the KV cache's usage and, where prefix caching is on, its hit rate.
VLLM_STATS_LINE = re.compile(
    _VLLM_PREFIX +
    r"(?:Engine \d{1,3}: )?Avg prompt throughput: [\d.]{1,24} tokens/s, Avg generation throughput: [\d.]{1,24} "
    r"tokens/s, Running: (?P<running>\d{1,9}) reqs, Waiting: (?P<waiting>\d{1,9}) reqs"
    r"[^\n]{0,512}? KV cache usage: (?P<kv>[\d.]{1,24})%(?:, Prefix cache hit rate: (?P<hit>[\d.]{1,24})%)?")
# SGLang's logger (`srt/utils`' configure_logger): "[2026-12-02 14:37:37 TP0] " before the message.
_SGLANG_PREFIX = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [\w ]{1,64})?\] "
# What SGLang logs of its settings at start (`entrypoints/engine.py`: logger.info(f"server_args={...}"), a
# ServerArgs repr; the speculative settings read from it by name, each bounded.
SGLANG_ARGS_LINE = re.compile(_SGLANG_PREFIX + r"server_args=ServerArgs\(")
SGLANG_SPEC_ARGS = {"speculative_algorithm": re.compile(r"\bspeculative_algorithm='(\w{1,40})'"),
                    "speculative_num_draft_tokens": re.compile(r"\bspeculative_num_draft_tokens=(\d{1,6})\b")}
SGLANG_LOG_LINE = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [\w ]{1,64})?\] Decode batch(?: \[\d{1,18}\])?, "
    r"[^\n]{0,2048}?accept len: (?P<accept_len>[\d.]{1,24}), accept rate: (?P<rate>[\d.]{1,24})")
# llama.cpp, once per request (`server-context.cpp` print_timing through `SLT_INF`, "slot %12.*s: id %2d |
# task %d | "): "slot print_timing: id  0 | task 2 | draft acceptance = 0.20974 (   56 accepted /   267
# generated), mean len =  2.44" (mean len = 1 + accepted / verify steps). Matched at the start of the line,
# after the logger's optional prefix (`common/log.cpp`: colour codes, an "M.ss.mmm.uuu " timestamp, the
# level letter "I "), so a request's text holding such a line counts nothing; every repeat bounded.
LLAMACPP_LOG_LINE = re.compile(
    rf"{_COLOUR}(?:\d{{1,9}}\.\d\d\.\d{{3}}\.\d{{3}}{_COLOUR} )?{_COLOUR}(?:I {_COLOUR})?"
    r"slot print_timing: id {1,2}-?\d{1,9} \| task -?\d{1,18} \| "
    r"draft acceptance = (?P<ratio>[\d.]{1,24}) \( {0,18}(?P<accepted>\d{1,18}) accepted / {0,18}"
    r"(?P<generated>\d{1,18}) generated\), mean len = {0,18}(?P<mean>[\d.]{1,24}|nan|inf)")
# llama.cpp's build at start (`common/common.cpp`: LOG_INF("build: %d (%s) with %s for %s"...)); packaged builds
# say 0 (unknown).
LLAMACPP_BUILD_LINE = re.compile(
    rf"{_COLOUR}(?:\d{{1,9}}\.\d\d\.\d{{3}}\.\d{{3}}{_COLOUR} )?{_COLOUR}(?:I {_COLOUR})?build: (\d{{1,7}}) \(([\w-]{{1,40}})\)")
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"


def histogram_from_positions(drafts: int, by_position: list[int]) -> list[int]:
    """Steps per accepted count from per-position acceptance: a chain accepts a prefix, so the steps
    with at least k+1 accepted are those that accepted position k, and h[j] = c[j-1] - c[j]."""
    at_least = [drafts, *by_position, 0]
    hist = [at_least[j] - at_least[j + 1] for j in range(len(by_position) + 1)]
    if any(h < 0 for h in hist):
        raise DraftboardError(f"per-position acceptance {by_position} is not a chain's (it grows with the position)")
    return hist


def per_step_counts(values, steps: int, total: int, most: int | None, what: str) -> list[int]:
    """A request's per-step list (accepted or drafted tokens of each verify step, in order), as the engines'
    per-request records carry it (vLLM's detailed metrics, spec_acceptance.py, AIPerf): one whole count per
    step, each at most `most` (the draft length, where known), adding up to the request's `total`."""
    if (not isinstance(values, list) or len(values) != steps
            or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 or (most is not None and v > most)
                   for v in values) or sum(values) != total):
        bound = f"0 to {most}" if most is not None else ">= 0"
        raise DraftboardError(f"{what} must be one whole count ({bound}) per verify step ({steps}), adding up to "
                              f"{total}")
    return values


def positions_from_histogram(histogram: list[int]) -> list[int]:
    """The inverse: c[k] = steps that accepted draft position k (at least k+1 accepted) = the sum of
    h[k+1:], as suffix sums (linear in the positions)."""
    out, at_least = [0] * max(0, len(histogram) - 1), 0
    for k in range(len(histogram) - 1, 0, -1):
        at_least += histogram[k]
        out[k - 1] = at_least
    return out


# --------------------------------------------------------------------------- Prometheus text

# One sample line: `name{label="value",...} value [timestamp]`. Read left to right, each piece matched
# where the last one ended (bounded repeats), so a line costs time linear in its length; a line past
# MAX_SAMPLE_LINE or with more than MAX_LABELS labels is not a sample any engine writes, and is skipped.
MAX_SAMPLE_LINE, MAX_LABELS = 64 << 10, 64
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,255}")
_LABEL = re.compile(r'\s{0,8}([a-zA-Z_][a-zA-Z0-9_]{0,255})\s{0,8}=\s{0,8}"((?:[^"\\]|\\.){0,4096})"\s{0,8}(,|\})')
_CLOSE = re.compile(r"\s{0,8}\}")
_VALUE = re.compile(r"\s{1,64}(\S{1,64})(?:\s|$)")


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    name = _NAME.match(line)
    if not name:
        return None
    at, labels = name.end(), {}
    if line.startswith("{", at):
        at += 1
        while True:
            close = _CLOSE.match(line, at)  # `{}`, or a trailing comma before `}`
            if close:
                at = close.end()
                break
            label = _LABEL.match(line, at)
            if label is None or len(labels) >= MAX_LABELS:
                return None
            labels[label.group(1)] = label.group(2)
            at = label.end()
            if label.group(3) == "}":
                break
    value = _VALUE.match(line, at)
    if value is None:
        return None
    try:
        number = float(value.group(1))
    except ValueError:
        return None
    return (name.group(0), labels, number) if math.isfinite(number) else None


def prometheus_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#") and len(line) <= MAX_SAMPLE_LINE:
            sample = _sample(line)
            if sample is not None:
                out.append(sample)
    return out


def counter(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float | None:
    """The sum of a counter's samples (all engines), with or without the `_total` suffix; None if absent."""
    values = [v for n, lab, v in samples if n in (name, name + "_total")
              and all(lab.get(k) == want for k, want in labels.items())]
    return sum(values) if values else None


def scrapes(text: str) -> list[list[tuple[str, dict[str, str], float]]]:
    """The samples of each scrape in a text of scrapes appended one after another: a sample (name and
    labels) seen a second time starts the next one."""
    out: list[list] = [[]]
    seen: set = set()
    for sample in prometheus_samples(text):
        key = (sample[0], tuple(sorted(sample[1].items())))
        if key in seen:
            out.append([])
            seen = set()
        seen.add(key)
        out[-1].append(sample)
    return [s for s in out if s]


@dataclass(frozen=True)
class SpecTotals:
    """An engine's spec-decode counters in one scrape, summed over its engines."""

    drafts: float
    draft_tokens: float
    accepted: float
    by_position: dict[int, float]  # draft position (from 0) -> drafts that accepted it
    created: float | None  # unix time the drafts counter was created (its `_created` sample)


# Whether a request resumes a cached prefix: one concept, each engine's switch for it and whether the
# switch says "off" when true (vLLM enable_prefix_caching, SGLang disable_radix_cache, llama.cpp's
# per-request cache_prompt), as an engine eval records them (values True / False or their text).
PREFIX_CACHE_SWITCHES = (("enable_prefix_caching", False), ("disable_radix_cache", True), ("cache_prompt", False))


def prefix_cache(settings: dict) -> bool | None:
    """Whether an engine's settings resume cached prefixes; None when none of the switches is stated."""
    for key, inverted in PREFIX_CACHE_SWITCHES:
        if settings.get(key) is not None:
            return (str(settings[key]).lower() == "true") != inverted
    return None


# Each engine's names for (verify steps, draft tokens, accepted tokens, accepted per position).
VLLM_COUNTERS = (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED, VLLM_ACCEPTED_PER_POS)
LLAMACPP_COUNTERS = (LLAMACPP_DRAFTS, LLAMACPP_DRAFT_TOKENS, LLAMACPP_ACCEPTED, LLAMACPP_ACCEPTED_PER_POS)


def spec_totals(samples: list[tuple[str, dict[str, str], float]], counters: tuple[str, str, str, str]) -> SpecTotals:
    drafts_name, draft_tokens_name, accepted_name, per_pos_name = counters
    positions = {whole_number(lab.get("position")) for n, lab, _ in samples if n.startswith(per_pos_name)} - {None}
    created = [v for n, _, v in samples if n == drafts_name + "_created"]
    return SpecTotals(drafts=counter(samples, drafts_name) or 0.0,
                      draft_tokens=counter(samples, draft_tokens_name) or 0.0,
                      accepted=counter(samples, accepted_name) or 0.0,
                      by_position={k: counter(samples, per_pos_name, position=str(k)) or 0.0
                                   for k in sorted(positions)},
                      created=min(created) if created else None)


def vllm_totals(samples: list[tuple[str, dict[str, str], float]]) -> SpecTotals:
    return spec_totals(samples, VLLM_COUNTERS)
