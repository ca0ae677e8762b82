"""Acceptance by context length: the curve one mean tau hides (docs/DESIGN.md, "Load, context and families").

- The context length of a block = the tokens before its first drafted position: the prompt's tokens + the
  completion's up to and including the block's anchor. Along a walk, block i's anchor is completion token
  sum(lengths[:i]) (the first completion token comes from the target's prefill), so its context is
  prompt_len + 1 + sum(lengths[:i]); an engine's steps the same with each step's accepted + 1; every anchor
  of the all-anchors statistic (anchor a) prompt_len + 1 + a.
- Buckets [from, to) from sorted edges, the last open ([last edge, ∞): `to` null). Per bucket: `blocks` (the
  blocks whose context lies in it), `tau` = their acceptance lengths summed / `blocks` (pooled over
  prompts; null with no block), `ci` its 95% percentile bootstrap interval over prompts.
- Default edges when none are given: 0 and the powers of two from the shortest context's up to the
  longest's, so every bucket holds blocks of one octave of context.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from tracker.config import MAX_CONTEXT_EDGE as MAX_EDGE
from tracker.measurement.uncertainty import pooled_interval

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
    """Edges as given by --context-buckets: sorted, unique, 0..MAX_EDGE; ValueError otherwise."""
    if not edges or not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e <= MAX_EDGE for e in edges):
        raise ValueError(f"context bucket edges must be integers from 0 to {MAX_EDGE}, got {list(edges)[:8]}")
    return tuple(sorted(set(edges)))


def by_walks(walks: Sequence[tuple[int, Sequence[int]]], edges: Sequence[int]) -> tuple[tuple[int, ...], list[dict]]:
    """(the edges used, the rows) of walks given per prompt as (prompt length, acceptance lengths in order):
    `edges`, or octaves of the walks' contexts when none are given."""
    pairs = [(walk_contexts(n, lengths), lengths) for n, lengths in walks]
    edges = tuple(edges) or default_edges(c for contexts, _ in pairs for c in contexts)
    return edges, by_context(pairs, edges)


def by_context(prompts: Sequence[tuple[Sequence[int], Sequence[float]]], edges: Sequence[int]) -> list[dict]:
    """One row per bucket from each prompt's (context lengths, acceptance lengths) of its blocks."""
    edges = check_edges(edges)
    bounds = list(zip(edges, [*edges[1:], None]))
    sums = [[0.0] * len(prompts) for _ in bounds]  # [bucket][prompt]
    counts = [[0.0] * len(prompts) for _ in bounds]
    for p, (contexts, lengths) in enumerate(prompts):
        for context, length in zip(contexts, lengths):
            b = bisect.bisect_right(edges, context) - 1  # the bucket [edges[b], edges[b + 1])
            if b >= 0:
                sums[b][p] += length
                counts[b][p] += 1
    rows = []
    for (low, high), s, c in zip(bounds, sums, counts):
        interval = pooled_interval(s, c) if prompts else None
        rows.append({"from": low, "to": high, "blocks": int(sum(c)),
                     "tau": interval.value if interval else None, "ci": interval.bounds() if interval else None})
    return rows
