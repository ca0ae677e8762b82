"""tracker/measurement/uncertainty.py: bootstrap intervals against exactly computed ones, paired verdicts."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from tracker.measurement.uncertainty import (
    BETTER,
    NO_DIFFERENCE,
    RESAMPLES,
    WORSE,
    ci_metrics,
    paired_comparison,
    results_uncertainty,
    tau_intervals,
)
from tracker.errors import DraftboardError


def exact_bootstrap_quantiles(per_prompt, statistic, level=0.95):
    """Every one of the n**n equally likely resamples, enumerated: the bootstrap distribution itself."""
    n = len(per_prompt)
    values = sorted(statistic([per_prompt[i] for i in draw]) for draw in itertools.product(range(n), repeat=n))
    tail = (1 - level) / 2
    return values[int(tail * len(values))], values[int((1 - tail) * len(values))]


def macro(prompts):
    return sum(sum(p) / len(p) for p in prompts) / len(prompts)


def pooled(prompts):
    return sum(map(sum, prompts)) / sum(map(len, prompts))


def test_two_prompts_interval_is_hand_computed():
    # Resamples of 2 prompts with means 2 and 4: means 2 (1/4), 3 (1/2), 4 (1/4); 2.5% and 97.5% -> 2, 4.
    got = tau_intervals([[1, 3], [4]])
    assert (got.tau.value, got.tau.low, got.tau.high) == (3.0, 2.0, 4.0)
    assert got.tau_pooled.value == pytest.approx(8 / 3) and got.n_prompts == 2


def test_interval_matches_the_exact_bootstrap_distribution():
    per_prompt = [[1], [1, 3], [4, 4, 4, 4], [8, 6]]  # uneven lengths: macro and pooled differ
    got = tau_intervals(per_prompt)
    assert got.tau.value == pytest.approx(macro(per_prompt))
    assert got.tau_pooled.value == pytest.approx(pooled(per_prompt))
    assert (got.tau.low, got.tau.high) == pytest.approx(exact_bootstrap_quantiles(per_prompt, macro))
    assert (got.tau_pooled.low, got.tau_pooled.high) == pytest.approx(exact_bootstrap_quantiles(per_prompt, pooled))


def test_interval_is_reproducible_and_narrows_with_more_prompts():
    rng = random.Random(3)
    prompts = [[rng.randint(1, 8) for _ in range(rng.randint(1, 20))] for _ in range(80)]
    first, again = tau_intervals(prompts), tau_intervals(prompts)
    assert first == again  # fixed seed
    assert first.tau.low < first.tau.value < first.tau.high
    small = tau_intervals(prompts[:10])
    assert small.tau.high - small.tau.low > first.tau.high - first.tau.low
    assert RESAMPLES >= 2000


def test_prompts_without_blocks_do_not_count():
    assert tau_intervals([[2, 4], [], [6]]) == tau_intervals([[2, 4], [6]])
    with pytest.raises(DraftboardError, match="no prompt has a scored block"):
        tau_intervals([[], []])


def test_an_eval_against_itself_shows_no_difference():
    rng = random.Random(0)
    a = {f"p{i}": [rng.randint(1, 6) for _ in range(12)] for i in range(40)}
    got = paired_comparison(a, a)
    assert (got.delta.value, got.delta.low, got.delta.high) == (0.0, 0.0, 0.0)
    assert got.verdict == NO_DIFFERENCE and got.n_prompts == 40


def test_a_real_gap_is_better_and_its_reverse_worse():
    rng = random.Random(1)
    a = {f"p{i}": [rng.randint(1, 6) for _ in range(10)] for i in range(40)}
    b = {pid: [min(8, x + rng.choice((0, 1, 1, 2))) for x in lengths] for pid, lengths in a.items()}
    up = paired_comparison(a, b)
    assert up.verdict == BETTER and 0 < up.delta.low < up.delta.value < up.delta.high
    assert up.delta.value == pytest.approx(macro(list(b.values())) - macro(list(a.values())))
    assert paired_comparison(b, a).verdict == WORSE


def test_pairing_removes_what_the_prompts_share():
    # Prompt difficulty varies a lot, B is uniformly a bit better: unpaired intervals overlap,
    # the paired one does not contain 0.
    rng = random.Random(2)
    a = {f"p{i}": [1 + (i % 7)] * 8 for i in range(30)}
    b = {pid: [x + rng.choice((0, 0, 1)) for x in lengths] for pid, lengths in a.items()}
    ia, ib = tau_intervals(list(a.values())), tau_intervals(list(b.values()))
    assert ib.tau.low < ia.tau.high  # overlapping intervals
    assert paired_comparison(a, b).verdict == BETTER


def test_a_small_noisy_gap_is_no_detectable_difference():
    a = {"p0": [2, 3], "p1": [5], "p2": [1, 1, 2], "p3": [4, 6]}
    b = {"p0": [3, 3], "p1": [4], "p2": [1, 2, 2], "p3": [4, 5]}
    assert paired_comparison(a, b).verdict == NO_DIFFERENCE


def test_different_prompt_sets_are_refused():
    with pytest.raises(DraftboardError, match="1 prompt id.s. only in A, 1 only in B .e.g. 'x'"):
        paired_comparison({"x": [1], "y": [2]}, {"y": [2], "z": [3]})


def test_results_sections_cover_ddtree_and_datasets():
    rng = random.Random(4)
    records = []
    for i in range(24):
        chain = [rng.randint(1, 5) for _ in range(6)]
        records.append({"id": str(i), "dataset": "gsm8k" if i < 16 else "mbpp", "acceptance_lengths": chain,
                        "ddtree_acceptance_lengths": {"8": [x + 1 for x in chain], "4": chain}})
    out = results_uncertainty(records)
    assert out["ci"]["tau"] == tau_intervals([r["acceptance_lengths"] for r in records]).tau.bounds()
    tree8 = tau_intervals([r["ddtree_acceptance_lengths"]["8"] for r in records]).tau
    assert out["ci"]["ddtree"] == {"4": out["ci"]["tau"], "8": tree8.bounds()}
    assert list(out["by_dataset"]) == ["gsm8k", "mbpp"]
    mbpp = out["by_dataset"]["mbpp"]
    alone = tau_intervals([r["acceptance_lengths"] for r in records[16:]]).tau
    assert (mbpp["tau"], mbpp["ci"], mbpp["n_prompts"]) == (alone.value, alone.bounds(), 8)
    assert set(mbpp["ddtree"]) == {"4", "8"} and mbpp["ddtree"]["8"]["tau"] == pytest.approx(alone.value + 1)
    assert results_uncertainty([{k: v for k, v in r.items() if k != "dataset"} for r in records])["by_dataset"] == {}


def test_ci_metric_names():
    metrics = ci_metrics({"tau": [1.0, 2.0], "tau_pooled": [1.5, 2.5], "ddtree": {"8": [3.0, 4.0]}})
    assert metrics == {"tau_ci_low": 1.0, "tau_ci_high": 2.0, "tau_pooled_ci_low": 1.5, "tau_pooled_ci_high": 2.5,
                       "ddtree_tau_b8_ci_low": 3.0, "ddtree_tau_b8_ci_high": 4.0}
    assert all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())


def test_a_ratio_of_medians_resamples_rounds_with_both_arms_drawn_together():
    """Hand-worked: rounds (10.5, 4.2), (7, 3.5), (14, 4.2): medians 10.5 / 4.2 = 2.5. A resample of mostly round 2
    (probability 7/27 > 2.5%) gives 7 / 3.5 = 2.0, of mostly round 3 14 / 4.2: the interval's ends. Unpaired draws
    would reach 7 / 4.2; one round is its own interval; bad rounds are refused, never divided by."""
    from tracker.measurement.uncertainty import ratio_of_medians

    ci = ratio_of_medians([10.5, 7.0, 14.0], [4.2, 3.5, 4.2])
    assert ci.value == pytest.approx(2.5) and ci.bounds() == [pytest.approx(2.0), pytest.approx(14 / 4.2)]
    assert ratio_of_medians([3.0], [2.0]).bounds() == [1.5, 1.5]
    assert ratio_of_medians([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]).bounds() == [2.0, 2.0]  # no spread, none drawn
    for a, b, message in (([1.0], [1.0, 2.0], "same positive number of rounds"), ([], [], "same positive number"),
                          ([1.0], [0.0], "positive denominators")):
        with pytest.raises(DraftboardError, match=message):
            ratio_of_medians(a, b)
