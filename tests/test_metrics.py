"""Acceptance metrics, on examples worked by hand."""

import pytest
import torch

from evaluators.metrics import chain_acceptance, summarize_walks, tau_all_anchors, walk, walk_anchors, walk_end


def test_chain_acceptance_counts_leading_matches_only():
    target = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 4]])
    draft = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3], [1, 2, 3]])
    # all match -> 4; mismatch at 2 (3 matches later does not count) -> 2; at 1 -> 1; at 3 -> 3
    assert chain_acceptance(draft, target).tolist() == [4, 2, 1, 3]
    assert chain_acceptance(draft, target).dtype == torch.long


def test_chain_acceptance_rejects_shape_mismatch():
    with pytest.raises(ValueError):
        chain_acceptance(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))


def test_walk_follows_acceptance_lengths():
    lengths = [3, 1, 2, 1, 1, 4]
    # a=0: L=3 -> a=3: L=1 -> a=4: L=1 -> a=5: L=4 -> a=9 >= 6, stop.
    assert walk_anchors(lengths, 6) == [0, 3, 4, 5]
    assert walk(lengths, 6) == [3, 1, 1, 4]
    # Stopped at an EOS at index 5: anchor 5 never starts a block.
    assert walk(lengths, 5) == [3, 1, 1]
    assert walk(torch.tensor(lengths), 6) == [3, 1, 1, 4]
    assert walk(lengths, 0) == []


def test_walk_rejects_bad_input():
    with pytest.raises(ValueError):
        walk([1, 0, 1], 3)  # length 0 at a visited anchor would never advance
    with pytest.raises(ValueError):
        walk([1, 1], 3)  # fewer lengths than anchors


def test_summarize_walks_macro_versus_pooled():
    # block_size 4. Prompt A: [4, 1] (mean 2.5); prompt B: [2, 2, 2, 2] (mean 2.0);
    # prompt C has no block and is skipped.
    # tau = (2.5 + 2.0) / 2 = 2.25; tau_pooled = (5 + 8) / 6 = 13/6.
    # histogram over L = 1..4: [1, 4, 0, 1].
    # accept rate of draft k = fraction with L >= k+1: k=1: 5/6, k=2: 1/6, k=3: 1/6.
    summary = summarize_walks([[4, 1], [2, 2, 2, 2], []], block_size=4)
    assert summary.tau == pytest.approx(2.25)
    assert summary.tau_pooled == pytest.approx(13 / 6)
    assert summary.streak == pytest.approx(1.25)
    assert summary.accept_len_histogram == [1, 4, 0, 1]
    assert summary.accept_rate_by_position == pytest.approx([5 / 6, 1 / 6, 1 / 6])
    assert summary.n_blocks == 6
    assert summary.n_prompts == 2


def test_summarize_walks_rejects_undefined_or_inconsistent_input():
    with pytest.raises(ValueError, match="no blocks"):
        summarize_walks([[], []], block_size=4)
    with pytest.raises(ValueError, match="no blocks"):
        summarize_walks([], block_size=4)
    with pytest.raises(ValueError, match="outside"):
        summarize_walks([[5]], block_size=4)
    with pytest.raises(ValueError, match="outside"):
        summarize_walks([[0]], block_size=4)


def test_tau_all_anchors_pools_every_anchor():
    # (3+1+2+1+1+4) + (2+2) = 16 over 8 anchors; the walk of the first prompt
    # alone gives 9/4 = 2.25, the all-anchor mean of it 12/6 = 2.0.
    assert tau_all_anchors([[3, 1, 2, 1, 1, 4], torch.tensor([2, 2])]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        tau_all_anchors([[], []])


def test_cut_walk_clips_the_last_block_to_what_is_left():
    lengths = [3, 1, 2, 1, 1, 4]
    # 6 completion tokens, no stop: cut ends the walk at N - 1 = 5 (the first token is the
    # prefill's), so the walk visits 0, 3, 4 and the block at 4 produces 5 - 4 = 1 token.
    end = walk_end(6, 6, stopped=False, last_block="cut")
    assert end == 5
    assert walk(lengths, end, cut=True) == [3, 1, 1]
    assert sum(walk(lengths, end, cut=True)) == 6 - 1
    # A block that would overshoot is clipped: [4, ...] with 3 tokens -> end 2 -> [2].
    assert walk([4, 1, 1], walk_end(3, 3, False, "cut"), cut=True) == [2]
    # full keeps today's rule: every anchor of the completion, the last block whole.
    assert walk_end(6, 6, False, "full") == 6 and walk(lengths, 6) == [3, 1, 1, 4]
    # A stop token ends both rules at the stop (index 5), the block reaching it clipped there.
    assert walk_end(6, 5, True, "cut") == 5 and walk([4, 1, 1, 1, 3, 1], 5, cut=True) == [4, 1]
    assert walk_end(1, 1, False, "cut") == 0 and walk([2], 0, cut=True) == []
    with pytest.raises(ValueError, match="last_block"):
        walk_end(6, 6, False, "half")


def test_the_engine_walk_counts_what_the_last_step_accepted_past_the_limit():
    from evaluators.metrics import engine_walk, walk, walk_end

    lengths = [3, 1, 2, 1, 4, 4]  # 6-token completion, no stop: anchors 0, 3, 4 (the walk ends at 5)
    assert engine_walk(lengths, 6, 6, stopped=False) == [3, 1, 4]
    assert walk(lengths, walk_end(6, 6, False, "cut"), cut=True) == [3, 1, 1]  # 3 + 1 + 1 = 6 - 1 tokens
    # A stop token at index 4 ends the walk there (it never anchors a block); the step that accepted
    # it and what followed counts whole: anchors 0, 3 and [3, 1].
    assert engine_walk(lengths, 5, 4, stopped=True) == [3, 1]


def test_decoding_speedup_is_zlabs_ratio_of_mean_times_per_output_token():
    """Hand-worked, z-lab benchmark.py's _print_decode_summary: TPOTs 0.02 and 0.04 s alone (mean 0.03), 0.01
    and 0.01 with the drafter (mean 0.01): speedup 3.0, 33.3 vs 100 tok/s (not the mean of per-prompt ratios,
    which would be 3.0 too here, but 2.0 and 4.0 apart)."""
    from evaluators.metrics import decoding_speedup

    d = decoding_speedup([0.02, 0.04], [0.01, 0.01])
    assert d["speedup"] == pytest.approx(3.0) and d["tokens_per_s"] == pytest.approx(100.0)
    assert d["tokens_per_s_target_alone"] == pytest.approx(1 / 0.03)
    skewed = decoding_speedup([0.02, 0.04], [0.01, 0.03])  # per prompt 2.0 and 1.33: means first, then the ratio
    assert skewed["speedup"] == pytest.approx(0.03 / 0.02)
    with pytest.raises(ValueError):
        decoding_speedup([0.02], [])
