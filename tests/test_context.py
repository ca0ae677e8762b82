"""tracker/measurement/context.py: acceptance by context length, on walks worked by hand."""

from __future__ import annotations

import pytest

from tracker.measurement.context import (
    anchor_contexts,
    by_context,
    check_edges,
    default_edges,
    paired_by_walks,
    walk_contexts,
)
from tracker.measurement.uncertainty import BETTER, WORSE


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


def test_two_walks_are_compared_bucket_by_bucket_where_enough_prompts_have_blocks_on_both_sides():
    """A walks 3,3,3 (contexts 11, 14, 17), B walks 1,4,4 (contexts 11, 12, 16), on 10-token prompts; edges 0,16.
    [0,16): A 3,3 (tau 3), B 1,4 (2.5): Δ -0.5 on every prompt, so every resample says -0.5: worse.
    [16,∞): A 3, B 4: Δ +1.0, better. Both means are 3: one mean τ hides both."""
    a, b = [(10, [3, 3, 3])] * 4, [(10, [1, 4, 4])] * 4
    edges, rows = paired_by_walks(a, b, [0, 16])
    assert edges == (0, 16)
    assert [(r["from"], r["to"], r["blocks_a"], r["blocks_b"], r["tau_a"], r["tau_b"], r["delta"], r["ci"],
             r["n_prompts"], r["verdict"]) for r in rows] == [
        (0, 16, 8, 8, 3.0, 2.5, -0.5, [-0.5, -0.5], 4, WORSE),
        (16, None, 4, 4, 3.0, 4.0, 1.0, [1.0, 1.0], 4, BETTER)]
    _, few = paired_by_walks(a[:3], b[:3], [0, 16])  # 3 prompts: under MIN_PROMPTS, nothing compared
    assert [(r["tau_a"], r["tau_b"], r["delta"], r["verdict"]) for r in few] == [(3.0, 2.5, None, None),
                                                                                 (3.0, 4.0, None, None)]
    assert paired_by_walks(a, b, [])[0] == (0, 8, 16)  # octaves of both sides' contexts 11..17
    with pytest.raises(ValueError, match="same prompts"):
        paired_by_walks(a, b[:2], [0])


def test_a_noisy_bucket_is_no_detectable_difference_at_the_bonferroni_level():
    """Half the prompts gain a token in the bucket, half lose one: Δ 0, its interval spans it."""
    a = [(10, [2, 2])] * 8
    b = [(10, [3, 2]), (10, [1, 2])] * 4
    (row,) = paired_by_walks(a, b, [0])[1]
    assert row["delta"] == 0.0 and row["ci"][0] < 0 < row["ci"][1] and row["verdict"] not in (WORSE, BETTER)


def test_default_edges_cover_the_contexts_in_octaves():
    assert default_edges([21, 40, 156]) == (0, 16, 32, 64, 128)
    assert default_edges([1]) == (0, 1)
    assert default_edges([]) == (0,)


@pytest.mark.parametrize("edges", [[], [-1, 4], [0, 1 << 30], [True], list(range(65))])
def test_bad_edges_are_refused(edges):
    with pytest.raises(ValueError, match="context bucket edges"):
        check_edges(edges)


@pytest.mark.parametrize("edges, message", [
    ("0,-5", "each context bucket edge must be an integer from 0 to 16777216"),
    ("0,99999999999", "each context bucket edge must be an integer from 0 to 16777216"),
    ("0,1k", "context_buckets must be comma-separated integers like 0,512,2048"),
    (",".join(map(str, range(65))), "context_buckets: at most 64 context bucket edges, got 65"),
])
def test_bad_bucket_edges_are_one_line_before_anything_runs(edges, message, tmp_path, capsys):
    from test_load import flag_refused

    assert message in flag_refused(tmp_path, capsys, "--context-buckets", edges)


@pytest.mark.sqlite_only(reason="one store is enough: the page reads what the import wrote")
def test_an_imported_serving_benchmark_lands_in_buckets_on_run_detail(tmp_path, monkeypatch, capsys):
    """Issue 50, item 6: speculators' spec_acceptance.py states each request's input length and its ordered steps,
    so the import places every step at its context, and Run detail tables the curve as it does a measured one."""
    import evalformats
    from apptest import run_page, serve
    from tracker.cli import main

    folder = tmp_path / "served"  # prompt 100: steps accepting 3, 1, 0 (lengths 4, 2, 1 at 101, 105, 107)
    evalformats.spec_acceptance(folder, [(100, evalformats.vllm_request_metrics([3, 1, 0], 3)),
                                         (5000, evalformats.vllm_request_metrics([2, 2], 3))])
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["import-results", str(folder), "--format", "speculators-spec-acceptance", "--tracking-uri", uri]) == 0
    run_id = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    serve(monkeypatch, uri, tmp_path, tmp_path)
    at = run_page("pages/run_detail.py", run=run_id)
    (table,) = [d.value for d in at.dataframe if "context (tokens)" in d.value.columns]
    rows = table[table["blocks"] > 0]
    assert rows["context (tokens)"].tolist() == ["[64, 128)", "[4096, ∞)"]
    assert rows["tau (engine steps)"].tolist() == pytest.approx([7 / 3, 3.0])


def test_each_non_empty_bucket_is_an_mlflow_metric_with_its_interval_under_its_curves_name():
    """`ctx{from}_tau` (the walk's) and `ctx{from}_engine_tau` (an engine's steps): two definitions, two names; an
    empty bucket logs nothing; the dashboard says what each is."""
    from evaluators.logging import context_metric_values
    from tracker.dashboard import metric_docs

    results = {"tau_by_context": [{"from": 0, "to": 512, "blocks": 3, "tau": 2.5, "ci": [2.0, 3.0]},
                                  {"from": 512, "to": None, "blocks": 0, "tau": None, "ci": None}],
               "engine_tau_by_context": [{"from": 512, "to": None, "blocks": 4, "tau": 3.25, "ci": [3.0, 3.5]}]}
    assert context_metric_values(results) == {
        "ctx0_tau": 2.5, "ctx0_tau_ci_low": 2.0, "ctx0_tau_ci_high": 3.0,
        "ctx512_engine_tau": 3.25, "ctx512_engine_tau_ci_low": 3.0, "ctx512_engine_tau_ci_high": 3.5}
    assert metric_docs.describe("ctx512_engine_tau").title == "Mean acceptance length from 512 tokens of context"
    assert "the engine's steps" in metric_docs.describe("ctx512_engine_tau").definition
    assert "the offline walk's blocks" in metric_docs.describe("ctx0_tau").definition
