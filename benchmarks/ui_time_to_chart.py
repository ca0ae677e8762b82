"""Time to curves on screen, in a real browser: draftboard's Compare page vs MLflow's chart view.

Builds a store like `dashboard_load.py`'s (default 20 training runs x 10,000 steps x 4 metrics),
serves it with `mlflow server` and `draftboard ui` on loopback, and drives Debian's headless
Chromium with Playwright. Trials alternate between the two UIs; each opens its page in a fresh tab
of a browser context kept per UI (static assets cached, as for a returning user).

"Drawn": every metric chart holds a drawn line per run. MLflow's charts are Plotly SVG: each holds at
least one trace (`.scatterlayer .trace`) per run with a non-empty line path. draftboard's are uPlot
canvases (`tracker/dashboard/curve_chart.js`): each has run its draw hook with a named series per
run, and Streamlit's script is not running (no visible `[data-testid="stStatusWidget"]`). MLflow's chart view shows its
first 10 runs by default: the benchmark switches it to "Show all runs" once (kept by MLflow in the
browser's local storage) before the timed trials.

Measured:
- load: navigation start to all curves drawn (Compare's "Training curves" view with every run
  chosen, vs MLflow's chart view with all runs shown); draftboard's first trial is the first visitor
  after the server started (histories read from the store), the others find them cached;
- the replica: the same for a plain-Streamlit app drawing the elements Compare drew, recorded from it
  before the timed trials (`_replica.py`: no store, no dashboard code), served beside them: what any
  Streamlit page showing these charts costs on this machine;
- zoom: From/To step set to a 100-step window to drawn with every logged point of it (each curve's
  trace holds exactly the window's steps);
- widget changes: the log step axis toggled on and off 2 x trials times (a fragment rerun; the
  median), and a 20th run added to 19 (a full rerun), each to the charts redrawn with the change;
- peak RSS of the Streamlit server process and of the MLflow server over the whole run.

    python benchmarks/ui_time_to_chart.py [--runs 20] [--steps 10000] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dashboard_load, runnable from a checkout

import psutil
from dashboard_load import METRICS, RUNS, STEPS, build_store

from _replica import record

from tracker import serve

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1500, "height": 1100}
# Compare at most 1.1x its plain-Streamlit replica (issue 65's third page target, which replaced issue 16's 10x
# MLflow: a Streamlit page cannot be faster than Streamlit drawing its elements, and that is no 10x MLflow here).
TARGET_REPLICA_RATIO = 1.1
TARGET_ZOOM_RATIO = 1.0  # a zoom at full detail, no slower than MLflow's chart view
# What a user should wait on an idle box: said in words above the JSON line (seconds vary with the box).
CHANGE_S_BOUND, RSS_MB_BOUND = 1.0, 500
ZOOM = (5000, 5099)  # scaled down with --steps

# MLflow: true once every chart (a Plotly `.js-plotly-plot`) holds `traces` rendered SVG traces with a
# non-empty line path.
MLFLOW_DRAWN_JS = """([selector, charts, traces]) => {
  const plots = [...document.querySelectorAll(selector)].filter(p => {
    const lines = [...p.querySelectorAll('.scatterlayer .trace path.js-line')];
    return lines.length >= traces && lines.every(l => (l.getAttribute('d') || '').length > 0);
  });
  return plots.length >= charts;
}"""
# draftboard: true once Streamlit's script is not running (no visible status widget) and every training
# chart (`.db-curves`, tracker/dashboard/curve_chart.js) has drawn `traces` named series on its canvas
# (uPlot's draw hook ran: data-drawn="1").
CURVES = ".db-curves"
DRAWN_JS = f"""([charts, traces]) => {{
  const busy = document.querySelector('[data-testid="stStatusWidget"]');
  if (busy && busy.offsetParent !== null) return false;
  return [...document.querySelectorAll("{CURVES}")].filter(
    c => c.dataset.drawn === "1" && Number(c.dataset.series) >= traces).length >= charts;
}}"""
# Every chart's x axis is of `type` (log / linear) and drawn; or every named series holds exactly the steps lo..hi.
AXIS_JS = f"""([type, drawn]) => {{
  const charts = [...document.querySelectorAll("{CURVES}")];
  return charts.length > 0 && charts.every(c => c.dataset.scale === type) && ({DRAWN_JS})(drawn);
}}"""
WINDOW_JS = f"""([lo, hi]) => {{
  const charts = [...document.querySelectorAll("{CURVES}")];
  return charts.length > 0 && charts.every(c => {{
    const named = c.dataset.drawn === "1" ? c.curves().filter(s => !s.faint) : [];
    return named.length > 0 && named.every(s => s.x.length === hi - lo + 1 && s.x[0] === lo && s.x[s.x.length - 1] === hi);
  }});
}}"""


def launch_chromium(p):
    """Debian's headless Chromium, as every browser benchmark runs it (`p`: Playwright's sync API)."""
    return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: {proc.args[:4]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"error: {url} did not answer within {timeout:.0f} s")


def process_tree(pid: int) -> list[psutil.Process]:
    """A process with every process under it (psutil.Error once it is gone)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


class PeakRss(threading.Thread):
    """Samples the RSS of the processes `pick` finds under each root every 50 ms; keeps the peak."""

    def __init__(self, roots: dict[str, subprocess.Popen], pick: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.roots, self.pick, self.peak_mb = roots, pick, {name: 0.0 for name in roots}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            for name, proc in self.roots.items():
                try:
                    tree = process_tree(proc.pid)
                    rss = sum(p.memory_info().rss for p in tree if self.pick[name] in " ".join(p.cmdline()))
                except psutil.Error:
                    continue
                self.peak_mb[name] = max(self.peak_mb[name], rss / 2**20)


def start_servers(home: Path, uri: str, log_dir: Path, replica: Path | None = None,
                  names: Iterable[str] = ("mlflow", "draftboard", "replica")) -> tuple[dict[str, subprocess.Popen],
                                                                                     dict[str, str]]:
    """`names` of: MLflow's server, the dashboard, and the plain-Streamlit replica of the pages recorded in
    `replica` (benchmarks/_replica.py), served as `draftboard ui` serves the dashboard (`serve.STREAMLIT_OPTIONS`)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["DRAFTBOARD_HOME"] = str(home)
    ports = {name: free_port() for name in names}
    argv = {
        "mlflow": lambda port: [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host",
                                "127.0.0.1", "--port", str(port), "--workers", "1"],
        "draftboard": lambda port: [sys.executable, "-m", "tracker.cli", "ui", "--port", str(port), "--home", str(home),
                                    "--no-worker"],
        "replica": lambda port: [sys.executable, "-m", "streamlit", "run", str(Path(__file__).with_name("_replica.py")),
                                 "--server.port", str(port), "--server.address", "127.0.0.1", *serve.STREAMLIT_OPTIONS,
                                 "--", str(replica)],
    }
    procs = {}
    for name, port in ports.items():
        out = open(log_dir / f"{name}.log", "w")
        procs[name] = subprocess.Popen(argv[name](port), stdout=out, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    for name in procs:
        wait_http(urls[name] + ("/health" if name == "mlflow" else "/_stcore/health"), procs[name])
    return procs, urls


def stop(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
    for proc in procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def wait_idle(pids: Iterable[int], timeout_s: float = 300, busy_cpu_s: float = 0.05) -> None:
    """Return once the processes `pids` (each with its children) used under busy_cpu_s of CPU in a second: work a
    server does after it answers its health check (MLflow's on a 10,000-run store: about 15 s of CPU), or the
    browser's teardown of the page just closed, would otherwise be timed as the next page's."""
    pids = list(pids)

    def cpu_s() -> dict[int, float]:  # per process: one that exits between two samples takes its time with it
        used = {}
        for pid in pids:
            try:
                tree = process_tree(pid)
            except psutil.Error:
                continue
            for proc in tree:
                try:
                    used[proc.pid] = sum(proc.cpu_times()[:2])
                except psutil.Error:
                    continue
        return used

    deadline, before = time.monotonic() + timeout_s, cpu_s()
    while time.monotonic() < deadline:
        time.sleep(1)
        now = cpu_s()
        if sum(t - before.get(pid, 0.0) for pid, t in now.items()) < busy_cpu_s:
            return
        before = now
    raise SystemExit(f"error: the servers and the browser were still busy after {timeout_s:.0f} s")


def timed(page, action, predicate: str, arg=None, timeout_s: float = 120) -> float:
    """Seconds from `action()` until `predicate` holds, polled every animation frame."""
    start = time.perf_counter()
    action()
    page.wait_for_function(predicate, arg=arg, polling="raf", timeout=timeout_s * 1000)
    return time.perf_counter() - start


def mlflow_show_all_runs(context, url: str, uri: str, runs: int, shots: Path) -> str:
    """The chart view's URL, after switching it once to show every run (MLflow keeps that in local storage)."""
    from mlflow import MlflowClient

    experiment = MlflowClient(uri).get_experiment_by_name("draftboard").experiment_id
    chart_url = f"{url}/#/experiments/{experiment}/runs?compareRunsMode=CHART"
    page = context.new_page()
    page.goto(chart_url)
    page.wait_for_function(MLFLOW_DRAWN_JS, arg=[".js-plotly-plot", len(METRICS), min(runs, 10)], timeout=180_000)
    page.locator("button[aria-label='Toggle visibility of runs']").click()
    page.get_by_text("Show all runs").click()
    page.wait_for_function(MLFLOW_DRAWN_JS, arg=[".js-plotly-plot", len(METRICS), runs], timeout=180_000)
    page.screenshot(path=shots / "mlflow-chart-view.png")
    page.close()
    return chart_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--shots", type=Path, default=None, help="keep screenshots in this directory")
    args = parser.parse_args()
    if args.runs < 2 or args.steps < 200 or args.trials < 2:
        print("error: needs --runs >= 2, --steps >= 200 and --trials >= 2", file=sys.stderr)
        raise SystemExit(2)
    from playwright.sync_api import sync_playwright

    zoom = ZOOM if args.steps > ZOOM[1] else (args.steps // 2, args.steps // 2 + 99)
    with tempfile.TemporaryDirectory(prefix="draftboard-ui-bench-") as tmp:
        home, shots = Path(tmp), args.shots or Path(tmp)
        shots.mkdir(parents=True, exist_ok=True)
        uri, run_ids, _ = build_store(home, "copy", args.runs, args.steps)
        compare_path = f"/compare?runs={','.join(run_ids)}&compare_view=Training+curves"
        drawn = {"mlflow": [".js-plotly-plot", len(METRICS), args.runs], "draftboard": [len(METRICS), args.runs],
                 "replica": [len(METRICS), args.runs]}
        # The replica's elements, recorded from a dashboard of its own: the timed one's first visitor stays the first
        procs, urls = start_servers(home, uri, home, names=["draftboard"])
        try:
            with sync_playwright() as p:
                browser = launch_chromium(p)
                record(browser.new_context(viewport=VIEWPORT), urls["draftboard"] + compare_path, DRAWN_JS,
                       drawn["draftboard"], home / "replica")
                browser.close()
        finally:
            stop(procs)
        procs, urls = start_servers(home, uri, home, home / "replica")
        rss = PeakRss({k: procs[k] for k in ("mlflow", "draftboard")}, {"mlflow": "mlflow", "draftboard": "tracker.serve"})
        rss.start()
        results: dict[str, list[float]] = {"mlflow": [], "draftboard": [], "replica": []}
        try:
            with sync_playwright() as p:
                browser = launch_chromium(p)
                contexts = {name: browser.new_context(viewport=VIEWPORT) for name in results}
                chart_url = mlflow_show_all_runs(contexts["mlflow"], urls["mlflow"], uri, args.runs, shots)
                compare_url = urls["draftboard"] + compare_path
                predicate = {"mlflow": MLFLOW_DRAWN_JS, "draftboard": DRAWN_JS, "replica": DRAWN_JS}
                target = {"mlflow": chart_url, "draftboard": compare_url, "replica": urls["replica"] + compare_path}
                for trial in range(args.trials):
                    for name in results:
                        page = contexts[name].new_page()
                        page.set_default_timeout(120_000)
                        results[name].append(timed(page, lambda: page.goto(target[name]), predicate[name], drawn[name]))
                        page.screenshot(path=shots / f"{name}-{trial}.png")
                        page.close()
                        print(f"trial {trial + 1}: {name:10s} drawn in {results[name][-1]:.2f} s", flush=True)

                page = contexts["draftboard"].new_page()
                page.set_default_timeout(120_000)
                page.goto(compare_url)
                page.wait_for_function(DRAWN_JS, arg=drawn["draftboard"], polling="raf")
                # A widget change, several times (on, off, ...): one alone varies by half a second here.
                toggles = []
                for k in range(2 * args.trials):  # every chart switched and drawn, both ways
                    toggles.append(timed(page, lambda: page.get_by_text("Log step axis").click(), AXIS_JS,
                                         ["linear" if k % 2 else "log", drawn["draftboard"]]))
                log_s = statistics.median(toggles)

                def set_window() -> None:
                    page.get_by_role("spinbutton", name="From step").fill(str(zoom[0]))
                    page.get_by_role("spinbutton", name="To step").fill(str(zoom[1]))
                    page.get_by_role("spinbutton", name="To step").press("Enter")

                zoom_s = timed(page, set_window, WINDOW_JS, list(zoom))
                page.wait_for_function(DRAWN_JS, arg=drawn["draftboard"], polling="raf")
                zoom_total_s = zoom_s  # the window is drawn once its traces hold it; the script has ended too
                page.screenshot(path=shots / "draftboard-zoom.png")
                page.close()

                page = contexts["draftboard"].new_page()
                page.set_default_timeout(120_000)
                page.goto(compare_url.replace(",".join(run_ids), ",".join(run_ids[:-1])))
                page.wait_for_function(DRAWN_JS, arg=[len(METRICS), args.runs - 1], polling="raf")
                name = "bench-%02d" % (args.runs - 1)

                def add_run() -> None:
                    page.locator("[data-testid='stMultiSelect']").filter(has_text="Runs").first.locator(
                        "input").click()
                    page.get_by_role("option", name=name).first.click()
                    page.keyboard.press("Escape")

                add_s = timed(page, add_run, DRAWN_JS, drawn["draftboard"])
                page.screenshot(path=shots / "draftboard-add-run.png")
                page.close()
                browser.close()
        finally:
            rss.stopped.set()
            rss.join()
            stop(procs)

    mlflow_s = statistics.median(results["mlflow"])
    cold_s, warm_s = results["draftboard"][0], statistics.median(results["draftboard"][1:])
    ratio, cold_ratio = mlflow_s / warm_s, mlflow_s / cold_s
    # The replica's first trial is its server's first visitor too: first against first, the rest against the rest
    replica_cold_s, replica_s = results["replica"][0], statistics.median(results["replica"][1:])
    points = args.runs * args.steps * len(METRICS)
    print(f"store      : {args.runs} runs x {args.steps:,} steps x {len(METRICS)} metrics ({points:,} points)")
    print(f"mlflow     : chart view, all runs: median {mlflow_s:.2f} s ({', '.join(f'{t:.2f}' for t in results['mlflow'])})")
    print(f"draftboard : Compare, training curves: first visitor {cold_s:.2f} s, then median {warm_s:.2f} s "
          f"({', '.join(f'{t:.2f}' for t in results['draftboard'])})")
    print(f"ratio      : {ratio:.1f}x faster than MLflow ({cold_ratio:.1f}x for the first visitor)")
    print(f"replica    : plain Streamlit drawing Compare's elements: first visitor {replica_cold_s:.2f} s, then median "
          f"{replica_s:.2f} s ({', '.join(f'{t:.2f}' for t in results['replica'])}); Compare takes "
          f"{warm_s / replica_s:.2f}x it ({cold_s / replica_cold_s:.2f}x for the first visitor)")
    print(f"zoom       : steps {zoom[0]}-{zoom[1]} with every logged point drawn in {zoom_total_s:.2f} s "
          f"({mlflow_s / zoom_total_s:.1f}x MLflow's time to its chart view)")
    print(f"widgets    : log step axis redrawn in median {log_s:.2f} s ({', '.join(f'{t:.2f}' for t in toggles)}), "
          f"a run added redrawn in {add_s:.2f} s")
    print(f"peak RSS   : Streamlit server {rss.peak_mb['draftboard']:.0f} MB, mlflow server {rss.peak_mb['mlflow']:.0f} MB")
    print(f"bounds     : widget changes {'within' if max(log_s, add_s) < CHANGE_S_BOUND else 'above'} "
          f"{CHANGE_S_BOUND:g} s, Streamlit's peak RSS {'within' if rss.peak_mb['draftboard'] < RSS_MB_BOUND else 'above'} "
          f"{RSS_MB_BOUND} MB")
    # Speedups (MLflow's time over ours: higher is better) and the cost against the replica (lower is better)
    ratios = {"load_vs_mlflow": round(ratio, 1), "first_visit_vs_mlflow": round(cold_ratio, 1),
              "replica_vs_mlflow": round(mlflow_s / replica_s, 1),
              "zoom_vs_mlflow_load": round(mlflow_s / zoom_total_s, 1),
              "load_vs_replica": round(warm_s / replica_s, 2), "first_visit_vs_replica": round(cold_s / replica_cold_s, 2)}
    targets = {"zoom_vs_mlflow_load": TARGET_ZOOM_RATIO, "load_vs_replica": TARGET_REPLICA_RATIO}
    ok = ratios["zoom_vs_mlflow_load"] >= TARGET_ZOOM_RATIO and ratios["load_vs_replica"] <= TARGET_REPLICA_RATIO
    print(json.dumps({"benchmark": "ui_time_to_chart", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
