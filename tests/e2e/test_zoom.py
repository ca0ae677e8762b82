"""Compare's training curves in a real browser: decimated overview, and a zoom that shows every logged point.

`draftboard ui` serves a fresh sqlite store with two training runs of 3,000 steps (a one-step spike in
the first); the page must ship at most 2 x CHART_BUCKETS + 2 points per curve, keep the spike, and
after From/To step are set to a 100-step window hold exactly that window's logged points.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from uiprocess import free_port, healthy
from waiting import wait_until

from tracker.store.history import CHART_BUCKETS

CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("DRAFTBOARD_REQUIRE_E2E"),
    reason="needs Debian's chromium (scripts/test.sh installs it)")]

STEPS, SPIKE = 3000, 1234
PLOTS = "[data-testid='stPlotlyChart'] .js-plotly-plot"
# Per chart: [x of every trace] for the raw (faint) and the named (smoothed) traces, once drawn.
TRACES_JS = f"""() => {{
  const busy = document.querySelector('[data-testid="stStatusWidget"]');
  if (busy && busy.offsetParent !== null) return null;
  return [...document.querySelectorAll("{PLOTS}")].map(p => (p._fullData || []).map(t => ({{
    name: t.name || '', legend: t.showlegend !== false, x: Array.from(t.x), y: Array.from(t.y)}})));
}}"""


@pytest.fixture
def served(tmp_path):
    from tracker import Tracker

    home = tmp_path / "home"
    home.mkdir()
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    ids = []
    for i in range(2):
        with tracker.training_run(f"zoom-{i}", {}, "/m/T") as run:
            for step in range(STEPS):
                run.log_step(step, loss=100.0 if (i == 0 and step == SPIKE) else 1.0 / (step + 1) + i)
        ids.append(run.run_id)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    with open(tmp_path / "ui.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "ui", "--port", str(port), "--home", str(home),
                                 "--no-worker"], stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    try:
        wait_until(lambda: proc.poll() is not None or healthy(port), 120, 0.2, "the dashboard to serve")
        assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
        yield f"http://127.0.0.1:{port}", ids
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def _raw(traces: list[dict]) -> list[dict]:
    return [t for t in traces if not t["legend"]]


def test_a_zoom_reveals_every_logged_point(served, tmp_path):
    from playwright.sync_api import sync_playwright

    url, ids = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(120_000)
        page.goto(f"{url}/compare?runs={','.join(ids)}&compare_view=Training+curves")
        overview = page.wait_for_function(
            f"() => {{ const c = ({TRACES_JS})(); return c && c.length === 1 && c[0].length === 4 && c; }}",
            polling="raf").json_value()[0]
        # Decimated: far fewer points than logged, and the one-step spike is still there.
        for trace in overview:
            assert 2 < len(trace["x"]) <= 2 * CHART_BUCKETS + 2 < STEPS
        assert any(SPIKE in t["x"] and t["y"][t["x"].index(SPIKE)] == 100.0 for t in _raw(overview))

        page.get_by_role("spinbutton", name="From step").fill("1200")
        page.get_by_role("spinbutton", name="To step").fill("1299")
        page.get_by_role("spinbutton", name="To step").press("Enter")
        zoomed = page.wait_for_function(
            f"() => {{ const c = ({TRACES_JS})(); return c && c.length === 1 && c[0].length === 4 && "
            "c[0].every(t => t.x.length === 100) && c; }", polling="raf").json_value()[0]
        page.screenshot(path=tmp_path / "zoomed.png", full_page=True)
        browser.close()
    for trace in zoomed:
        assert trace["x"] == list(range(1200, 1300))  # every logged step of the window
    raw = {round(t["y"][-1]): t for t in _raw(zoomed)}  # run 1's curve sits 1 above run 0's
    assert raw[0]["y"][SPIKE - 1200] == 100.0
    assert raw[0]["y"][0] == pytest.approx(1.0 / 1201) and raw[1]["y"][0] == pytest.approx(1.0 / 1201 + 1)
