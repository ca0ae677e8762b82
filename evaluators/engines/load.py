"""A load sweep (`draftboard eval --engine vllm ... --concurrency 1,4,8`): the eval's prompts served with
that many requests in flight, level by level, with the drafter and then with the target alone, into the
results' `load` section (docs/DESIGN.md, "Load sweeps").

- In flight: at a level of c, c client threads take the prompts in order, each sending its next request as
  soon as its last one returned, so c requests are in flight until fewer than c prompts are left. The
  server has as many slots as the largest level (vLLM `--max-num-seqs`).
- Counts: each request's own, from its reply (vLLM `--per-request-spec-decode-metrics detailed` gives them
  per request at any concurrency; llama.cpp's `timings` its drafted and accepted tokens, not its verify
  steps); around the whole level the engine's counters must move by exactly their sum (managed: no other
  client), or the level is refused, as a single request is at concurrency 1. Where replies carry no steps,
  the level's steps are the counters' move (managed servers only: config.load_problem).
- Speed: a level's tokens/s = its completion tokens / its wall time (first request sent to last reply);
  each request's latency and tokens/s beside. The target alone is the same prompts at the same level on the
  same server settings without the drafter, started after; speedup = tokens/s with the drafter / without.
  The box's 1-minute load average is recorded with each arm: a busy box moves both. Its two parts: the
  served acceptance length (tokens per verify step) and the step cost = acceptance length / speedup (a
  speculative step's time over a plain decode step's, as the two arms' wall clocks imply), so
  speedup = acceptance length / step cost; the break-even concurrency is where speedup crosses 1
  between two measured levels (linear in the level).
- Flags per request (`flags`): a greedy completion that differs from the same prompt's at concurrency 1
  or from the target alone's at the same level (first differing token), counts that differ from
  concurrency 1's (batch composition moved acceptance: vLLM RFC #54506), and the collapse signature
  (nothing accepted over at least COLLAPSE_STEPS steps where concurrency 1 accepted at least COLLAPSE_FLOOR
  per step: SGLang #36537, vLLM #53919), with the cache settings that were on.
- Prefix cache (`--prefix-caching`, managed vLLM; any server whose counters say): each level's hit rate, prompt
  tokens found cached / looked up, from the engine's own counters around the level.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from evaluators.engines.base import EngineClient, EngineError, EngineReply, EngineRequest, InFlightCounts

COLLAPSE_STEPS = 4  # verify steps without one accepted token: not a hard prompt's bad luck
COLLAPSE_FLOOR = 0.5  # ... where the same prompt accepted at least this many tokens per step at concurrency 1
# The results' `definitions` of the `load` section's numbers.
DEFINITIONS = {
    "load.engine_mean_acceptance_length": "1 + the level's accepted draft tokens / its verify steps, pooled over its "
                                          "requests (each request's own counts)",
    "load.tokens_per_s": "completion tokens of the level's requests / the level's wall time (first request sent to "
                         "last reply), drafter on, `concurrency` requests in flight",
    "load.tokens_per_s_target_alone": "the same prompts at the same level on the same server settings without the "
                                      "drafter, started after the drafter's (managed servers only)",
    "load.speedup": "tokens_per_s / tokens_per_s_target_alone, both from this eval",
    "load.step_cost": "engine_mean_acceptance_length / speedup: a speculative step's time over a plain decode "
                      "step's, as the two arms' wall clocks imply (speedup = acceptance length / step cost)",
    "load_break_even_concurrency": "where speedup crosses 1 between two measured levels, linear in the level "
                                   "(null: it does not cross inside them)",
    "load.prefix_cache_hit_rate": "prompt tokens the engine found in its prefix cache / prompt tokens it looked up, "
                                  "over the level (vLLM's prefix_cache_hits / prefix_cache_queries counters; null "
                                  "where the engine counts none or looked nothing up); `_target_alone` the same "
                                  "for the target alone's server",
    "load.prompts.engine_drafts": "the request's verify steps, from its reply; null where the engine's reply does "
                                  "not count steps (llama.cpp: the level's steps are its counters' move, "
                                  "`engine_steps`)",
    "load.prompts.engine_accepted_per_step": "the request's accepted draft tokens at each verify step, in order, "
                                             "where the engine's reply lists them (vLLM detailed); null otherwise",
    "load.prompts.engine_timings": "the engine's own per-request timings under its own names and definitions, "
                                   "milliseconds (vLLM --enable-per-request-metrics: time_to_first_token_ms, "
                                   "mean_itl_ms, queue_time_ms, generation_time_ms; llama.cpp timings: "
                                   "prompt_ms, predicted_per_token_ms, predicted_ms); latency_s and tokens_per_s "
                                   "beside them are draftboard's, from send to reply",
}
CACHE_SETTINGS = ("enable_prefix_caching", "mamba_cache_mode", "disable_radix_cache", "radix_cache_strategy",
                  "cache_prompt")


@dataclass(frozen=True)
class Request:
    """One prompt of the sweep: what is sent, and what concurrency 1 (the eval's own pass) got for it."""

    id: str
    input_ids: list[int]
    alone: EngineReply  # its reply at concurrency 1


@dataclass
class Served:
    """One request at one level: its own counts (None for the target alone: ids only) and its time."""

    id: str
    completion_ids: list[int]
    counts: InFlightCounts | None
    latency_s: float


@dataclass
class Arm:
    """One level of one arm (drafter on, or the target alone): every request, the level's wall time, and
    (drafter on) its verify steps: the requests' own summed, else the server's counters' move."""

    served: list[Served]
    wall_s: float
    load_average_1m: float
    steps: int | None = None
    prefix_cache: tuple[float, float] | None = None  # (tokens queried, found cached) over the level; None: no counters

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.served)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache / looked up, over the level; None without the counters."""
        return self.prefix_cache[1] / self.prefix_cache[0] if self.prefix_cache and self.prefix_cache[0] else None


def in_flight(requests: Sequence[Request], level: int, send: Callable[[Request], tuple[list[int], InFlightCounts | None]],
              progress: Callable[[int], None]) -> Arm:
    """`requests` through `send` with `level` in flight; the served requests in the prompts' order."""
    load = os.getloadavg()[0]
    done, lock = [0], threading.Lock()

    def one(r: Request) -> Served:
        t0 = time.perf_counter()
        ids, counts = send(r)
        served = Served(r.id, ids, counts, time.perf_counter() - t0)
        with lock:
            done[0] += 1
            progress(done[0])
        return served

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=level, thread_name_prefix=f"load-{level}") as pool:
        served = list(pool.map(one, requests))  # the first failure is raised here, the rest still finish
    return Arm(served, time.perf_counter() - start, load)


def check_totals(client: EngineClient, before, arm: Arm, level: int) -> int:
    """The engine's counters moved around the level by exactly the sum of its requests' own counts (steps
    where the replies count them); the level's verify steps."""
    after = client.counters()
    if before is None or after is None:
        raise EngineError(f"{client.name} at {client.url} exposes no spec-decode counters to check concurrency "
                          f"{level} against")
    moved = tuple(round(getattr(after, k) - getattr(before, k)) for k in ("drafts", "draft_tokens", "accepted"))
    own = [s.counts for s in arm.served]
    steps = [c.steps for c in own]
    summed = (sum(steps) if None not in steps else moved[0], sum(c.draft_tokens for c in own),
              sum(c.accepted for c in own))
    if summed != moved:
        raise EngineError(f"at concurrency {level} the requests' own counts (steps, draft tokens, accepted) sum to "
                          f"{summed}, but {client.name}'s counters moved by {moved}: refused, not averaged (another "
                          "client on this server, or counts given to the wrong request)")
    return moved[0]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if a == b else n


def _compared(c: InFlightCounts, alone: EngineReply) -> tuple[str, int, int]:
    """What a request's counts are compared with concurrency 1's by: verify steps where its reply counts
    them, else drafted tokens; (name, here, at concurrency 1)."""
    if c.steps is not None:
        return "steps", c.steps, alone.drafts
    return "draft_tokens", c.draft_tokens, alone.draft_tokens


def _collapsed(c: InFlightCounts, alone: EngineReply) -> bool:
    """Nothing accepted over at least COLLAPSE_STEPS steps (drafted tokens / concurrency 1's per step where
    the reply counts no steps), where concurrency 1 accepted at least COLLAPSE_FLOOR per step."""
    if c.accepted or not alone.drafts or alone.accepted / alone.drafts < COLLAPSE_FLOOR:
        return False
    steps = c.steps if c.steps is not None else c.draft_tokens / (alone.draft_tokens / alone.drafts)
    return steps >= COLLAPSE_STEPS


def flags(requests: Sequence[Request], level: int, arm: Arm, alone: Arm | None, greedy: bool,
          cache: dict) -> list[dict]:
    """What each request of a level shows against concurrency 1 and the target alone (see the module)."""
    out: list[dict] = []
    others = {s.id: s for s in alone.served} if alone else {}
    for r, s in zip(requests, arm.served):
        c = s.counts
        if greedy and level > 1:
            first = _first_difference(s.completion_ids, r.alone.completion_ids)
            kind, here, there = _compared(c, r.alone)
            if first is not None:
                out.append({"id": r.id, "flag": "completion differs from concurrency 1", "first_difference": first})
            elif (here, c.accepted) != (there, r.alone.accepted):
                out.append({"id": r.id, "flag": "counts differ from concurrency 1",
                            kind: [here, there], "accepted": [c.accepted, r.alone.accepted]})
        if greedy and s.id in others:
            first = _first_difference(s.completion_ids, others[s.id].completion_ids)
            if first is not None:
                out.append({"id": r.id, "flag": "completion differs from the target alone", "first_difference": first})
        if _collapsed(c, r.alone):
            out.append({"id": r.id, "flag": "acceptance collapse", "steps": c.steps, "draft_tokens": c.draft_tokens,
                        "accepted_per_step_at_concurrency_1": round(r.alone.accepted / r.alone.drafts, 4),
                        "cache": {k: cache[k] for k in CACHE_SETTINGS if k in cache}})
    return out


def level_record(level: int, arm: Arm, alone: Arm | None, found: list[dict], checked: bool) -> dict:
    """One object of the results' `load` list (docs/DESIGN.md, "Load sweeps")."""
    accepted = sum(s.counts.accepted for s in arm.served)
    steps = arm.steps
    alone_tps = alone.tokens_per_s if alone else None
    tau = 1 + accepted / steps if steps else 1.0
    speedup = arm.tokens_per_s / alone_tps if alone_tps else None
    return {
        "concurrency": level,
        "prompts": [{"id": s.id, "engine_drafts": s.counts.steps, "engine_draft_tokens": s.counts.draft_tokens,
                     "engine_accepted": s.counts.accepted, "engine_accepted_per_step": s.counts.accepted_per_step,
                     "completion_ids": s.completion_ids,
                     "latency_s": s.latency_s,
                     "tokens_per_s": len(s.completion_ids) / s.latency_s if s.latency_s > 0 else None,
                     "engine_timings": s.counts.timings}
                    for s in arm.served],
        "engine_steps": steps, "engine_mean_acceptance_length": tau,
        "completion_tokens": arm.completion_tokens, "wall_s": arm.wall_s, "tokens_per_s": arm.tokens_per_s,
        "tokens_per_s_target_alone": alone_tps, "speedup": speedup,
        "step_cost": tau / speedup if speedup else None,
        "wall_s_target_alone": alone.wall_s if alone else None,
        "load_average_1m": arm.load_average_1m,
        "load_average_1m_target_alone": alone.load_average_1m if alone else None,
        "counters_checked": checked,
        "prefix_cache_hit_rate": arm.prefix_cache_hit_rate,
        "prefix_cache_hit_rate_target_alone": alone.prefix_cache_hit_rate if alone else None,
        "flags": found,
    }


def break_even(records: Sequence[dict]) -> float | None:
    """The concurrency where speedup crosses 1 between two measured levels (linear in the level); None
    where every measured pair stays on one side (or speedup was not measured)."""
    points = sorted((r["concurrency"], r["speedup"]) for r in records if r.get("speedup") is not None)
    for (c0, s0), (c1, s1) in zip(points, points[1:]):
        if s0 >= 1 >= s1 and s0 > s1:
            return c0 + (1 - s0) * (c1 - c0) / (s1 - s0)
    return None


def requests_of(prompts, replies: Sequence[EngineReply]) -> list[Request]:
    return [Request(p.id, p.input_ids, r) for p, r in zip(prompts, replies)]


def drafter_arm(client: EngineClient, requests: Sequence[Request], request: EngineRequest, level: int,
                checked: bool, progress: Callable[[int], None]) -> Arm:
    """One level with the drafter: each request's own counts; the level's totals checked against the
    server's counters where no other client can move them (`checked`)."""
    if level > 1 and not client.counts_per_request:
        raise EngineError(f"{client.name} at {client.url} gives no per-request counts at concurrency {level} (only "
                          "counter deltas, exact one request at a time): start vLLM with "
                          "--per-request-spec-decode-metrics detailed")
    before = client.counters() if checked else None

    def send(r: Request) -> tuple[list[int], InFlightCounts]:
        counts = client.generate_in_flight(r.input_ids, request)
        return counts.completion_ids, counts

    arm = _cached(client, lambda: in_flight(requests, level, send, progress))
    if checked:
        arm.steps = check_totals(client, before, arm, level)
    else:
        steps = [s.counts.steps for s in arm.served]
        if None in steps:
            raise EngineError(f"{client.name} at {client.url}: its replies count no verify steps, and its counters "
                              "are not this eval's alone: the level's acceptance cannot be known")
        arm.steps = sum(steps)
    return arm


def target_arm(client: EngineClient, requests: Sequence[Request], request: EngineRequest, level: int,
               progress: Callable[[int], None]) -> Arm:
    """One level of the target alone: completions, time and the prefix cache's hits."""
    return _cached(client, lambda: in_flight(requests, level, lambda r: (client.complete(r.input_ids, request), None),
                                             progress))


def _cached(client: EngineClient, run: Callable[[], Arm]) -> Arm:
    """`run`'s arm with what the server's prefix cache counted around it (tokens looked up, found)."""
    before = client.prefix_cache_counters()
    arm = run()
    after = client.prefix_cache_counters()
    if before is not None and after is not None:
        arm.prefix_cache = (after[0] - before[0], after[1] - before[1])
    return arm
