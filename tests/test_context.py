"""tracker/measurement/context.py: acceptance by context length, on walks worked by hand."""

from __future__ import annotations

import pytest

from tracker.measurement.context import anchor_contexts, by_context, check_edges, default_edges, walk_contexts


def test_a_blocks_context_is_the_prompt_the_prefill_token_and_the_blocks_before_it():
    """A 10-token prompt, blocks of 3, 1, 4: anchors at completion tokens 0, 3, 4, so contexts 11, 14, 15."""
    assert walk_contexts(10, [3, 1, 4]) == [11, 14, 15]
    assert anchor_contexts(10, 3) == [11, 12, 13]
    assert walk_contexts(5, []) == []


def test_buckets_pool_their_blocks_over_prompts():
    """Prompt a: blocks 3,1,4 at contexts 11,14,15; prompt b (20 tokens): blocks 2,2 at 21,23. Edges 0,12,16:
    [0,12) holds a's 3 (tau 3); [12,16) a's 1 and 4 (2.5); [16,∞) b's 2 and 2 (2.0)."""
    a, b = (walk_contexts(10, [3, 1, 4]), [3, 1, 4]), (walk_contexts(20, [2, 2]), [2, 2])
    rows = by_context([a, b], [16, 0, 12])  # edges in any order
    assert [(r["from"], r["to"], r["blocks"], r["tau"]) for r in rows] == [
        (0, 12, 1, 3.0), (12, 16, 2, 2.5), (16, None, 2, 2.0)]
    low, high = rows[1]["ci"]
    assert low <= 2.5 <= high
    assert rows[0]["ci"] == [3.0, 3.0]  # one block: every resample that has it says 3
    empty = by_context([a], [0, 100])
    assert empty[1] == {"from": 100, "to": None, "blocks": 0, "tau": None, "ci": None}
    assert by_context([a], [12])[0]["blocks"] == 2  # contexts below the first edge are in no bucket


def test_default_edges_cover_the_contexts_in_octaves():
    assert default_edges([21, 40, 156]) == (0, 16, 32, 64, 128)
    assert default_edges([1]) == (0, 1)
    assert default_edges([]) == (0,)


@pytest.mark.parametrize("edges", [[], [-1, 4], [0, 1 << 30], [True]])
def test_bad_edges_are_refused(edges):
    with pytest.raises(ValueError, match="context bucket edges"):
        check_edges(edges)


@pytest.mark.parametrize("edges, message", [
    ("0,-5", "each context bucket edge must be an integer from 0 to 16777216"),
    ("0,99999999999", "each context bucket edge must be an integer from 0 to 16777216"),
    ("0,1k", "context_buckets must be comma-separated integers like 0,512,2048"),
])
def test_bad_bucket_edges_are_one_line_before_anything_runs(edges, message, tmp_path, capsys):
    from test_load import flag_refused

    assert message in flag_refused(tmp_path, capsys, "--context-buckets", edges)
