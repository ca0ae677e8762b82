"""How sure a tau is: 95% percentile bootstrap intervals over prompts, and paired compare_deltas; how sure a
served speedup is: the same interval over a load sweep's rounds (`ratio_of_medians`).

The resampling unit is the prompt, not the block: the blocks of one prompt share its text and
are far from independent. Every interval draws one `[resamples, prompts]` matrix of draw counts
from a fixed seed, so the same results always give the same interval and every statistic of one eval
(tau, tau_pooled, each DDTree budget, each dataset) sees the same resamples. Inputs are per-prompt
scores (`PromptScore`: a greedy walk's blocks, or a sampled prompt's mean over its draws, as
`prompt_score` reads a results record); prompts without blocks do not count, as in `tau` itself
(docs/DESIGN.md, "Metric names").

A sampled prompt's score is the mean over its draws (continuations, or online runs), so resampling
prompts also carries the draws' noise: the interval is over prompts and draws together (the
"ultimate cluster" estimate of two-stage sampling). `draws_interval` is the other question: how far
the estimate could move from its draws alone, the prompts held fixed (the Monte Carlo error).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tracker.errors import DraftboardError
from tracker.store import names

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference at this sample size"


@dataclass(frozen=True)
class Interval:
    value: float  # the statistic on all prompts
    low: float
    high: float

    def bounds(self) -> list[float]:
        return [self.low, self.high]


@dataclass(frozen=True)
class TauIntervals:
    tau: Interval  # macro: mean over prompts of each prompt's mean
    tau_pooled: Interval  # sum of all blocks / number of blocks
    n_prompts: int  # prompts with at least one block


@dataclass(frozen=True)
class PairedComparison:
    delta: Interval  # tau(B) - tau(A), macro
    n_prompts: int
    verdict: str  # BETTER | WORSE | NO_DIFFERENCE: B relative to A


@dataclass(frozen=True)
class PromptScore:
    """One prompt's part in a tau: its mean acceptance length and its blocks' totals."""

    mean: float  # its walk's mean length; sampled: the mean over its draws of each draw's (expected) mean
    tokens: float  # the lengths summed (sampled: the mean over its draws)
    blocks: float  # 0: no block, the prompt does not count

    @classmethod
    def of_walk(cls, lengths: Sequence[int]) -> PromptScore:
        total, n = float(sum(lengths)), float(len(lengths))
        return cls(total / n if n else 0.0, total, n)


Scores = Sequence["PromptScore | Sequence[int]"]  # scores, or plain walks (acceptance-length lists)


def _score(item: PromptScore | Sequence[int]) -> PromptScore:
    return item if isinstance(item, PromptScore) else PromptScore.of_walk(item)


def _draw_list(record: Mapping, key: str) -> list[Mapping] | None:
    draws = record.get(key)
    return draws if isinstance(draws, list) and draws and all(isinstance(d, Mapping) for d in draws) else None


def prompt_score(record: Mapping, budget: str | None = None) -> PromptScore | None:
    """A results record's score: its walk (`acceptance_lengths`, or `ddtree_acceptance_lengths[budget]`),
    or for a sampled eval the mean over its `samples` (each {"tau" (null: no block), "tokens",
    "blocks"}). None when the record holds neither."""
    draws = _draw_list(record, "samples")
    if draws is not None:
        if budget is not None:
            return None
        try:
            taus = [float(d["tau"]) for d in draws if d.get("tau") is not None]
            tokens = sum(float(d["tokens"]) for d in draws) / len(draws)
            blocks = sum(float(d["blocks"]) for d in draws) / len(draws)
        except (KeyError, TypeError, ValueError):
            return None
        return PromptScore(sum(taus) / len(taus) if taus else 0.0, tokens, blocks if taus else 0.0)
    lengths = record.get("acceptance_lengths") if budget is None else \
        (record.get("ddtree_acceptance_lengths") or {}).get(budget)
    if not isinstance(lengths, list) or not all(isinstance(x, (int, float)) for x in lengths):
        return None
    return PromptScore.of_walk(lengths)


def _totals(per_prompt: Scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scores = [_score(item) for item in per_prompt]
    means = np.array([s.mean for s in scores], dtype=np.float64)
    sums = np.array([s.tokens for s in scores], dtype=np.float64)
    counts = np.array([s.blocks for s in scores], dtype=np.float64)
    return means, sums, counts


@functools.lru_cache(maxsize=8)
def _weights(n_prompts: int, resamples: int, seed: int) -> np.ndarray:
    """[R, P]: how often each prompt is drawn in each resample (cached, read-only: every
    statistic of an eval reuses the same draws, and a statistic is then one product)."""
    if resamples < 1:
        raise DraftboardError(f"resamples must be positive, got {resamples}")
    draws = np.random.default_rng(seed).integers(0, n_prompts, size=(resamples, n_prompts))  # [R, P]
    rows = np.arange(resamples)[:, None] * n_prompts
    weights = np.bincount((draws + rows).ravel(), minlength=resamples * n_prompts)
    weights = weights.reshape(resamples, n_prompts).astype(np.float64)
    weights.flags.writeable = False
    return weights


def _macro(means: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per resample (rows of weights [R, P]): mean over the drawn prompts that have blocks."""
    has_blocks = (counts > 0).astype(np.float64)
    means = np.where(counts > 0, means, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of only empty prompts: nan
        return (weights @ means) / (weights @ has_blocks)  # [R]


def _pooled(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return (weights @ sums) / (weights @ counts)  # [R]


def _interval(value: float, samples: np.ndarray, level: float) -> Interval:
    tail = (1.0 - level) / 2
    low, high = np.nanquantile(samples, [tail, 1.0 - tail])
    return Interval(float(value), float(low), float(high))


def tau_intervals(per_prompt: Scores, *, resamples: int = RESAMPLES, seed: int = SEED,
                  level: float = LEVEL) -> TauIntervals:
    """tau and tau_pooled with their percentile bootstrap intervals, resampling prompts."""
    kept = [score for score in map(_score, per_prompt) if score.blocks > 0]
    if not kept:
        raise DraftboardError("no prompt has a scored block: nothing to put an interval on")
    means, sums, counts = _totals(kept)
    everything = np.ones((1, len(kept)))  # [1, P]: the full sample
    weights = _weights(len(kept), resamples, seed)
    return TauIntervals(
        tau=_interval(_macro(means, counts, everything)[0], _macro(means, counts, weights), level),
        tau_pooled=_interval(_pooled(sums, counts, everything)[0], _pooled(sums, counts, weights), level),
        n_prompts=len(kept),
    )


def pooled_interval(sums: Sequence[float], counts: Sequence[float], *, resamples: int = RESAMPLES,
                    seed: int = SEED, level: float = LEVEL) -> Interval | None:
    """sum(sums) / sum(counts) with its percentile bootstrap interval, resampling prompts (each prompt's
    tokens and blocks in one group, e.g. one context bucket: a prompt with none there still counts as drawn);
    None when no prompt has a block."""
    total = float(sum(counts))
    if total <= 0:
        return None
    s, c = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample of prompts without blocks: nan, skipped
        return _interval(float(s.sum()) / total, _pooled(s, c, _weights(len(s), resamples, seed)), level)


def paired_pooled(a: tuple[Sequence[float], Sequence[float]], b: tuple[Sequence[float], Sequence[float]], *,
                  resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> PairedComparison | None:
    """Δ of two pooled taus (each prompt's (sums, counts) of one group of blocks, e.g. one context bucket, in
    the same prompt order on both sides), B - A, the prompts resampled together; None when a side has no block.
    `n_prompts`: the prompts with a block there on either side."""
    (sa, ca), (sb, cb) = (np.asarray(x, dtype=np.float64) for x in a), (np.asarray(x, dtype=np.float64) for x in b)
    if ca.sum() <= 0 or cb.sum() <= 0:
        return None
    weights = _weights(len(ca), resamples, seed)
    everything = np.ones((1, len(ca)))

    def delta(w: np.ndarray) -> np.ndarray:
        return _pooled(sb, cb, w) - _pooled(sa, ca, w)

    with np.errstate(invalid="ignore", divide="ignore"):  # a resample without blocks on a side: nan, skipped
        interval = _interval(float(delta(everything)[0]), delta(weights), level)
    return PairedComparison(interval, int(((ca > 0) | (cb > 0)).sum()), verdict(interval))


def verdict(delta: Interval) -> str:
    if delta.low > 0:
        return BETTER
    if delta.high < 0:
        return WORSE
    return NO_DIFFERENCE


def paired_comparison(a: Mapping[str, PromptScore | Sequence[int]], b: Mapping[str, PromptScore | Sequence[int]],
                      *, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> PairedComparison:
    """Δtau = tau(B) - tau(A) on the same prompts ({prompt id: score or acceptance lengths} each).

    Both evals are resampled with the same prompt draws, so what the prompts share (their
    difficulty) cancels and only the drafters' difference is left to vary. Sampled evals scored on
    the same continuations share those too, so their draws' noise cancels as well.
    """
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        example = (only_a or only_b)[0]
        raise DraftboardError(
            f"the two evals were not run on the same prompts: {len(only_a)} prompt id(s) only in A, "
            f"{len(only_b)} only in B (e.g. {example!r}); a paired comparison needs one prompt set")
    ids = [pid for pid in sorted(a) if _score(a[pid]).blocks or _score(b[pid]).blocks]
    if not ids:
        raise DraftboardError("no prompt has a scored block in either eval: nothing to compare")
    means_a, _, counts_a = _totals([a[pid] for pid in ids])
    means_b, _, counts_b = _totals([b[pid] for pid in ids])
    everything = np.ones((1, len(ids)))
    weights = _weights(len(ids), resamples, seed)

    def delta(w: np.ndarray) -> np.ndarray:
        return _macro(means_b, counts_b, w) - _macro(means_a, counts_a, w)

    interval = _interval(delta(everything)[0], delta(weights), level)
    return PairedComparison(interval, len(ids), verdict(interval))


def draws_interval(per_prompt_draws: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, seed: int = SEED,
                   level: float = LEVEL) -> Interval:
    """The macro mean of per-prompt means of draws, with the interval from resampling each prompt's
    draws and keeping the prompts (the Monte Carlo error of a sampled tau on these prompts).
    Prompts without a draw do not count."""
    kept = [np.asarray(d, dtype=np.float64) for d in per_prompt_draws if len(d)]
    if not kept:
        raise DraftboardError("no prompt has a scored draw: nothing to put an interval on")
    rng = np.random.default_rng(seed)
    total = np.zeros(resamples)
    for draws in kept:  # [R] means of resampled draws, one prompt at a time: memory O(R * draws)
        total += draws[rng.integers(0, len(draws), size=(resamples, len(draws)))].mean(axis=1)
    value = float(np.mean([d.mean() for d in kept]))
    return _interval(value, total / len(kept), level)


def ratio_of_medians(a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                     level: float = LEVEL) -> Interval:
    """median(a) / median(b) with its percentile bootstrap interval, resampling rounds: round i's a[i] and b[i]
    were measured side by side (a load sweep's two arms, interleaved), so they are drawn together and what
    the box did during a round moves both. With few rounds the interval is coarse, never narrower than the
    rounds say: 3 rounds give at most 10 distinct resamples."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(x) != len(y) or not len(x):
        raise DraftboardError(f"a ratio of medians needs the same positive number of rounds on both sides, got "
                              f"{len(x)} and {len(y)}")
    if (y <= 0).any():
        raise DraftboardError("a ratio of medians needs positive denominators (a round that served no token?)")
    draws = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))  # [R, rounds]
    samples = np.median(x[draws], axis=1) / np.median(y[draws], axis=1)  # [R]
    return _interval(float(np.median(x) / np.median(y)), samples, level)


# --------------------------------------------------------------------------- results sections


def _section(records: Sequence[Mapping], resamples: int, seed: int) -> dict:
    """{"tau", "tau_pooled", "ci", "n_prompts", "ddtree"} of a group of per-prompt records."""
    main = tau_intervals([prompt_score(r) for r in records], resamples=resamples, seed=seed)
    budgets = sorted({b for r in records for b in r.get("ddtree_acceptance_lengths", {})}, key=int)
    ddtree = {}
    for budget in budgets:
        tree = tau_intervals([prompt_score(r, budget) for r in records], resamples=resamples, seed=seed)
        ddtree[budget] = {"tau": tree.tau.value, "ci": tree.tau.bounds()}
    return {"tau": main.tau.value, "tau_pooled": main.tau_pooled.value, "n_prompts": main.n_prompts,
            "ci": {"tau": main.tau.bounds(), "tau_pooled": main.tau_pooled.bounds(),
                   "ddtree": {budget: entry["ci"] for budget, entry in ddtree.items()}},
            "ddtree": ddtree}


def results_uncertainty(prompt_records: Sequence[Mapping], *, resamples: int = RESAMPLES,
                        seed: int = SEED) -> dict:
    """The results JSON's `ci` and `by_dataset` sections from its `prompts` records.

    `ci` = {"tau": [lo, hi], "tau_pooled": [lo, hi], "ddtree": {"8": [lo, hi], ...}};
    `by_dataset` = {name: {"tau", "ci" ([lo, hi]), "n_prompts", "ddtree": {"8": {"tau", "ci"}}}}
    for prompts that carry a `dataset` (empty when none does).
    """
    overall = _section(prompt_records, resamples, seed)
    groups: dict[str, list[Mapping]] = {}
    for record in prompt_records:
        if record.get("dataset") is not None:
            groups.setdefault(str(record["dataset"]), []).append(record)
    by_dataset = {}
    for name, records in groups.items():
        if any(prompt_score(r).blocks for r in records):
            part = _section(records, resamples, seed)
            by_dataset[name] = {"tau": part["tau"], "ci": part["ci"]["tau"], "n_prompts": part["n_prompts"],
                                "ddtree": part["ddtree"]}
    return {"ci": overall["ci"], "by_dataset": by_dataset}


def ci_metrics(ci: Mapping) -> dict[str, float]:
    """MLflow metrics for a `ci` section: tau_ci_low/_high, tau_pooled_ci_*, ddtree_tau_b{B}_ci_*."""
    bounds = {"tau": ci["tau"], "tau_pooled": ci["tau_pooled"]}
    bounds.update({names.ddtree_tau_metric(int(budget)): pair for budget, pair in ci.get("ddtree", {}).items()})
    metrics = {}
    for metric, (low, high) in bounds.items():
        low_name, high_name = names.ci_metrics(metric)
        metrics[low_name], metrics[high_name] = float(low), float(high)
    return metrics
