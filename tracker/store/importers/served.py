"""Served numbers from production, imported as eval runs of protocol `imported` with the window they
cover: vLLM's periodic `SpecDecoding metrics:` log lines, SGLang's `Decode batch, ... accept len:` lines,
llama.cpp's per-request `draft acceptance = ...` lines, and a `/metrics` scrape of vLLM or llama.cpp
(one, or several appended: then the counters' change between the first and the last). Formats and
names: `tracker.measurement.engine_metrics`.

What each number is, and never is:
- vLLM log lines and counters give accepted and drafted token counts. Each draft proposes
  num_speculative_tokens (= the length of the per-position list) tokens, so drafts = drafted tokens
  / that length, and `engine_mean_acceptance_length` = 1 + accepted / drafts, pooled over the window:
  vLLM's definition, the same one an engine eval records. `accept_rate_pos{k}` (the fraction of
  drafts whose token k was accepted) is the per-position rates weighted by each line's drafts.
- SGLang's `accept len` is tokens per verify step (bonus token included) averaged over one log
  interval, with no counts: the window's number is the mean over lines, `sglang_accept_len`, a
  definition of its own. Neither is draftboard's per-prompt `tau`, and neither is logged as it.
- llama.cpp's lines give each request's accepted and drafted ("generated") tokens, so the draft
  acceptance rate is exact, and `mean len` = 1 + accepted / verify steps to two decimals: the steps
  are recovered where exactly one count fits every line, and only then is the pooled
  `engine_mean_acceptance_length` logged; otherwise the protocol says why it is not.
- AIPerf's `profile_export.jsonl` (`--export-level records`): each line a `MetricRecordInfo` whose
  `spec_decode_acceptance` is AIPerf's engine-neutral per-request record (aiperf 0.13,
  `common/models/spec_decode_models.py`: `engine`, a sparse `acceptance_histogram` {accepted drafts:
  steps} without the bonus token, `num_spec_steps`, `num_accepted_draft_tokens`, `num_draft_tokens`,
  optional `per_step_accepted` / `per_step_drafted`), checked with AIPerf's own invariants (the
  histogram sums to the steps and its weighted sum to the accepted tokens; no more accepted than
  drafted; per-step arrays one entry per step) and pooled over the requests:
  `engine_mean_acceptance_length` = 1 + accepted / steps (vLLM's definition; AIPerf's
  `mean_acceptance_length`, pooled), `draft_acceptance_rate`, `accept_rate_pos{k}` from the pooled
  histogram. `aiperf_records(results)` writes a served eval's requests in that same shape (`draftboard
  export-results --format aiperf`), and reading them back gives the eval's own numbers.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tracker import config
from tracker.environment.evidence import MAX_QUOTE, Fact
from tracker.measurement import engine_metrics as em
from tracker.measurement import known_bad
from tracker.measurement.levels import level_results
from tracker.errors import DraftboardError
from tracker.untrusted.digits import whole_number
from tracker.untrusted.jsonlines import records
from tracker.store import names
from tracker.store.importers.results import ImportedEval, finite

VLLM_LOG, SGLANG_LOG, LLAMACPP_LOG, PROMETHEUS = "vllm-log", "sglang-log", "llamacpp-log", "prometheus"
AIPERF = "aiperf"
FORMATS = (VLLM_LOG, SGLANG_LOG, LLAMACPP_LOG, PROMETHEUS, AIPERF)
MAX_RECORD = 16 << 20  # one request's AIPerf record, per-step arrays of a long completion included
MAX_LINE = 64 << 10  # a server's log line is short; a longer one is cut before any pattern reads it
DATASET = "served"  # production traffic: no prompt set of ours
# vLLM: "INFO 12-02 14:37:37 [...]"; SGLang: "[2026-12-02 14:37:37 TP0] ..."
_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}|\d{2}-\d{2} \d{2}:\d{2}:\d{2})")


def _lines(path: str | Path):
    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
    with file.open(encoding="utf-8", errors="replace") as handle:
        yield from enumerate(handle, 1)


def _window(first: str | None, last: str | None, n: int, unit: str) -> dict[str, str]:
    return {"window_start": first or "unknown", "window_end": last or "unknown", "window": f"{n} {unit}"}


def parse_vllm_log(path: str | Path) -> list[ImportedEval]:
    accepted = drafts = 0.0
    by_pos: list[float] = []
    first = last = None
    n = 0
    load = _Load()
    box: dict[str, str] = {}  # what the server said at start of the box it is
    facts: list[Fact] = []
    for lineno, line in _lines(path):
        m = em.VLLM_LOG_LINE.match(line[:MAX_LINE])
        if not m:
            load.read(em.VLLM_STATS_LINE.match(line[:MAX_LINE]), f"{path}:{lineno}")
            for key, pattern in (("version", em.VLLM_ENGINE_LINE), ("model_runner", em.VLLM_RUNNER_LINE),
                                 ("attention_backend", em.VLLM_BACKEND_LINE)):
                said = pattern.match(line[:MAX_LINE])
                if said and key not in box:
                    box[key] = said.group(1)
                    facts.append(_fact(f"engine.{key}", said.group(1), path, lineno, line, f"vLLM start-up: {key}"))
            continue
        where = f"{path}:{lineno}"
        rates = [finite(x, f"{where}: per-position rate") for x in m.group("positions").replace(",", " ").split()]
        if not rates:
            raise DraftboardError(f"{where}: a SpecDecoding line without per-position rates")
        line_drafts = finite(m.group("drafted"), where) / len(rates)
        accepted += finite(m.group("accepted"), where)
        drafts += line_drafts
        by_pos = [a + r * line_drafts for a, r in zip(by_pos, rates)] if by_pos else [r * line_drafts for r in rates]
        stamp = _TIME.search(line)
        first, last, n = first or (stamp and stamp.group(1)), (stamp and stamp.group(1)) or last, n + 1
    if not n or not drafts:
        raise DraftboardError(f"{path}: no 'SpecDecoding metrics:' line with drafts (is it a vLLM server log with "
                              "speculative decoding?)")
    metrics = {names.ENGINE_MEAN_AL: 1 + accepted / drafts,
               **{names.accept_rate_metric(k + 1): c / drafts for k, c in enumerate(by_pos)}}
    protocol = {"backend": "vllm", "num_speculative_tokens": str(len(by_pos)), **_window(first, last, n, "log lines"),
                **load.protocol(), **({"engine_version": box["version"]} if "version" in box else {})}
    return [ImportedEval(DATASET, metrics, protocol, {"accepted_tokens": accepted, "drafts": drafts, "lines": n,
                                                      **load.details()},
                         serving=known_bad.Serving("vllm", box.get("version"),
                                                   {"model_runner": box.get("model_runner")}),
                         environment={"engine.name": "vllm"}, facts=facts)]


def _fact(field: str, value, path, lineno: int, line: str, rule: str) -> Fact:
    """What a serving engine's own start-up line states of its box, cited (tracker/environment/evidence)."""
    return Fact(field, value, Path(path).name, lineno, line.rstrip("\n")[:MAX_QUOTE], rule)


class _Load:
    """What a vLLM log's scheduler lines say of the load its numbers were taken under (the requests running,
    the KV cache's usage, the prefix cache's hit rate): a served number is comparable only at its concurrency."""

    def __init__(self):
        self.running: list[int] = []
        self.kv: list[float] = []
        self.hit: float | None = None

    def read(self, m, where: str) -> None:
        if m:
            self.running.append(int(m.group("running")))
            self.kv.append(finite(m.group("kv"), f"{where}: KV cache usage"))
            self.hit = finite(m.group("hit"), f"{where}: prefix cache hit rate") if m.group("hit") else self.hit

    def protocol(self) -> dict[str, str]:
        if not self.running:
            return {"concurrency": "not stated (no scheduler line in the log)"}
        mean = sum(self.running) / len(self.running)
        return {"concurrency": f"{min(self.running)}-{max(self.running)} requests running (mean {mean:.1f} over "
                               f"{len(self.running)} scheduler lines)",
                "kv_cache_usage_max": f"{max(self.kv):.1f}%"}

    def details(self) -> dict:
        if not self.running:
            return {}
        return {"running_requests": {"min": min(self.running), "max": max(self.running),
                                     "mean": sum(self.running) / len(self.running), "lines": len(self.running)},
                "kv_cache_usage_max_percent": max(self.kv), "prefix_cache_hit_rate_last_percent": self.hit}


def parse_sglang_log(path: str | Path) -> list[ImportedEval]:
    values, rates = [], []
    first = last = None
    facts: list[Fact] = []
    for lineno, line in _lines(path):
        if not facts and em.SGLANG_ARGS_LINE.match(line[:MAX_LINE]):
            for key, pattern in em.SGLANG_SPEC_ARGS.items():
                if said := pattern.search(line[:MAX_LINE]):
                    facts.append(_fact(f"engine.{key}", said.group(1), path, lineno, line, "SGLang server_args"))
        m = em.SGLANG_LOG_LINE.match(line[:MAX_LINE])
        if m:
            values.append(finite(m.group("accept_len"), f"{path}:{lineno}"))
            rates.append(finite(m.group("rate"), f"{path}:{lineno}"))
            stamp = _TIME.search(line)
            first, last = first or (stamp and stamp.group(1)), (stamp and stamp.group(1)) or last
    if not values:
        raise DraftboardError(f"{path}: no 'Decode batch, ... accept len:' line (is it an SGLang server log with "
                              "speculative decoding?)")
    metrics = {"sglang_accept_len": sum(values) / len(values), "sglang_accept_rate": sum(rates) / len(rates)}
    return [ImportedEval(DATASET, metrics, {"backend": "sglang", **_window(first, last, len(values), "log lines")},
                         {"lines": len(values)}, environment={"engine.name": "sglang"}, facts=facts)]


def _steps(accepted: int, mean: str) -> int | None:
    """The one verify-step count s with 1 + accepted / s printed as `mean` (two decimals); None when
    none or several fit."""
    shown = float(mean)
    if shown <= 1.0:
        return None
    # s lies within the rounding of mean - 1: accepted / (m - 1 +- 0.005), a handful of integers
    low, high = accepted / (shown - 1 + 0.005), accepted / max(shown - 1 - 0.005, 1e-9)
    fits = [s for s in range(max(1, int(low)), min(int(high) + 2, accepted + 1))
            if f"{1 + accepted / s:.2f}" == f"{shown:.2f}"]
    return fits[0] if len(fits) == 1 else None


def parse_llamacpp_log(path: str | Path) -> list[ImportedEval]:
    accepted = generated = steps = n = 0
    exact = True
    facts: list[Fact] = []
    for lineno, line in _lines(path):
        m = em.LLAMACPP_LOG_LINE.match(line[:MAX_LINE])
        if not m:
            build = em.LLAMACPP_BUILD_LINE.match(line[:MAX_LINE]) if not facts else None
            if build and int(build.group(1)):  # packaged builds say 0: unknown
                facts.append(_fact("engine.build", build.group(1), path, lineno, line, "llama.cpp build line"))
            continue
        where = f"{path}:{lineno}"
        a, g = int(m.group("accepted")), int(m.group("generated"))
        if a > g:
            raise DraftboardError(f"{where}: {a} accepted of {g} drafted tokens")
        s = _steps(a, m.group("mean")) if a else None
        exact = exact and (s is not None or a == 0)
        accepted, generated, steps, n = accepted + a, generated + g, steps + (s or 0), n + 1
    if not n or not generated:
        raise DraftboardError(f"{path}: no 'draft acceptance = ...' line with drafted tokens (is it a llama.cpp server "
                              "log with speculative decoding?)")
    metrics = {"draft_acceptance_rate": accepted / generated}
    protocol = {"backend": "llamacpp", "window": f"{n} requests"}
    if exact and steps:
        metrics[names.ENGINE_MEAN_AL] = 1 + accepted / steps
    else:
        protocol["not_logged"] = ("engine_mean_acceptance_length: a request's verify steps cannot be told from its "
                                  "two-decimal mean len")
    return [ImportedEval(DATASET, metrics, protocol, {"accepted_tokens": accepted, "drafted_tokens": generated,
                                                      "requests": n, "steps": steps if exact else None},
                         environment={"engine.name": "llamacpp"}, facts=facts)]


def parse_prometheus(path: str | Path) -> list[ImportedEval]:
    """vLLM or llama.cpp counters (or SGLang gauges) of one scrape, or the change between the first and
    last of several."""
    text = "".join(line for _, line in _lines(path))
    for counters, backend in ((em.VLLM_COUNTERS, "vllm"), (em.LLAMACPP_COUNTERS, "llamacpp")):
        scrapes = [s for s in em.scrapes(text) if em.counter(s, counters[0]) is not None]
        if scrapes:
            return [_counters(scrapes, path, counters, backend)]
    samples = em.prometheus_samples(text)
    length = em.counter(samples, em.SGLANG_ACCEPT_LENGTH)
    if length is None:
        raise DraftboardError(f"{path}: no {em.VLLM_DRAFTS} or {em.LLAMACPP_DRAFTS} counter and no "
                              f"{em.SGLANG_ACCEPT_LENGTH} gauge: not a /metrics scrape of a speculative-decoding server")
    rate = em.counter(samples, em.SGLANG_ACCEPT_RATE)
    return [ImportedEval(DATASET, {"sglang_accept_len": length, **({"sglang_accept_rate": rate} if rate is not None
                                                                   else {})},
                         {"backend": "sglang", "window": "the gauge at the scrape"})]


def _counters(scrapes: list[list], path, counters: tuple[str, str, str, str], backend: str) -> ImportedEval:
    last = em.spec_totals(scrapes[-1], counters)
    first = em.spec_totals(scrapes[0], counters) if len(scrapes) > 1 else None
    drafts = last.drafts - (first.drafts if first else 0.0)
    accepted = last.accepted - (first.accepted if first else 0.0)
    if drafts <= 0:
        raise DraftboardError(f"{path}: no drafts in the window the scrape(s) cover")
    by_pos = [c - (first.by_position.get(k, 0.0) if first else 0.0) for k, c in last.by_position.items()]
    metrics = {names.ENGINE_MEAN_AL: 1 + accepted / drafts,
               **{names.accept_rate_metric(k + 1): c / drafts for k, c in enumerate(by_pos)}}
    window = (f"between the first and last of {len(scrapes)} scrapes" if len(scrapes) > 1 else
              "since the counters were created" + (f" (unix {last.created:.0f})" if last.created else ""))
    return ImportedEval(DATASET, metrics, {"backend": backend, "num_speculative_tokens": str(len(by_pos)),
                                           "window": window}, {"drafts": drafts, "accepted_tokens": accepted})


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DraftboardError(f"{what} must be a whole number >= 0, got {str(value)[:40]!r}")
    return value


def _aiperf_record(sd: dict, where: str) -> tuple[Counter, int, int, int, str]:
    """(histogram, steps, accepted, drafted, engine) of one record, with AIPerf's own invariants."""
    if not isinstance(sd, dict) or not isinstance(sd.get("acceptance_histogram"), dict):
        raise DraftboardError(f"{where}: spec_decode_acceptance has no acceptance_histogram object")
    histogram: Counter = Counter()
    for key, value in sd["acceptance_histogram"].items():
        drafted_n = whole_number(key)
        if drafted_n is None or drafted_n > config.MAX_BUDGET:
            raise DraftboardError(f"{where}: acceptance_histogram key {str(key)[:20]!r} is not a draft count "
                                  f"(0..{config.MAX_BUDGET})")
        histogram[drafted_n] += _count(value, f"{where}: acceptance_histogram[{str(key)[:20]}]")
    steps, accepted, drafted = (_count(sd.get(k), f"{where}: {k}") for k in
                                ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens"))
    if sum(histogram.values()) != steps or sum(j * c for j, c in histogram.items()) != accepted or accepted > drafted:
        raise DraftboardError(f"{where}: the record's counts contradict each other (histogram {dict(histogram)}, "
                              f"{steps} steps, {accepted} accepted of {drafted} drafted)")
    for key, total in (("per_step_accepted", accepted), ("per_step_drafted", drafted)):
        if sd.get(key) is not None:
            em.per_step_counts(sd[key], steps, total, None, f"{where}: {key}")
    return histogram, steps, accepted, drafted, str(sd.get("engine") or "unknown")[:40]


def parse_aiperf(path: str | Path) -> list[ImportedEval]:
    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
    pooled: Counter = Counter()
    steps = accepted = drafted = requests = 0
    engines: set[str] = set()
    for where, record in records(file, MAX_RECORD, "AIPerf's profile_export.jsonl"):
        sd = record.get("spec_decode_acceptance") if isinstance(record, dict) else None
        if sd is None:
            continue  # a failed request, or one with no verify step: AIPerf records none
        histogram, n_steps, n_accepted, n_drafted, engine = _aiperf_record(sd, where)
        pooled.update(histogram)
        steps, accepted, drafted = steps + n_steps, accepted + n_accepted, drafted + n_drafted
        requests += 1
        engines.add(engine)
    if not steps:
        raise DraftboardError(f"{file}: no spec_decode_acceptance record with verify steps (AIPerf writes them at "
                              "--export-level records, for a server that reports speculative decoding)")
    histogram = [pooled[j] for j in range(max(pooled) + 1)]
    metrics = {names.ENGINE_MEAN_AL: 1 + accepted / steps, "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
               **{names.accept_rate_metric(k + 1): c / steps
                  for k, c in enumerate(em.positions_from_histogram(histogram))}}
    protocol = {"backend": ",".join(sorted(engines)), "source": "AIPerf per-request records",
                "window": f"{requests} requests"}
    return [ImportedEval(DATASET, metrics, protocol, {"requests": requests, "steps": steps, "accepted_tokens": accepted,
                                                      "drafted_tokens": drafted,
                                                      "accept_len_histogram": histogram})]


PARSERS = {VLLM_LOG: parse_vllm_log, SGLANG_LOG: parse_sglang_log, LLAMACPP_LOG: parse_llamacpp_log,
           PROMETHEUS: parse_prometheus, AIPERF: parse_aiperf}


def aiperf_records(results: dict, concurrency: int | None = None) -> list[dict]:
    """A served eval's requests as AIPerf's profile_export.jsonl records, one per prompt, each checked
    with AIPerf's invariants (`_aiperf_record`): the eval's own pass, or with `concurrency` that level of its
    load sweep (`load`). An offline eval has no served requests: DraftboardError."""
    engine = results.get("engine")
    if not isinstance(engine, dict) or not engine.get("name"):
        raise DraftboardError("not a served eval: AIPerf records are a serving engine's requests (an offline "
                              "eval has none)")
    try:
        rows = (results if concurrency is None else level_results(results, concurrency))["prompts"]
        return [_aiperf_line(row, engine) for row in rows]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # results are read from the store: untrusted
        raise DraftboardError(f"the eval's results are not a served eval's per-prompt records ({exc!r:.80})") from None


def _aiperf_line(row: dict, engine: dict) -> dict:
    accepted_per_step = [length - 1 for length in row["acceptance_lengths"]]
    ordered = row.get("engine_accepted_per_step")
    steps, accepted, drafted = len(accepted_per_step), sum(accepted_per_step), row["engine_draft_tokens"]
    record = {"engine": str(engine["name"]), "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
              "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
              "acceptance_histogram": {str(a): c for a, c in sorted(Counter(accepted_per_step).items())},
              "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted, "num_spec_steps": steps,
              "num_spec_tokens": engine.get("num_speculative_tokens"),
              "completion_tokens": len(row["completion_ids"]),
              # the engine's order where it reported one; per-step drafted counts it never reports
              "per_step_accepted": ordered, "per_step_drafted": None}
    _aiperf_record(record, f"prompt {str(row['id'])[:40]!r}")
    return {"metadata": {"x_request_id": str(row["id"])}, "metrics": {}, "error": None,
            "spec_decode_acceptance": record}
