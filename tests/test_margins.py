"""The offline drafter's margin at a chosen block position (evaluators/margins.py), checked against
the offline eval's own walk on the trained serving pair: one drafter forward at one anchor must agree
with the batched scoring of every anchor about which positions it accepts."""

from __future__ import annotations

import json

from evaluators.margins import MarginAsk, block_margins, settings_of


def test_margins_agree_with_the_walk_about_every_accepted_and_rejected_position(serving_pair):
    offline = json.loads((serving_pair / "offline.json").read_text())
    asks, expected = [], []
    for p in offline["prompts"][:3]:
        anchor = 0
        for length in p["acceptance_lengths"][:-1]:  # the last block may be cut at the limit
            accepted = length - 1
            if accepted > 0:  # its last accepted position: the drafter agrees there
                asks.append(MarginAsk(p["id"], p["completion_ids"], anchor, accepted - 1))
                expected.append(True)
            if accepted < 7:  # the position it rejected: the drafter's top token is not the target's
                asks.append(MarginAsk(p["id"], p["completion_ids"], anchor, accepted))
                expected.append(False)
            anchor += length
    margins = block_margins(settings_of(offline), asks)
    assert [m.accepts for m in margins] == expected
    assert all(m.value >= 0 for m in margins) and any(m.value > 0.5 for m in margins)
    # Past the completion there is no target token to compare with.
    last = offline["prompts"][0]
    assert block_margins(settings_of(offline), [MarginAsk(last["id"], last["completion_ids"],
                                                          len(last["completion_ids"]) - 1, 3)]) == [None]
