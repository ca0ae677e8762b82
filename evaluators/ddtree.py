"""DDTree acceptance of one DFlash block (Ringel & Romano 2026), scored offline.

A DFlash drafter fills the block_size-1 masked positions of a block in one pass,
giving one distribution per depth. DDTree turns those independent per-depth
distributions into a draft tree: the `budget` most probable prefixes, found
best-first with a max-heap on summed log-probabilities, hung under the root (the
anchor token). The target verifies the whole tree at once, so the acceptance
length is 1 + the longest prefix of the target's greedy continuation that is a
root path of the tree.

Why one heap run serves every budget: the pop order does not depend on the
budget. A prefix holding rank r at some depth is pushed only after its siblings of
rank 0..r-1 were popped, so it can never be among the first r pops; hence
capping the ranks at K = min(budget, vocab) does not change the first `budget`
pops, and a single run up to max(budgets) with K = min(max(budgets), vocab)
gives the tree for every smaller budget: the tree of budget b is its first b
pops. The tree is prefix-closed (a child is pushed only after its parent pops),
so acceptance(b) = 1 + the number of target prefixes popped within the first b.

Only two things about a depth's distribution matter: its top-K log-probs (which
fix the pop order) and the rank of the target token (which says where the target
path runs). The token identity at other ranks never matters, so no tree of
tokens is built: the target's rank is read off the top-K.

Scores are computed as (sum of the path's logits) - (sum of the per-depth
log-normalisers), in float64: the logit sum is exact for bf16 / fp16 / typical
fp32 logits and the normaliser sum is the same float for every prefix of a given
depth, so prefixes of one depth whose log-probs are mathematically equal get
exactly equal scores (summing rounded log-probs would break such ties by
rounding noise). Deterministic tie-breaking:
- within a depth, tokens with equal logits rank by token id (smaller id first);
- in the heap, on equal score the lexicographically smaller rank tuple pops
  first (heapq on (-score, ranks)).

The per-depth reductions run on the CPU in float32 (float64 if the input is
float64), whatever the input dtype and device, so the same logits give the same
tree everywhere.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import accumulate

import torch

# Elements of logits handled per chunk (float32: 64 MiB), to bound peak memory.
_CHUNK_ELEMENTS = 1 << 24


def ddtree_acceptance(draft_logits: torch.Tensor, target_tokens: torch.Tensor, budget: int) -> int:
    """Acceptance length (root included, 1..block_size) of a DDTree of `budget` nodes.

    draft_logits: [block_size-1, vocab], the drafter's logits for the masked positions.
    target_tokens: [block_size-1], the target's greedy tokens for those positions.
    """
    return ddtree_acceptance_multi(draft_logits, target_tokens, [budget])[budget]


def ddtree_acceptance_multi(
    draft_logits: torch.Tensor, target_tokens: torch.Tensor, budgets: Iterable[int]
) -> dict[int, int]:
    """Acceptance length for each budget of one block, from a single heap run."""
    if draft_logits.dim() != 2 or target_tokens.dim() != 1:
        raise ValueError(
            "expected draft_logits [block_size-1, vocab] and target_tokens [block_size-1], "
            f"got {tuple(draft_logits.shape)} and {tuple(target_tokens.shape)}"
        )
    batch = ddtree_acceptance_batch(draft_logits.unsqueeze(0), target_tokens.unsqueeze(0), budgets)
    return {budget: int(lengths[0]) for budget, lengths in batch.items()}


def ddtree_acceptance_batch(
    draft_logits: torch.Tensor, target_tokens: torch.Tensor, budgets: Iterable[int]
) -> dict[int, torch.Tensor]:
    """Acceptance lengths of N blocks for each budget: {budget: LongTensor[N]}.

    draft_logits: [N, block_size-1, vocab]; target_tokens: [N, block_size-1].
    The per-depth reductions run batched in torch; only the small heap loop, which
    stops as soon as the target path cannot grow, runs per block in Python.
    """
    budget_list = _check_budgets(budgets)
    if draft_logits.dim() != 3 or target_tokens.shape != draft_logits.shape[:2]:
        raise ValueError(
            "expected draft_logits [N, block_size-1, vocab] and target_tokens [N, block_size-1], "
            f"got {tuple(draft_logits.shape)} and {tuple(target_tokens.shape)}"
        )
    n_blocks, depth, vocab = draft_logits.shape
    if vocab == 0:
        raise ValueError("draft_logits has an empty vocabulary dimension")
    if target_tokens.numel() and (int(target_tokens.min()) < 0 or int(target_tokens.max()) >= vocab):
        raise ValueError(f"target_tokens must lie in [0, {vocab})")

    max_pops = max(budget_list)
    top_k = min(max_pops, vocab)
    pop_indices: list[list[int]] = []
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, depth * vocab))
    for start in range(0, n_blocks, rows_per_chunk):
        stop = start + rows_per_chunk
        top_logits, log_norms, ranks = _reduce_depths(
            draft_logits[start:stop], target_tokens[start:stop], top_k
        )
        for block in zip(top_logits.tolist(), log_norms.tolist(), ranks.tolist()):
            pop_indices.append(_target_pop_indices(*block, max_pops))

    return {
        budget: torch.tensor(
            [1 + sum(index < budget for index in indices) for indices in pop_indices], dtype=torch.long
        )
        for budget in budget_list
    }


def _check_budgets(budgets: Iterable[int]) -> list[int]:
    budget_list = list(dict.fromkeys(budgets))
    if not budget_list:
        raise ValueError("budgets is empty")
    for budget in budget_list:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError(f"budgets must be positive ints, got {budget!r}")
    return budget_list


def _reduce_depths(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per depth: the top-K logits (descending), the log-normaliser, the target's rank.

    logits [n, D, V], targets [n, D] -> (float64 [n, D, K], float64 [n, D], long [n, D]).
    log_softmax is a per-row shift of the logits, so ranking by logits is ranking
    by log-prob, and the full log-prob tensor is never materialised.
    Tokens with equal logits rank by token id.
    """
    x = logits.to("cpu")
    if x.dtype != torch.float64:
        x = x.float()
    t = targets.to("cpu", torch.long).unsqueeze(-1)  # [n, D, 1]

    log_norms = torch.logsumexp(x, dim=-1)  # [n, D]
    if not torch.isfinite(log_norms).all():
        raise ValueError("draft_logits has a row with NaN / inf logits or all -inf")
    top = torch.topk(x, top_k, dim=-1)  # values, indices: [n, D, K]
    top_logits = top.values

    # Rank from the top-K alone: exact when the target's logit is above the K-th
    # (every token tied with it is then inside the top-K), and >= K (outside)
    # when it is below. Only a tie with the K-th logit, where topk picks the
    # boundary tokens arbitrarily, needs a count over the whole vocabulary.
    target_logit = x.gather(-1, t)  # [n, D, 1]
    ties_before = (top_logits == target_logit) & (top.indices < t)
    ranks = (top_logits > target_logit).sum(-1) + ties_before.sum(-1)  # [n, D]
    boundary = (target_logit == top_logits[..., -1:]).squeeze(-1)  # [n, D]
    if boundary.any():
        rows, row_logit, row_target = x[boundary], target_logit[boundary], t[boundary]  # [m, V], [m, 1]
        row_ties_before = (rows == row_logit) & (torch.arange(x.shape[-1]) < row_target)
        ranks[boundary] = (rows > row_logit).sum(-1) + row_ties_before.sum(-1)
    return top_logits.double(), log_norms.double(), ranks


def _target_pop_indices(
    top_logits: list[list[float]], log_norms: list[float], target_ranks: list[int], max_pops: int
) -> list[int]:
    """Pop indices of the target's prefixes of depth 1, 2, ... in the best-first run.

    top_logits: D lists of the top-K logits per depth; log_norms: D log-normalisers;
    target_ranks: D ranks (>= K when the target token is outside the top-K).
    A prefix is a tuple of per-depth ranks; its log-prob is its logit sum minus
    the normaliser sum of its depth. Heap entries are (-log-prob, ranks, the
    parent's logit sum), every logit sum being parent sum + own logit. The run
    stops after max_pops pops, when the heap is empty, or once every target
    prefix that can be in a tree (all ranks < K) has popped.
    """
    top_k = len(top_logits[0]) if top_logits else 0
    reachable = 0
    while reachable < len(target_ranks) and target_ranks[reachable] < top_k:
        reachable += 1
    target_prefixes = [tuple(target_ranks[: d + 1]) for d in range(reachable)]
    found: list[int] = []
    if not target_prefixes:
        return found

    norm_sums = list(accumulate(log_norms))  # [D]: normaliser sum of a depth-(d+1) prefix
    heap = [(norm_sums[0] - top_logits[0][0], (0,), 0.0)]
    for pop_index in range(max_pops):
        if not heap:
            break
        _, ranks, parent_sum = heapq.heappop(heap)
        if ranks == target_prefixes[len(found)]:
            found.append(pop_index)
            if len(found) == reachable:
                break
        depth = len(ranks)
        sibling_rank = ranks[-1] + 1
        if sibling_rank < top_k:
            sibling = ranks[:-1] + (sibling_rank,)
            sibling_sum = parent_sum + top_logits[depth - 1][sibling_rank]
            heapq.heappush(heap, (norm_sums[depth - 1] - sibling_sum, sibling, parent_sum))
        if depth < len(top_logits):
            logit_sum = parent_sum + top_logits[depth - 1][ranks[-1]]
            child_sum = logit_sum + top_logits[depth][0]
            heapq.heappush(heap, (norm_sums[depth] - child_sum, ranks + (0,), logit_sum))
    return found
