"""Every page on the `draftboard demo --quick` store, as a newcomer first sees it."""


import mlflow
import pytest

from apptest import page_text, run_page, serve
from tracker.jobs.queue import JobQueue

PAGES = ["pages/runs.py", "pages/compare.py", "pages/environments.py", "pages/launch.py", "pages/run_detail.py"]


@pytest.fixture
def demo_env(demo_home, tmp_path, monkeypatch):
    serve(monkeypatch, f"sqlite:///{demo_home / 'draftboard.db'}", demo_home, tmp_path)
    return demo_home




@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_on_the_demo_store(demo_env, page):
    run_page(page)


def test_runs_page_shows_the_demo_runs(demo_env):
    table = run_page("pages/runs.py").dataframe[0].value
    names = set(table["name"])
    assert {"drafter-v1 (1 tapped layer)", "drafter-v2 (2 tapped layers)", "drafter-v3 (uniform loss, bf16)",
            "drafter-v4 (DFlash2)", "longer-trained drafter (demo)"} <= names
    # the DFlash2 drafter and its evals say their family
    assert set(table.loc[table["name"].str.startswith("drafter-v4"), "drafter"]) == {"DFlash2"}
    assert any(name.startswith("z-lab published:") for name in names)


def test_compare_names_the_bf16_training_mismatch(demo_env):
    client = mlflow.MlflowClient(f"sqlite:///{demo_env / 'draftboard.db'}")
    exp = client.get_experiment_by_name("draftboard").experiment_id
    v3 = client.search_runs([exp], "attributes.run_name = 'drafter-v3 (uniform loss, bf16)'")[0]
    text = page_text(run_page("pages/compare.py", runs=v3.info.run_id))
    assert "longer-trained drafter (demo)" in text
    # v3 trained its drafter under bf16 autocast on fp32 features; the demo's evals cast nothing to
    # bf16, so the banner names the drafter's precision, with both values.
    assert "drafter precision fp32 vs its training run: bf16-autocast" in text


def test_an_eval_in_its_training_environment_says_so(demo_env):
    """v1 trained and was evaluated on the same CPU fallback path in fp32: Run detail of its eval says the
    environments match (it said the training run had no fingerprint: an empty diff is a tuple, not a list)."""
    client = mlflow.MlflowClient(f"sqlite:///{demo_env / 'draftboard.db'}")
    exp = client.get_experiment_by_name("draftboard").experiment_id
    ev = client.search_runs([exp], "tags.`draftboard.kind` = 'eval' and attributes.run_name LIKE 'drafter-v1%'")[0]
    at = run_page("pages/run_detail.py", run=ev.info.run_id)
    assert [s.value for s in at.success] == ["Same environment as the training run."]
    assert "has no fingerprint" not in page_text(at)


def test_launch_queues_a_job_on_the_demo_store(demo_env, tmp_path):
    at = run_page("pages/launch.py")
    at.button(key="launch_submit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    jobs = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}").list()
    assert len(jobs) == 1 and jobs[0].kind == "eval", [e.value for e in at.error] + [w.value for w in at.warning]
    assert jobs[0].params["target"].endswith("qwen35-tiny-stdlib")
    # the form starts on the team's newest drafter, not the reference's own training run (trained last)
    client = mlflow.MlflowClient(f"sqlite:///{demo_env / 'draftboard.db'}")
    assert client.get_run(jobs[0].params["train_run_id"]).info.run_name == "drafter-v4 (DFlash2)"
    # ... whose eval runs no DDTree: the page says so instead of dropping the budgets in silence
    assert any("not run for a DFlash2 drafter" in i.value for i in at.info), [i.value for i in at.info]


def test_compare_starts_with_the_teams_training_runs_and_the_closest_reference(demo_env):
    client = mlflow.MlflowClient(f"sqlite:///{demo_env / 'draftboard.db'}")
    at = run_page("pages/compare.py")
    names = {client.get_run(r).info.run_name for r in at.multiselect(key="compare_runs").value}
    assert names == {"drafter-v1 (1 tapped layer)", "drafter-v2 (2 tapped layers)", "drafter-v3 (uniform loss, bf16)",
                     "drafter-v4 (DFlash2)"}
    assert at.selectbox(key="compare_reference").options[0].startswith("closest match: longer-trained drafter (demo)")



def test_compare_keeps_every_legend_clear_of_the_plotly_toolbar(demo_env):
    """The toolbar sits at the top right of a chart, where a default legend goes: every Compare Plotly
    chart (acceptance by position, DDTree; curves over steps are canvases, legend below by construction) puts its
    legend under the plot instead."""
    import json

    at = run_page("pages/compare.py")
    charts = []
    switch = at.segmented_control(key="compare_view")
    for view in switch.options:  # one view is drawn at a time
        at.segmented_control(key="compare_view").set_value(view).run()
        assert not at.exception, [e.message for e in at.exception]
        charts += [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    assert len(charts) >= 2  # acceptance by position, DDTree (evals by checkpoint are canvases)
    for spec in charts:
        legend = spec["layout"]["legend"]
        assert legend["orientation"] == "h" and legend["y"] < 0, legend


def test_the_demo_stores_tables_read_from_the_env_tags_equal_those_read_from_every_fingerprint(demo_env):
    """Issue 38: the Runs table, the landing count and Environments' pairs decide what they can from the
    `env.*` key tags and read only the other fingerprints; on the demo store every cell equals what reading
    every fingerprint (the keys ignored) gives, and fewer files are read."""
    from dataclasses import replace

    from tracker import Tracker
    from tracker.dashboard import envmatrix, lineage, tables
    from tracker.dashboard.index import RunIndex, load_run_index

    keys = ("env.critical_key", "env.warning_key", "env.probe_digest")
    tracker = Tracker(f"sqlite:///{demo_env / 'draftboard.db'}")
    index = load_run_index(tracker)
    every = RunIndex(replace(r, tags={k: v for k, v in r.tags.items() if k not in keys}) for r in index.runs.values())
    every.read_fingerprints(every.runs.values())
    assert all(keys[0] in r.tags for r in index.runs.values() if "env.hash" in r.tags)  # the demo logs them
    assert tables.runs_table(index, list(index.runs.values())).equals(tables.runs_table(every, list(every.runs.values())))
    assert [e.run_id for e in lineage.open_evals(index)] == [e.run_id for e in lineage.open_evals(every)] != []
    assert envmatrix.pairs_frame(index, lineage.train_eval_pairs(index)).equals(
        envmatrix.pairs_frame(every, lineage.train_eval_pairs(every)))
    read = [r for r in index.runs.values() if r.fingerprint_read]
    assert 0 < len(read) < len(index.runs) / 2, (len(read), len(index.runs))
