"""The sampled protocol's pure parts: z-lab's sampling distributions, and the walk's exact expectation."""

import itertools

import pytest
import torch

from evaluators import metrics
from evaluators.sampling import Sampling, acceptance_ratios, expected_walk, length_distribution, sampling_probs
from tracker.errors import DraftboardError
from zlab import zlab_model


def test_sampling_probs_is_zlabs():
    _sampling_probs = zlab_model()._sampling_probs

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for t, p, k in [(1.0, 1.0, 0), (1.0, 0.95, 20), (0.6, 0.8, 0), (1.3, 1.0, 5), (1.0, 0.5, 50)]:
        assert torch.equal(sampling_probs(logits, Sampling(t, p, k)), _sampling_probs(logits, t, p, k))


def test_bad_sampling_flags_are_refused():
    for kwargs, needle in [({"temperature": -1}, "--temperature"), ({"top_p": 0}, "--top-p"),
                           ({"top_k": -2}, "--top-k")]:
        with pytest.raises(DraftboardError, match=needle):
            Sampling(**kwargs)


def test_acceptance_ratio_is_min_one_q_over_p():
    q, p = torch.tensor([0.2, 0.5, 0.0]), torch.tensor([0.4, 0.25, 0.3])
    assert acceptance_ratios(q, p).tolist() == pytest.approx([0.5, 1.0, 0.0])


def test_length_distribution_by_hand():
    # r = (0.5, 0.25): L=1 w.p. 0.5, L=2 w.p. 0.5*0.75, L=3 w.p. 0.5*0.25
    assert length_distribution([0.5, 0.25]).tolist() == pytest.approx([0.5, 0.375, 0.125])


def test_expected_walk_by_hand():
    # Blocks of 2 (one draft each), 3 anchors, full rule. r = 0.5 at anchor 0, 1 at anchor 1, 0 at 2.
    # Paths: reject at 0 (p .5): anchors 0,1 -> L=1, then L=2 (reaches 3): lengths [1, 2], mean 1.5
    #        accept at 0 (p .5): L=2 -> anchor 2, L=1: lengths [2, 1], mean 1.5
    ew = expected_walk([[0.5], [1.0], [0.0]], end=3, cut=False, block=2)
    assert ew.tau == pytest.approx(1.5) and ew.blocks == pytest.approx(2.0) and ew.tokens == pytest.approx(3.0)
    assert ew.histogram == pytest.approx([1.0, 1.0])
    # Where the blocks are: anchor 0 always, anchor 1 after a rejection (.5), anchor 2 after an acceptance (.5);
    # the block at 0 is 1 or 2 long (E 1.5), at 1 always 2 (r = 1), at 2 always 1 (r = 0).
    assert ew.visits == pytest.approx([1.0, 0.5, 0.5]) and ew.lengths == pytest.approx([1.5, 2.0, 1.0])
    # Now r = 0.5 everywhere over 2 anchors: [1, then anchor 1: 1 or 2] or [2]
    # P: .5*.5 [1,1] mean 1; .5*.5 [1,2] mean 1.5; .5 [2] mean 2 -> E = .25 + .375 + 1 = 1.625
    ew = expected_walk([[0.5], [0.5]], end=2, cut=False, block=2)
    assert ew.tau == pytest.approx(1.625) and ew.blocks == pytest.approx(1.5)
    # cut clips the last block to what is left: [1,2] becomes [1,1]: E = .25 + .25 + 1 = 1.5
    assert expected_walk([[0.5], [0.5]], end=2, cut=True, block=2).tau == pytest.approx(1.5)


@pytest.mark.parametrize("cut", [False, True])
def test_expected_walk_equals_the_mean_over_every_acceptance_pattern(cut):
    """Brute force: enumerate every accept/reject draw at every (anchor, position), weigh each
    pattern by its probability and walk it; the DP's expectation equals that sum exactly."""
    g = torch.Generator().manual_seed(1)
    block, n = 3, 5
    r = torch.rand(n, block - 1, generator=g).tolist()
    cells = [(a, j) for a in range(n) for j in range(block - 1)]
    tau = 0.0
    hist = [0.0] * block
    for bits in itertools.product([0, 1], repeat=len(cells)):
        prob, accepted = 1.0, {}
        for (a, j), b in zip(cells, bits):
            prob *= r[a][j] if b else 1 - r[a][j]
            accepted[a, j] = b
        lengths = [1 + next((j for j in range(block - 1) if not accepted[a, j]), block - 1) for a in range(n)]
        walk = metrics.walk(lengths, n, cut)
        tau += prob * sum(walk) / len(walk)
        for length in walk:
            hist[length - 1] += prob
    ew = expected_walk(r, end=n, cut=cut, block=block)
    assert ew.tau == pytest.approx(tau, abs=1e-12)
    assert ew.histogram == pytest.approx(hist, abs=1e-12)


def test_with_ratios_of_zero_and_one_it_is_the_greedy_walk_exactly():
    g = torch.Generator().manual_seed(2)
    block = 4
    for trial in range(50):
        n = int(torch.randint(1, 30, (1,), generator=g))
        lengths = torch.randint(1, block + 1, (n,), generator=g).tolist()
        rows = [[1.0] * (L - 1) + [0.0] * (block - L) for L in lengths]  # L - 1 accepted, then a reject
        for cut in (False, True):
            walk = metrics.walk(lengths, n, cut)
            ew = expected_walk(rows, end=n, cut=cut, block=block)
            summary = metrics.summarize_walks([walk], block)
            assert ew.tau == summary.tau  # bit for bit, not approximately
            assert ew.histogram == [float(c) for c in summary.accept_len_histogram]
            assert ew.blocks == summary.n_blocks
