"""First start in a real browser: what `./scripts/run.sh` runs after its install (`draftboard ui --demo`)
on a fresh home serves the page within 10 s, with the demo's progress on it while the demo builds."""

import re
import time

from playwright.sync_api import expect
from test_browser import page, pytestmark  # noqa: F401  (the Chromium page fixture and its skip)
from uiprocess import Ui, free_port, healthy
from waiting import wait_until


def test_first_start_serves_at_once_with_the_demo_progress(page, tmp_path):  # noqa: F811
    t0 = time.monotonic()
    ui = Ui(tmp_path / "home", free_port(), "--demo", "--no-worker", env={"MLFLOW_TRACKING_URI": ""})
    try:
        wait_until(lambda: healthy(ui.port), 10, interval=0.1, what="the dashboard answering")
        page.goto(f"http://127.0.0.1:{ui.port}/")
        expect(page.get_by_text(re.compile("Building the demo store"))).to_be_visible(timeout=10_000)
        elapsed = time.monotonic() - t0
        page.screenshot(path=str(tmp_path / "first-start.png"))
        assert elapsed < 10, f"the progress showed {elapsed:.1f} s after the start ({tmp_path / 'first-start.png'})"
        # The banner follows the build: its stage counter appears once the build process is up.
        expect(page.get_by_text(re.compile(r"stage \d/\d+"))).to_be_visible(timeout=90_000)
    finally:
        ui.kill()
