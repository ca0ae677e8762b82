"""Acceptance metrics of DFlash drafters, as z-lab's `dflash_generate` at temperature 0.

A block starts at an anchor a (completion-relative index) holding the last
verified token; the drafter proposes tokens for positions a+1..a+B-1 and the
block's acceptance length is 1 + the number of leading draft tokens equal to the
target's greedy tokens there (1..B, the 1 being the target's bonus token).

The harness scores every anchor offline; the speculative loop only ever sees the
anchors of its *walk* (next anchor = anchor + acceptance length), which is why
`tau` is taken along the walk and `tau_all_anchors` (the training-style statistic)
is reported separately: the two differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def chain_acceptance(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Acceptance length of a plain (chain) draft per block: 1 + leading matches.

    draft_tokens, target_tokens: [N, B-1] -> LongTensor [N] with values in 1..B.
    """
    if draft_tokens.dim() != 2 or draft_tokens.shape != target_tokens.shape:
        raise ValueError(
            "expected draft_tokens and target_tokens of the same shape [N, block_size-1], "
            f"got {tuple(draft_tokens.shape)} and {tuple(target_tokens.shape)}"
        )
    matches = (draft_tokens == target_tokens).long()  # [N, B-1]
    return 1 + matches.cumprod(dim=1).sum(dim=1)


def walk_anchors(accept_len_by_anchor: Sequence[int] | torch.Tensor, n_anchors: int) -> list[int]:
    """Anchors the speculative loop visits: a = 0, then a += acceptance length at a.

    accept_len_by_anchor[a] is the acceptance length of the block anchored at a,
    for every a in 0..n_anchors-1 (a DDTree walk passes its tree acceptance here,
    so it follows its own anchors). The walk runs while a < n_anchors; the caller
    picks n_anchors as z-lab's loop bounds it: the completion length, or the index
    of the EOS / stop token when generation stopped there (the EOS token never
    anchors a block: it ends generation as soon as it is accepted).
    """
    lengths = _as_int_list(accept_len_by_anchor)
    if n_anchors < 0 or n_anchors > len(lengths):
        raise ValueError(f"n_anchors={n_anchors} must lie in [0, {len(lengths)}] (one length per anchor)")
    anchors = []
    anchor = 0
    while anchor < n_anchors:
        if lengths[anchor] < 1:
            raise ValueError(f"acceptance length at anchor {anchor} is {lengths[anchor]}, must be >= 1")
        anchors.append(anchor)
        anchor += lengths[anchor]
    return anchors


def walk(accept_len_by_anchor: Sequence[int] | torch.Tensor, n_anchors: int, cut: bool = False) -> list[int]:
    """Acceptance lengths of the blocks along the walk (see `walk_anchors`).

    Example: lengths [3, 1, 2, 1, 1, 4] with n_anchors=6 visit anchors 0, 3, 4, 5
    and give [3, 1, 1, 4].

    cut=True is z-lab's end-of-generation rule since 07ebd93: a block never produces past
    `n_anchors` (the caller passes the walk's end, `walk_end`), so the last length is
    clipped to what is left: the same lengths with n_anchors=6 and cut give [3, 1, 1, 1].
    """
    lengths = _as_int_list(accept_len_by_anchor)
    anchors = walk_anchors(lengths, n_anchors)
    if cut:
        return [min(lengths[a], n_anchors - a) for a in anchors]
    return [lengths[a] for a in anchors]


def walk_end(n_completion: int, n_anchors: int, stopped: bool, last_block: str) -> int:
    """Where the walk of one completion ends, under the end-of-generation rule `last_block`.

    n_completion tokens (the first from the prefill), n_anchors = anchors before a stop token
    (its index when `stopped`, else n_completion). `full` (z-lab 44947fb) walks every anchor
    and scores the last block whole. `cut` (z-lab 07ebd93) runs while anchor + 1 < N and
    produces at most N - anchor - 1 tokens per block, so a walk that runs to the limit ends at
    N - 1 and its blocks sum to N - 1; a stop token ends it at the stop, as in `full`.
    """
    if last_block == "full" or stopped:
        return n_anchors
    if last_block == "cut":
        return max(0, n_completion - 1)
    raise ValueError(f"unknown last_block rule {last_block!r}; expected cut or full")


def engine_walk(accept_len_by_anchor: Sequence[int] | torch.Tensor, n_completion: int, n_anchors: int,
                stopped: bool) -> list[int]:
    """The walk as a serving engine counts it (vLLM, SGLang): every step drafts a whole block, the
    walk ends where `cut`'s does (once the completion's tokens are out), and what the last step
    accepted past --max-new-tokens or a stop token still counts, since the engine verified it
    before it cut the output. Example: lengths [3, 1, 2, 1, 4, 4] of a 6-token completion visit
    anchors 0, 3, 4 and give [3, 1, 4] (`cut` gives [3, 1, 1]: the last block clipped to what is left).
    """
    return walk(accept_len_by_anchor, walk_end(n_completion, n_anchors, stopped, "cut"), cut=False)


@dataclass(frozen=True)
class WalkSummary:
    """Walk statistics over a set of prompts (names as in the results JSON)."""

    tau: float  # mean over prompts of each prompt's mean acceptance length
    tau_pooled: float  # mean over all blocks of all prompts
    streak: float  # tau - 1: accepted draft tokens per block, bonus excluded
    accept_rate_by_position: list[float]  # [B-1]: fraction of blocks with draft k accepted
    accept_len_histogram: list[int]  # [B]: block counts for L = 1..B
    n_blocks: int
    n_prompts: int  # prompts with at least one block (the ones tau averages over)


def summarize_walks(walks: Sequence[Sequence[int]], block_size: int) -> WalkSummary:
    """Summarise per-prompt walks (lists of acceptance lengths, each in 1..block_size).

    `tau` is z-lab's macro average, so long completions do not dominate it; prompts
    whose walk has no block are skipped. `tau_pooled` weighs every block equally.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    histogram = [0] * block_size
    prompt_means = []
    for prompt_index, lengths in enumerate(walks):
        lengths = _as_int_list(lengths)
        for length in lengths:
            if not 1 <= length <= block_size:
                raise ValueError(
                    f"prompt {prompt_index}: acceptance length {length} outside 1..{block_size}"
                )
            histogram[length - 1] += 1
        if lengths:
            prompt_means.append(sum(lengths) / len(lengths))
    n_blocks = sum(histogram)
    if n_blocks == 0:
        raise ValueError("no blocks in any walk: tau is undefined")

    tau = sum(prompt_means) / len(prompt_means)
    total_length = sum(length * count for length, count in enumerate(histogram, start=1))
    # Draft k is accepted iff L >= k + 1, i.e. the block lands in histogram[k:].
    accepted_at = [sum(histogram[k:]) / n_blocks for k in range(1, block_size)]
    return WalkSummary(
        tau=tau,
        tau_pooled=total_length / n_blocks,
        streak=tau - 1,
        accept_rate_by_position=accepted_at,
        accept_len_histogram=histogram,
        n_blocks=n_blocks,
        n_prompts=len(prompt_means),
    )


def tau_all_anchors(accept_lens: Sequence[Sequence[int] | torch.Tensor]) -> float:
    """Pooled mean acceptance length over every anchor of every prompt.

    This is the training-style statistic (every position anchors a block), not
    what the speculative loop sees; see `summarize_walks` for that.
    """
    total = 0
    count = 0
    for lengths in accept_lens:
        lengths = _as_int_list(lengths)
        total += sum(lengths)
        count += len(lengths)
    if count == 0:
        raise ValueError("no anchors at all: tau_all_anchors is undefined")
    return total / count


def _as_int_list(values: Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"expected a 1-D tensor of acceptance lengths, got shape {tuple(values.shape)}")
        return [int(v) for v in values.tolist()]
    return [int(v) for v in values]


def decoding_speedup(tpot_target_alone: Sequence[float], tpot_drafter: Sequence[float]) -> dict:
    """z-lab benchmark.py's "Decoding speedup": the mean over prompts of the target alone's time per output
    token over the mean of the drafter's (each TPOT = decoding time after the first token / output tokens,
    the first included); its throughputs are 1 / those means, as z-lab prints them."""
    if not tpot_target_alone or len(tpot_target_alone) != len(tpot_drafter):
        raise ValueError("decoding_speedup needs one target-alone and one drafter time per prompt")
    alone, drafted = sum(tpot_target_alone) / len(tpot_target_alone), sum(tpot_drafter) / len(tpot_drafter)
    return {"speedup": alone / drafted if drafted > 0 else None, "tokens_per_s": 1 / drafted if drafted > 0 else None,
            "tokens_per_s_target_alone": 1 / alone if alone > 0 else None,
            "time_per_output_token_s": drafted, "time_per_output_token_s_target_alone": alone}
