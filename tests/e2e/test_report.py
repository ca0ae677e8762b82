"""`draftboard report`'s HTML in Chromium with every request refused: it draws every chart from what is
inside the file, asks no network for anything, and shows a hostile run name as text."""

import re
import shutil

from mlflow import MlflowClient
from test_browser import HOSTILE, page, pytestmark  # noqa: F401  (the Chromium page fixture and its skip)

from tracker.cli import main


def test_the_report_opens_offline_draws_every_chart_and_runs_no_name(dashboard_store, page, tmp_path, capsys):  # noqa: F811
    store = tmp_path / "store.db"  # a copy: the session's store keeps its names
    shutil.copy(dashboard_store.uri.removeprefix("sqlite:///"), store)
    uri = f"sqlite:///{store}"
    ids = dashboard_store.ids
    MlflowClient(uri).set_tag(ids["v4"], "mlflow.runName", HOSTILE)
    out = tmp_path / "report.html"
    assert main(["report", ids["v5"], ids["v4"], "--out", str(out), "--tracking-uri", uri]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    html = out.read_text()  # issue 52: a file meant for sharing names the store, not where it lies here
    assert "Store: <code>store.db (sqlite)</code>" in html and str(tmp_path) not in html

    requested = []

    def refuse(route):
        requested.append(route.request.url)
        route.abort()

    page.route("**/*", lambda route: route.continue_() if route.request.url == out.as_uri() else refuse(route))
    page.goto(out.as_uri())
    charts = page.locator(".db-chart")
    n = charts.count()
    assert n >= 5  # loss, acc, streak, dds8 over training; tau over checkpoints
    page.wait_for_function(f"document.querySelectorAll('.db-curves[data-drawn=\"1\"]').length === {n}")
    drawn = page.evaluate("[...document.querySelectorAll('.db-curves')].map(c => c.curves().length)")
    assert all(k >= 1 for k in drawn), drawn  # every chart has its lines
    # Issue 39: a series of one point (v4's one evaluated checkpoint) is drawn as its point, not left out.
    ones = page.evaluate("[...document.querySelectorAll('.db-curves')].flatMap(c => c.curves())"
                         ".filter(s => s.y.filter(v => !Number.isNaN(v)).length === 1)")
    assert ones and all(s["single"] for s in ones), ones
    # Evals over checkpoints as Compare draws them: each point's interval as an error bar, the reference's line.
    evals = page.evaluate("[...document.querySelectorAll('.db-curves')].filter(c => c.curves().some(s => s.low))"
                          ".map(c => ({reference: c.dataset.reference, curves: c.curves()}))")
    assert evals and any(lo is not None for chart in evals for s in chart["curves"] for lo in s["low"]), evals
    assert any(chart["reference"] == "1" for chart in evals), evals
    # The cursor away, an eval chart's legend holds each series' latest checkpoint with its interval.
    legend = page.locator(".db-curves .u-legend").filter(has_text="checkpoint step").first.inner_text()
    assert "latest" in legend and re.search(r"\d(\.\d+)? \(\d\.\d{3}–\d\.\d{3}\)", legend), legend
    assert page.evaluate("window.__xss") is None
    assert HOSTILE in page.locator("h1").text_content()  # the name, as text
    assert requested == []
    text = page.locator("body").text_content()
    for heading in ("vs reference", "vs previous checkpoint", "Environment and protocol against the reference",
                    "Definitions"):
        assert heading in text
    assert "Mean acceptance length" in text and "linear-attn" in text  # a definition; v4's known difference
    assert not re.search(r"\d\.\d{6,}", text), re.search(r"\d\.\d{6,}", text)  # numbers as Compare shows them
    page.screenshot(path=tmp_path / "report.png", full_page=True)


def test_an_eval_chart_with_only_the_reference_draws_its_line(page, tmp_path):  # noqa: F811
    """A metric only the reference has (no eval logged it yet): the chart draws the reference's lines alone,
    with no error, though it has no checkpoint to span."""
    import json

    import pandas as pd

    from tracker.dashboard import curve_chart
    from tracker.dashboard.compare import POINT_COLUMNS

    # Issue 65 M6: a matched number and one drawn apart (another prompt set: shape only) on one chart
    spec = curve_chart.eval_spec(pd.DataFrame(columns=POINT_COLUMNS), "speedup", None, [
        {"value": 2.5, "label": "z-lab paper · gsm8k"},
        {"value": 3.1, "label": "z-lab paper · avg over math500 · other prompts: shape only", "apart": True}])
    js = curve_chart.JS.replace("export default function", "window.draftboardChart = function")
    html = tmp_path / "chart.html"
    html.write_text(f"<html><head><style>{curve_chart.CSS}</style></head><body><div id='c'></div><script>{js}"
                    f"</script><script>window.draftboardChart({{data: {json.dumps(spec)}, parentElement: "
                    "document.getElementById('c'), setTriggerValue: () => null});</script></body></html>")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(html.as_uri())
    page.wait_for_function("document.querySelector('.db-curves')?.dataset.drawn === '1'")
    assert errors == [] and page.evaluate("document.querySelector('.db-curves').dataset.reference") == "2"
