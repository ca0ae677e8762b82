"""Compare's training curves in a real browser: decimated overview, and a zoom that shows every logged point.

`draftboard ui` serves a fresh sqlite store with two training runs of 3,000 steps (a one-step spike in
the first); the canvas charts (tracker/dashboard/curve_chart.js) must draw at most 2 x CHART_BUCKETS + 2
points per curve and keep the spike. A window dragged on a chart, or typed in From/To step, must then
be drawn with exactly that window's logged points.
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
# Per chart: every drawn series ({name, faint, dashed, x, y}), once all charts are drawn and the script ended.
CURVES_JS = """() => {
  const busy = document.querySelector('[data-testid="stStatusWidget"]');
  if (busy && busy.offsetParent !== null) return null;
  const charts = [...document.querySelectorAll(".db-curves")];
  return charts.every(c => c.dataset.drawn === "1") ? charts.map(c => c.curves()) : null;
}"""


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


def _raw(curves: list[dict]) -> list[dict]:
    return [c for c in curves if c["faint"]]


def _drawn(page, condition: str) -> list[list[dict]]:
    """The charts' curves once there are 4 (2 runs, raw and smoothed) and `condition` (JS on `c`) holds."""
    return page.wait_for_function(
        f"() => {{ const c = ({CURVES_JS})(); return c && c.length === 1 && c[0].length === 4 && {condition} && c; }}",
        polling="raf").json_value()


def test_a_zoom_reveals_every_logged_point(served, tmp_path):
    from playwright.sync_api import sync_playwright

    url, ids = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(120_000)
        page.goto(f"{url}/compare?runs={','.join(ids)}&compare_view=Training+curves")
        overview = _drawn(page, "true")[0]
        # Decimated: far fewer points than logged, and the one-step spike is still there.
        for curve in overview:
            assert 2 < len(curve["x"]) <= 2 * CHART_BUCKETS + 2 < STEPS
        assert any(SPIKE in c["x"] and c["y"][c["x"].index(SPIKE)] == 100.0 for c in _raw(overview))

        # A window dragged across the middle fifth of the chart: read again, at full detail.
        box = page.locator(".db-curves .u-over").first.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + 0.4 * box["width"], y)
        page.mouse.down()
        page.mouse.move(box["x"] + 0.5 * box["width"], y, steps=5)
        page.mouse.move(box["x"] + 0.6 * box["width"], y, steps=5)
        page.mouse.up()
        # Both inputs are set by one rerun, but the browser may draw them a frame apart.
        start, end = (page.get_by_role("spinbutton", name=n) for n in ("From step", "To step"))
        wait_until(lambda: start.input_value() != "0" and end.input_value() != str(STEPS - 1), 60, 0.1,
                   "the dragged window in From and To step")
        lo, hi = int(start.input_value()), int(end.input_value())
        assert 0.3 * STEPS < lo < 0.5 * STEPS < hi < 0.7 * STEPS  # about the dragged fifth
        dragged = _drawn(page, f"c[0].every(t => t.x[0] === {lo} && t.x.length === {hi - lo + 1})")[0]
        for curve in dragged:
            assert curve["x"] == list(range(lo, hi + 1))  # every logged step of the window

        page.get_by_role("spinbutton", name="From step").fill("1200")
        page.get_by_role("spinbutton", name="To step").fill("1299")
        page.get_by_role("spinbutton", name="To step").press("Enter")
        zoomed = _drawn(page, "c[0].every(t => t.x.length === 100)")[0]
        page.screenshot(path=tmp_path / "zoomed.png", full_page=True)
        # A double click on the chart shows the whole run again, decimated.
        page.locator(".db-curves .u-over").first.dblclick()
        _drawn(page, f"c[0].every(t => t.x[0] === 0 && t.x[t.x.length - 1] === {STEPS - 1} && t.x.length < {STEPS})")
        assert page.get_by_role("spinbutton", name="To step").input_value() == str(STEPS - 1)
        browser.close()
    for curve in zoomed:
        assert curve["x"] == list(range(1200, 1300))  # every logged step of the window
    raw = {round(c["y"][-1]): c for c in _raw(zoomed)}  # run 1's curve sits 1 above run 0's
    assert raw[0]["y"][SPIKE - 1200] == 100.0
    assert raw[0]["y"][0] == pytest.approx(1.0 / 1201) and raw[1]["y"][0] == pytest.approx(1.0 / 1201 + 1)
