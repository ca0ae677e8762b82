"""Scoring a drafter on known continuations, and the results keys that follow from it.

A continuation of one prompt is `Walked`: its completion, where its walk ends, and what the drafter
scored at every anchor. Greedy (T = 0): the acceptance length at each anchor (`score_anchors`), the
walk read off those (`summarize`). Sampled (T > 0): the acceptance ratio r = min(1, q / p) at every
drafted position of every anchor (`score_ratios`), the walk's exact expectation from those
(`summarize_sampled`, by `sampling.expected_walk`). Both take the drafter's blocks in a few large
batched calls (`_anchor_blocks`); under `cut`, the blocks z-lab shortens near max_new_tokens are
drafted again at their own length (`_short_blocks`), since the drafter's masked positions attend to
each other and a shorter block drafts differently.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch

from evaluators import metrics
from evaluators.ddtree import ddtree_acceptance_batch
from evaluators.drafter import DFLASH2, LoadedDrafter, Precision
from evaluators.prompts import Prompt
from evaluators.sampling import (
    ExpectedWalk,
    Sampling,
    acceptance_ratios,
    draft_probability,
    expected_length,
    expected_walk,
)
from evaluators.target import Target, TargetHeads
from tracker.errors import DraftboardError


@dataclass
class Walked:
    """One continuation of one prompt: its per-anchor results and walks."""

    prompt: Prompt
    completion_ids: list[int]
    n_anchors: int
    limit: int  # max_new_tokens for this prompt: z-lab's loop shortens blocks near it (`cut`)
    end: int  # where the walk ends (metrics.walk_end)
    chain: list[int] = field(default_factory=list)  # acceptance length at every anchor
    tree: dict[int, list[int]] = field(default_factory=dict)  # budget -> per-anchor acceptance
    # `cut`: acceptance of the shortened blocks near `limit`, {anchor: length} (tree: per budget)
    short_chain: dict[int, int] = field(default_factory=dict)
    short_tree: dict[int, dict[int, int]] = field(default_factory=dict)
    # Sampled: the seed it was drawn with, the probability p of each continuation token, and at every
    # anchor the acceptance ratio of each drafted position ([B-1] each; short blocks: fewer)
    seed: int | None = None
    probs: list[float] | None = None
    ratios: list[list[float]] = field(default_factory=list)
    short_ratios: dict[int, list[float]] = field(default_factory=dict)
    expected: ExpectedWalk | None = None  # sampled: its walk's expectation (summarize_sampled)

    @property
    def id(self) -> str:
        return self.prompt.id

    @property
    def input_ids(self) -> list[int]:
        return self.prompt.input_ids

    def walk_lengths(self, budget: int | None = None) -> list[int]:
        """Per-anchor acceptance as the loop sees it: the full-block lengths, short blocks replaced."""
        lengths = list(self.chain if budget is None else self.tree[budget])
        for anchor, length in (self.short_chain if budget is None else self.short_tree.get(budget, {})).items():
            lengths[anchor] = length
        return lengths

    def walk_ratios(self) -> list[list[float]]:
        """Per-anchor acceptance ratios as the loop sees them: short blocks replaced."""
        ratios = list(self.ratios)
        for anchor, row in self.short_ratios.items():
            ratios[anchor] = row
        return ratios

    def to_json(self) -> dict:
        """Everything scoring found, as JSON (a shard's share of an eval, evaluators.shards): the expectation is left
        out (pooling computes it); integer keys become strings, floats keep every bit (Python's repr round-trips)."""
        out = asdict(self)
        out.pop("expected")
        out["tree"] = {str(b): v for b, v in self.tree.items()}
        out["short_chain"] = {str(a): v for a, v in self.short_chain.items()}
        out["short_tree"] = {str(b): {str(a): v for a, v in rows.items()} for b, rows in self.short_tree.items()}
        out["short_ratios"] = {str(a): v for a, v in self.short_ratios.items()}
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Walked":
        return cls(prompt=Prompt(**data["prompt"]), completion_ids=data["completion_ids"], n_anchors=data["n_anchors"],
                   limit=data["limit"], end=data["end"], chain=data["chain"],
                   tree={int(b): v for b, v in data["tree"].items()},
                   short_chain={int(a): v for a, v in data["short_chain"].items()},
                   short_tree={int(b): {int(a): v for a, v in rows.items()} for b, rows in data["short_tree"].items()},
                   seed=data["seed"], probs=data["probs"], ratios=data["ratios"],
                   short_ratios={int(a): v for a, v in data["short_ratios"].items()})


def completion_bounds(continuation: list[int], max_new_tokens: int, stops: set[int]) -> tuple[list[int], int]:
    """(completion_ids, n_anchors) of a continuation, as z-lab's loop bounds them.

    The completion is cut at max_new_tokens or just after the first stop token. Anchors run
    over the completion, except that a stop token never anchors a block: it ends generation as
    soon as it is accepted.
    """
    completion = continuation[:max_new_tokens]
    for i, token in enumerate(completion):
        if token in stops:
            return completion[: i + 1], i
    return completion, len(completion)


# --------------------------------------------------------------------------- the drafter's blocks


@dataclass
class _Blocks:
    """The drafter's blocks at some anchors of one continuation."""

    anchors: torch.Tensor  # [m] completion-relative
    hidden: torch.Tensor  # [m, S+1, H]: the block, anchor slot first
    logits: torch.Tensor  # [m, S, V] of positions 1..S
    tokens: torch.Tensor  # [m, S]: the continuation's tokens at those positions
    predecessors: torch.Tensor  # [m, S]: the continuation's token before each


def _inputs(loaded: LoadedDrafter, target: Target | TargetHeads, context: torch.Tensor, continuation: list[int]):
    """(embedding, lm_head, context [1, T, n_tapped*H] in fp32, continuation as a tensor) on the drafter's
    device. The context reaches the drafter in fp32 whatever dtype the cache stores (bf16 widens exactly)."""
    device = loaded.model.device
    lm_head = loaded.own_lm_head if loaded.own_lm_head is not None else target.lm_head_weight
    return (target.embed_weight.to(device), lm_head.to(device), context[None].to(device, torch.float32),
            torch.tensor(continuation, device=device))


def _blocks(loaded: LoadedDrafter, embed, lm_head, ctx, seq, P: int, anchors: torch.Tensor, size: int,
            precision: Precision | None, prompt_id: str) -> _Blocks:
    drafter = loaded.model
    with precision.context(drafter.device) if precision else nullcontext():
        hidden = drafter.forward_anchors(ctx, P + anchors, drafter.block_embeddings(seq[anchors], embed, size))
        logits = drafter.logits(hidden, lm_head)  # [m, size-1, V]
    if not torch.isfinite(logits).all():
        bad = int(anchors[(~torch.isfinite(logits)).flatten(1).any(1)][0])
        raise DraftboardError(f"non-finite drafter logits for prompt {prompt_id!r} at completion position {bad}")
    offsets = torch.arange(1, size, device=drafter.device)
    return _Blocks(anchors, hidden, logits, seq[anchors[:, None] + offsets], seq[anchors[:, None] + offsets - 1])


def _anchor_blocks(loaded: LoadedDrafter, target: Target | TargetHeads, w: Walked, context: torch.Tensor,
                   continuation: list[int], chunk: int, precision: Precision | None) -> Iterator[_Blocks]:
    """Full blocks at every anchor of the completion, `chunk` anchors per drafter call. The drafter
    computes under `precision`'s autocast, if any (as a mixed-precision training run did)."""
    drafter = loaded.model
    embed, lm_head, ctx, seq = _inputs(loaded, target, context, continuation)
    for start in range(0, w.n_anchors, chunk):
        anchors = torch.arange(start, min(start + chunk, w.n_anchors), device=drafter.device)
        yield _blocks(loaded, embed, lm_head, ctx, seq, len(w.input_ids), anchors, drafter.block_size, precision,
                      w.id)


def _short_blocks(loaded: LoadedDrafter, target: Target | TargetHeads, w: Walked, context: torch.Tensor,
                  continuation: list[int], precision: Precision | None) -> Iterator[_Blocks]:
    """`cut`: the blocks z-lab verifies at fewer than block_size positions, one anchor each.

    At anchor a, z-lab's loop verifies min(block_size, limit - a) positions, so an anchor with
    2 <= limit - a < block_size drafts limit - a - 1 tokens from a block of that length.
    """
    drafter = loaded.model
    embed, lm_head, ctx, seq = _inputs(loaded, target, context, continuation)
    for a in range(max(0, w.limit - drafter.block_size + 1), min(w.n_anchors, w.limit - 1)):
        anchors = torch.tensor([a], device=drafter.device)
        yield _blocks(loaded, embed, lm_head, ctx, seq, len(w.input_ids), anchors, w.limit - a, precision, w.id)


# --------------------------------------------------------------------------- greedy


@torch.no_grad()
def score_anchors(loaded: LoadedDrafter, target: Target | TargetHeads, w: Walked, context: torch.Tensor,
                  continuation: list[int], budgets: tuple[int, ...], chunk: int = 256,
                  precision: Precision | None = None) -> None:
    """Chain and DDTree acceptance at every anchor of one completion (fills w.chain / w.tree)."""
    w.chain, w.tree = [], {b: [] for b in budgets}
    for b in _anchor_blocks(loaded, target, w, context, continuation, chunk, precision):
        drafts = loaded.model.greedy_drafts(b.hidden, b.logits, b.predecessors)
        w.chain += metrics.chain_acceptance(drafts, b.tokens).tolist()
        for budget, acc in (ddtree_acceptance_batch(b.logits, b.tokens, budgets) if budgets else {}).items():
            w.tree[budget] += acc.tolist()


@torch.no_grad()
def score_short_blocks(loaded: LoadedDrafter, target: Target | TargetHeads, w: Walked, context: torch.Tensor,
                       continuation: list[int], budgets: tuple[int, ...], precision: Precision | None = None) -> None:
    """`cut`: acceptance of the shortened blocks near the limit (fills w.short_*)."""
    w.short_chain, w.short_tree = {}, {b: {} for b in budgets}
    for b in _short_blocks(loaded, target, w, context, continuation, precision):
        a = int(b.anchors[0])
        w.short_chain[a] = int(metrics.chain_acceptance(loaded.model.greedy_drafts(b.hidden, b.logits,
                                                                                     b.predecessors), b.tokens)[0])
        for budget, acc in (ddtree_acceptance_batch(b.logits, b.tokens, budgets) if budgets else {}).items():
            w.short_tree[budget][a] = int(acc[0])


# Why DDTree is not run (docs/DESIGN.md, "DFlash2 and sampled acceptance").
DDTREE_DFLASH2 = ("DDTree is not run for DFlash2 drafters: its tree is searched over each depth's own "
                  "distribution, while DFlash2 proposes a path whose token at each position depends on the "
                  "one chosen before it (the candidate selector), so those per-depth distributions are not "
                  "what the drafter proposes")
DDTREE_SAMPLED = ("DDTree is not run at temperature > 0: its acceptance is the longest root path equal to the "
                  "target's greedy tokens, a greedy verification; a sampled tree needs a multi-draft "
                  "rejection scheme the DDTree authors do not define")


def tree_budgets(loaded: LoadedDrafter, budgets: tuple[int, ...],
                 sampling: Sampling = Sampling()) -> tuple[tuple[int, ...], str | None]:
    """(the DDTree budgets this drafter is scored at, why none if so)."""
    if loaded.model.family == DFLASH2:
        return (), DDTREE_DFLASH2
    if not sampling.greedy:
        return (), DDTREE_SAMPLED
    return budgets, None


def summarize(walked: list[Walked], block: int, budgets: tuple[int, ...], last_block: str) -> dict:
    """The fixed results keys (DESIGN.md) from per-anchor acceptance lengths."""
    cut = last_block == "cut"
    chain_walks = [metrics.walk(w.walk_lengths(), w.end, cut) for w in walked]
    summary = metrics.summarize_walks(chain_walks, block)
    tree_walks = {b: [metrics.walk(w.walk_lengths(b), w.end, cut) for w in walked] for b in budgets}
    ddtree = {}
    for b in budgets:
        tau = metrics.summarize_walks(tree_walks[b], block).tau
        ddtree[str(b)] = {"tau": tau, "dds": tau - 1}
    return {
        "block_size": block,
        "tau": summary.tau,
        "tau_pooled": summary.tau_pooled,
        "tau_all_anchors": metrics.tau_all_anchors([w.chain[: w.n_anchors] for w in walked]),
        "streak": summary.streak,
        "accept_rate_by_position": summary.accept_rate_by_position,
        "accept_len_histogram": summary.accept_len_histogram,
        "n_blocks": summary.n_blocks,
        "ddtree": ddtree,
        "prompts": [
            {"id": w.id, "dataset": w.prompt.dataset, "category": w.prompt.category,
             "input_ids": w.input_ids, "completion_ids": w.completion_ids, "acceptance_lengths": walks,
             "acceptance_lengths_as_engine": metrics.engine_walk(w.chain, len(w.completion_ids), w.n_anchors,
                                                                 w.n_anchors < len(w.completion_ids)),
             "ddtree_acceptance_lengths": {str(b): tree_walks[b][i] for b in budgets}}
            for i, (w, walks) in enumerate(zip(walked, chain_walks))
        ],
    }


# --------------------------------------------------------------------------- sampled


def _ratios(loaded: LoadedDrafter, b: _Blocks, probs: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """r = min(1, q / p) at each drafted position of the blocks b: [m, S]."""
    q = draft_probability(loaded.model, b.hidden, b.logits, b.predecessors, b.tokens, sampling)
    offsets = torch.arange(1, b.tokens.shape[1] + 1, device=b.anchors.device)
    return acceptance_ratios(q.double(), probs[b.anchors[:, None] + offsets])


@torch.no_grad()
def score_ratios(loaded: LoadedDrafter, target: Target | TargetHeads, w: Walked, context: torch.Tensor,
                 continuation: list[int], sampling: Sampling, chunk: int = 256,
                 precision: Precision | None = None) -> None:
    """Acceptance ratios at every anchor of one sampled continuation (fills w.ratios);
    continuation[t] was drawn with probability w.probs[t]."""
    probs = torch.tensor(w.probs, dtype=torch.float64, device=loaded.model.device)
    w.ratios = []
    for b in _anchor_blocks(loaded, target, w, context, continuation, chunk, precision):
        w.ratios += _ratios(loaded, b, probs, sampling).tolist()


@torch.no_grad()
def score_short_ratios(loaded: LoadedDrafter, target: Target | TargetHeads, w: Walked, context: torch.Tensor,
                       continuation: list[int], sampling: Sampling, precision: Precision | None = None) -> None:
    """`cut`: acceptance ratios of the shortened blocks near the limit (fills w.short_ratios)."""
    probs = torch.tensor(w.probs, dtype=torch.float64, device=loaded.model.device)
    w.short_ratios = {int(b.anchors[0]): _ratios(loaded, b, probs, sampling)[0].tolist()
                      for b in _short_blocks(loaded, target, w, context, continuation, precision)}


def sample_totals(groups: list[list[dict]], block: int) -> dict:
    """tau, tau_pooled, streak, accept_rate_by_position, accept_len_histogram and n_blocks of sampled
    prompts. groups[i] holds prompt i's draws, each {"tau" (None: no block), "tokens", "blocks",
    "histogram"}: a continuation's expectation offline, one run's counts online.

    Per prompt the mean over its draws (over those with a block, for tau), so `tau` is z-lab's
    macro average over prompts; the histogram, block count and pooled tau count one draw per
    prompt, as a greedy eval counts its one walk.
    """
    histogram, tokens, blocks, means = [0.0] * block, 0.0, 0.0, []
    for draws in groups:
        for d in draws:
            for length, count in enumerate(d["histogram"]):
                histogram[length] += count / len(draws)
        scored = [d["tau"] for d in draws if d["tau"] is not None]
        if scored:
            means.append(sum(scored) / len(scored))
        tokens += sum(d["tokens"] for d in draws) / len(draws)
        blocks += sum(d["blocks"] for d in draws) / len(draws)
    if not means:
        raise DraftboardError("no continuation has a token to anchor a block (every one stopped at once)")
    tau = sum(means) / len(means)
    return {"tau": tau, "tau_pooled": tokens / blocks, "streak": tau - 1,
            "accept_rate_by_position": [sum(histogram[k:]) / blocks for k in range(1, block)],
            "accept_len_histogram": histogram, "n_blocks": blocks}


def summarize_sampled(walked: list[Walked], draws: int, block: int, last_block: str) -> dict:
    """The fixed results keys from acceptance ratios, `draws` consecutive continuations per prompt.

    Each continuation's walk is taken in expectation over the acceptance draws
    (`sampling.expected_walk`: its tau is E[tokens / blocks], exact), then `sample_totals`. A
    prompt row holds its continuations under `samples` (`completion_ids`: the first one's).
    """
    cut = last_block == "cut"
    groups, rows, anchors_expected, n_anchors = [], [], 0.0, 0
    for start in range(0, len(walked), draws):
        group = walked[start:start + draws]
        samples = []
        for w in group:
            ew = w.expected = expected_walk(w.walk_ratios(), w.end, cut, block)
            samples.append({"seed": w.seed, "completion_ids": w.completion_ids,
                            "tau": ew.tau if ew.blocks else None, "tokens": ew.tokens, "blocks": ew.blocks,
                            "histogram": ew.histogram})
            anchors_expected += sum(map(expected_length, w.ratios[: w.n_anchors]))
            n_anchors += w.n_anchors
        groups.append(samples)
        w = group[0]
        rows.append({"id": w.id, "dataset": w.prompt.dataset, "category": w.prompt.category,
                     "input_ids": w.input_ids, "completion_ids": w.completion_ids, "samples": samples})
    return {"block_size": block, **sample_totals(groups, block),
            "tau_all_anchors": anchors_expected / n_anchors if n_anchors else None, "ddtree": {}, "prompts": rows}
