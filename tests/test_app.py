"""The dashboard, page by page, with Streamlit's AppTest on a store of real runs (conftest `dashboard_store`)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from apptest import APP, page_text, run_page, serve, shown, canvas_charts
from tracker.jobs.queue import QUEUED, JobQueue

@pytest.fixture
def app_env(dashboard_store, tmp_path, monkeypatch):
    serve(monkeypatch, dashboard_store.uri, dashboard_store.home, tmp_path, allowed_roots=dashboard_store.root)
    monkeypatch.setenv("DRAFTBOARD_MLFLOW_UI_URL", "http://mlflow.example:5000")
    return dashboard_store


def _frames(at: AppTest):
    return [df.value for df in at.dataframe]


def test_runs_page_lists_every_run_with_the_known_mismatch(app_env):
    at = run_page("pages/runs.py")
    table = _frames(at)[0]
    assert set(app_env.ids.values()) <= set(table["run_id"])
    # At 1280 px the number shows beside the checks that say whether it compares (issue 39: tau was off-screen)
    assert list(at.dataframe[0].proto.column_order)[:4] == ["env check", "protocol check", "name", "tau"]
    by_id = table.set_index("run_id")
    v4 = by_id.loc[app_env.ids["v4"]]
    assert v4["env check"].startswith("🔴") and "linear-attn fallback vs training: fast" in v4["env check"]
    assert by_id.loc[app_env.ids["v4@200"], "env check"].startswith("🔴")
    assert not by_id.loc[app_env.ids["v5"], "env check"].startswith("🔴")
    # The headline count is the number of runs with a critical mismatch (v4 and its eval).
    assert [m.value for m in at.metric if m.label == "Runs flagged 🔴"] == ["2"]
    # ... and says which, so it never reads as a second count of the banner's evals (issue 39)
    assert [m.help for m in at.metric if m.label == "Runs flagged 🔴"][0].startswith(("1 eval, 1 train", "1 train, 1 eval"))
    # The landing page says what this is, and what to do about the mismatch.
    assert "draftboard tracks DFlash drafters" in at.caption[0].value
    assert [shown(w.value) for w in at.warning] == [
        "1 eval(s) ran in a different environment than trained: their numbers are not the drafter as trained. (Runs "
        "flagged 🔴 below counts every row with a 🔴: these evals, their training runs, and evals whose protocol "
        "differs.)"]
    assert [link.proto.page for link in at.get("page_link") if link.proto.label == "Re-evaluate"]
    assert by_id.loc[app_env.ids["published"], "kind"] == "reference · published"
    assert by_id.loc[app_env.ids["published"], "target"] == "Qwen3.5-4B"
    # A training run's tau comes from its evals; its steps from its curve.
    assert by_id.loc[app_env.ids["v5"], "steps"] == "300"  # shown as text, so a missing one reads "—"
    assert float(by_id.loc[app_env.ids["v5"], "tau latest"]) == pytest.approx(app_env.results[200]["tau"], abs=5e-4)

    at.multiselect(key="runs_kind").set_value(["eval"]).run()
    kinds = set(_frames(at)[0]["kind"])
    assert kinds == {"eval"}
    at.text_input(key="runs_search").set_value("z-lab").run()
    assert not at.exception
    assert "No run matches" in page_text(at)


def test_runs_page_shows_a_page_of_rows_and_counts_every_run(app_env, monkeypatch):
    """Issue 38: the Runs table sends a page of rows at a time (bounded by what it shows, whatever the
    store's size); the counts cover every run, the pages together every run once, and a selection
    opens the run shown on that page."""
    from tracker.dashboard import tables

    whole = _frames(run_page("pages/runs.py"))[0]
    monkeypatch.setattr(tables, "RUNS_PAGE_ROWS", 3)
    at = run_page("pages/runs.py")
    pages = -(-len(whole) // 3)
    assert pages > 1 and at.number_input(key="runs_page").max == pages
    assert [m.value for m in at.metric if m.label == "Runs flagged 🔴"] == ["2"]  # over every run
    seen = []
    for page in range(1, pages + 1):
        at.number_input(key="runs_page").set_value(page).run()
        frame = _frames(at)[0]
        assert len(frame) == (3 if page < pages else len(whole) - 3 * (pages - 1))
        seen += list(frame["run_id"])
    assert seen == list(whole["run_id"])  # the same rows, in the same order, each once


def test_the_sidebar_says_where_regression_alerts_go(app_env, monkeypatch):
    """Issue 39: the webhook setting shows in the dashboard: alerts on the runs only, or also POSTed to
    the webhook's host (never its path, which holds Slack's token)."""
    monkeypatch.delenv("DRAFTBOARD_ALERT_WEBHOOK", raising=False)
    at = run_page("pages/runs.py")
    assert "Regression alerts: on the runs only (no `DRAFTBOARD_ALERT_WEBHOOK`)" in [c.value for c in at.sidebar.caption]
    monkeypatch.setenv("DRAFTBOARD_ALERT_WEBHOOK", "https://hooks.slack.example/services/T0/B0/s3cret")
    at = run_page("pages/runs.py")
    captions = [c.value for c in at.sidebar.caption]
    assert "Regression alerts: on the runs and POSTed to `hooks.slack.example`" in captions
    assert not any("s3cret" in c for c in captions)


def test_run_detail_shows_checkpoints_fingerprint_and_mlflow_link(app_env):
    at = run_page("pages/run_detail.py", run=app_env.ids["v4"])
    assert at.title[0].value == "v4"
    frames = _frames(at)
    checkpoints = next(f for f in frames if "sha256" in f.columns)
    assert list(checkpoints["step"]) == [100, 200]
    assert checkpoints.set_index("step").loc[200, "env check"].startswith("🔴")
    fingerprint = next(f for f in frames if list(f.columns) == ["section", "field", "value"])
    assert "linear_attention_path" in set(fingerprint["field"])
    links = [b.proto.url for b in at.get("link_button")]
    assert any(url.startswith("http://mlflow.example:5000/#/experiments/") and url.endswith(app_env.ids["v4"])
               for url in links)
    assert "Critical environment difference" in page_text(at)
    # Run detail has no From/To step inputs: its caption never asks for them (issue 52), it says where to zoom
    caption = next(c.value for c in at.caption if "points shown" in c.value)
    assert "From/To" not in caption and "Compare's Training curves zoom" in caption
    # Values read with 3 decimals, as everywhere else; the sidebar names the store in a word, its URI on hover.
    metrics = next(d for d in at.dataframe if "definition" in d.value.columns)
    assert json.loads(metrics.proto.columns)["value"]["type_config"]["format"] == "%.3f"
    (store,) = [c for c in at.sidebar.caption if c.value.startswith("Store:")]
    assert store.value.startswith("Store: `draftboard.db (sqlite)`") and app_env.uri in store.proto.help


def test_run_detail_links_to_mlflow_ui_only_when_configured(app_env, monkeypatch):
    monkeypatch.delenv("DRAFTBOARD_MLFLOW_UI_URL")
    at = run_page("pages/run_detail.py", run=app_env.ids["v4"])
    assert at.title[0].value == "v4" and not at.get("link_button")


def test_promote_and_demote_an_eval(app_env):
    run_id = app_env.ids["v5@100"]
    at = run_page("pages/run_detail.py", run=run_id)
    assert ":violet-badge[:material/account_tree: DFlash]" in page_text(at)  # issue 65 LOW: the family is badged
    at.button(key="detail_promote").click().run()
    assert not at.exception
    from tracker import Tracker

    tracker = Tracker(app_env.uri)
    assert tracker.run(run_id).data.tags["draftboard.kind"] == "reference"
    at.button(key="detail_promote").click().run()
    assert tracker.run(run_id).data.tags["draftboard.kind"] == "eval"


def test_published_references_cannot_be_demoted(app_env):
    at = run_page("pages/run_detail.py", run=app_env.ids["published"])
    assert shown(at.title[0].value) == "z-lab paper" and "detail_promote" not in [b.key for b in at.button]
    at = run_page("pages/run_detail.py", run=app_env.ids["ref"])  # a measured reference still can be
    assert at.button(key="detail_promote").label == "Demote to eval"


def test_eval_runs_span_the_eval_and_the_experiment_says_what_it_holds(app_env, tmp_path):
    from mlflow import MlflowClient

    from tracker import Tracker

    # An experiment made before the labels existed gets them when the store is next written to.
    old = f"sqlite:///{tmp_path / 'old.db'}"
    made = MlflowClient(old).create_experiment("draftboard")
    assert "mlflow.experimentKind" not in MlflowClient(old).get_experiment(made).tags
    assert Tracker(old).find_experiment() == made and "mlflow.experimentKind" not in (
        MlflowClient(old).get_experiment(made).tags)  # reading changes nothing
    assert Tracker(old).experiment_id == made
    assert MlflowClient(old).get_experiment(made).tags["mlflow.experimentKind"] == "custom_model_development"

    tracker = Tracker(app_env.uri)
    info = tracker.run(app_env.ids["v5@200"]).info
    # Logged once the eval is done, the run is back-dated to when the eval began.
    assert info.end_time - info.start_time >= app_env.results[200]["timing"]["total_s"] * 1000 - 1
    experiment = tracker.client.get_experiment(info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # mlflow ui: "Runs"
    assert "evals" in experiment.tags["mlflow.note.content"]


def _get(app, path: str) -> tuple[dict, bytes]:
    """One GET through an ASGI app: (response headers, body)."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [], "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "", "http_version": "1.1"}
    asyncio.run(app(scope, receive, send))
    return dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_deep_links_ask_the_server_root_for_health_and_host_config():
    """Without RootBase, Streamlit's browser code on /compare first asks /compare/_stcore/health (a 404)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, PlainTextResponse
    from starlette.routing import Route

    from tracker.serve import RootBase

    page = "<!doctype html><html><head><title>draftboard</title></head><body></body></html>"
    app = Starlette(routes=[Route("/_stcore/health", lambda request: PlainTextResponse("ok")),
                            Route("/{page:path}", lambda request: HTMLResponse(page))])
    headers, body = _get(RootBase(app), "/compare")
    assert body.startswith(b"<!doctype html><html><head><script>window.__streamlit=")
    assert b'BACKEND_BASE_URL:window.location.origin+"/"' in body and body.endswith(page[-30:].encode())
    assert int(headers[b"content-length"]) == len(body)
    _, body = _get(RootBase(app, base_path="/board/"), "/board/runs")
    assert b'window.location.origin+"/board/"' in body
    assert _get(RootBase(app), "/_stcore/health")[1] == b"ok"  # not a page: untouched


def test_a_reference_in_a_compare_link_is_the_pages_reference_not_a_missing_run(app_env):
    """Issue 65 M4: Runs' "Compare selected" of a reference row and a training run said the reference did not
    exist here. It is chosen as the page's reference; only ids that name no run are said to be missing."""
    ids = app_env.ids
    at = run_page("pages/compare.py", runs=f"{ids['v5']},{ids['ref']},nosuchrun")
    assert at.selectbox(key="compare_reference").value == ids["ref"]
    [warning] = [shown(w.value) for w in at.warning if "do not exist here" in w.value]
    assert "nosuchrun" in warning and ids["ref"] not in warning


def test_one_checkpoint_control_draws_the_same_step_of_every_run(app_env):
    """Issue 65: Compare's per-run "Checkpoint drawn" pickers (ten at 20 runs) are one control: each run's latest,
    or one step for all, with how many runs evaluated it; a run without it is left out, and said."""
    ids = app_env.ids
    at = run_page("pages/compare.py", runs=f"{ids['v4']},{ids['v5']}")
    control = at.selectbox(key="compare_checkpoint")
    assert control.options == ["latest of each run", "step 200 (2 of 2 runs)", "step 100 (1 of 2 runs)"]
    assert len([s for s in at.sidebar.selectbox if s.label == "Checkpoint drawn"]) == 1
    assert "Left out of the views by checkpoint" not in page_text(at)
    control.select(100).run()
    assert not at.exception
    assert "Left out of the views by checkpoint: v4: no eval at step 100." in page_text(at)


def test_compare_banner_names_the_mismatched_fields(app_env):
    ids = app_env.ids
    at = run_page("pages/compare.py", runs=f"{ids['v4']},{ids['v5']}")
    text = page_text(at)
    # The default reference: same target, and the environment it shares with the chosen runs named.
    assert "z-lab ref: same target, same environment" in text
    # the reference names the hub repository and commit its drafter came from
    picker = at.selectbox(key="compare_reference")
    assert any("z-lab ref · z-lab/tiny-DFlash @ 2274357 ·" in option for option in picker.options), picker.options
    errors = "\n".join(shown(e.value) for e in at.error)
    assert "v4 (training): linear-attn fast vs reference: fallback" in errors
    assert "v5" not in errors
    warnings = "\n".join(shown(w.value) for w in at.warning)
    assert "v4 @ step 200 (eval): linear-attn fallback vs its training run: fast" in warnings
    # Every warning sits in one panel, open because a series is not comparable with the reference.
    (panel,) = [e for e in at.expander if "on what these numbers can be compared with" in e.label]
    assert "not comparable with the reference" in panel.label and panel.proto.expanded
    # The whole comparison as one file (`draftboard report`; tests/e2e/test_report.py opens it in Chromium).
    assert [b.proto.label for b in at.get("download_button") if b.proto.label == "Download report"]
    # One view at a time: only the shown one is computed, each with its CSV; Data holds every chart's rows.
    assert _view(at) == "Eval by checkpoint" and not _traces(at, "compare_train_")
    for view in VIEWS:
        _view(at, view)
        assert at.get("download_button"), view
    export = next(f for f in _frames(at) if "chart" in f.columns)
    assert {"training curve", "eval over checkpoints", "reference", "acceptance by position",
            "ddtree vs budget"} <= set(export["chart"])


VIEWS = ("Eval by checkpoint", "Training curves", "Acceptance by position", "DDTree vs budget", "Data")


def _view(at: AppTest, view: str | None = None) -> str:
    """Switch Compare to `view` (when given); the view shown."""
    switch = at.segmented_control(key="compare_view")
    if view is not None:
        switch.set_value(view).run()
        assert not at.exception, [e.message for e in at.exception]
    return switch.value


def _traces(at: AppTest, key_prefix: str) -> list[dict]:
    """Every named series drawn: Plotly traces, and the training charts' lines in their shape (a line's
    legend row holds the dash reason as its tooltip: tests/e2e/test_zoom.py)."""
    import json

    plotly = [t for chart in at.get("plotly_chart") if chart.proto.id and key_prefix in chart.proto.id
              for t in json.loads(chart.proto.spec)["data"] if t.get("name")]
    lines = [{"name": s["name"] + (f" ⚠ {s['reason']}" if s["reason"] else ""),
              "line": {"color": s["color"], "dash": "dash" if s["dashed"] else "solid"}}
             for spec in canvas_charts(at, key_prefix).values() for s in spec["series"] if not s["faint"]]
    return plotly + lines


def test_compare_draws_each_run_in_one_colour_with_the_dash_reason_in_the_legend(app_env):
    ids = app_env.ids
    at = run_page("pages/compare.py", runs=f"{ids['v4']},{ids['v5']}")
    colours, dashed_against = {}, set()
    traces = []
    for view in VIEWS:
        _view(at, view)
        traces += _traces(at, "compare_")
    for trace in traces:
        run_name = trace["name"].split(" ")[0]
        colours.setdefault(run_name, set()).add(trace["line"]["color"])
        if "⚠" in trace["name"]:  # dashed, and the legend says why
            against = re.search(r"≠ (reference|training): (.*)", trace["name"])
            assert trace["line"]["dash"] == "dash" and "linear-attn" in against.group(2)
            dashed_against.add(against.group(1))
            reason = trace["name"].split(" ⚠ ")[1]
            assert "hovertemplate" not in trace or f"dashed: {reason}" in trace["hovertemplate"]
        elif not trace["name"].startswith("reference"):
            assert trace["line"]["dash"] == "solid"
    assert len(colours["v4"]) == 1 and len(colours["v5"]) == 1 and colours["v4"] != colours["v5"]
    # v4 trained on the fast kernels, unlike the reference (its training curve); its eval ran the fallback.
    assert dashed_against == {"reference", "training"}
    # The Training view smooths (EMA) by default and offers a log step axis.
    _view(at, "Training curves")
    assert at.slider(key="compare_smoothing").value == 0.6 and not at.toggle(key="compare_log_step").value


def test_compare_says_when_no_reference_matches_the_target(app_env, tmp_path):
    # Only the published reference for another target: choosing it by hand, the other target is the
    # first thing said, once, and nothing contradicts it (no "only warnings" box, no env banner).
    at = run_page("pages/compare.py", runs=app_env.ids["v5"])
    at.selectbox(key="compare_reference").set_value(app_env.ids["published"]).run()
    assert not at.exception
    assert [shown(e.value) for e in at.error] == [
        "**Different target: the reference z-lab paper was evaluated for Qwen3.5-4B, the chosen runs for target. "
        "Its numbers describe another model: compare the shapes of the curves, not their values.**"]
    assert not at.info and "published numbers for target" not in page_text(at)
    # Issue 52: chosen by hand, it still says whether its line is drawn, or exactly why not
    [why] = [shown(w.value) for w in at.warning]
    assert why.startswith("No reference number matches: the chosen evals ran on ") and "is drawn apart" in why


def test_environments_matrix_and_reevaluate_queue_a_job(app_env):
    at = run_page("pages/environments.py")
    pairs = _frames(at)[0]
    assert pairs.iloc[0]["eval_run_id"] == app_env.ids["v4@200"] and pairs.iloc[0]["critical"] > 0
    matrix = _frames(at)[1]
    assert "numerics.linear_attention_path" in matrix.index
    # Choosing other runs (the baseline no longer among them) re-renders cleanly.
    at.multiselect(key="env_runs").set_value([app_env.ids["v5"], app_env.ids["ref"], app_env.ids["published"]]).run()
    assert not at.exception
    assert list(_frames(at)[1].columns) == ["v5", "z-lab ref", "z-lab paper"]
    at.button(key="env_reeval").click().run()
    assert not at.exception
    jobs = JobQueue().list()
    assert len(jobs) == 1 and jobs[0].state == QUEUED
    params = jobs[0].params
    assert params["linear_attn"] == "fast" and params["dtype"] == "bf16" and params["device"] == "cpu"
    assert params["train_run_id"] == app_env.ids["v4"] and params["checkpoint_step"] == 200
    assert params["drafter"] == str(app_env.drafters[200]) and "tracking_uri" not in params  # the worker's store
    assert params["drafter_precision"] == "fp32"  # the training run's drafter computed in fp32


def test_reevaluate_is_disabled_with_the_reason_when_nothing_would_change(app_env):
    at = run_page("pages/environments.py")
    at.selectbox(key="env_reeval_run").set_value(app_env.ids["v5@200"]).run()
    assert not at.exception
    assert at.button(key="env_reeval").disabled
    assert "already ran in its training run's environment" in page_text(at)


def test_launch_prefills_the_run_and_project_defaults_not_the_last_eval(app_env):
    at = run_page("pages/launch.py")  # a fresh visitor: the first training run is chosen
    assert not at.exception
    # Every eval in the store ran budgets 2,4,8: budgets are the project's, the measurement the run's.
    assert at.text_input(key="launch_budgets").value == "4,8,16,32"
    assert at.number_input(key="launch_max_new").value == 12
    assert at.selectbox(key="launch_prompt_set").value == app_env.prompts  # a file the project's evals used


def test_launch_cards_show_the_result_or_the_cause_and_a_clean_log_tail(app_env):
    from tracker import config
    from tracker.events import PREFIX
    from tracker.jobs.queue import FAILED, SUCCEEDED

    queue = JobQueue()
    base = {"target": app_env.target, "drafter": str(app_env.drafters[200]), "prompts": app_env.prompts}
    done, broken = queue.submit("eval", base), queue.submit("eval", {**base, "device": "cuda"})
    for job in (queue.claim("w"), queue.claim("w")):
        log = config.logs_dir() / f"job-{job.id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"loading target\ndrafter:  50%|█████     | 1/2\n{PREFIX}{{\"event\": \"progress\"}}\n"
                       "Traceback (most recent call last):\n" if job.id == broken.id else
                       f"loading target\ndrafter:  50%|█████     | 1/2\n{PREFIX}{{\"event\": \"progress\"}}\ntau 2\n")
        queue.attach_process(job.id, "w", None, str(log))
    queue.finish(done.id, SUCCEEDED, mlflow_run_id=app_env.ids["v5@200"])
    queue.finish(broken.id, FAILED, error="exit code 1; last output:\nTraceback (most recent call last):\n"
                                          "  File \"x.py\", line 1\nAssertionError: Torch not compiled with CUDA enabled")
    at = run_page("pages/launch.py")
    assert not at.exception
    text = page_text(at)
    metrics = app_env.results[200]
    assert f"τ {metrics['tau']:.3f} · ddtree_tau_b8 {metrics['ddtree']['8']['tau']:.3f}" in text
    assert "AssertionError: Torch not compiled with CUDA enabled" in text
    tails = [c.value for c in at.code]
    assert tails and all(PREFIX not in t and "50%|" not in t and "loading target" in t for t in tails)
    assert all(c.proto.wrap_lines for c in at.code)  # a long argv line wraps instead of running off the card
    at.toggle(key=f"log_all_{done.id}").set_value(True).run()
    assert any(PREFIX in c.value and "50%|" in c.value for c in at.code)


def test_a_job_card_shows_its_result_as_soon_as_the_eval_lands(tmp_path, monkeypatch):
    from tracker import Tracker
    from tracker.jobs.queue import SUCCEEDED

    home = tmp_path / "home"
    home.mkdir()
    uri = f"sqlite:///{home / 'draftboard.db'}"
    serve(monkeypatch, uri, home, tmp_path)
    tracker = Tracker(uri)
    with tracker.training_run("v9", {}, "/m/T", fingerprint={}) as train:
        train.log_step(0, loss=1.0)
    queue = JobQueue()
    job = queue.submit("eval", {"target": "/m/T", "drafter": "/m/d", "prompts": "/m/p.jsonl"})
    at = run_page("pages/launch.py")  # the page has read the store: the eval is not in it yet
    with tracker.eval_run("v9 @ step 0", target="/m/T", train_run_id=train.run_id, checkpoint_step=0,
                          fingerprint={}) as ev:
        ev.log_metrics({"tau": 2.345})
    queue.claim("w")
    queue.finish(job.id, SUCCEEDED, mlflow_run_id=ev.run_id)
    at.run()
    assert not at.exception
    assert "τ 2.345" in page_text(at)  # at once: no reload, no waiting for the store's cache to expire


def test_launch_refuses_max_new_tokens_beyond_the_targets_context_at_submit(app_env):
    import json

    context = json.loads((Path(app_env.target) / "config.json").read_text())["max_position_embeddings"]
    at = run_page("pages/launch.py")
    at.selectbox(key="launch_train_run").set_value(app_env.ids["v5"]).run()
    at.selectbox(key="launch_prompt_set").set_value(app_env.prompts)
    at.selectbox(key="launch_checkpoint").set_value(100).run()
    at.number_input(key="launch_max_new").set_value(10**12)  # in the form: sent with the submit, as a browser does
    at.button(key="launch_submit").click().run()
    (error,) = [shown(e.value) for e in at.error]
    assert error == (f"max new tokens {10**12} leaves no room for a prompt in the target's context of {context} "
                     "tokens (max_position_embeddings)")
    # An emoji, not a Material icon: its ligature name ("block") is text that shows before the icon font
    # loads and in anything copied from the page.
    assert at.error[0].icon == "🚫"
    # Out-of-range numbers reach the check as typed (no field clamps them back to an earlier value).
    for key, value, why in (("launch_max_new", -5, "max new tokens must be a positive integer"),
                            ("launch_limit", 0, "prompts per dataset must be a positive integer (or empty: all of them)")):
        at.number_input(key="launch_max_new").set_value(12)
        at.number_input(key=key).set_value(value)
        at.button(key="launch_submit").click().run()
        assert [shown(e.value) for e in at.error] == [why]
    at.selectbox(key="launch_sampling").set_value("custom").run()
    at.number_input(key="launch_limit").set_value(None)
    at.number_input(key="launch_temperature").set_value(1.0)
    at.number_input(key="launch_top_p").set_value(1.5)
    at.button(key="launch_submit").click().run()
    assert [shown(e.value) for e in at.error] == ["top_p must lie in (0, 1], got 1.5"]  # the field's name, not the CLI's --top-p
    assert JobQueue().list() == []


def test_launch_says_how_to_get_served_numbers_when_no_engine_is_configured(app_env, monkeypatch):
    """Issue 39: with no engine configured "Measured by" offers only offline; the form says so, and how
    to configure one, on the page (not only in a tooltip); with an engine configured it says nothing."""
    from tracker import config

    for engine in config.ENGINES:
        monkeypatch.delenv(config.engine_python_var(engine), raising=False)
    monkeypatch.delenv(config.ENGINE_URLS_VAR, raising=False)
    at = run_page("pages/launch.py")
    notes = [c.value for c in at.caption if "no serving engine is configured" in c.value]
    assert len(notes) == 1 and "`DRAFTBOARD_LLAMACPP_PYTHON`" in notes[0] and "`DRAFTBOARD_ENGINE_URLS`" in notes[0]
    assert at.selectbox(key="launch_measured_by").options == ["offline (teacher-forced, exact)"]
    monkeypatch.setenv(config.engine_python_var("vllm"), sys.executable)
    at = run_page("pages/launch.py")
    assert not [c for c in at.caption if "no serving engine is configured" in c.value]


def test_launch_creates_a_job_and_dedups_the_second(app_env):
    at = run_page("pages/launch.py")
    at.selectbox(key="launch_train_run").set_value(app_env.ids["v5"]).run()
    assert at.text_input(key="launch_target").value == app_env.target
    at.selectbox(key="launch_prompt_set").set_value(app_env.prompts)
    at.selectbox(key="launch_checkpoint").set_value(100).run()
    at.text_input(key="launch_budgets").set_value("2,8")
    at.number_input(key="launch_max_new").set_value(12)
    at.button(key="launch_submit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Queued job #1" in s.value for s in at.success), page_text(at)
    jobs = JobQueue().list()
    assert len(jobs) == 1
    params = jobs[0].params
    assert params["drafter"] == str(app_env.drafters[100])
    assert params["linear_attn"] == "fallback"  # matched from the training run
    assert params["train_run_id"] == app_env.ids["v5"]
    assert "job #1" in page_text(at) or any("#1" in m.value for m in at.markdown)

    at.button(key="launch_submit").click().run()
    assert any("already submitted" in i.value for i in at.info)
    assert len(JobQueue().list()) == 1
    # The queue below: a progress bar per job and a cancel button, which asks once.
    assert len(at.get("progress")) == 1
    at.button(key="ask_cancel_1").click().run()
    assert JobQueue().get(1).state == "queued"  # not yet: a stray click costs nobody an eval
    at.button(key="keep_1").click().run()
    assert JobQueue().get(1).state == "queued" and not [b for b in at.button if b.key == "cancel_1"]
    at.button(key="ask_cancel_1").click().run()
    at.button(key="cancel_1").click().run()
    assert not at.exception
    assert JobQueue().get(1).state == "cancelled"
    # A cancelled job can be queued again as it was, or brought back into the form to change first.
    at.button(key="edit_1").click().run()
    assert at.number_input(key="launch_max_new").value == 12 and at.text_input(key="launch_budgets").value == "2,8"
    # issue 65 M2: the registered checkpoint comes back as the step it was picked as, not as a typed path
    assert at.selectbox(key="launch_checkpoint").value == 100
    assert not [t for t in at.text_input if t.key == "launch_drafter_path"]
    at.button(key="retry_1").click().run()
    assert not at.exception
    assert [(j.id, j.state) for j in JobQueue().list()] == [(2, "queued"), (1, "cancelled")]
    assert JobQueue().get(2).params == JobQueue().get(1).params


def test_launch_sampling_presets_fill_the_numbers_and_reach_the_job(app_env):
    at = run_page("pages/launch.py")
    at.selectbox(key="launch_train_run").set_value(app_env.ids["v5"]).run()
    at.selectbox(key="launch_prompt_set").set_value(app_env.prompts)
    at.selectbox(key="launch_checkpoint").set_value(100)
    assert at.number_input(key="launch_temperature").value == 0.0 and at.number_input(key="launch_temperature").disabled
    at.selectbox(key="launch_sampling").set_value("DFlash2 model card (T=1, top_p 0.95, top_k 20)").run()
    assert [at.number_input(key=k).value for k in ("launch_temperature", "launch_top_p", "launch_top_k")] == [
        1.0, 0.95, 20]
    at.number_input(key="launch_samples").set_value(4)
    at.button(key="launch_submit").click().run()
    assert not at.exception and any("Queued job #1" in s.value for s in at.success), page_text(at)
    params = JobQueue().get(1).params
    assert (params["temperature"], params["top_p"], params["top_k"], params["samples"]) == (1.0, 0.95, 20, 4)
    # custom: the numbers are the user's
    at.selectbox(key="launch_sampling").set_value("custom").run()
    assert not at.number_input(key="launch_top_k").disabled
    at.number_input(key="launch_temperature").set_value(0.7)
    at.button(key="launch_submit").click().run()
    assert JobQueue().get(2).params["temperature"] == 0.7
    # custom at T = 0 with Samples as it was shown: greedy, and no note on a setting nobody chose (issue 52 LOW)
    at.number_input(key="launch_temperature").set_value(0.0)
    at.number_input(key="launch_samples").set_value(8)
    at.number_input(key="launch_max_new").set_value(13)  # another job than the first greedy ones
    at.button(key="launch_submit").click().run()
    assert not any("Not part of this eval" in i.value for i in at.info), page_text(at)
    assert "samples" not in JobQueue().list()[0].params or JobQueue().list()[0].params["samples"] == 1


def test_launch_refuses_paths_outside_the_allowed_roots(app_env, tmp_path):
    at = run_page("pages/launch.py")
    at.selectbox(key="launch_checkpoint").set_value("__path__").run()
    at.text_input(key="launch_drafter_path").set_value(str(tmp_path))
    at.selectbox(key="launch_prompt_set").set_value(app_env.prompts)
    at.button(key="launch_submit").click().run()
    assert any("outside the allowed roots" in shown(e.value) for e in at.error)
    assert JobQueue().list() == []


def test_readonly_hides_the_controls(app_env, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_READONLY", "1")
    at = run_page("pages/launch.py")
    assert not [b for b in at.button if b.key == "launch_submit"]
    at = run_page("pages/run_detail.py", run=app_env.ids["v5@100"])
    assert not [b for b in at.button if b.key == "detail_promote"]
    at = run_page("pages/environments.py")
    assert not [b for b in at.button if b.key == "env_reeval"]


def test_empty_store_says_how_to_start(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'empty.db'}")
    monkeypatch.setenv("DRAFTBOARD_JOBS_URI", f"sqlite:///{tmp_path / 'jobs.db'}")
    for page in ("pages/runs.py", "pages/compare.py", "pages/environments.py", "pages/run_detail.py",
                 "pages/launch.py"):
        at = run_page(page)
        if page != "pages/launch.py":
            assert "draftboard demo" in page_text(at)


PAGES = ("pages/runs.py", "pages/compare.py", "pages/environments.py", "pages/launch.py", "pages/run_detail.py")


def test_pages_never_import_torch_or_transformers(app_env):
    """In a fresh interpreter: every page renders on the real store without pulling in the model stack."""
    code = (
        "import sys\n"
        "from streamlit.testing.v1 import AppTest\n"
        f"for page in {PAGES!r}:\n"
        f"    at = AppTest.from_file({APP!r}, default_timeout=60)\n"
        "    at.switch_page(page)\n"
        "    at.run()\n"
        "    assert not at.exception, (page, [e.message for e in at.exception])\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=os.environ.copy(), capture_output=True, text=True,
                          cwd=Path(APP).parent, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_full_histories_kept_for_zooms_are_bounded(app_env, monkeypatch):
    """Past FULL_HISTORY_MAX_POINTS the least recently read run's full history is dropped (it is
    read again when a zoom needs it); the curves drawn are the same either way."""
    from tracker.dashboard import ui
    from tracker.store import history

    index = ui.run_index(app_env.uri)
    runs = [r.run_id for r in index.of_kind("train") if r.metric_steps][:2]
    assert len(runs) == 2
    ui.refresh()
    monkeypatch.setattr(ui, "FULL_HISTORY_MAX_POINTS", 1)  # room for one run only
    drawn = ui.curves(app_env.uri, runs, index=index)
    assert [run for uri, run in ui._full if uri == app_env.uri] == [sorted(runs)[-1]]  # the last one read
    assert set(drawn["run_id"]) == set(runs)
    first = sorted(runs)[0]
    again = ui._full_history(app_env.uri, first, ("v",), None)
    assert again.equals(history.load_histories(app_env.uri, [first]))
    assert [run for uri, run in ui._full if uri == app_env.uri] == [first]
    ui.refresh()


def test_a_slow_store_is_read_again_in_the_background_and_only_when_it_changed(tmp_path, monkeypatch):
    """Issue 38: an unchanged store is never read again for a visitor; a changed store whose read is
    slow (here: every read, BACKGROUND_READ_S < 0) is read again in the background while visitors get
    the previous read at once, and the next visit after it gets the new runs."""
    from waiting import wait_until

    from tracker import Tracker
    from tracker.dashboard import ui

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("first", {}, "/models/t"):
        pass
    ui.refresh()
    first = ui.run_index(uri)
    assert ui.run_index(uri) is first and ui.index_age_s(uri) is None  # unchanged: the same read
    monkeypatch.setattr(ui, "BACKGROUND_READ_S", -1.0)
    with tracker.training_run("second", {}, "/models/t") as second:
        pass
    # Issue 52: a small store read slowly (a demo building on a busy box) is read at once, never shown stale
    assert second.run_id in ui.run_index(uri).runs and ui.index_age_s(uri) is None
    first = ui.run_index(uri)
    monkeypatch.setattr(ui, "BACKGROUND_MIN_RUNS", 0)  # as a large store
    with tracker.training_run("third", {}, "/models/t") as second:
        pass
    assert ui.run_index(uri) is first  # the previous read, at once, while the new one is made
    wait_until(lambda: second.run_id in ui.run_index(uri).runs and ui.index_age_s(uri) is None, 60,
               what="the background read landing")
    ui.refresh()


def test_the_server_warms_what_the_first_visitor_reads(app_env, tmp_path, monkeypatch):
    """`ui.warm` (run beside the server by `draftboard ui`) reads the landing page's rows (and the
    fingerprints they ask for) and every point of the default Compare selection's histories into the
    caches the pages use; an empty store stays uncached, so runs logged next show at once."""
    from tracker import Tracker
    from tracker.jobs import demo_progress
    from tracker.dashboard import lineage, ui
    from tracker.dashboard.compare import train_runs_for_histories
    from tracker.dashboard.tables import default_selection

    ui.refresh()
    with ui._fp_lock:
        ui._fingerprints.clear()
    said = ui.warm(app_env.uri)
    index = ui.run_index(app_env.uri)
    chosen = train_runs_for_histories(index, default_selection(index))
    assert said.startswith(f"warm: {len(index.runs)} runs, the histories of {len(chosen)} training runs"), said
    assert chosen and {run for uri, run in ui._full if uri == app_env.uri} == set(chosen)
    # The landing page's fingerprints: those of the evals that differ from their training runs (and of those
    # runs), not those of evals whose `env.*` keys match their training run's (issue 38: one request each).
    read = {run for uri, run, _ in ui._fingerprints if uri == app_env.uri}
    pairs = [p for p in (lineage.vs_training(index, ev) for ev in index.of_kind("eval")) if p is not None]
    differing = {r.run_id for p in pairs if not p.nothing_critical for r in (p.eval, p.train)}
    matching = {p.eval.run_id for p in pairs if p.nothing_critical}
    assert differing and differing <= read, (differing, read)
    assert matching and not matching & read, (matching, read)

    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert ui.warm(empty) == "warm: the store has no runs yet"
    with Tracker(empty).training_run("first", {}, "/models/t") as run:
        pass
    assert run.run_id in ui.run_index(empty).runs  # not the empty index the warm-up saw

    # A store the demo is still building is not opened (two first opens of one SQLite file can fail).
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    building = f"sqlite:///{tmp_path / 'home' / 'draftboard.db'}"
    demo_progress.ProgressWriter(tmp_path / "home", building, pid=os.getpid(), log="demo.log").update()
    assert ui.warm(building) == "warm: skipped (the demo is building the store)"
    assert not (tmp_path / "home" / "draftboard.db").exists()


def test_the_warm_up_reads_environments_pairs_only_where_the_runs_files_are_local(tracker, tmp_path, monkeypatch):
    """Environments' table reads the fingerprints of evals that differ from their training run in warnings
    too, which the landing page does not: the warm-up derives it where those reads are files on this machine,
    and leaves it to Environments' first visitor where each is a request to the server (issue 38). Never the
    fingerprint of an eval whose `env.*` keys all match its training run's."""
    from tracker.dashboard import ui

    def box(gpu: str, fast: bool = True) -> dict:
        return {"software": {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.24.0"},
                "hardware": {"device": "cuda" if fast else "cpu", "gpu_name": gpu},
                "numerics": {"dtype": "bf16", "linear_attention_path": "fast" if fast else "fallback"}}

    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path))
    with tracker.training_run("warmed drafter", {}, "/models/t", fingerprint=box("H100")) as train:
        train.log_step(1, loss=1.0)
    ids = {}
    for name, fp in (("same", box("H100")), ("other gpu", box("A100")), ("fallback", box("H100", fast=False))):
        with tracker.eval_run(name, target="/models/t", train_run_id=train.run_id, checkpoint="/ck/1",
                              checkpoint_step=1, fingerprint=fp) as ev:
            ev.log_metrics({"tau": 3.0}, step=0)
        ids[name] = ev.run_id
    ui.refresh()
    with ui._fp_lock:
        ui._fingerprints.clear()
    said = ui.warm(tracker.uri)
    assert said.startswith("warm: ") and "skipped" not in said, said
    mine = {train.run_id, *ids.values()}
    read = {run for store, run, _ in ui._fingerprints if store == tracker.uri} & mine
    landing = {train.run_id, ids["fallback"]}  # the critical pair's, which the landing page reads
    assert read == (landing | {ids["other gpu"]} if tracker.uri.startswith("sqlite") else landing), read


def test_launch_queues_an_engine_eval_managed_or_on_an_allowed_server(app_env, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_VLLM_PYTHON", "/opt/vllm-venv/bin/python")
    for engine in ("SGLANG", "LLAMACPP"):
        monkeypatch.delenv(f"DRAFTBOARD_{engine}_PYTHON", raising=False)
    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", "http://serving-box:30000")
    at = run_page("pages/launch.py")
    choices = at.selectbox(key="launch_measured_by").options
    assert choices == ["offline (teacher-forced, exact)", "vLLM (started by the worker)",
                       "vLLM at http://serving-box:30000", "SGLang at http://serving-box:30000",
                       "llama.cpp at http://serving-box:30000"]
    at.selectbox(key="launch_train_run").set_value(app_env.ids["v5"]).run()
    at.selectbox(key="launch_prompt_set").set_value(app_env.prompts)
    at.selectbox(key="launch_checkpoint").set_value(100)
    # The demo's target is a hybrid: the worker's vLLM on CPU runs its GDN layers in bf16 only, and
    # Launch says so in one line instead of queueing a job that cannot run.
    at.selectbox(key="launch_measured_by").set_value(("vllm", None)).run()
    at.button(key="launch_submit").click().run()
    assert [shown(e.value) for e in at.error] == ["vllm's cpu Gated DeltaNet kernels take bf16 only; this hybrid "
                                                  "target was asked for in fp32: use --dtype bf16"]
    assert not JobQueue().list()
    for choice in [("vllm", None), ("sglang", "http://serving-box:30000")]:
        at.selectbox(key="launch_measured_by").set_value(choice).run()
        at.selectbox(key="launch_dtype").set_value("bf16")  # a form's field: sent with the submit
        at.button(key="launch_submit").click().run()
        assert not at.exception and not at.error, page_text(at)
    managed, attached = JobQueue().list()[::-1]
    assert managed.params["engine"] == "vllm" and "engine_url" not in managed.params
    assert not {"budgets", "linear_attn", "drafter_precision"} & set(managed.params)  # offline settings
    assert (attached.params["engine"], attached.params["engine_url"]) == ("sglang", "http://serving-box:30000")
    assert "vllm" in managed.params["name"]  # an engine eval is never named like the offline one
    assert "vLLM" in page_text(at) or "vllm" in page_text(at)


def test_deep_links_with_unknown_run_ids_say_so(app_env):
    """Issue 26: `/run?run=doesnotexist123` showed another run without a word; `/compare?runs=zzz,...`
    dropped the id."""
    at = run_page("pages/run_detail.py", run="doesnotexist123")
    assert not at.exception
    assert any("No run with id" in shown(w.value) and "doesnotexist123" in shown(w.value) for w in at.warning)
    at = run_page("pages/compare.py", runs=f"zzz<b>,{app_env.ids['v5']}")
    assert not at.exception
    [warning] = [shown(w.value) for w in at.warning if "No training or eval run" in shown(w.value)]
    assert "zzz<b>" in warning and app_env.ids["v5"] not in warning
    assert at.multiselect(key="compare_runs").value == [app_env.ids["v5"]]  # the known id kept
    at = run_page("pages/run_detail.py", run=app_env.ids["v5"])
    assert not [w for w in at.warning if "No run with id" in shown(w.value)]


def test_run_detail_shows_the_doctor_report_attached_to_the_run_as_text(tmp_path, monkeypatch):
    """The report is anyone's artifact: its words reach the page as table text (never markdown or
    HTML), an unknown severity shows as `?`, and a run without one says how to attach one."""
    from tracker.store import names
    from tracker.store.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'doctor.db'}"
    serve(monkeypatch, uri, tmp_path / "home", tmp_path)
    tracker = Tracker(uri)
    with tracker.training_run("doctored", {}, "Qwen/Qwen3.5-4B") as checked, \
            tracker.training_run("undoctored", {}, "Qwen/Qwen3.5-4B") as plain:
        pass
    hostile = "<script>alert(1)</script> **not bold** [link](javascript:alert(2))"
    tracker.write_json(checked.run_id, names.DOCTOR_ARTIFACT, {"checks": [
        {"name": "mask_token", "severity": "ok", "verdict": "fine", "evidence": "258", "fix": ""},
        {"name": "layer_offset", "severity": "critical", "verdict": hostile, "evidence": "tau 1.4 vs 3.1",
         "fix": "retrain"},
        {"name": "weird", "severity": "boom", "verdict": ["not", "text"], "evidence": 7}]})
    tracker.client.set_tag(checked.run_id, names.DOCTOR, "critical")

    at = run_page("pages/run_detail.py", run=checked.run_id)
    table = next(f for f in _frames(at) if list(f.columns) == ["", "check", "verdict", "evidence", "fix"])
    assert list(table[""]) == ["🔴 critical", "❔ ?", "🟢 ok"]
    assert table.loc[0, "verdict"] == hostile and table.loc[1, "verdict"] == "" and table.loc[1, "evidence"] == ""
    assert any("Doctor: **critical** — 3 checks" in shown(e.value) for e in at.error)
    assert "<script>" not in "".join(m.value for m in at.markdown)

    at = run_page("pages/run_detail.py", run=plain.run_id)
    assert not [f for f in _frames(at) if "verdict" in f.columns]
    assert (f"draftboard doctor --target Qwen/Qwen3.5-4B --drafter CHECKPOINT --run {plain.run_id}"
            in [c.value for c in at.code])


def test_a_replaced_fingerprint_is_read_again_after_refresh(tmp_path):
    """`draftboard fingerprint --attach` replaces a run's fingerprint.json and its env tags. The dashboard keeps
    what it read, and the diffs of what it read, across reads of the store, per file version: after Refresh
    the eval's new environment is what it compares, not the file it read before."""
    from test_views import fp

    from tracker import Tracker
    from tracker.dashboard import lineage, ui

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    trained = fp(path="fast", dtype="bf16", device="cuda", gpu="H100")
    with tracker.training_run("t", {}, "/m/T", fingerprint=trained) as train:
        pass
    with tracker.eval_run("e", target="/m/T", train_run_id=train.run_id, checkpoint="/ck/1", checkpoint_step=1,
                          fingerprint=trained) as ev:
        ev.log_metrics({"tau": 2.0}, step=0)
    index = ui.run_index(uri)
    assert lineage.vs_training(index, index.runs[ev.run_id]).rows == ()  # read, diffed and kept: the same
    tracker.attach_fingerprint(ev.run_id, fp())  # it ran on the CPU box after all
    ui.refresh()
    again = ui.run_index(uri)
    assert again.runs[ev.run_id].fingerprint["numerics"]["linear_attention_path"] == "fallback"
    assert [e.run_id for e in lineage.open_evals(again)] == [ev.run_id]
