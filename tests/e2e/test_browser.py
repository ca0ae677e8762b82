"""A newcomer's path through the real dashboard in a real browser (Debian's headless Chromium).

`draftboard ui` serves a copy of the quick demo store on a free loopback port, with its local
worker. The test opens Launch, queues an eval of a training checkpoint in bf16 (a new
environment for that run), waits for the job to succeed, then finds the new eval on Compare,
where evals from another environment form their own series. Screenshots go to the test's
output directory (printed on failure).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from playwright.sync_api import expect
from uiprocess import free_port, healthy
from waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("DRAFTBOARD_REQUIRE_E2E"),
    reason="needs Debian's chromium (scripts/test.sh installs it)")]


@pytest.fixture
def dashboard(demo_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(demo_home, home)
    port = free_port()
    log = open(tmp_path / "ui.log", "w")
    env = dict(os.environ, DRAFTBOARD_HOME=str(home))
    env.pop("MLFLOW_TRACKING_URI", None)
    # The copied store records the demo's absolute paths: Launch may read them, writes go to the copy.
    roots = os.pathsep.join([str(demo_home), str(home)])
    proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "ui", "--port", str(port), "--home", str(home),
                             "--allowed-roots", roots],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or healthy(port), 90, 0.2, "the dashboard to serve")
        assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
        yield url, home
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
        log.close()


@pytest.fixture
def page(tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def _settled(page) -> None:
    """Wait until the app has finished the rerun a widget change started."""
    page.locator("[data-testid='stStatusWidget']").wait_for(state="hidden")


def _choose(page, label: str, option: str) -> None:
    """Pick `option` in the Streamlit selectbox labelled `label`, and let the app apply it."""
    box = page.locator("[data-testid='stSelectbox']").filter(has_text=label)
    box.click()
    page.get_by_role("option", name=option).first.click()
    # The choice shows as the value of the box's input; then the rerun it starts must finish.
    expect(box.locator("input")).to_have_value(re.compile("^" + re.escape(option)))
    _settled(page)


# A run name that would run script if any page let it through as HTML: each payload sets __xss.
HOSTILE = ('<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
           '<iframe src="javascript:parent.__xss=3"></iframe><svg onload="window.__xss=4">')
PAGES = {"runs-root": "/", "runs": "/runs", "compare": "/compare", "environments": "/environments",
         "launch": "/launch", "run-detail": "/run"}


def test_every_page_by_its_deep_link_stays_local_and_runs_no_script_from_a_run_name(dashboard, page, tmp_path):
    from tracker import Tracker, fingerprint

    url, home = dashboard
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    with tracker.training_run(HOSTILE, {"lr": 1e-4}, "demo-target",
                              fingerprint=fingerprint.capture(device="cpu", dtype="fp32")) as run:
        run.log_step(0, loss=1.0)
        run.log_step(1, loss=0.5)
    hostile = run.run_id
    elsewhere, failed = [], []
    page.on("request", lambda r: None if r.url.startswith(url) or r.url.startswith("data:") else elsewhere.append(r.url))
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    paths = {**PAGES, "run-detail-hostile": f"/run?run={hostile}", "compare-hostile": f"/compare?runs={hostile}"}
    for name, path in paths.items():
        page.goto(url + path)
        page.locator("h1").first.wait_for()
        _settled(page)
        page.wait_for_timeout(500)  # plots draw after the script run ends
        page.screenshot(path=tmp_path / f"page-{name}.png", full_page=True)
        assert page.get_by_text("Page not found").count() == 0, path
        assert page.evaluate("window.__xss") is None, f"a run name ran script on {path}"
        if name == "run-detail-hostile":
            assert page.locator("h1").first.text_content().strip() == HOSTILE  # shown, as text
    # Deep links ask the server root for health and host-config (no /<page>/_stcore/health 404s), the
    # favicon is drawn from an emoji, and nothing is fetched from another host.
    assert failed == [] and elsewhere == [], (failed, elsewhere)
    print(f"screenshots: {tmp_path}")


def test_launch_an_eval_watch_it_finish_and_find_it_on_compare(dashboard, page, tmp_path):
    url, home = dashboard
    client = mlflow.MlflowClient(f"sqlite:///{home / 'draftboard.db'}")
    exp = client.get_experiment_by_name("draftboard").experiment_id
    v1 = client.search_runs([exp], "attributes.run_name = 'drafter-v1 (1 tapped layer)'")[0]
    evals_before = len(client.search_runs([exp], "tags.`draftboard.kind` = 'eval'"))

    page.goto(f"{url}/launch")
    page.get_by_text("Queue eval").wait_for()
    _choose(page, "Training run", "drafter-v1 (1 tapped layer)")
    _choose(page, "Dtype", "bf16")
    page.screenshot(path=tmp_path / "1-launch.png", full_page=True)
    page.get_by_role("button", name="Queue eval").click()
    # The queue fragment refreshes itself; the job runs in the dashboard's local worker.
    page.get_by_text("succeeded").first.wait_for(timeout=180_000)
    page.screenshot(path=tmp_path / "2-queue.png", full_page=True)

    new = [r for r in client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")
           if r.data.tags.get("draftboard.train_run_id") == v1.info.run_id and r.data.tags.get("env.dtype") == "bf16"]
    assert len(client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")) == evals_before + 1
    assert len(new) == 1 and new[0].data.metrics["tau"] > 1

    page.goto(f"{url}/compare?runs={v1.info.run_id}")
    # Evals from another environment are their own series, labelled with that environment.
    legend = page.locator("g.legend text").filter(has_text="bf16")
    legend.first.wait_for()
    page.screenshot(path=tmp_path / "3-compare.png", full_page=True)
    assert "drafter-v1" in legend.first.text_content()
    print(f"screenshots: {tmp_path}")
