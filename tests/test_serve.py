"""tracker/serve.py's warm-up of the pages' first runs (its auth and host checks: test_security_ui.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A fresh interpreter, as `draftboard ui` starts one: the server's warm-up (argv[1] == "warm") or only its
# store's part, then each page's first script run through app.py (AppTest), in the order a visitor might
# take them. For each run: the modules it imported and how many paths it resolved (os.path.realpath:
# `inspect` resolves one per module it has not mapped yet, the cost of Streamlit's REPL check).
FIRST_RUNS = """
import json, os, sys
from streamlit.testing.v1 import AppTest
from tracker import config, serve
from tracker.dashboard import ui
if sys.argv[1] == "warm":
    serve._warm()  # what `draftboard ui` runs beside the server as it starts
else:
    ui.warm(config.store_uri())  # the same warm-up of the store's caches, without the rest
train = ui.run_index(config.store_uri()).of_kind("train")[0].run_id
runs, realpath = {}, os.path.realpath
for page, query in [("pages/runs.py", {}), ("pages/compare.py", {}), ("pages/environments.py", {}),
                    ("pages/run_detail.py", {"run": train}), ("pages/launch.py", {})]:
    at = AppTest.from_file(sys.argv[2], default_timeout=120)
    at.query_params.update(query)
    at.switch_page(page)
    before, calls = set(sys.modules), [0]
    def counted(path, *args, **kwargs):
        calls[0] += 1
        return realpath(path, *args, **kwargs)
    os.path.realpath = counted
    at.run()
    os.path.realpath = realpath
    assert not at.exception, (page, [e.message for e in at.exception])
    runs[page] = {"imported": sorted(set(sys.modules) - before), "realpaths": calls[0], "title": at.title[0].value}
print(json.dumps(runs))
"""


def _first_runs(store, tmp_path: Path, warm: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DRAFTBOARD_HOME": str(store.home), "MLFLOW_TRACKING_URI": store.uri,
           "DRAFTBOARD_JOBS_URI": f"sqlite:///{tmp_path / 'jobs.db'}"}
    done = subprocess.run([sys.executable, "-c", FIRST_RUNS, "warm" if warm else "cold", str(ROOT / "app.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_pages_first_runs_work_is_done_before_the_first_visitor(dashboard_store, tmp_path):
    """What each page's first script run in a process would do besides reading the store is done by the
    server's warm-up: the first visitor's run of any page imports none of the dashboard's modules, pandas'
    Styler or Streamlit's icon tables, and the first page's run resolves almost no module path (Streamlit's REPL
    check on its first element maps every loaded module to its file). The cold runs are the control: the
    same pages pay both."""
    cold, warm = _first_runs(dashboard_store, tmp_path, warm=False), _first_runs(dashboard_store, tmp_path, warm=True)
    assert [r["title"] for r in cold.values()] == [r["title"] for r in warm.values()], (cold, warm)

    def imported(runs):  # what the warm-up takes on (mlflow's own lazy imports on some calls it leaves: ms)
        return {m for r in runs.values() for m in r["imported"] if m.startswith(("tracker.", "pandas.", "jinja2"))
                or m in ("streamlit.emojis", "streamlit.material_icon_names")}

    assert {"streamlit.emojis", "tracker.dashboard.load_view"} <= imported(cold), imported(cold)
    assert imported(warm) == set(), imported(warm)
    # Cold: one path per loaded module, thousands with mlflow and pandas; warm: only what the run itself loads.
    first = "pages/runs.py"
    assert cold[first]["realpaths"] > 1000 and warm[first]["realpaths"] < cold[first]["realpaths"] / 10, \
        (cold[first]["realpaths"], warm[first]["realpaths"])
