"""tracker/measurement/levels.py: one level of a load sweep read as an engine eval of its own."""

from __future__ import annotations

import pytest

from tracker.errors import DraftboardError
from tracker.measurement.levels import level_results
from tracker.store.importers.served import aiperf_records


def _results(per_step_at_4):
    row = {"id": "q", "completion_ids": [1, 2, 3, 4, 5, 6], "engine_drafts": 2, "engine_draft_tokens": 14,
           "engine_accepted": 3, "engine_accepted_per_step": per_step_at_4}
    return {"engine": {"name": "vllm", "num_speculative_tokens": 7}, "engine_mean_acceptance_length": 2.0,
            "prompts": [{**row, "acceptance_lengths": [1, 3], "engine_accepted_per_step": [0, 2]}],
            "load": [{"concurrency": 4, "engine_mean_acceptance_length": 2.5, "prompts": [row]}]}


def test_a_level_reads_as_an_eval_of_its_own_steps():
    """At 4 in flight the request accepted 2 then 1: blocks of 3 and 2, the level's pooled 2.5."""
    level = level_results(_results([2, 1]), 4)
    assert level["prompts"][0]["acceptance_lengths"] == [3, 2] and level["engine_mean_acceptance_length"] == 2.5
    assert level["prompts"][0]["engine_steps_ordered"] is True and level["load"] is None
    [record] = aiperf_records(_results([2, 1]), 4)
    assert record["spec_decode_acceptance"]["per_step_accepted"] == [2, 1]
    assert record["spec_decode_acceptance"]["num_spec_steps"] == 2


@pytest.mark.parametrize("results, level, message", [
    (_results([2, 1]), 8, "the eval measured levels 4"),
    ({"prompts": []}, 4, "the eval measured no load sweep"),
    (_results(None), 4, "listed no per-step counts"),  # llama.cpp's replies: drafted and accepted tokens only
])
def test_a_level_not_measured_or_without_steps_is_one_line(results, level, message):
    with pytest.raises(DraftboardError, match=message):
        level_results(results, level)
