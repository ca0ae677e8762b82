"""A load sweep (`draftboard eval --engine vllm ... --concurrency 1,4,8`): the eval's prompts served with
that many requests in flight, level by level, with the drafter and with the target alone in interleaved
rounds, into the results' `load` section (docs/DESIGN.md, "Load sweeps").

- In flight: at a level of c, c client threads take the prompts in order, each sending its next request as
  soon as its last one returned, so c requests are in flight until fewer than c prompts are left. The
  server has as many slots as the largest level (vLLM `--max-num-seqs`).
- Counts: each request's own, from its reply (vLLM `--per-request-spec-decode-metrics detailed` gives them
  per request at any concurrency; llama.cpp's `timings` its drafted and accepted tokens, not its verify
  steps); around the whole level the engine's counters must move by exactly their sum (managed: no other
  client), or the level is refused, as a single request is at concurrency 1 (every round is checked). Where replies carry no steps,
  the level's steps are the counters' move (managed servers only: config.load_problem).
- Rounds: both arms' servers are up at once (the target alone on the same server settings without the
  drafter). At each level each arm first serves the prompts once untimed (a level's first batch shapes are
  slow on a fresh server: 3x at 4 and 8 in flight on vLLM's CPU backend), then `repeats` rounds of both arms,
  the drafter first in odd rounds, second in even ones (A B, B A, ...), each timed window once the other arm's
  server is quiet (evaluators.engines.busy.settle: vLLM spins a second after its last request). Inside a timed
  window is nothing but the requests: counters, cache counters and the box's load are read before it starts and
  after its last reply.
- Speed: a round's tokens/s = its completion tokens / its wall time (first request sent to last reply);
  each request's latency and tokens/s beside (first round). A level's tokens/s is the median over its
  rounds; speedup = median with the drafter / median without, with a 95% bootstrap interval over rounds
  (`uncertainty.ratio_of_medians`: a round's two arms drawn together). The box's 1-minute load average and
  other programs' CPU (evaluators.engines.busy) are recorded per round, a round they slowed flagged busy. Its
  two parts: the served acceptance length (tokens per verify step) and the step cost = acceptance length /
  speedup (a speculative step's time over a plain decode step's, as the two arms' wall clocks imply), so
  speedup = acceptance length / step cost; the break-even concurrency is where speedup crosses 1 between
  two measured levels (linear in the level).
- Flags per request (`flags`, on the first round): a greedy completion that differs from the same prompt's at
  concurrency 1 or from the target alone's at the same level (first differing token), counts that differ from
  concurrency 1's (batch composition moved acceptance: vLLM RFC #54506), a later round's completion or counts
  that differ from the first round's, and the collapse signature
  (nothing accepted over at least COLLAPSE_STEPS steps where concurrency 1 accepted at least COLLAPSE_FLOOR
  per step: SGLang #36537, vLLM #53919), with the cache settings that were on.
- Prefix cache (`--prefix-caching`, managed vLLM; any server whose counters say): each level's hit rate, prompt
  tokens found cached / looked up, from the engine's own counters around its timed rounds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from evaluators.engines import busy
from evaluators.engines.base import EngineClient, EngineError, EngineReply, EngineRequest, InFlightCounts
from tracker.measurement.uncertainty import ratio_of_medians

COLLAPSE_STEPS = 4  # verify steps without one accepted token: not a hard prompt's bad luck
COLLAPSE_FLOOR = 0.5  # ... where the same prompt accepted at least this many tokens per step at concurrency 1
# The results' `definitions` of the `load` section's numbers.
DEFINITIONS = {
    "load.engine_mean_acceptance_length": "1 + the level's accepted draft tokens / its verify steps, pooled over its "
                                          "requests (each request's own counts)",
    "load.tokens_per_s": "the median over the level's rounds of completion tokens / the round's wall time (first "
                         "request sent to last reply), drafter on, `concurrency` requests in flight",
    "load.tokens_per_s_target_alone": "the same for the same prompts at the same level on the same server settings "
                                      "without the drafter, its rounds interleaved with the drafter's (managed "
                                      "servers only)",
    "load.speedup": "tokens_per_s / tokens_per_s_target_alone (the ratio of the two arms' medians), both from this "
                    "eval",
    "load.speedup_ci": "95% percentile bootstrap interval of the speedup over rounds (a round's two arms drawn "
                       "together); as wide as the rounds moved",
    "load.rounds": "one per round, in the order run: each arm's tokens/s, the box's 1-minute load average (the "
                   "larger at the round's start and end) and other programs' CPU in cores (`others_cores`, all "
                   "but the sweep's servers and draftboard); `busy`: others took at least 0.5 cores (null: unknown, an "
                   "attached server's processes cannot be told from others'); the drafter's counts summed "
                   "(`engine_steps`, `engine_draft_tokens`, `engine_accepted`)",
    "load.warm_up": "the drafter's untimed pass at the level before its rounds, its counts summed (every request "
                    "the drafter's server answered is counted in the results)",
    "load.aborts": "each death of a managed server at this level ({server, exit_code, log_tail}): it was started "
                   "again and the level measured from its warm-up; counted here, never hidden by a lower level",
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
                                   "beside them are draftboard's, from send to reply (first round)",
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
    box: busy.Window  # what else ran on the box meanwhile
    steps: int | None = None
    prefix_cache: tuple[float, float] | None = None  # (tokens queried, found cached) over the level; None: no counters

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.completion_ids) for s in self.served)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0


def in_flight(requests: Sequence[Request], level: int, send: Callable[[Request], tuple[list[int], InFlightCounts | None]],
              progress: Callable[[int], None], groups: Collection[int] | None = None) -> Arm:
    """`requests` through `send` with `level` in flight; the served requests in the prompts' order. The box is
    sampled just outside the timed window (`groups`: the process groups of the servers the sweep started;
    None: it started none)."""
    before = busy.sample(groups)
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
    wall = time.perf_counter() - start
    return Arm(served, wall, busy.window(before, busy.sample(groups)))


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


def between_rounds(requests: Sequence[Request], rounds: Sequence[Arm], greedy: bool) -> list[dict]:
    """A later round's completion (greedy) or counts that differ from the first round's, per request."""
    out: list[dict] = []
    first = rounds[0].served
    for k, arm in enumerate(rounds[1:], 2):
        for r, a, b in zip(requests, first, arm.served):
            moved = _first_difference(b.completion_ids, a.completion_ids) if greedy else None
            if moved is not None:
                out.append({"id": r.id, "flag": "completion differs between rounds", "round": k,
                            "first_difference": moved})
            elif (b.counts.steps, b.counts.draft_tokens, b.counts.accepted) != \
                    (a.counts.steps, a.counts.draft_tokens, a.counts.accepted):
                out.append({"id": r.id, "flag": "counts differ between rounds", "round": k,
                            "accepted": [b.counts.accepted, a.counts.accepted]})
    return out


@dataclass
class Level:
    """One level's rounds, in the order run: the drafter's arm, and the target alone's (None: not served)."""

    concurrency: int
    drafted: list[Arm]
    alone: list[Arm] | None
    warm_up: Arm | None = None  # the drafter's untimed pass before the rounds
    aborts: list[dict] = field(default_factory=list)  # each server death at this level, before it was measured


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def level_record(level: Level, found: list[dict], checked: bool) -> dict:
    """One object of the results' `load` list (docs/DESIGN.md, "Load sweeps"): the first round's requests
    and counts, each arm's median over the rounds, the speedup with its interval, every round."""
    arm = level.drafted[0]
    accepted = sum(s.counts.accepted for s in arm.served)
    steps = arm.steps
    tau = 1 + accepted / steps if steps else 1.0
    tps = _median([a.tokens_per_s for a in level.drafted])
    alone_tps = _median([a.tokens_per_s for a in level.alone]) if level.alone else None
    ci = ratio_of_medians([a.tokens_per_s for a in level.drafted], [a.tokens_per_s for a in level.alone]) \
        if level.alone and all(a.tokens_per_s > 0 for a in level.alone) else None
    speedup = tps / alone_tps if alone_tps else None
    rounds = []
    for k, d in enumerate(level.drafted):
        a = level.alone[k] if level.alone else None
        load_1m = max(d.box.load_average_1m, a.box.load_average_1m if a else 0.0)
        others = [w.others_cores for w in (d.box, a.box if a else None) if w is not None]
        flagged = [w.busy for w in (d.box, a.box if a else None) if w is not None]
        rounds.append({"tokens_per_s": d.tokens_per_s, "tokens_per_s_target_alone": a.tokens_per_s if a else None,
                       "load_average_1m": load_1m,
                       "others_cores": None if None in others else max(others),
                       "busy": None if None in flagged else any(flagged), **_totals(d)})
    cached = [x.prefix_cache for x in level.drafted]
    cached_alone = [x.prefix_cache for x in level.alone or ()]
    return {
        "concurrency": level.concurrency,
        "prompts": [{"id": s.id, "engine_drafts": s.counts.steps, "engine_draft_tokens": s.counts.draft_tokens,
                     "engine_accepted": s.counts.accepted, "engine_accepted_per_step": s.counts.accepted_per_step,
                     "completion_ids": s.completion_ids,
                     "latency_s": s.latency_s,
                     "tokens_per_s": len(s.completion_ids) / s.latency_s if s.latency_s > 0 else None,
                     "engine_timings": s.counts.timings}
                    for s in arm.served],
        "engine_steps": steps, "engine_mean_acceptance_length": tau,
        "completion_tokens": arm.completion_tokens, "wall_s": _median([a.wall_s for a in level.drafted]),
        "tokens_per_s": tps, "tokens_per_s_target_alone": alone_tps, "speedup": speedup,
        "speedup_ci": [ci.low, ci.high] if ci else None,
        "step_cost": tau / speedup if speedup else None,
        "wall_s_target_alone": _median([a.wall_s for a in level.alone]) if level.alone else None,
        "load_average_1m": max(a.box.load_average_1m for a in level.drafted),
        "load_average_1m_target_alone": max(a.box.load_average_1m for a in level.alone) if level.alone else None,
        "rounds": rounds, "busy_rounds": sum(r["busy"] is True for r in rounds),
        "warm_up": _totals(level.warm_up) if level.warm_up else None,
        "aborts": level.aborts,
        "counters_checked": checked,
        "prefix_cache_hit_rate": _hit_rate(cached),
        "prefix_cache_hit_rate_target_alone": _hit_rate(cached_alone),
        "flags": found,
    }


def _totals(arm: Arm) -> dict:
    """A drafter pass's counts summed: its verify steps (the requests' own, else the counters' move), drafted
    and accepted tokens."""
    return {"engine_steps": arm.steps, "engine_draft_tokens": sum(s.counts.draft_tokens for s in arm.served),
            "engine_accepted": sum(s.counts.accepted for s in arm.served)}


def _hit_rate(counted: Sequence[tuple[float, float] | None]) -> float | None:
    """Prompt tokens found in the prefix cache / looked up over every round; None without the counters."""
    if not counted or None in counted:
        return None
    queried, found = sum(c[0] for c in counted), sum(c[1] for c in counted)
    return found / queried if queried else None


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
                checked: bool, progress: Callable[[int], None], groups: Collection[int] | None = None) -> Arm:
    """One round of a level with the drafter: each request's own counts; the round's totals checked against the
    server's counters where no other client can move them (`checked`)."""
    if level > 1 and not client.counts_per_request:
        raise EngineError(f"{client.name} at {client.url} gives no per-request counts at concurrency {level} (only "
                          "counter deltas, exact one request at a time): start vLLM with "
                          "--per-request-spec-decode-metrics detailed")
    before = client.counters() if checked else None

    def send(r: Request) -> tuple[list[int], InFlightCounts]:
        counts = client.generate_in_flight(r.input_ids, request)
        return counts.completion_ids, counts

    arm = _cached(client, lambda: in_flight(requests, level, send, progress, groups))
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
               progress: Callable[[int], None], groups: Collection[int] | None = None) -> Arm:
    """One round (or the warm-up) of a level on a server without the drafter: completions, time and the prefix
    cache's hits."""
    return _cached(client, lambda: in_flight(requests, level, lambda r: (client.complete(r.input_ids, request), None),
                                             progress, groups))


def rounds_at(requests: Sequence[Request], level: int, repeats: int, request: EngineRequest, drafter: EngineClient,
              alone: EngineClient | None, checked: bool, groups: Mapping[str, int] | None,
              progress: Callable[[str, int], None]) -> Level:
    """One level: each arm warmed up at it (untimed), then `repeats` rounds of both arms, the drafter first in
    odd rounds and second in even ones (A B, B A, A B, ...: each arm as often first, and half the switches between
    servers). Before each timed window the other arm's server is left to go quiet (`busy.settle`). `groups`: each
    arm's server's process group ("drafter", "alone"; None: servers the sweep did not start). `progress(what,
    done)` is told each request as it returns."""
    arms = ["drafter", *(["alone"] if alone else [])]
    every = list(groups.values()) if groups is not None else None

    def others(arm: str) -> list[int]:
        return [g for name, g in (groups or {}).items() if name != arm]

    # The drafter's warm-up is counted like a round (every request its server answered is in the results).
    warm = drafter_arm(drafter, requests, request, level, checked, lambda i: progress("drafter, warming up", i))
    if alone:
        target_arm(alone, requests, request, level, lambda i: progress("target alone, warming up", i))
    timed: dict[str, list[Arm]] = {name: [] for name in arms}
    for k in range(1, repeats + 1):
        for name in (arms if k % 2 else arms[::-1]):
            busy.settle(others(name))
            told = (lambda i, n=name: progress(f"round {k}/{repeats}, {NAMES[n]}", i))
            timed[name].append(drafter_arm(drafter, requests, request, level, checked, told, every)
                               if name == "drafter" else target_arm(alone, requests, request, level, told, every))
    return Level(level, timed["drafter"], timed["alone"] if alone else None, warm)


NAMES = {"drafter": "drafter", "alone": "target alone"}


def _cached(client: EngineClient, run: Callable[[], Arm]) -> Arm:
    """`run`'s arm with what the server's prefix cache counted around it (tokens looked up, found)."""
    before = client.prefix_cache_counters()
    arm = run()
    after = client.prefix_cache_counters()
    if before is not None and after is not None:
        arm.prefix_cache = (after[0] - before[0], after[1] - before[1])
    return arm
