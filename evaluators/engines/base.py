"""What every engine client reports, and the HTTP and Prometheus plumbing they share.

A served number is only comparable with an offline one block for block, so a reply carries the
engine's own per-request counts: drafts (verify steps), draft tokens, accepted draft tokens, how
many steps accepted each count (`histogram`), and the ordered per-step counts where the engine
returns them (vLLM `--per-request-spec-decode-metrics detailed`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tracker.measurement import engine_metrics as em
from tracker.untrusted import outgoing
from tracker.errors import DraftboardError

REQUEST_TIMEOUT_S = 600.0  # one completion of a long prompt on a slow box
MAX_RESPONSE_BYTES = 64 << 20  # a reply holds ids and counts; anything larger is not an engine's answer


class EngineError(DraftboardError):
    """The engine cannot be used as asked (unreachable, wrong model, no speculative decoding)."""


@dataclass(frozen=True)
class EngineRequest:
    """What every request asks an engine for: the protocol's decoding settings, in the engines' own
    convention (top_k -1: off, as vLLM and SGLang spell it). The eval's `evaluators.sampling.Sampling`
    says 0 for off; `of` converts at this boundary, the one place the two conventions meet."""

    max_tokens: int
    stop_token_ids: tuple[int, ...]
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off (vLLM's and SGLang's spelling)

    @classmethod
    def of(cls, sampling, max_tokens: int, stop_token_ids) -> EngineRequest:
        """From an `evaluators.sampling.Sampling` (top_k 0: all) and the protocol's lengths and stops."""
        return cls(max_tokens=max_tokens, stop_token_ids=tuple(stop_token_ids), temperature=sampling.temperature,
                   top_p=sampling.top_p, top_k=sampling.top_k or -1)


@dataclass
class EngineInfo:
    """What the server says it serves (results `engine`). `settings` holds what it reports of its
    numerics and caches (dtype, prefix/radix caching, CUDA graphs, attention backend, SSM dtype)."""

    name: str
    version: str | None
    url: str
    model: str | None  # the served target, as the server names it
    draft_model: str | None  # None: the server does not report it
    method: str | None
    num_speculative_tokens: int | None
    aux_layers: list[int] | None = None  # the target layers the engine taps for the drafter
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "url": self.url, "model": self.model,
                "draft_model": self.draft_model, "method": self.method,
                "num_speculative_tokens": self.num_speculative_tokens, "aux_layers": self.aux_layers,
                **self.settings}


@dataclass
class EngineReply:
    """One request's completion and its speculative-decoding counts, as the engine counted them."""

    completion_ids: list[int]
    drafts: int  # verify steps that carried a draft
    draft_tokens: int
    accepted: int  # accepted draft tokens (the bonus token not included)
    histogram: list[int] | None  # histogram[j]: steps that accepted exactly j draft tokens; None: not reported
    accepted_per_step: list[int] | None = None  # ordered, where the engine reports steps
    source: str = ""  # which of the engine's reports the counts came from
    reported_mean: float | None = None  # the engine's own per-request number, under its own definition
    timings: dict[str, float] = field(default_factory=dict)  # the engine's own per-request timings (TIMINGS)

    def __post_init__(self):
        # Each verify step adds at least one token to the completion: counts past its length are not an
        # engine's, and are refused before anything is built from them (a list of 10^9 steps).
        n = len(self.completion_ids)
        if (min(self.drafts, self.draft_tokens, self.accepted) < 0 or max(self.drafts, self.accepted) > n
                or self.histogram is not None and (len(self.histogram) > n + 1 or min(self.histogram, default=0) < 0)
                or self.accepted_per_step is not None and len(self.accepted_per_step) > n):
            raise EngineError(f"the engine's counts ({self.source}) are more than its completion allows: "
                              f"{self.drafts} verify steps and {self.accepted} accepted tokens for {n} tokens "
                              "generated; refused")
        if self.accepted_per_step is not None and (len(self.accepted_per_step) != self.drafts
                                                   or sum(self.accepted_per_step) != self.accepted):
            raise EngineError(f"the engine's counts disagree ({self.source}): {self.drafts} drafts and "
                              f"{self.accepted} accepted tokens, but per step {self.accepted_per_step}")
        if self.histogram is not None and (sum(self.histogram) != self.drafts
                                           or sum(j * c for j, c in enumerate(self.histogram)) != self.accepted):
            raise EngineError(f"the engine's counts disagree ({self.source}): {self.drafts} drafts and "
                              f"{self.accepted} accepted tokens, but a histogram of {self.histogram}")

    @property
    def accepted_by_position(self) -> list[int] | None:
        """accepted_by_position[k]: steps whose draft token k+1 was accepted (a chain accepts a prefix)."""
        if self.histogram is None:
            return None
        return em.positions_from_histogram(self.histogram)

    @property
    def steps_multiset(self) -> list[int] | None:
        """Each step's accepted count: in order where the engine reports steps, else from the histogram
        (in count order: what a per-block comparison cannot use, but means and histograms can)."""
        if self.accepted_per_step is not None:
            return list(self.accepted_per_step)
        if self.histogram is None:
            return None
        return [j for j, c in enumerate(self.histogram) for _ in range(c)]


@dataclass(frozen=True)
class InFlightCounts:
    """One request's own counts while others are in flight (a load sweep): what its reply says. `steps` is
    None where the reply does not count verify steps (llama.cpp: drafted and accepted tokens only); a
    level's steps then come from the server's counters (evaluators.engines.load)."""

    completion_ids: list[int]
    steps: int | None
    draft_tokens: int
    accepted: int
    timings: dict[str, float]
    accepted_per_step: list[int] | None = None  # in order, where the reply lists its steps (vLLM detailed)

    @classmethod
    def of(cls, reply: EngineReply) -> InFlightCounts:
        return cls(reply.completion_ids, reply.drafts, reply.draft_tokens, reply.accepted, reply.timings,
                   reply.accepted_per_step)


def engine_timings(found: Any, names: tuple[str, ...]) -> dict[str, float]:
    """The named per-request timings an engine's reply carries (its own fields, its own definitions: the
    results' `definitions` say which), finite and non-negative; what is missing or not a number is left out."""
    if not isinstance(found, dict):
        return {}
    out = {}
    for name in names:
        value = found.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e12:
            out[name] = float(value)
    return out


class EngineClient(ABC):
    """One engine's HTTP API. Each engine's module (`vllm`, `sglang`) also holds what a managed server
    needs: `server_argv`, `server_env`, `managed_settings` and `aux_layers_from_log`; and, for hybrid
    targets, `PREFIX_CACHE_OFF` (how to turn off what `engine_metrics.prefix_cache` reads), `GDN_PROBE` (Python
    run in the engine's own interpreter that names what its code runs for each Gated DeltaNet piece;
    None: unknown), `settings_from_log` and `gdn_functions_from_log` (what it logged at start)."""

    name: str
    cross_check = False  # managed servers: check each reply's counts against the server's own counters

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    @abstractmethod
    def info(self) -> EngineInfo:
        """What the server serves; EngineError if it is not up or has no speculative decoding."""

    @abstractmethod
    def generate(self, input_ids: list[int], request: EngineRequest) -> EngineReply:
        """One completion of token ids, with the engine's counts for exactly this request."""

    def counters(self) -> em.SpecTotals | None:
        """The server's spec-decode counters now (summed over its engines); None where it exposes none."""
        return None

    @property
    def counts_per_request(self) -> bool:
        """Whether each reply carries that request's own counts, whatever else is in flight (a load sweep
        needs them); an engine whose counts come from counter deltas has them only at concurrency 1."""
        return False

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """The server's prefix cache counters now, (tokens queried, tokens found cached); None where it has none."""
        return None

    def generate_in_flight(self, input_ids: list[int], request: EngineRequest) -> InFlightCounts:
        """One completion with other requests in flight: its reply's own counts, no counter deltas."""
        if not self.counts_per_request:
            raise EngineError(f"{self.name} at {self.url} gives no per-request counts with other requests in flight")
        return InFlightCounts.of(self.generate(input_ids, request))

    def complete(self, input_ids: list[int], request: EngineRequest) -> list[int]:
        """One completion's token ids from a server without a drafter (a load sweep's target alone)."""
        raise EngineError(f"{self.name}: draftboard does not serve the target alone on this engine")

    def get_json(self, path: str, timeout: float = 30.0) -> Any:
        return json.loads(self._call(path, None, timeout) or b"null")

    def post_json(self, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        return json.loads(self._call(path, json.dumps(body).encode(), timeout) or b"null")

    def get_text(self, path: str, timeout: float = 30.0) -> str:
        return self._call(path, None, timeout).decode("utf-8", "replace")

    def _call(self, path: str, data: bytes | None, timeout: float) -> bytes:
        request = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET",
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with outgoing.open_url(request, timeout) as response:  # http(s) only: run.py
                body = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace").strip().replace("\n", " ")
            raise EngineError(f"{self.name} at {self.url}{path}: HTTP {exc.code}: {detail[:300]}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EngineError(f"{self.name} at {self.url}{path}: {reason}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise EngineError(f"{self.name} at {self.url}{path}: a reply over {MAX_RESPONSE_BYTES >> 20} MiB")
        return body


def reply_from_deltas(ids: list[int], before: em.SpecTotals | None, after: em.SpecTotals, source: str) -> EngineReply:
    """One request's counts as the change of the server's spec-decode counters around it (exact at
    concurrency 1, with no other client); the histogram follows from the per-position counts."""
    n = max(after.by_position, default=-1) + 1
    by_pos = [round(after.by_position.get(k, 0.0) - (before.by_position.get(k, 0.0) if before else 0.0))
              for k in range(n)]
    drafts = round(after.drafts - (before.drafts if before else 0.0))
    return EngineReply(completion_ids=ids, drafts=drafts,
                       draft_tokens=round(after.draft_tokens - (before.draft_tokens if before else 0.0)),
                       accepted=round(after.accepted - (before.accepted if before else 0.0)),
                       histogram=em.histogram_from_positions(drafts, by_pos), source=source)
