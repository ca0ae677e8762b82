"""A team's store after months of auto-evals: what a dashboard page costs as the store grows.

Builds two stores in one run (default 1,000 and 10,000 runs; `--sizes`) the way a team fills one:
training runs (10% of the runs), each with evals of its checkpoints every 100 steps, of which a
third ran on a CPU box (the torch fallback: a critical environment mismatch) and half of those were
re-evaluated in the training environment, a few engine evals and sampled evals, with fingerprints
that differ where environments differ. Every run is logged through `Tracker`, as `draftboard eval`
logs it (about 20 runs/s here: the 10,000-run store takes ~8 minutes to build).

Measured per size, in this process, as the dashboard's first visitor and the next one:
- index: `load_run_index` (every run, its tags and metrics; fingerprint.json only when asked), first
  read and the next (fingerprints kept, as the dashboard keeps them; each next cost the median of
  NEXT_ROUNDS reads);
- runs table, first: `tables.runs_table` over every run plus the landing page's open-mismatch count
  on a fresh index (an eval whose `env.critical_key` equals its training run's is settled by the tags;
  the others are diffed against it once, their two fingerprint.json files read);
- runs table, next read: the same on the next read of the store, whose diffs of logged-once
  fingerprints outlive the index (`RunIndex.lasting`);
- diffs: `fingerprint.diff` calls of the first (linear in the evals: at most one per eval).

Then, per size, in a real browser (Debian's headless Chromium, Playwright), with `draftboard ui` and
`mlflow ui` (`mlflow server`) serving the same store on loopback, beside each page its plain-Streamlit replica
(`_replica.py`: the elements the page drew, recorded from the page itself on a server started for that, sent
again with no store and no dashboard code): Runs (the landing page), Run detail of a training run (its
checkpoints), Compare of 2 and of 20 runs, Environments, each from navigation to the page whole (its title
shown, its last element drawn, Streamlit's script ended, unchanged for STABLE_MS, which is taken off); and
MLflow UI's runs list until its runs are listed. A first visit is the first after the servers started (and the
dashboard read the store: `ui.warm`; every server idle), the median of FIRST_STARTS fresh starts of all the
servers; the next visit the median of NEXT_ROUNDS rounds after the last start's first visits. Page and replica
take turns at going first. Each visit starts once the servers and the browser are idle (the page before it
closed and torn down). Peak RSS of the dashboard's server over all of it.

Ratios: each in-process cost's growth exponent between the two sizes, log(t2 / t1) / log(n2 / n1) (1.0:
linear), target <= 1.1, and diffs per eval <= 1; at the larger size (issue 65's page targets) each page's first
and next visit <= 1.15x the same page at the smaller size (the store's growth costs nothing visible) and
<= 1.1x its replica (the dashboard adds nothing to what Streamlit costs to draw the page), each first visit
<= 0.5x MLflow UI's runs list, and peak RSS < RSS_MB_TARGET.

`--server`: the same in-process costs against the deployment of docs/DEPLOY.md, an `mlflow server` on
PostgreSQL with proxied artifacts and basic auth (scripts/services.sh starts one: its exports name it),
where every fingerprint.json is an HTTP download. The store grows in place from the smaller size to the
larger (one experiment, as a team's does), and the fingerprint downloads of each read are counted: the
first page load downloads only those of the evals that differ critically from their training runs and of
those training runs (ratio to that count <= 1), the next only those of runs logged since (target 0).

    python benchmarks/store_scale.py [--sizes 1000 10000] [--no-browser]
    eval "$(bash scripts/services.sh start)"; python benchmarks/store_scale.py --server --sizes 300 1500
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # ui_time_to_chart's servers and browser

import psutil
from tqdm import tqdm

from tracker import Tracker
from tracker.environment import fingerprint
from tracker.dashboard import lineage, tables
from tracker.dashboard.index import load_run_index, read_json_artifact

TARGET = "/models/Qwen3.5-4B"
TARGET_EXPONENT = 1.1
# At the larger size (issue 65): each page's first and next visit at most 1.15x the same page at the smaller size,
# at most 1.1x its plain-Streamlit replica (benchmarks/_replica.py), and every first visit at most half of MLflow
# UI's runs list on the same store.
GROWTH_TARGET, REPLICA_TARGET, MLFLOW_TARGET, RSS_MB_TARGET = 1.15, 1.1, 0.5, 1024
STABLE_MS = 250
FIRST_STARTS, NEXT_ROUNDS = 3, 3  # a first visit: the median of FIRST_STARTS fresh server starts
# A page is whole once its title and last element show, no spinner or running script is visible, and
# that has held for STABLE_MS (Streamlit draws a page in several deltas).
WHOLE_JS = """([title, last, stable]) => {
  const visible = s => [...document.querySelectorAll(s)].some(e => e.offsetParent !== null);
  const h1 = [...document.querySelectorAll('h1')].some(h => h.textContent.includes(title));
  const ok = h1 && document.querySelector(last) !== null && !visible('[data-testid="stStatusWidget"]')
             && !visible('[data-testid="stSpinner"]');
  if (!ok) { window.__wholeSince = undefined; return false; }
  window.__wholeSince = window.__wholeSince || performance.now();
  return performance.now() - window.__wholeSince >= stable;
}"""
# MLflow UI's runs list: listed once `shown` run links are in the table, unchanged for STABLE_MS.
MLFLOW_LISTED_JS = """([shown, stable]) => {
  const links = new Set([...document.querySelectorAll('a[href*="/runs/"]')].map(a => a.getAttribute('href')));
  if (links.size < shown) { window.__wholeSince = undefined; return false; }
  window.__wholeSince = window.__wholeSince || performance.now();
  return performance.now() - window.__wholeSince >= stable;
}"""
EVALS_PER_TRAIN = 9
DRAWN = '.db-curves[data-drawn="1"]'  # Compare's eval chart, drawn (curve_chart.js says so on its root)


def _fingerprint(fast: bool, run: int) -> dict:
    """A GPU box with the kernels, or a CPU box on the torch fallback; git commits differ per run."""
    return {
        "software": {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.24.0",
                     "flash-linear-attention": "0.4.1" if fast else None},
        "hardware": {"device": "cuda" if fast else "cpu", "gpu_name": "H100" if fast else None,
                     "gpu_count": 1 if fast else 0, "cpu": "Xeon"},
        "numerics": {"dtype": "bf16" if fast else "fp32", "linear_attention_path": "fast" if fast else "fallback",
                     "attn_implementation": "sdpa", "tf32_matmul": False},
        "code": {"git_commit": f"{run:040x}", "dirty": False},
    }


def build(uri: str, n_runs: int, first: int = 0) -> None:
    """Training runs `first`.. with their evals, until the store holds about n_runs runs."""
    tracker = Tracker(uri)
    n_train = max(1, n_runs // (EVALS_PER_TRAIN + 1))
    with tqdm(total=(n_train - first) * (EVALS_PER_TRAIN + 1), desc=f"store of {n_runs} runs", unit="run") as bar:
        for t in range(first, n_train):
            with tracker.training_run(f"drafter-v{t}", {"lr": 6e-4, "block_size": 16}, TARGET,
                                      fingerprint=_fingerprint(True, t)) as train:
                train.log_step(1000, loss=1.0 / (1 + t))
            bar.update()
            for e in range(EVALS_PER_TRAIN):
                step = 100 * (e // 2 + 1)
                on_cpu = e % 3 == 0
                scoring = "engine" if e == 8 else "offline"
                tags = {"protocol.scoring": scoring, "protocol.temperature": "0.7" if e == 7 else "0",
                        "protocol.prompt_digest": "d0", "protocol.max_new_tokens": "256"}
                params = {"drafter": f"/ck/{t}/{step}", "prompts": "gsm8k.jsonl", "max_new_tokens": "256"}
                with tracker.eval_run(f"drafter-v{t} @ {step}", target=TARGET, train_run_id=train.run_id,
                                      checkpoint=f"/ck/{t}/{step}", checkpoint_step=step, params=params, tags=tags,
                                      fingerprint=_fingerprint(not on_cpu, t)) as ev:
                    ev.log_metrics({"tau": 3.0 + e / 10, "streak": 2.0 + e / 10}, step=0)
                bar.update()


def measure(uri: str) -> dict:
    tracker = Tracker(uri)
    cached: dict = {}
    reads: list[int] = []

    def fingerprints(run_id: str, artifact_uri: str, version: str):  # the dashboard's loader keeps what it read
        if run_id not in cached:
            reads.append(1)
            cached[run_id] = read_json_artifact(tracker.client, run_id, artifact_uri, "fingerprint.json")
        return cached[run_id]

    calls = []
    real = fingerprint.diff
    fingerprint.diff = lambda a, b: calls.append(1) or real(a, b)
    try:
        out, lasting = {}, {}
        t = time.perf_counter()
        index = load_run_index(tracker, fingerprints, lasting)
        out["index_first_s"] = time.perf_counter() - t
        t = time.perf_counter()
        tables.runs_table(index, list(index.runs.values()))
        open_evals = len(lineage.open_evals(index))
        out["runs_first_s"] = time.perf_counter() - t
        out["fingerprint_reads_first"] = len(reads)
        out["diffs"], out["evals"], out["open_mismatches"] = len(calls), len(index.of_kind("eval")), open_evals
        differing = [ev for ev in index.of_kind("eval") if lineage.vs_training(index, ev).critical]
        out["differing_and_their_training_runs"] = len(differing) + len({ev.train_run_id for ev in differing})
        # Next reads, as the pages' next visits: the median of NEXT_ROUNDS (one read at 10,000 runs swung 1.1-1.8 s)
        took: dict[str, list[float]] = {"index_next_s": [], "runs_next_s": []}
        for _ in range(NEXT_ROUNDS):
            t = time.perf_counter()
            index = load_run_index(tracker, fingerprints, lasting)
            took["index_next_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            tables.runs_table(index, list(index.runs.values()))
            took["runs_next_s"].append(time.perf_counter() - t)
        out.update({key: statistics.median(values) for key, values in took.items()})
        out["fingerprint_reads_next"] = len(reads) - out["fingerprint_reads_first"]
        out["runs"] = len(index)
    finally:
        fingerprint.diff = real
    return out


def _pages(index) -> dict[str, tuple[str, str, str]]:
    """The pages measured: name -> (path, its h1, the page's last element)."""
    trains, evals = index.of_kind("train"), index.of_kind("eval")
    return {
        "runs": ("/", "Runs", '[data-testid="stDownloadButton"]'),
        "run_detail": (f"/run?run={trains[0].run_id}", trains[0].name, '[data-testid="stTabs"]'),
        "compare_2": (f"/compare?runs={trains[0].run_id},{trains[1].run_id}", "Compare", DRAWN),
        "compare_20": ("/compare?runs=" + ",".join(r.run_id for r in (trains[:10] + evals[:10])), "Compare", DRAWN),
        "environments": ("/environments", "Environments", '[data-testid="stDataFrame"]'),
    }


def _until_warm(home: Path) -> None:
    """The dashboard's server has read the store (`ui.warm` logs `warm:`): a first visit starts after that."""
    deadline = time.monotonic() + 600
    while "warm:" not in (home / "draftboard.log").read_text():
        if time.monotonic() > deadline:
            raise SystemExit("error: the dashboard never finished reading the store")
        time.sleep(0.5)


def _browser(p):
    """Chromium, with a context whose first navigation (the renderer and network stack starting) is paid by none
    of the pages measured."""
    from ui_time_to_chart import VIEWPORT, launch_chromium

    browser = launch_chromium(p)
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto("data:text/html,<title>warm</title>")
    page.close()
    return browser, context


def browse(home: Path, uri: str) -> dict:
    """Each page's first and next visit in Chromium beside its plain-Streamlit replica, MLflow UI's runs list,
    and the dashboard's peak RSS."""
    from playwright.sync_api import sync_playwright
    from _replica import record
    from ui_time_to_chart import PeakRss, start_servers, stop, timed, wait_idle

    tracker = Tracker(uri)
    index = load_run_index(tracker, None)
    pages, listed, experiment = _pages(index), min(10, len(index)), tracker.find_experiment()
    # The replicas' elements, recorded from a dashboard started for that alone: the timed ones' first visits stay
    # first visits.
    procs, urls = start_servers(home, uri, home, names=["draftboard"])
    try:
        _until_warm(home)
        with sync_playwright() as p:
            browser, context = _browser(p)
            for path, title, last in pages.values():
                record(context, urls["draftboard"] + path, WHOLE_JS, [title, last, STABLE_MS], home / "replica")
            browser.close()
    finally:
        stop(procs)

    took: dict[str, list[float]] = {}
    peak_mb = 0.0
    for start in range(FIRST_STARTS):
        procs, urls = start_servers(home, uri, home, home / "replica")
        rss = PeakRss({"draftboard": procs["draftboard"]}, {"draftboard": "tracker.serve"})
        rss.start()
        try:
            _until_warm(home)
            wait_idle(proc.pid for proc in procs.values())
            with sync_playwright() as p:
                browser, context = _browser(p)

                def visit(name: str, url: str, predicate: str, arg, visit: str, settle_s: float = STABLE_MS / 1000):
                    # Every visit starts on a quiet machine: this process's children are the servers and
                    # Playwright's browser, whose teardown of the page just closed once cost the next page up to
                    # 0.3 s (this process itself is not quiet: its RSS sampler wakes every 50 ms).
                    wait_idle(child.pid for child in psutil.Process().children())
                    page = context.new_page()
                    page.set_default_timeout(300_000)
                    took.setdefault(f"{name}_{visit}_s", []).append(
                        timed(page, lambda: page.goto(url), predicate, arg, timeout_s=300) - settle_s)
                    page.close()

                def every_page(visit_kind: str, dashboard_first: bool) -> None:
                    visit("mlflow_runs_list", f"{urls['mlflow']}/#/experiments/{experiment}/runs", MLFLOW_LISTED_JS,
                          [listed, STABLE_MS], visit_kind)
                    for name, (path, title, last) in pages.items():  # each page beside its replica, order alternating
                        for server in (("draftboard", "replica") if dashboard_first else ("replica", "draftboard")):
                            visit(f"{'page' if server == 'draftboard' else 'replica'}_{name}", urls[server] + path,
                                  WHOLE_JS, [title, last, STABLE_MS], visit_kind)

                every_page("first", start % 2 == 0)  # one sample per fresh start: the median of FIRST_STARTS
                if start == FIRST_STARTS - 1:
                    for round_ in range(NEXT_ROUNDS):
                        every_page("next", round_ % 2 == 0)
                browser.close()
        finally:
            rss.stopped.set()
            stop(procs)
        peak_mb = max(peak_mb, rss.peak_mb["draftboard"])
    out: dict = {key: statistics.median(values) for key, values in took.items()}
    out["spread"] = {key: [round(v, 2) for v in values] for key, values in took.items()}
    out["dashboard_peak_rss_mb"] = round(peak_mb)
    return out


def _server_store() -> str:
    """The mlflow server scripts/services.sh started (its exports: a fresh one holds no runs), with its
    admin's credentials."""
    import os

    missing = [k for k in ("DRAFTBOARD_TEST_SERVER_URI", "DRAFTBOARD_TEST_ADMIN_USER", "DRAFTBOARD_TEST_ADMIN_PASSWORD")
               if not os.environ.get(k)]
    if missing:
        raise SystemExit(f"error: --server needs {', '.join(missing)}: eval \"$(bash scripts/services.sh start)\"")
    os.environ["MLFLOW_TRACKING_USERNAME"] = os.environ["DRAFTBOARD_TEST_ADMIN_USER"]
    os.environ["MLFLOW_TRACKING_PASSWORD"] = os.environ["DRAFTBOARD_TEST_ADMIN_PASSWORD"]
    return os.environ["DRAFTBOARD_TEST_SERVER_URI"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[1000, 10_000])
    parser.add_argument("--no-browser", action="store_true", help="in-process costs only")
    parser.add_argument("--server", action="store_true",
                        help="against the PostgreSQL-backed mlflow server of scripts/services.sh (in-process costs)")
    args = parser.parse_args()
    small, large = sorted(args.sizes)
    results = {}
    if args.server:
        uri = _server_store()
        args.no_browser = True  # the pages' browser timings are the embedded store's (the default run)
    with tempfile.TemporaryDirectory(prefix="draftboard-scale-") as tmp:
        for n in (small, large):
            if args.server:
                build(uri, n, first=0 if n == small else max(1, small // (EVALS_PER_TRAIN + 1)))
            else:
                home = Path(tmp) / f"store-{n}"
                home.mkdir()
                uri = f"sqlite:///{home / 'draftboard.db'}"
                build(uri, n)
            results[n] = measure(uri)
            if not args.no_browser:
                results[n].update(browse(home, uri))
            print(f"{results[n]['runs']} runs: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                             for k, v in results[n].items()), flush=True)
    a, b = results[small], results[large]
    growth = math.log(b["runs"] / a["runs"])
    exponents = {f"{k.removesuffix('_s')}_exponent": round(math.log(b[k] / a[k]) / growth, 2)
                 for k in ("index_first_s", "index_next_s", "runs_first_s", "runs_next_s")}
    ratios = {**exponents, "diffs_per_eval": round(b["diffs"] / b["evals"], 2),
              "fingerprint_reads_next": b["fingerprint_reads_next"],
              "fingerprint_reads_first_vs_differing": round(b["fingerprint_reads_first"]
                                                            / max(1, b["differing_and_their_training_runs"]), 2)}
    targets = {**{k: TARGET_EXPONENT for k in exponents}, "diffs_per_eval": 1, "fingerprint_reads_next": 0,
               "fingerprint_reads_first_vs_differing": 1}
    if not args.no_browser:
        for key in [k for k in b if k.startswith("page_") and k.endswith("_s")]:
            name, visit = key.removesuffix("_s"), "first" if key.endswith("_first_s") else "next"
            page = name.removeprefix("page_").removesuffix(f"_{visit}")
            ratios[f"{name}_vs_{a['runs']}_runs"] = round(b[key] / a[key], 2)  # what the store's growth costs it
            targets[f"{name}_vs_{a['runs']}_runs"] = GROWTH_TARGET
            ratios[f"{name}_vs_replica"] = round(b[key] / b[f"replica_{page}_{visit}_s"], 2)
            targets[f"{name}_vs_replica"] = REPLICA_TARGET
            if visit == "first":
                ratios[f"{name}_vs_mlflow_runs_list"] = round(b[key] / b["mlflow_runs_list_first_s"], 2)
                targets[f"{name}_vs_mlflow_runs_list"] = MLFLOW_TARGET
        ratios["dashboard_peak_rss_mb"], targets["dashboard_peak_rss_mb"] = b["dashboard_peak_rss_mb"], RSS_MB_TARGET
    ok = all(ratios[k] <= targets[k] for k in targets)
    print(json.dumps({"benchmark": "store_scale", "ratios": ratios, "targets": targets, "ok": ok}))


if __name__ == "__main__":
    main()
