"""What engines report, parsed: hand-worked counts and Prometheus text as vLLM 0.32 exports it."""

from __future__ import annotations

import pytest

from evaluators.engines.base import EngineError, EngineReply
from tracker.measurement.engine_metrics import counter, histogram_from_positions, prometheus_samples, scrapes
from tracker.errors import DraftboardError


def test_a_chains_per_position_counts_give_its_histogram():
    # 5 steps; position 0 accepted in 4 of them, position 1 in 2, position 2 in 1:
    # exactly 0 accepted: 5-4 = 1, exactly 1: 4-2 = 2, exactly 2: 2-1 = 1, exactly 3: 1.
    assert histogram_from_positions(5, [4, 2, 1]) == [1, 2, 1, 1]
    with pytest.raises(DraftboardError, match="not a chain"):
        histogram_from_positions(5, [2, 3, 1])
    reply = EngineReply([1] * 9, drafts=5, draft_tokens=15, accepted=4 + 2 + 1, histogram=[1, 2, 1, 1])
    assert reply.accepted_by_position == [4, 2, 1] and reply.steps_multiset == [0, 1, 1, 2, 3]
    with pytest.raises(EngineError, match="disagree"):
        EngineReply([1] * 9, drafts=5, draft_tokens=15, accepted=6, histogram=[1, 2, 1, 1])


def test_prometheus_counters_with_or_without_the_total_suffix():
    text = ('# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 39.0\n'
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09\n'
            'vllm:spec_decode_num_drafts{engine="1",model_name="m"} 3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="2"} 7.0\n')
    samples = prometheus_samples(text)
    assert counter(samples, "vllm:spec_decode_num_drafts") == 42.0  # both engines, _created left out
    assert counter(samples, "vllm:spec_decode_num_accepted_tokens_per_pos", position="2") == 7.0
    assert counter(samples, "vllm:spec_decode_num_draft_tokens") is None


def test_appended_scrapes_are_told_apart_by_a_repeated_sample():
    one = ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 4.0\n'
           'vllm:spec_decode_num_drafts_total{engine="0"} 10.0\n')
    two = one.replace("4.0", "9.0").replace("10.0", "16.0")
    first, second = scrapes(one + "# a comment between them\n" + two)
    assert counter(first, "vllm:spec_decode_num_drafts") == 10.0 and counter(second, "vllm:spec_decode_num_drafts") == 16.0
    assert scrapes("") == []
