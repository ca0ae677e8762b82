"""Acceptance by context length: the curve one mean tau hides (docs/DESIGN.md, "Load, context and families").

- The context length of a block = the tokens before its first drafted position: the prompt's tokens + the
  completion's up to and including the block's anchor. Along a walk, block i's anchor is completion token
  sum(lengths[:i]) (the first completion token comes from the target's prefill), so its context is
  prompt_len + 1 + sum(lengths[:i]); an engine's steps the same with each step's accepted + 1; every anchor
  of the all-anchors statistic (anchor a) prompt_len + 1 + a.
- Buckets [from, to) from sorted edges, the last open ([last edge, ∞): `to` null). Per bucket: `blocks` (the
  blocks whose context lies in it), `tau` = their acceptance lengths summed / `blocks` (pooled over
  prompts; null with no block), `ci` its 95% percentile bootstrap interval over prompts.
- A sampled eval's curves are expectations, like its tau: each block weighted by the probability that its walk
  puts it there (`blocks` then is their expected number, `tau` expected tokens / expected blocks per bucket).
- Default edges when none are given: 0 and the powers of two from the shortest context's up to the
  longest's, so every bucket holds blocks of one octave of context.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

from tracker.config import MAX_CONTEXT_BUCKETS as MAX_BUCKETS
from tracker.config import MAX_CONTEXT_EDGE as MAX_EDGE
from tracker.measurement.uncertainty import LEVEL, paired_pooled, pooled_interval

# One prompt's blocks: (context lengths, acceptance lengths) or, weighted by each block's probability, (..., weights)
Blocks = tuple[Sequence[int], Sequence[float]] | tuple[Sequence[int], Sequence[float], Sequence[float]]
MIN_PROMPTS = 4  # a bucket's paired comparison needs this many prompts with blocks there on both sides
DEFINITION = ("per bucket [from, to) of context length (prompt tokens + completion tokens up to and including a "
              "block's anchor): the acceptance lengths of the blocks whose context lies in it, summed / their count "
              "(`blocks`), pooled over prompts; `ci` a 95% percentile bootstrap over prompts; the last bucket open")


def walk_contexts(prompt_len: int, lengths: Sequence[int]) -> list[int]:
    """Each block's context length along a walk (or an engine's ordered steps) of `lengths`."""
    out, done = [], 0
    for length in lengths:
        out.append(prompt_len + 1 + done)
        done += length
    return out


def anchor_contexts(prompt_len: int, n_anchors: int) -> list[int]:
    """The context length at each anchor of a completion (the all-anchors statistic)."""
    return [prompt_len + 1 + a for a in range(n_anchors)]


def default_edges(contexts: Iterable[int]) -> tuple[int, ...]:
    """0 and the powers of two from the shortest context's octave up to the longest's."""
    found = [c for c in contexts if c > 0]
    if not found:
        return (0,)
    low, high = min(found), max(found)
    edges, edge = [0], 1 << max(0, low.bit_length() - 1)
    while edge <= high and edge <= MAX_EDGE:
        if edge > 0:
            edges.append(edge)
        edge <<= 1
    return tuple(sorted(set(edges)))


def check_edges(edges: Sequence[int]) -> tuple[int, ...]:
    """Edges as given by --context-buckets: sorted, unique, 0..MAX_EDGE, at most MAX_BUCKETS; ValueError otherwise."""
    if not edges or len(edges) > MAX_BUCKETS or not all(
            isinstance(e, int) and not isinstance(e, bool) and 0 <= e <= MAX_EDGE for e in edges):
        raise ValueError(f"context bucket edges must be 1 to {MAX_BUCKETS} integers from 0 to {MAX_EDGE}, got "
                         f"{list(edges)[:8]}{' ...' if len(edges) > 8 else ''}")
    return tuple(sorted(set(edges)))


def by_walks(walks: Sequence[tuple[int, Sequence[int]]], edges: Sequence[int]) -> tuple[tuple[int, ...], list[dict]]:
    """(the edges used, the rows) of walks given per prompt as (prompt length, acceptance lengths in order):
    `edges`, or octaves of the walks' contexts when none are given."""
    pairs = [(walk_contexts(n, lengths), lengths) for n, lengths in walks]
    edges = tuple(edges) or default_edges(c for contexts, _ in pairs for c in contexts)
    return edges, by_context(pairs, edges)


def totals(prompts: Sequence[Blocks], edges: Sequence[int]
           ) -> tuple[list[tuple[int, int | None]], list[list[float]], list[list[float]]]:
    """The buckets' bounds and, per bucket, each prompt's summed acceptance lengths and its block count there
    ([bucket][prompt] each), from each prompt's (context lengths, acceptance lengths[, weights]) of its blocks: a
    weight is the block's probability (a sampled eval's expectation), 1 when none is given."""
    edges = check_edges(edges)
    bounds = list(zip(edges, [*edges[1:], None]))
    sums = [[0.0] * len(prompts) for _ in bounds]  # [bucket][prompt]
    counts = [[0.0] * len(prompts) for _ in bounds]
    for p, (contexts, lengths, *weights) in enumerate(prompts):
        for context, length, weight in zip(contexts, lengths, weights[0] if weights else itertools.repeat(1.0)):
            b = bisect.bisect_right(edges, context) - 1  # the bucket [edges[b], edges[b + 1])
            if b >= 0:
                sums[b][p] += weight * length
                counts[b][p] += weight
    return bounds, sums, counts


def by_context(prompts: Sequence[Blocks], edges: Sequence[int]) -> list[dict]:
    """One row per bucket from each prompt's (context lengths, acceptance lengths[, weights]) of its blocks;
    weighted, `blocks` is their expected number."""
    bounds, sums, counts = totals(prompts, edges)
    rows = []
    for (low, high), s, c in zip(bounds, sums, counts):
        interval = pooled_interval(s, c) if prompts else None
        blocks = sum(c)
        rows.append({"from": low, "to": high, "blocks": int(blocks) if blocks == int(blocks) else round(blocks, 3),
                     "tau": interval.value if interval else None, "ci": interval.bounds() if interval else None})
    return rows


def paired_by_walks(a: Sequence[tuple[int, Sequence[int]]], b: Sequence[tuple[int, Sequence[int]]],
                    edges: Sequence[int], *, level: float = LEVEL) -> tuple[tuple[int, ...], list[dict]]:
    """B against A bucket by bucket: each side's walks per prompt as (prompt length, acceptance lengths in order),
    the same prompts in the same order; `edges`, or octaves of both sides' contexts. A bucket is compared where
    at least MIN_PROMPTS prompts have a block there on both sides, its Δ's interval at 1 - (1 - level) / k over
    the k buckets compared (Bonferroni: all k together are wrong at most 1 - level of the time). Rows {from, to,
    blocks_a, blocks_b, tau_a, tau_b, delta, ci, n_prompts, verdict}, the last four None where not compared."""
    if len(a) != len(b):
        raise ValueError(f"paired walks need the same prompts on both sides ({len(a)} vs {len(b)})")
    sides = [[(walk_contexts(n, lengths), lengths) for n, lengths in walks] for walks in (a, b)]
    edges = tuple(edges) or default_edges(c for side in sides for contexts, _ in side for c in contexts)
    (bounds, sa, ca), (_, sb, cb) = totals(sides[0], edges), totals(sides[1], edges)
    compared = [sum(x > 0 and y > 0 for x, y in zip(ca[k], cb[k])) >= MIN_PROMPTS for k in range(len(bounds))]
    k_level = 1.0 - (1.0 - level) / max(1, sum(compared))
    rows = []
    for k, (low, high) in enumerate(bounds):
        pair = paired_pooled((sa[k], ca[k]), (sb[k], cb[k]), level=k_level) if compared[k] else None
        rows.append({"from": low, "to": high, "blocks_a": int(sum(ca[k])), "blocks_b": int(sum(cb[k])),
                     "tau_a": sum(sa[k]) / sum(ca[k]) if sum(ca[k]) else None,
                     "tau_b": sum(sb[k]) / sum(cb[k]) if sum(cb[k]) else None,
                     "delta": pair.delta.value if pair else None, "ci": pair.delta.bounds() if pair else None,
                     "n_prompts": pair.n_prompts if pair else None, "verdict": pair.verdict if pair else None})
    return edges, rows


def bucket_text(row: dict) -> str:
    """`[512, 2048)` / `[8192, ∞)`: a bucket as the dashboard, the CLI and an alert name it."""
    return f"[{row.get('from')}, {'∞' if row.get('to') is None else row.get('to')})"


def results_walks(results: dict) -> dict[str, tuple[int, list[int]]] | None:
    """A results JSON's walks in the order walked, by prompt id: (prompt length, acceptance lengths); None when a
    prompt has no such walk (a sampled eval's draws, an engine that reported only a histogram, no token ids).
    Results are untrusted: anything else than lists of integers is no walk."""
    walks = {}
    for row in results.get("prompts") or () if isinstance(results, dict) else ():
        ids, lengths = (row.get("input_ids"), row.get("acceptance_lengths")) if isinstance(row, dict) else (None, None)
        if (not isinstance(ids, list) or not isinstance(lengths, list) or row.get("engine_steps_ordered") is False
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in lengths)):
            return None
        walks[str(row.get("id"))] = (len(ids), lengths)
    return walks or None


def results_edges(results: dict) -> tuple[int, ...]:
    """The edges an eval's curves were bucketed by (`context_buckets`), or () when it names none usable."""
    try:
        return check_edges(results.get("context_buckets") or ())
    except (ValueError, AttributeError, TypeError):
        return ()
