"""The sampled protocol (T > 0): z-lab's sampling distributions, and the walk's exact expectation.

z-lab's loop (07ebd93 `dflash_generate`) samples the target and the drafter from `_sampling_probs`
(temperature, then top-k, then top-p) and accepts draft d with probability min(1, p(d) / q(d)),
else samples the residual max(p - q, 0). That is lossless: the output x is a sample of the target.
Given x, position j of the block anchored at a is accepted with probability

    r[a, j] = min(1, q_a,j(x[a + j]) / p(x[a + j] | x before it))

independently of everything else given x (docs/DESIGN.md, "Sampled acceptance", has the proof).
So one drafter pass over a sampled continuation gives r at every anchor, and `expected_walk` turns
those into the exact expectation of the walk's statistics by dynamic programming over anchors.
At T = 0 both distributions are one-hot (z-lab's `sample` takes the argmax there), every r is 0
or 1, and the expectation is the greedy walk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tracker import config
from tracker.errors import DraftboardError


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn: z-lab's `temperature`, `top_p`, `top_k` (0: all), T = 0 greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        problem = config.sampling_problem(self.temperature, self.top_p, self.top_k)
        if problem:
            raise DraftboardError(problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


CONTINUATION, ONLINE = "continuation", "online"  # draw_seed's streams


def draw_seed(seed: int, input_ids: Sequence[int], draw: int, stream: str = CONTINUATION) -> int:
    """The seed of one sampled continuation (stream CONTINUATION) or online run (ONLINE) of one
    prompt: a function of the eval's seed, the prompt's tokens and the draw's index only, so a
    prompt gets the same draws whatever its batch, its place in the prompt set, or the checkpoint
    being scored, and the online runs never replay the offline draws."""
    text = f"{stream}|{int(seed)}|{','.join(map(str, input_ids))}|{int(draw)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1  # torch seeds: < 2**63


def sampling_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """z-lab's `_sampling_probs`: logits [..., V] -> probabilities [..., V] (fp32). At T = 0 the
    one-hot of the argmax (z-lab's `sample` at T = 0), so the sampled machinery reduces to greedy."""
    if s.greedy:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    scores = logits.float() / s.temperature
    indices = None
    if 0 < s.top_k < scores.shape[-1]:
        scores, indices = torch.topk(scores, s.top_k, dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if s.top_p < 1.0:  # keep the smallest head whose mass before each token is below top_p
        ordered, order = probs.sort(dim=-1, descending=True)
        ordered = ordered * (ordered.cumsum(dim=-1) - ordered < s.top_p)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if indices is not None:
        probs = torch.zeros_like(logits, dtype=probs.dtype).scatter(-1, indices, probs)
    return probs


def draft_probability(drafter, hidden: torch.Tensor, logits: torch.Tensor, predecessors: torch.Tensor,
                      tokens: torch.Tensor, s: Sampling) -> torch.Tensor:
    """q: the probability that the drafter proposes `tokens` [N, S] at each block position.

    hidden [N, S+1, H] (the block, anchor slot first), logits [N, S, V] of positions 1..,
    predecessors [N, S] the continuation's token before each position. DFlash samples each position
    from `sampling_probs` of its logits; DFlash2 samples among its selector's candidates with
    temperature only (z-lab's `CandidateSelector.select`), the predecessor being the token before.
    """
    if drafter.candidate_selector is None:
        return sampling_probs(logits, s).gather(-1, tokens[..., None])[..., 0]
    candidates, scores = drafter.candidate_selector.teacher_forced(hidden[..., 1:, :], logits, predecessors)
    q = sampling_probs(scores, Sampling(s.temperature))  # [N, S, K]: temperature alone over the candidates
    return (q * (candidates == tokens[..., None])).sum(-1)


def acceptance_ratios(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """r = min(1, q / p) per position (p > 0: the continuation was drawn from p)."""
    return torch.where(p > 0, (q / p.clamp_min(torch.finfo(p.dtype).tiny)).clamp(max=1.0), torch.zeros_like(q))


@dataclass(frozen=True)
class ExpectedWalk:
    """The expectation of one continuation's walk over the acceptance draws (given the continuation)."""

    tau: float  # E[sum of lengths / number of blocks]: the expectation of this walk's mean
    tokens: float  # E[sum of lengths]
    blocks: float  # E[number of blocks]
    histogram: list[float]  # [B]: E[number of blocks of length L], L = 1..B
    visits: list[float]  # [end]: P(the walk puts a block at anchor a)
    lengths: list[float]  # [end]: E[that block's length as recorded | it is there]


def length_distribution(ratios: Sequence[float]) -> np.ndarray:
    """P(L = 1 + m) for m = 0..len(ratios): m leading acceptances, then a rejection or the block's end."""
    r = np.asarray(ratios, dtype=np.float64)
    reach = np.concatenate([[1.0], np.cumprod(r)])  # P(first m drafts accepted)
    return reach * np.concatenate([1.0 - r, [1.0]])


def expected_length(ratios: Sequence[float]) -> float:
    """E[L] of one block: 1 + sum over m of P(the first m drafts are accepted)."""
    return 1.0 + float(np.cumprod(np.asarray(ratios, dtype=np.float64)).sum())


def expected_walk(ratios: Sequence[Sequence[float]], end: int, cut: bool, block: int) -> ExpectedWalk:
    """The walk's expectation given r at every anchor (ratios[a]: the r's of the block at anchor a).

    The walk is a Markov chain on anchors: from a it moves to a + L with L drawn from
    `length_distribution(ratios[a])`, until a + L >= end; `cut` clips the last block to end - a
    (metrics.walk). The mass is tracked per (anchor, blocks so far), so the expectation of the
    ratio tokens / blocks is exact, not a ratio of expectations. O(end^2 * B / 2) multiply-adds.
    With every r in {0, 1} there is one path of mass 1.0 and the numbers are the greedy walk's.
    """
    if end < 0 or end > len(ratios):
        raise ValueError(f"end={end} must lie in [0, {len(ratios)}] (one row of ratios per anchor)")
    histogram = np.zeros(block)
    mass: dict[int, np.ndarray] = {0: np.ones(1)} if end > 0 else {}  # anchor -> P(reach it after k blocks)
    tau = tokens = blocks = 0.0
    visits, lengths = [0.0] * end, [0.0] * end
    for a in range(end):
        here = mass.pop(a, None)
        if here is None:
            continue
        visit = visits[a] = float(here.sum())
        blocks += visit
        for m, prob in enumerate(length_distribution(ratios[a])):
            if prob == 0.0:
                continue
            length = m + 1
            recorded = min(length, end - a) if cut else length
            histogram[recorded - 1] += visit * prob
            tokens += visit * prob * recorded
            lengths[a] += prob * recorded
            if a + length >= end:  # the walk ends with this block: its mean is (a + recorded) / (k + 1)
                tau += prob * float(np.dot(here, (a + recorded) / np.arange(1, len(here) + 1)))
            else:
                nxt = mass.setdefault(a + length, np.zeros(len(here) + 1))
                if len(nxt) < len(here) + 1:
                    nxt = mass[a + length] = np.pad(nxt, (0, len(here) + 1 - len(nxt)))
                nxt[1:len(here) + 1] += prob * here
    return ExpectedWalk(float(tau), float(tokens), float(blocks), histogram.tolist(), visits, lengths)
