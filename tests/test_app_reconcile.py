"""Run detail draws an engine eval's reconciliation with an offline eval of the same checkpoint and
prompts: the hand-worked pair of tests/test_reconcile.py, logged as two eval runs of a real store."""

from __future__ import annotations

from apptest import page_text, run_page, serve
from test_reconcile import evals
from tracker.store import names
from tracker.store.tracker import Tracker


def log_pair(tmp_path, engine: dict, offline: dict) -> tuple[str, dict[str, str]]:
    """The two evals as runs of one checkpoint on one prompt set, in a store of their own."""
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    checkpoint = tmp_path / "drafter"
    checkpoint.mkdir()
    tracker, ids = Tracker(uri), {}
    for name, results, scoring in (("served", engine, "engine"), ("offline", offline, "offline")):
        tags = {names.protocol_tag("scoring"): scoring, names.protocol_tag("prompt_digest"): "abc123"}
        with tracker.eval_run(name, target="t", checkpoint=str(checkpoint), tags=tags,
                              params={"engine": "vllm"} if scoring == "engine" else {}) as run:
            run.log_metrics({"tau": results["tau"]}, step=0)
            run.log_json(names.EVAL_RESULTS_ARTIFACT, results)
            ids[name] = run.run_id
    return uri, ids


def test_run_detail_reconciles_an_engine_eval_with_its_offline_twin(tmp_path, monkeypatch):
    engine, offline = evals()
    engine["prompts"][0]["id"] = offline["prompts"][0]["id"] = "<img src=x onerror=alert(1)>"  # a user's id
    uri, ids = log_pair(tmp_path, engine, offline)
    serve(monkeypatch, uri, tmp_path / "home", tmp_path)
    at = run_page("pages/run_detail.py", run=ids["served"])
    assert not at.exception, [e.message for e in at.exception]
    text = page_text(at)
    assert "engine 3.300 vs offline tau 2.500 (gap +0.800)" in text and "nothing unexplained" in text
    parts, prompts = [df.value for df in at.dataframe if "part" in df.value.columns or "prompt" in df.value.columns]
    assert list(parts["part"]) == ["pooling", "end of generation", "acceptance", "numerics", "unexplained"]
    assert abs(parts["change of the pooled mean"].sum() - 0.8) < 1e-9
    assert list(prompts["cause"]) == ["end_of_generation", "acceptance", "numerics", "every block agrees"]
    assert "<img" not in text  # ids reach tables only, never markdown

    at = run_page("pages/run_detail.py", run=ids["offline"])  # an offline eval has no such section
    assert "Served vs offline" not in page_text(at)


def test_compare_tables_the_served_gap_of_each_engine_eval(tmp_path, monkeypatch):
    from tracker.dashboard.comparisons import served_gaps
    from tracker.dashboard.index import load_run_index

    engine, offline = evals()
    uri, ids = log_pair(tmp_path, engine, offline)
    loaded = {ids["served"]: engine, ids["offline"]: offline}
    index = load_run_index(Tracker(uri))
    frame = served_gaps(index, list(index.runs.values()), lambda run: loaded.get(run.run_id))
    [row] = frame.to_dict("records")
    assert row["checkpoint"].endswith("(served by vllm)") and abs(row["gap"] - 0.8) < 1e-12
    assert row["engine mean acceptance length"] == 3.3 and row["offline tau"] == 2.5
    assert row["unexplained"] == 0.0 and "nothing unexplained" in row["verdict"]
