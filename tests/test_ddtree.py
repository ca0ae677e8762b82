"""DDTree acceptance: hand-worked trees, tie rules, and a literal reference build."""

import heapq
import math
from itertools import accumulate

import pytest
import torch

from evaluators.ddtree import ddtree_acceptance, ddtree_acceptance_batch, ddtree_acceptance_multi
from evaluators.metrics import chain_acceptance


def reference_acceptance(draft_logits: torch.Tensor, target_tokens: torch.Tensor, budget: int) -> int:
    """The paper's procedure taken literally, for one budget: build the tree of
    token paths with K = min(budget, vocab), then look for the target path.
    A path's log-prob is summed as the module documents (logit sum minus the
    per-depth log-normalisers), so exact ties are the same ties."""
    depth, vocab = draft_logits.shape
    top_k = min(budget, vocab)
    logits = draft_logits.float()
    norm_sums = list(accumulate(torch.logsumexp(logits, dim=-1).double().tolist()))
    # Stable descending sort: equal logits keep token-id order.
    values, tokens = torch.sort(logits, dim=-1, descending=True, stable=True)
    values, tokens = values[:, :top_k].double().tolist(), tokens[:, :top_k].tolist()

    def neg_logprob(ranks):
        return norm_sums[len(ranks) - 1] - sum(values[d][r] for d, r in enumerate(ranks))

    tree = set()
    heap = [(neg_logprob((0,)), (0,))]
    while heap and len(tree) < budget:
        _, ranks = heapq.heappop(heap)
        tree.add(tuple(tokens[d][r] for d, r in enumerate(ranks)))
        if ranks[-1] + 1 < top_k:
            sibling = ranks[:-1] + (ranks[-1] + 1,)
            heapq.heappush(heap, (neg_logprob(sibling), sibling))
        if len(ranks) < depth:
            heapq.heappush(heap, (neg_logprob(ranks + (0,)), ranks + (0,)))
    target = target_tokens.tolist()
    accepted = 0
    while accepted < depth and tuple(target[: accepted + 1]) in tree:
        accepted += 1
    return 1 + accepted


# Hand-worked tree: block_size 4 (3 depths), vocab 3, logits = log(probabilities).
#   depth 1: token 2: .50, token 0: .35, token 1: .15   -> ranks 0, 1, 2 = tokens 2, 0, 1
#   depth 2: token 1: .80, token 0: .15, token 2: .05   -> ranks 0, 1, 2 = tokens 1, 0, 2
#   depth 3: token 0: .65, token 2: .25, token 1: .10   -> ranks 0, 1, 2 = tokens 0, 2, 1
# Best-first pops (rank tuple = token path: path probability):
#   0: (0)     = [2]      .50     4: (0,0,0) = [2,1,0] .26     8: (0,0,1) = [2,1,2] .10
#   1: (0,0)   = [2,1]    .40     5: (1,0,0) = [0,1,0] .182
#   2: (1)     = [0]      .35     6: (2)     = [1]     .15
#   3: (1,0)   = [0,1]    .28     7: (2,0)   = [1,1]   .12
# Target [0,1,0] (ranks 1,0,0) has its prefixes at pops 2, 3, 5; the greedy chain
# [2,1,0] at pops 0, 1, 4; target [1,1,0] at pops 6, 7 and (2,0,0) (.078) later.
HAND_LOGITS = torch.tensor([[0.35, 0.15, 0.50], [0.15, 0.80, 0.05], [0.65, 0.10, 0.25]]).log()
HAND_CASES = {
    (0, 1, 0): [1, 1, 2, 3, 3, 4, 4, 4],
    (2, 1, 0): [2, 3, 3, 3, 4, 4, 4, 4],
    (1, 1, 0): [1, 1, 1, 1, 1, 1, 2, 3],
    (2, 0, 0): [2, 2, 2, 2, 2, 2, 2, 2],  # token 0 is rank 1 at depth 2: (0,1) pops after budget 8
}


@pytest.mark.parametrize("target", list(HAND_CASES))
def test_hand_worked_tree(target):
    expected = HAND_CASES[target]
    got = [ddtree_acceptance(HAND_LOGITS, torch.tensor(target), b) for b in range(1, 9)]
    assert got == expected


def test_hand_worked_tree_multi():
    multi = ddtree_acceptance_multi(HAND_LOGITS, torch.tensor([0, 1, 0]), [6, 2, 3])
    assert multi == {6: 4, 2: 1, 3: 2}


def test_equal_scores_pop_lexicographically_smaller_ranks_first():
    # Uniform logits, vocab 2, 2 depths: both depth-1 nodes score -ln2, all four
    # depth-2 nodes score -2ln2, and equal logits rank by token id (rank r = token r).
    # Pop order: (0), (1), (0,0), (0,1), (1,0), (1,1).
    logits = torch.zeros(2, 2)
    assert [ddtree_acceptance(logits, torch.tensor([1, 0]), b) for b in range(1, 7)] == [1, 2, 2, 2, 3, 3]
    assert [ddtree_acceptance(logits, torch.tensor([0, 1]), b) for b in range(1, 7)] == [2, 2, 2, 3, 3, 3]


def test_same_depth_ties_are_exact_even_when_rows_differ():
    # Rows [2, 1, 0] and [3, 2, 1] have the same probabilities (.665, .245, .090)
    # but different normalisers. (0,1) and (1,0) both have logit sum 4, so they tie
    # exactly (rounded log-probs summed per depth might not). Pops: (0) .665,
    # (0,0) .442, (1) .245, then the tie .163: (0,1) before (1,0).
    logits = torch.tensor([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0]])
    assert [ddtree_acceptance(logits, torch.tensor([0, 1]), b) for b in (3, 4, 5)] == [2, 3, 3]
    assert [ddtree_acceptance(logits, torch.tensor([1, 0]), b) for b in (3, 4, 5)] == [2, 2, 3]


def test_equal_logits_rank_by_token_id():
    # Tokens 0 and 1 tie for the best logit: token 0 is rank 0, token 1 rank 1.
    logits = torch.tensor([[1.0, 1.0, 0.0]])
    assert ddtree_acceptance(logits, torch.tensor([0]), 1) == 2
    assert ddtree_acceptance(logits, torch.tensor([1]), 1) == 1
    assert ddtree_acceptance(logits, torch.tensor([1]), 2) == 2
    assert ddtree_acceptance(logits, torch.tensor([2]), 2) == 1


def test_budget_one_is_the_argmax_token():
    torch.manual_seed(0)
    for _ in range(50):
        logits = torch.randn(5, 7)
        target = torch.randint(0, 7, (5,))
        if torch.rand(()) < 0.5:
            target[0] = logits[0].argmax()
        expected = 2 if target[0] == logits[0].argmax() else 1
        assert ddtree_acceptance(logits, target, 1) == expected


def test_budget_covering_the_full_tree_accepts_everything():
    # vocab 3, 3 depths: the full tree has 3 + 9 + 27 = 39 nodes, so K = vocab and
    # every token path is in it.
    torch.manual_seed(1)
    logits = torch.randn(3, 3)
    for target in torch.randint(0, 3, (20, 3)):
        assert ddtree_acceptance(logits, target, 39) == 4
        assert ddtree_acceptance(logits, target, 1000) == 4


def test_budget_equal_to_depth_need_not_contain_the_greedy_chain():
    # depth 1: .5 / .4 / .1, depth 2: .6 / .3 / .1. Pops: (0) .5, (1) .4, (0,0) .3:
    # with budget 2 the second depth-1 token beats the greedy chain's second node.
    logits = torch.tensor([[0.5, 0.4, 0.1], [0.6, 0.3, 0.1]]).log()
    greedy = torch.tensor([0, 0])
    assert ddtree_acceptance(logits, greedy, 2) == 2
    assert ddtree_acceptance(logits, greedy, 3) == 3


def test_tree_accepts_at_least_the_chain_when_the_chain_is_confident():
    # With every greedy token above 0.9 (and depth 4), the greedy chain's prefixes
    # outscore any prefix that leaves it (< log .1 < 4 log .9), so the first
    # depth pops are exactly the chain, and the tree accepts at least as much.
    torch.manual_seed(2)
    depth, vocab = 4, 11
    for _ in range(40):
        logits = torch.randn(depth, vocab)
        logits[torch.arange(depth), torch.randint(0, vocab, (depth,))] += 12.0
        greedy = logits.argmax(-1)
        target = greedy.clone()
        cut = int(torch.randint(0, depth + 1, ()))
        target[cut:] = torch.randint(0, vocab, (depth - cut,))
        chain = int(chain_acceptance(greedy[None], target[None])[0])
        for budget in (depth, depth + 3, 16):
            assert ddtree_acceptance(logits, target, budget) >= chain


def _random_case(generator, n, depth, vocab, integer_logits):
    if integer_logits:  # many exact ties, within and across depths
        logits = torch.randint(-2, 2, (n, depth, vocab), generator=generator).float()
    else:
        logits = torch.randn(n, depth, vocab, generator=generator) * 2
    # Targets mostly among the top few tokens so paths run deep.
    order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
    pick = torch.randint(0, 3, (n, depth, 1), generator=generator).clamp(max=vocab - 1)
    target = order.gather(-1, pick).squeeze(-1)
    noise = torch.rand(n, depth, generator=generator) < 0.1
    target[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=generator)
    return logits, target


@pytest.mark.parametrize("integer_logits", [False, True])
def test_batch_multi_single_and_reference_agree(integer_logits):
    generator = torch.Generator().manual_seed(3)
    budgets = [1, 2, 3, 5, 8, 16, 40]
    for depth, vocab in [(1, 4), (3, 3), (5, 6), (7, 2)]:
        logits, target = _random_case(generator, 12, depth, vocab, integer_logits)
        batch = ddtree_acceptance_batch(logits, target, budgets)
        assert set(batch) == set(budgets)
        for i in range(len(logits)):
            multi = ddtree_acceptance_multi(logits[i], target[i], budgets)
            for budget in budgets:
                single = ddtree_acceptance(logits[i], target[i], budget)
                reference = reference_acceptance(logits[i], target[i], budget)
                got = (int(batch[budget][i]), multi[budget], single)
                assert got == (reference,) * 3, (depth, vocab, i, budget)


def test_acceptance_is_monotone_in_budget_and_bounded():
    generator = torch.Generator().manual_seed(4)
    logits, target = _random_case(generator, 64, 6, 9, integer_logits=False)
    budgets = list(range(1, 30))
    batch = ddtree_acceptance_batch(logits, target, budgets)
    stacked = torch.stack([batch[b] for b in budgets])  # [budgets, N]
    assert (stacked[1:] >= stacked[:-1]).all()
    assert stacked.min() >= 1 and stacked.max() <= 7


def test_low_precision_input_is_scored_in_float32():
    generator = torch.Generator().manual_seed(5)
    logits, target = _random_case(generator, 16, 5, 50, integer_logits=False)
    half = logits.bfloat16()
    got = ddtree_acceptance_batch(half, target, [4, 8])
    want = ddtree_acceptance_batch(half.float(), target, [4, 8])
    assert all(torch.equal(got[b], want[b]) for b in (4, 8))


def test_small_chunks_give_the_same_answer(monkeypatch):
    generator = torch.Generator().manual_seed(6)
    logits, target = _random_case(generator, 10, 4, 8, integer_logits=True)
    whole = ddtree_acceptance_batch(logits, target, [3, 9])
    monkeypatch.setattr("evaluators.ddtree._CHUNK_ELEMENTS", 1)
    chunked = ddtree_acceptance_batch(logits, target, [3, 9])
    assert all(torch.equal(whole[b], chunked[b]) for b in (3, 9))


def test_block_size_one_accepts_only_the_root():
    out = ddtree_acceptance_batch(torch.zeros(3, 0, 5), torch.zeros(3, 0, dtype=torch.long), [1, 4])
    assert out[1].tolist() == out[4].tolist() == [1, 1, 1]


@pytest.mark.parametrize(
    "logits, target, budgets",
    [
        (torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), [1]),  # depth mismatch
        (torch.zeros(2, 3), torch.tensor([0, 3]), [1]),  # token outside the vocab
        (torch.zeros(2, 3), torch.tensor([0, 1]), []),  # no budget
        (torch.zeros(2, 3), torch.tensor([0, 1]), [0]),  # budget < 1
        (torch.tensor([[0.0, math.nan, 0.0], [0, 0, 0]]), torch.tensor([0, 1]), [2]),
    ],
)
def test_bad_input_raises(logits, target, budgets):
    with pytest.raises(ValueError):
        ddtree_acceptance_multi(logits, target, budgets)
