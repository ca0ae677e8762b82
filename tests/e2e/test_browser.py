"""A newcomer's path through the real dashboard in a real browser (Debian's headless Chromium).

`draftboard ui` serves a copy of the quick demo store on a free loopback port, with its local
worker. One test opens Launch, queues an eval of a training checkpoint in bf16 (a new
environment for that run), waits for the job to succeed, then finds the new eval on Compare,
where evals from another environment form their own series. The headline test re-evaluates the
bf16 demo run's eval under its training environment from Environments and checks that the flag
clears. Screenshots of every page visited go to the test's output directory (printed on failure).
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


def _until_held(page, act, held) -> None:
    """`act` (a click) until `held(timeout_ms)` (an `expect`) holds once the rerun the click started has
    finished. A change made while the page still ran can be undone when Streamlit restarts that run: a
    selectbox's choice by Launch's on_change pre-fill, a tab's by the tabs drawn again (seen once in CI: Run
    detail back on its first tab 60 s after the click). Then do it again, as a user would."""
    for _ in range(2):
        act()
        try:
            held(5_000)
            _settled(page)
            held(1_000)
            return
        except AssertionError:
            continue
    held(5_000)  # expect's own default, as each caller's last try had
    _settled(page)


def _choose(page, label: str, option: str, exact: bool = False) -> None:
    """Pick `option` (the first option starting with it, or exactly it) in the Streamlit selectbox
    labelled `label`, and let the app apply it (shown as the value of the box's input)."""
    box = page.locator("[data-testid='stSelectbox']").filter(has_text=label).first
    value = re.compile("^" + re.escape(option) + ("$" if exact else ""))

    def pick() -> None:
        box.click()
        page.get_by_role("option", name=option, exact=exact).first.click()

    def held(ms: int) -> None:
        expect(box.locator("input")).to_have_value(value, timeout=ms)

    try:  # already chosen (a page's default): nothing to pick, and no dropdown left open
        held(1_000)
        return
    except AssertionError:
        pass
    _until_held(page, pick, held)


def _add(page, label: str, option: str) -> None:
    """Add the first option starting with `option` to the Streamlit multiselect labelled `label`, and let
    the app apply it (shown as a chip in the box). Typed into the box's own input: a click on the box's
    middle can land on a chosen run's chip and remove it instead (seen once in CI)."""
    box = page.locator("[data-testid='stMultiSelect']").filter(has_text=label).first
    name = re.compile("^" + re.escape(option))

    def pick() -> None:
        box.locator("input").focus()
        page.keyboard.type(option)
        page.get_by_role("option", name=name).first.click()
        page.keyboard.press("Escape")

    def held(ms: int) -> None:
        expect(box.locator("[data-tag]").filter(has_text=name).first).to_be_visible(timeout=ms)

    try:  # already chosen: a chosen run is no longer offered
        held(1_000)
        return
    except AssertionError:
        pass
    _until_held(page, pick, held)


def _open_tab(page, name: str) -> None:
    """Select the tab `name` and let the page finish its run."""
    tab = page.get_by_role("tab", name=name)
    _until_held(page, tab.click, lambda ms: expect(tab).to_have_attribute("aria-selected", "true", timeout=ms))


def test_the_browser_draws_the_badges_in_colour(page):
    """scripts/test.sh installs an emoji font so screenshots show the 🔴 / 🟢 badges users see: without
    one Chromium draws an empty box or a black outline, never red."""
    page.set_content("<canvas id=c width=64 height=64></canvas>")
    red = page.evaluate("""() => {
        const ctx = document.getElementById('c').getContext('2d');
        ctx.font = '48px sans-serif';
        ctx.fillText('🔴', 4, 52);
        const px = ctx.getImageData(0, 0, 64, 64).data;
        let n = 0;
        for (let i = 0; i < px.length; i += 4) if (px[i] > 180 && px[i + 1] < 90 && px[i + 2] < 90 && px[i + 3] > 200) n++;
        return n;
    }""")
    assert red > 100, f"{red} red pixels: no colour emoji font (apt-get install fonts-noto-color-emoji)"


# A run name that would run script if any page let it through as HTML: each payload sets __xss.
HOSTILE = ('<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
           '<iframe src="javascript:parent.__xss=3"></iframe><svg onload="window.__xss=4">')
PAGES = {"runs-root": "/", "runs": "/runs", "compare": "/compare", "environments": "/environments",
         "launch": "/launch", "run-detail": "/run"}


def test_every_page_by_its_deep_link_stays_local_and_runs_no_script_from_a_run_name(dashboard, page, tmp_path):
    from tracker import Tracker
    from tracker.environment import fingerprint

    url, home = dashboard
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    with tracker.training_run(HOSTILE, {"lr": 1e-4}, "demo-target",
                              fingerprint=fingerprint.capture(device="cpu", dtype="fp32")) as run:
        run.log_step(0, loss=1.0)
        run.log_step(1, loss=0.5)
    hostile = run.run_id
    elsewhere, failed = [], []
    # blob: URLs of our origin are code the page made itself (Streamlit loads a component's module so).
    page.on("request", lambda r: None if r.url.startswith((url, "data:", f"blob:{url}/"))
            else elsewhere.append(r.url))
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    paths = {**PAGES, "run-detail-hostile": f"/run?run={hostile}", "compare-hostile": f"/compare?runs={hostile}"}
    for name, path in paths.items():
        _visit(page, url + path, tmp_path / f"page-{name}.png")  # every chart drawn: a name in one had its chance
        assert page.get_by_text("Page not found").count() == 0, path
        assert page.evaluate("window.__xss") is None, f"a run name ran script on {path}"
        if name == "run-detail-hostile":
            assert page.locator("h1").first.text_content().strip() == HOSTILE  # shown, as text
    # Deep links ask the server root for health and host-config (no /<page>/_stcore/health 404s), the
    # favicon is drawn from an emoji, and nothing is fetched from another host.
    assert failed == [] and elsewhere == [], (failed, elsewhere)
    # On a 1600 px screen the Runs table's columns fit: nothing to scroll sideways inside it.
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(url + "/runs")
    scroller = page.locator("[data-testid='stDataFrame'] .dvn-scroller").first
    scroller.wait_for()
    _settled(page)
    page.screenshot(path=tmp_path / "page-runs-1600.png", full_page=True)
    widths = scroller.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert widths[0] <= widths[1], f"the Runs table is {widths[0]} px wide in {widths[1]} px"
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
    # Issue 65 M1: Enter in a field commits the field; only the button queues an eval. Had Enter queued it, the
    # button's submission of the same settings would find it queued already ("already submitted").
    field = page.get_by_role("spinbutton", name="Max new tokens")
    field.click()
    field.press("Enter")
    page.screenshot(path=tmp_path / "1-launch.png", full_page=True)
    page.get_by_role("button", name="Queue eval").click()
    # The queue fragment refreshes itself; the job runs in the dashboard's local worker.
    page.get_by_text("succeeded").first.wait_for(timeout=180_000)
    expect(page.get_by_text(re.compile(r"Queued job #\d+"))).to_have_count(1)
    expect(page.get_by_text("already submitted")).to_have_count(0)
    page.screenshot(path=tmp_path / "2-queue.png", full_page=True)

    new = [r for r in client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")
           if r.data.tags.get("draftboard.train_run_id") == v1.info.run_id and r.data.tags.get("env.dtype") == "bf16"]
    assert len(client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")) == evals_before + 1
    assert len(new) == 1 and new[0].data.metrics["tau"] > 1

    page.goto(f"{url}/compare?runs={v1.info.run_id}")
    # Evals from another environment are their own series, labelled with that environment.
    legend = page.locator(".db-curves .u-legend .u-series").filter(has_text="bf16")
    legend.first.wait_for()
    page.screenshot(path=tmp_path / "3-compare.png", full_page=True)
    assert "drafter-v1" in legend.first.text_content()
    print(f"screenshots: {tmp_path}")


def _reevaluate(page, url: str, option: str, changes: str, shots: Path, exact: bool = False) -> None:
    """On Environments: choose the eval to repeat, check the changes the page says it makes, queue it, and wait on
    Launch until the job has succeeded."""
    _choose(page, "Eval to repeat", option, exact=exact)
    expect(page.get_by_text(f"Changes: {changes}")).to_be_visible()
    page.screenshot(path=shots / "2-environments-chosen.png", full_page=True)
    page.get_by_role("button", name="Re-evaluate under the training environment").click()
    page.get_by_text(re.compile(r"Queued job #\d+")).wait_for()
    _visit(page, f"{url}/launch", shots / "3-launch-queued.png")
    page.get_by_text("succeeded").first.wait_for(timeout=180_000)
    page.screenshot(path=shots / "4-launch-succeeded.png", full_page=True)


def _critical_count(page) -> int:
    """The number in Environments' banner of evals that differ critically from their training run (0: no banner)."""
    banner = page.get_by_text(re.compile(r"eval\(s\) ran in an environment that differs critically"))
    if banner.count() == 0:
        return 0
    return int(re.match(r"\s*(\d+)", banner.first.text_content()).group(1))


def _runs_critical(page) -> int:
    """The Runs page's "Runs flagged 🔴" number."""
    metric = page.locator("[data-testid='stMetric']").filter(has_text="Runs flagged").first
    return int(metric.locator("[data-testid='stMetricValue']").text_content().strip())


def _visit(page, url: str, shot: Path) -> None:
    page.goto(url)
    page.locator("h1").first.wait_for()
    _settled(page)
    # Plots draw after the script run ends: every Plotly chart holds its drawn SVG, every training
    # chart's component (its container is there at once, its canvas once its code has loaded) has drawn.
    page.wait_for_function("""() => [...document.querySelectorAll("[data-testid='stPlotlyChart']")]
        .every(c => c.querySelector('.js-plotly-plot .main-svg'))
        && [...document.querySelectorAll("[data-testid='stBidiComponentRegular']")]
        .every(c => c.querySelector('.db-curves[data-drawn="1"]'))""")
    page.screenshot(path=shot, full_page=True)


def test_reevaluating_the_bf16_run_under_its_training_environment_clears_the_flag(dashboard, page, tmp_path):
    """The headline flow: the demo's v3 trained its drafter under bf16 autocast on fp32 features, and
    every demo eval cast the drafter to fp32. Re-evaluate on Environments must queue the eval that
    reproduces training's numerics, and its result must match the training run: 0 critical."""
    from tracker import Tracker
    from tracker.environment import fingerprint
    from tracker.dashboard.envmatrix import environment_flags

    url, home = dashboard
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    client = tracker.client
    exp = client.get_experiment_by_name("draftboard").experiment_id
    v3 = client.search_runs([exp], "attributes.run_name = 'drafter-v3 (uniform loss, bf16)'")[0].info.run_id
    train_fp = tracker.fingerprint(v3)

    def v3_evals():
        return [r for r in client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")
                if r.data.tags.get("draftboard.train_run_id") == v3]

    before = v3_evals()
    step = max(int(r.data.tags["draftboard.checkpoint_step"]) for r in before)
    v3_name = "drafter-v3 (uniform loss, bf16)"

    # The original eval, and after the re-evaluation the one beside it: their badges tell them apart.
    original = f"{v3_name} @ step {step} — 🟠 fallback · cpu · fp32 · DFlash"
    _visit(page, f"{url}/", tmp_path / "0-runs-before.png")
    runs_flagged = _runs_critical(page)
    _visit(page, f"{url}/environments", tmp_path / "1-environments-before.png")
    flagged = _critical_count(page)
    assert flagged >= 1, "the demo's bf16 run should start with a critical mismatch"
    _reevaluate(page, url, original, "drafter-precision fp32 → bf16-autocast", tmp_path, exact=True)

    new = [r for r in v3_evals() if r.info.run_id not in {b.info.run_id for b in before}]
    assert len(new) == 1, [r.info.run_name for r in new]
    reeval = new[0]
    assert reeval.info.run_name == (f"{v3_name} @ step {step} · fp32 · drafter bf16-autocast · fallback · cpu · "
                                    f"{reeval.data.params['max_new_tokens']} tok")
    assert int(reeval.data.tags["draftboard.checkpoint_step"]) == step
    reeval_fp = tracker.fingerprint(reeval.info.run_id)
    assert environment_flags(reeval_fp) == environment_flags(train_fp)
    rows = fingerprint.diff(train_fp, reeval_fp)
    assert not fingerprint.has_critical(rows), [(r.field, r.severity) for r in rows if r.severity == "critical"]

    _visit(page, f"{url}/environments", tmp_path / "5-environments-after.png")
    assert _critical_count(page) == flagged - 1
    # The original eval is answered: its row names the re-evaluation, and it is no longer offered.
    expect(page.get_by_text(re.compile(r"such eval\(s\) were re-evaluated"))).to_be_visible()
    page.locator("[data-testid='stSelectbox']").filter(has_text="Eval to repeat").first.click()
    expect(page.get_by_role("option").first).to_be_visible()
    assert page.get_by_role("option", name=original, exact=True).count() == 0
    page.keyboard.press("Escape")
    page.screenshot(path=tmp_path / "6-environments-resolved.png", full_page=True)

    # Resolved wherever it is counted: one run fewer on Runs, the training run's page says so.
    _visit(page, f"{url}/", tmp_path / "6b-runs-after.png")
    assert _runs_critical(page) == runs_flagged - 1
    _visit(page, f"{url}/run?run={v3}", tmp_path / "6c-training-run.png")
    expect(page.get_by_text(re.compile(rf"Resolved: .*step {step} differed from training")).first).to_be_visible()
    assert page.locator("[data-testid='stAlertContentError']").count() <= 1  # one banner for what stays open

    _visit(page, f"{url}/compare?runs={v3}", tmp_path / "7-compare.png")
    # Compare no longer lists the step among the evals that differ from training.
    assert not page.get_by_text(re.compile(rf"@ steps? [\d, ]*\b{step}\b[^:]*\(eval\): drafter precision")).count()
    # The re-evaluation is its own series, drawn solid: it matches its training run's numerics.
    page.locator(".db-curves .u-legend .u-series").filter(has_text="bf16-autocast").first.wait_for()
    dashed = page.evaluate("[...document.querySelectorAll('.db-curves')].flatMap(c => c.curves())"
                           ".filter(s => s.name.includes('bf16-autocast')).map(s => s.dashed)")
    assert dashed and not any(dashed), dashed
    print(f"screenshots: {tmp_path}")


def test_edit_on_a_cancelled_job_fills_the_form_above(dashboard, page, tmp_path):
    """Issue 39: Launch's Edit sits in the queue's fragment, whose click reruns only the fragment, so the
    form above never showed the job's settings. It does now, and says whose they are."""
    from tracker.jobs.queue import JobQueue

    url, home = dashboard
    queue = JobQueue(f"sqlite:///{home / 'jobs.db'}")
    job = queue.submit("eval", {"target": str(home / "no-such-target"), "drafter": str(home / "ck"),
                                "prompts": str(home / "p.jsonl"),
                                "max_new_tokens": 17, "budgets": [4, 8], "dtype": "bf16", "device": "cpu"})
    if queue.get(job.id).state == "queued":
        queue.request_cancel(job.id)
    wait_until(lambda: queue.get(job.id).state in ("cancelled", "failed"), 60, 0.2, "the job to end")
    page.goto(f"{url}/launch")
    page.get_by_text("Queue eval").wait_for()
    _settled(page)
    max_new = page.locator("input[aria-label='Max new tokens']")
    assert max_new.input_value() != "17"
    # Issue 52 LOW: a fraction in a count reaches the check (Streamlit's integer inputs cut it off in the browser)
    max_new.fill("12.5")
    page.get_by_role("button", name="Queue eval").click()
    expect(page.get_by_text("max new tokens must be a whole number, got 12.5")).to_be_visible()
    assert len(queue.list()) == 1
    page.get_by_role("button", name="Edit").first.click()
    expect(max_new).to_have_value("17")
    expect(page.get_by_text(f"The form holds job #{job.id}'s settings")).to_be_visible()
    page.screenshot(path=tmp_path / "edit.png", full_page=True)
    # Issue 65 M2: a sampled job (no DDTree, 6 draws, 5 prompts per dataset) comes back as it ran; the greedy job
    # after it gets its own fields back, not the sampled one's leftovers.
    sampled = queue.submit("eval", {"target": str(home / "no-such-target"), "drafter": str(home / "ck"),
                                    "prompts": str(home / "p.jsonl"), "max_new_tokens": 23, "temperature": 0.7,
                                    "top_p": 0.9, "top_k": 50, "samples": 6, "limit_per_dataset": 5,
                                    "device": "cpu"})
    if queue.get(sampled.id).state == "queued":
        queue.request_cancel(sampled.id)
    wait_until(lambda: queue.get(sampled.id).state in ("cancelled", "failed"), 60, 0.2, "the sampled job to end")
    cards = lambda job_id: page.locator(f".st-key-job_{job_id}")  # noqa: E731
    cards(sampled.id).get_by_role("button", name="Edit").click()
    expect(max_new).to_have_value("23")
    expect(page.locator("input[aria-label='Samples']")).to_have_value("6")
    expect(page.locator("input[aria-label='Prompts per dataset']")).to_have_value("5")
    expect(page.locator("input[aria-label='DDTree budgets']")).to_have_value("")
    cards(job.id).get_by_role("button", name="Edit").click()
    expect(max_new).to_have_value("17")
    expect(page.locator("input[aria-label='Prompts per dataset']")).to_have_value("")
    expect(page.locator("input[aria-label='DDTree budgets']")).to_have_value("4,8")
    # Issue 65 LOW: Edit printed Streamlit's warning with a stack in the terminal ("created with a default value
    # but also had its value set via the Session State API"), and every start its warm-up's "missing
    # ScriptRunContext"
    terminal = (tmp_path / "ui.log").read_text()
    assert "Stack (most recent call last)" not in terminal and "ScriptRunContext" not in terminal, terminal[-3000:]


# transformers 5.24's own lines (integrations/hub_kernels.py) as a training box without the kernels printed them.
CONSOLE_FALLBACK = (
    "[transformers] `causal_conv1d_fn` is falling back to its reference PyTorch implementation because `causal_conv1d` "
    "is not installed. This is correct but much slower; install `causal_conv1d` for the optimized kernel.\n"
    "[transformers] `chunk_gated_delta_rule` is falling back to its reference PyTorch implementation because "
    "`flash-linear-attention` is not installed. This is correct but much slower; install `flash-linear-attention` for "
    "the optimized kernel.\n")


def _demo_v1_eval(client):
    """The demo's experiment, its drafter-v1 training run and that run's latest offline fp32 eval."""
    from tracker.store import names

    exp = client.get_experiment_by_name("draftboard").experiment_id
    v1 = client.search_runs([exp], "attributes.run_name = 'drafter-v1 (1 tapped layer)'")[0].info.run_id
    demo_eval = max((r for r in client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")
                     if r.data.tags.get(names.TRAIN_RUN_ID) == v1 and r.data.tags.get("env.dtype") == "fp32"
                     and r.data.tags.get("protocol.scoring") == "offline"),
                    key=lambda r: int(r.data.tags[names.CHECKPOINT_STEP]))
    return exp, v1, demo_eval


def test_an_imported_training_console_against_an_eval_that_ran_the_kernels(dashboard, page, tmp_path):
    """Issue 62's headline: a training run imported from its console log (transformers said every Gated DeltaNet
    piece fell back to torch) against an eval of its checkpoint that ran the fla and causal-conv1d kernels (the
    record a GPU box leaves: the demo eval's own, with the kernels' fingerprint). Environments shows the pair as
    critical and cites the console's line; Re-evaluate repeats the eval on the fallback the console stated, and
    the re-evaluation answers the mismatch."""
    import copy
    import json

    from tracker import Tracker
    from tracker.cli import main
    from tracker.store import names

    url, home = dashboard
    uri = f"sqlite:///{home / 'draftboard.db'}"
    tracker = Tracker(uri)
    client = tracker.client
    exp, v1, demo_eval = _demo_v1_eval(client)
    step = int(demo_eval.data.tags[names.CHECKPOINT_STEP])

    log = tmp_path / "train.log"
    log.write_text("torch 2.13.0+cpu\n" + CONSOLE_FALLBACK + "".join(f"step={s} loss={2.0 - s / 1000}\n"
                                                                    for s in range(0, step + 1, 10)))
    assert main(["import-log", str(log), "--name", "trainer-from-console", "--tracking-uri", uri]) == 0
    imported = client.search_runs([exp], "attributes.run_name = 'trainer-from-console'")[0].info.run_id

    kernels = copy.deepcopy(tracker.fingerprint(demo_eval.info.run_id))
    kernels["numerics"]["linear_attention_path"] = "fast"
    kernels["numerics"]["linear_attention"].update(linear_attention_path="fast", functions={
        **kernels["numerics"]["linear_attention"]["functions"],
        "causal_conv1d_fn": "causal_conv1d.causal_conv1d_interface.causal_conv1d_fn",
        "causal_conv1d_update": "causal_conv1d.causal_conv1d_interface.causal_conv1d_update",
        "torch_chunk_gated_delta_rule": "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule",
        "torch_recurrent_gated_delta_rule": "fla.ops.gated_delta_rule.fused_recurrent.fused_recurrent_gated_delta_rule"})
    carried = {k: v for k, v in demo_eval.data.tags.items()
               if not k.startswith(("env.", "mlflow.")) and k not in (names.TRAIN_RUN_ID, names.KIND)}
    results = json.loads(Path(client.download_artifacts(demo_eval.info.run_id, names.EVAL_RESULTS_ARTIFACT,
                                                        str(tmp_path))).read_text())
    with tracker.eval_run("gpu-box eval", target=demo_eval.data.tags[names.TARGET], train_run_id=imported,
                          checkpoint_step=step, params=demo_eval.data.params, fingerprint=kernels,
                          tags=carried) as run:
        run.log_metrics({k: v for k, v in demo_eval.data.metrics.items()}, step=step)
        run.log_json(names.EVAL_RESULTS_ARTIFACT, {**results, "fingerprint": kernels})
    gpu_eval = run.run_id

    _visit(page, f"{url}/environments", tmp_path / "e1-environments.png")
    flagged = _critical_count(page)
    assert flagged >= 1
    # The imported run in the matrix (the demo's own pairs may open first): it cites where its values come from.
    _add(page, "Runs", "trainer-from-console")
    expect(page.get_by_text("Where imported runs' values come from")).to_be_visible()
    expect(page.get_by_text(re.compile(r"train\.log:2.*causal_conv1d_fn. is falling back")).first).to_be_visible()
    page.get_by_text("Where imported runs' values come from").scroll_into_view_if_needed()
    page.screenshot(path=tmp_path / "e1b-evidence.png")
    _reevaluate(page, url, "trainer-from-console @ step", "linear-attn fast → fallback", tmp_path)

    redone = [r for r in client.search_runs([exp], "tags.`draftboard.kind` = 'eval'")
              if r.data.tags.get(names.TRAIN_RUN_ID) == imported and r.info.run_id != gpu_eval]
    assert len(redone) == 1 and redone[0].data.tags["env.linear_attn"] == "fallback"
    _visit(page, f"{url}/environments", tmp_path / "e4-environments-after.png")
    assert _critical_count(page) == flagged - 1
    expect(page.get_by_text(re.compile(r"such eval\(s\) were re-evaluated"))).to_be_visible()
    print(f"screenshots: {tmp_path}")


def test_compare_draws_an_eval_of_another_generation_length_as_its_own_series(dashboard, page, tmp_path):
    """Issue 65 H1 in the browser: a newer eval of a demo run's checkpoint at 512 max new tokens (the demo's are
    64) was drawn as the next point of the run's one line, its legend quoting it. A series is one protocol: it is a
    line of its own, named by what differs, and the run's 64-token line holds none of it."""
    from tracker import Tracker
    from tracker.store import names

    url, home = dashboard
    tracker = Tracker(f"sqlite:///{home / 'draftboard.db'}")
    client = tracker.client
    exp, v1, demo_eval = _demo_v1_eval(client)
    assert demo_eval.data.tags["protocol.max_new_tokens"] != "512"
    step = int(demo_eval.data.tags[names.CHECKPOINT_STEP]) + 100
    carried = {k: v for k, v in demo_eval.data.tags.items()
               if not k.startswith(("env.", "mlflow.")) and k not in (names.TRAIN_RUN_ID, names.KIND,
                                                                     names.CHECKPOINT_STEP)}
    with tracker.eval_run("drafter-v1 @ 512 tok", target=demo_eval.data.tags[names.TARGET], train_run_id=v1,
                          checkpoint_step=step, params={**demo_eval.data.params, "max_new_tokens": "512"},
                          fingerprint=tracker.fingerprint(demo_eval.info.run_id),
                          tags={**carried, "protocol.max_new_tokens": "512"}) as run:
        run.log_metrics({**demo_eval.data.metrics, "tau": 9.5}, step=step)

    _visit(page, f"{url}/compare?runs={v1}", tmp_path / "h1-compare.png")
    # Drawn once a chart holds the point (on a busy box the page may still show its skeletons after `_visit`)
    page.wait_for_function("() => [...document.querySelectorAll('.db-curves[data-drawn=\"1\"]')]"
                           ".some(c => c.curves().some(s => s.y.includes(9.5)))", timeout=120_000)
    curves = page.evaluate("[...document.querySelectorAll('.db-curves')].map(c => c.curves())")
    tau = next(chart for chart in curves if any(9.5 in s["y"] for s in chart))  # the tau chart
    holding = [s for s in tau if 9.5 in s["y"]]
    assert len(holding) == 1 and "512 tok" in holding[0]["name"] and holding[0]["x"] == [step], holding
    others = [s for s in tau if s is not holding[0] and not s["faint"] and "drafter-v1" in s["name"]]
    assert others and all(step not in s["x"] and "512" not in s["name"] for s in others), others
