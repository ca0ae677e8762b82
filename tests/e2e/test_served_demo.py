"""Issue 52: the demo shows the served features for real, in a real browser. Its Qwen3 pair, measured by the
llama.cpp that scripts/run.sh installs (scripts/test.sh installs the same), is an engine eval beside its offline
eval: Run detail takes the gap apart, Compare's Engines view and Under load view draw it."""

import json
import re

import pytest
from playwright.sync_api import expect
from test_browser import _open_tab, _settled, dashboard, page, pytestmark  # noqa: F401  (fixtures and the skip)


def test_the_demos_engine_eval_is_reconciled_and_drawn(dashboard, page, tmp_path, llamacpp_python):  # noqa: F811
    url, home = dashboard
    served = json.loads((home / "draftboard-demo" / "manifest.json").read_text()).get("served")
    if served is None:
        pytest.fail("the session's demo was built without llama.cpp (demo.served.installed found none)")
    engine_run = served["engines"]["llamacpp"]

    page.goto(f"{url}/run?run={engine_run}")
    _open_tab(page, "Acceptance")
    expect(page.get_by_text("Served vs offline", exact=True)).to_be_visible(timeout=60_000)
    verdict = page.get_by_text(re.compile(r"^engine \d\.\d+ vs offline tau \d\.\d+ \(gap"))
    expect(verdict).to_be_visible()
    assert "nothing unexplained" in verdict.inner_text()
    page.screenshot(path=str(tmp_path / "run-detail-served.png"), full_page=True)

    from mlflow import MlflowClient

    train = MlflowClient(f"sqlite:///{home / 'draftboard.db'}").get_run(engine_run).data.tags["draftboard.train_run_id"]
    page.goto(f"{url}/compare?runs={train}&compare_view=Engines")
    expect(page.get_by_text(re.compile(r"^Each checkpoint and prompt set: the offline tau"))).to_be_visible(
        timeout=60_000)
    _settled(page)
    expect(page.get_by_text("No engine evals among these runs")).to_have_count(0)
    expect(page.get_by_text(re.compile(r"served drafter \(Qwen3 pair\) @ step \d+"))).not_to_have_count(0)
    assert page.locator("[data-testid='stDataFrame']").count() >= 1
    page.screenshot(path=str(tmp_path / "compare-engines.png"), full_page=True)

    page.goto(f"{url}/compare?runs={train}&compare_view=Under+load")
    expect(page.get_by_text(re.compile(r"^Each line: one served eval"))).to_be_visible(timeout=60_000)
    _settled(page)
    expect(page.get_by_text("No load sweeps among these runs")).to_have_count(0)
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    page.screenshot(path=str(tmp_path / "compare-load.png"), full_page=True)
