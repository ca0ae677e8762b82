"""Issue 50 in a real browser: a long-document set (LongBench's format, made 4,096 tokens long) evaluated by
`draftboard eval` into a store, and Compare's "By context" view in Chromium drawing that eval's curve, bucket by
bucket, from the dashboard `draftboard ui` serves over that store."""

from __future__ import annotations

import json

import mlflow

from test_browser import _settled, page, pytestmark  # noqa: F401  (the Chromium page fixture and its skip)
from test_long_context import _documents, longbench_row, write
from tracker.cli import main


def test_compare_draws_a_long_document_evals_curve_by_context(serving_pair, start_ui, page, tmp_path,  # noqa: F811
                                                              monkeypatch):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    prompts = write(tmp_path / "narrativeqa.jsonl", [longbench_row(i, d) for i, d in enumerate(_documents(3, 2000))])
    out = tmp_path / "results.json"
    assert main(["eval", "--target", str(serving_pair / "target"), "--drafter", str(serving_pair / "drafter"),
                 "--prompts", prompts, "--prompt-tokens", "4096", "--max-new-tokens", "32", "--context-buckets",
                 "0,4096,4112,4128", "--cache-dir", str(serving_pair / "cache"), "--name", "long documents",
                 "--out", str(out)]) == 0
    drawn = [r for r in json.loads(out.read_text())["tau_by_context"] if r["blocks"]]
    assert len(drawn) >= 2
    (run,) = mlflow.MlflowClient(store).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(store).search_experiments()])
    assert {f"ctx{r['from']}_tau" for r in drawn} <= set(run.data.metrics)  # each bucket a metric of its own
    ui, _ = start_ui("--no-worker", children=1, env={"MLFLOW_TRACKING_URI": store})

    page.goto(f"http://127.0.0.1:{ui.port}/compare?runs={run.info.run_id}&compare_view=By+context")
    chart = page.locator("[data-testid='stPlotlyChart'] .js-plotly-plot .main-svg").first
    chart.wait_for(timeout=120_000)
    _settled(page)
    page.screenshot(path=tmp_path / "by-context.png", full_page=True)
    ticks = [t.strip() for t in page.locator("[data-testid='stPlotlyChart'] .xtick text").all_text_contents()]
    assert ticks == [f"[{r['from']}, {'∞' if r['to'] is None else r['to']})" for r in drawn]
    names = page.evaluate("() => document.querySelector('[data-testid=stPlotlyChart] .js-plotly-plot').data"
                          ".map(t => t.name)")
    assert len(names) == 1 and names[0].startswith("long documents")  # one line: the eval's, named by it
