"""Runs other training stacks wrote, on the dashboard (AppTest): listed, compared with aliased curves,
their recipes diffed, their missing fingerprints fixed, their checkpoint folders watched.

The store holds a SpecForge-legacy-style run and a speculators-style run written with a bare
`MlflowClient` as the tools write them (names from ../shared/research/training-stacks.md), each
with its checkpoint folder written exactly as the tool writes it (tests/toolformats.py), plus a
draftboard training run whose recipe taps the target's last layer.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from apptest import page_text, run_page, serve, shown, canvas_charts
from tests import toolformats
from tracker import redact
from tracker import Tracker
from tracker.jobs import watch
from tracker.jobs.queue import JobQueue
from tracker.dashboard.curve_chart import X_DTYPE, Y_DTYPE, unpack
from tracker.store import names

pytestmark = pytest.mark.sqlite_only(reason="the foreign runs are written into their own experiments with a bare client")


def _log(client, run_id, metrics: dict, step: int) -> None:
    client.log_batch(run_id, metrics=[Metric(k, float(v), 0, step) for k, v in metrics.items()], synchronous=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory, machine_fp):
    home = tmp_path_factory.mktemp("adoption")
    uri = f"sqlite:///{home / 'draftboard.db'}"
    client = MlflowClient(tracking_uri=uri)
    model = toolformats.tiny_drafter()

    legacy = client.create_run(client.create_experiment("dflash-qwen3-8b"), run_name="train_dflash").info.run_id
    args = {"target_model_path": "Qwen/Qwen3-8B", "block_size": 16, "num_anchors": 512, "mask_token_id": 39,
            "loss_decay_gamma": 7.0, "learning_rate": 6e-4, "wandb_key": "wk-SECRET-9f8e"}
    client.log_batch(legacy, params=[Param(k, str(v)) for k, v in args.items()], synchronous=True)
    for step in (50, 100, 150):  # micro-batches
        _log(client, legacy, {"train/loss": 3.0 / step, "train/accuracy": step / 300, "train/lr": 6e-4}, step)
    legacy_dir = home / "specforge-out"
    toolformats.specforge_legacy(legacy_dir, 0, 100, model)

    spec = client.create_run(client.create_experiment("speculators"), run_name="spec-8b").info.run_id
    _log(client, spec, {"dflash/block_size": 8, "draft/num_layers": 2, "draft/mask_token_id": 39}, 0)
    for step in range(3):
        _log(client, spec, {"train/loss": 2.0 - step / 10, "train/full_acc": 0.2 + step / 10, "train/eal": 1.5,
                            "train/position_1_acc": 0.6}, step)
    spec_dir = home / "spec-ckpts"
    toolformats.speculators(spec_dir, 0, 2, model)
    # Two more speculators runs whose release is known (MLFLOW_TAGS at training time sets the tag): `eal`
    # without the bonus token (0.8.1) and with it (0.9.0, PR #1032).
    versioned = {}
    for version, eal in (("0.8.1", 1.2), ("0.9.0", 2.3)):
        run_id = client.create_run(client.get_experiment_by_name("speculators").experiment_id,
                                   run_name=f"spec-{version}", tags={names.TOOL_VERSION: version}).info.run_id
        for step in range(3):
            _log(client, run_id, {"train/loss": 2.0, "train/full_acc": 0.3, "train/eal": eal + step / 10}, step)
        versioned[version] = run_id

    # SpecForge after PR #810: current names, the MLflow step a row index, the optimizer step on every row.
    specforge = client.create_run(client.create_experiment("specforge"), run_name="qwen3-dflash2").info.run_id
    client.log_batch(specforge, params=[Param("tracking.report_to", "mlflow")], synchronous=True)
    for row, optimizer_step in enumerate((100, 200, 300)):
        _log(client, specforge, {"train/optimizer_step": optimizer_step, "train/loss": 2.0 - row / 10,
                                 "train/acc": 0.3 + row / 10, "train/dflash2/selector/greedy_accepted_length": 2 + row,
                                 "train/dflash2/selector/loss": 1.5 - row / 10,
                                 # PR #844's names (SpecForge's dflash_family_model.py)
                                 "train/dflash2/selector/teacher_forced_covered_accuracy": 0.7 + row / 100,
                                 "train/dflash2/selector/self_conditioned_marginal_accuracy": 0.4 + row / 100,
                                 "train/dflash/hard_label/unary_top16_recall": 0.9}, row)
    old_specforge = client.create_run(client.get_experiment_by_name("specforge").experiment_id,
                                      run_name="before-810").info.run_id
    for step in (100, 200):
        _log(client, old_specforge, {"train/loss": 2.2, "train/acc": 0.25,
                                     "train/dflash2/selector/serving_accepted_length": 1.5 + step / 200}, step)

    tracker = Tracker(uri)
    params = {"block_size": 16, "target_layer_ids": [1, 5], "num_target_layers": 6, "mask_token_id": 39, "lr": 6e-4}
    with tracker.training_run("ours", params, str(home / "target"), fingerprint=machine_fp) as run:
        for step in (1, 2, 3):
            run.log_step(step, loss=2.0 / step, acc=step / 10)
    return SimpleNamespace(uri=uri, home=home, legacy=legacy, spec=spec, ours=run.run_id, legacy_dir=legacy_dir,
                           spec_dir=spec_dir, tracker=tracker, specforge=specforge, old_specforge=old_specforge,
                           spec_old=versioned["0.8.1"], spec_new=versioned["0.9.0"])


@pytest.fixture
def app_env(store, tmp_path, monkeypatch):
    serve(monkeypatch, store.uri, store.home, tmp_path, allowed_roots=store.home)
    return store


def test_runs_lists_both_foreign_runs_as_training_runs_with_their_tool_and_step_unit(app_env):
    at = run_page("pages/runs.py")
    table = at.dataframe[0].value.set_index("run_id")
    assert table.loc[app_env.legacy, "kind"] == "train · SpecForge (train_dflash.py) · step = micro-batch"
    assert table.loc[app_env.spec, "kind"] == "train · vLLM speculators · step = optimizer step"
    assert table.loc[app_env.ours, "kind"] == "train"
    assert table.loc[app_env.legacy, "steps"] == "150" and table.loc[app_env.legacy, "target"] == "Qwen3-8B"
    assert "wk-SECRET" not in table.to_csv()


def test_environments_lists_each_run_without_a_fingerprint_with_its_fix(app_env):
    at = run_page("pages/environments.py")
    lines = [shown(m.value) for m in at.markdown if "fingerprint --attach" in m.value]
    assert len(lines) == 6  # the six foreign runs; ours logged its fingerprint
    for run_id, name in ((app_env.legacy, "train_dflash"), (app_env.spec, "spec-8b")):
        command = f"draftboard fingerprint --attach {run_id} --tracking-uri {app_env.uri}"
        assert any(line.startswith(f"**{name}**") and f"`{command}`" in line for line in lines), lines
    assert "Runs without a fingerprint (6)" in page_text(at)


def _watch_form(at, folder: str, preset: dict | None):
    at.toggle(key="detail_watch").set_value(True).run()
    at.text_input(key="detail_watch_dir").set_value(folder)
    at.checkbox(key="detail_watch_auto").set_value(preset is not None)
    if preset is not None:
        at.text_area(key="detail_watch_preset").set_value(json.dumps(preset))
    at.number_input(key="detail_watch_settle").set_value(0.0)
    at.button[0].click()  # the form's only button: Watch
    at.run()
    assert not at.exception, [e.message for e in at.exception]


def test_run_detail_registers_a_watch_that_the_worker_runs(app_env, tmp_path, monkeypatch):
    tracker = app_env.tracker
    monkeypatch.setenv("DRAFTBOARD_WATCH_EXPERIMENTS", "dflash-qwen3-8b")  # the worker runs this tool's watches
    at = run_page("pages/run_detail.py", run=app_env.legacy)
    assert at.title[0].value == "train\\_dflash"  # escaped Markdown
    params = next(df.value for df in at.dataframe if list(df.value.columns) == ["param", "value"])
    assert params.set_index("param").loc["wandb_key", "value"] == redact.MASK  # the tool logged it in clear
    # A folder outside the allowed roots is refused, in one line, and nothing is registered.
    _watch_form(at, str(tmp_path), None)
    assert "outside the allowed roots" in "\n".join(shown(e.value) for e in at.error)
    assert names.WATCH not in tracker.run(app_env.legacy).data.tags

    preset = {"target": str(app_env.home / "target"), "prompts": str(app_env.home / "prompts.jsonl"),
              "budgets": [4], "device": "cpu"}
    _watch_form(at, str(app_env.legacy_dir), preset)
    assert not at.error
    state = watch.state(tracker, app_env.legacy)
    assert state.dir == str(app_env.legacy_dir.resolve()) and state.preset["budgets"] == [4] and state.seen == {}
    assert "Watching" in page_text(at)  # the page now shows the watch

    # The dashboard registered the watch; the worker's scan records the checkpoint and queues its eval.
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    [result] = [r for r in watch.scan_all(tracker, queue) if r.run_id == app_env.legacy]
    assert [f.step for f in result.recorded] == [100] and len(result.queued) == 1
    [job] = queue.list()
    assert job.params["train_run_id"] == app_env.legacy and job.params["checkpoint_step"] == 100
    at = run_page("pages/run_detail.py", run=app_env.legacy)
    seen = next(df.value for df in at.dataframe if "layout" in df.value.columns)
    assert list(seen["step"]) == [100] and list(seen["eval job"]) == [f"#{job.id}"]


def test_a_read_only_dashboard_offers_no_watch_form(app_env, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_READONLY", "1")
    at = run_page("pages/run_detail.py", run=app_env.spec)
    assert not [t for t in at.toggle if t.key == "detail_watch"]
    assert f"draftboard watch {app_env.spec} DIR" in page_text(at)


def test_compare_draws_foreign_curves_under_our_names_with_both_names_shown(app_env):
    runs = f"{app_env.legacy},{app_env.spec},{app_env.ours}"
    at = run_page("pages/compare.py", runs=runs, compare_view="Training curves")
    options = at.multiselect(key="compare_train_metrics").options
    assert {"acc", "loss", "acc_pos1", "lr", "eal_unversioned"} <= set(options)  # spec-8b does not say its release
    assert not [k for k in options if k.startswith(("train/", "dflash/", "draft/"))]  # aliased, or config
    at.multiselect(key="compare_train_metrics").set_value(["acc", "loss"]).run()
    acc = next(spec for key, spec in canvas_charts(at, "compare_train_").items() if "compare_train_acc" in key)
    names_ = sorted(s["name"] for s in acc["series"] if not s["faint"])
    assert names_ == ["ours", "spec-8b · train/full_acc", "train_dflash · train/accuracy"]
    assert acc["x_title"] == "training step (micro-batches: train_dflash; optimizer steps: spec-8b, ours)"


def test_config_view_flags_a_changed_block_size_and_a_tapped_last_layer(app_env):
    runs = f"{app_env.ours},{app_env.spec}"
    at = run_page("pages/compare.py", runs=runs, compare_view="Config")
    at.selectbox(key="compare_recipe_ref").set_value(app_env.ours).run()
    table = next(df.value for df in at.dataframe if "logged as" in df.value.columns).set_index("key")
    row = table.loc["★ block_size"]
    assert (row["severity"], row["reference"], row["spec-8b"], row["logged as"]) == (
        "🔴 critical", "16", "8", "dflash/block_size")
    assert "★ mask_token_id" not in table.index  # same value: diff-only by default
    assert "block_size" in "\n".join(shown(e.value) for e in at.error)
    lints = next(df.value for df in at.dataframe if list(df.value.columns) == ["run", "severity", "key", "reason"])
    tapped = lints[lints["key"] == "target_layer_ids"]
    assert list(tapped["run"]) == ["ours"] and "tapped layer 5 is the target's last layer" in tapped["reason"].iloc[0]
    at.toggle(key="compare_config_all").set_value(True).run()
    assert "★ mask_token_id" in next(df.value for df in at.dataframe if "logged as" in df.value.columns)["key"].tolist()


def test_a_run_with_specforges_current_names_is_drawn_on_its_optimizer_step(app_env):
    table = run_page("pages/runs.py").dataframe[0].value.set_index("run_id")
    assert table.loc[app_env.specforge, "kind"] == "train · SpecForge (runtime) · step = optimizer step"
    assert table.loc[app_env.specforge, "steps"] == "300"  # the optimizer step, not the row index (2)

    runs = f"{app_env.specforge},{app_env.old_specforge}"
    at = run_page("pages/compare.py", runs=runs, compare_view="Training curves")
    options = at.multiselect(key="compare_train_metrics").options
    assert {"accept_len", "selector_loss", "loss", "acc"} <= set(options)
    assert "train/optimizer_step" not in options and not [k for k in options if k.startswith("train/")]
    at.multiselect(key="compare_train_metrics").set_value(["accept_len"]).run()
    chart = next(spec for key, spec in canvas_charts(at, "compare_train_").items() if "accept_len" in key)
    assert unpack(chart["x"], X_DTYPE).tolist() == [100, 200, 300]
    lines = {s["name"]: unpack(s["y"], Y_DTYPE).tolist() for s in chart["series"] if s["faint"]}  # raw, unsmoothed
    # old and new names of the same quantity share the chart, each with the name it was logged under
    assert lines["qwen3-dflash2 · train/dflash2/selector/greedy_accepted_length"] == [2.0, 3.0, 4.0]
    old = lines["before-810 · train/dflash2/selector/serving_accepted_length"]
    assert old[:2] == [2.0, 2.5] and old[2] != old[2]  # no point at 300


def test_specforge_pr_844_names_are_drawn_under_ours(app_env):
    at = run_page("pages/compare.py", runs=app_env.specforge, compare_view="Training curves")
    options = at.multiselect(key="compare_train_metrics").options
    assert {"selector_covered_acc", "selector_marginal_acc", "candidate_recall"} <= set(options)
    at.multiselect(key="compare_train_metrics").set_value(["selector_covered_acc"]).run()
    chart = next(spec for key, spec in canvas_charts(at, "compare_train_").items() if "selector_covered_acc" in key)
    lines = {s["name"]: unpack(s["y"], Y_DTYPE).tolist() for s in chart["series"] if s["faint"]}
    assert lines == {"qwen3-dflash2 · train/dflash2/selector/teacher_forced_covered_accuracy":
                     pytest.approx([0.70, 0.71, 0.72])}


def test_speculators_eal_from_either_side_of_its_redefinition_is_never_one_series(app_env):
    runs = f"{app_env.spec},{app_env.spec_old},{app_env.spec_new}"
    at = run_page("pages/compare.py", runs=runs, compare_view="Training curves")
    options = at.multiselect(key="compare_train_metrics").options
    assert {"eal", "eal_marginal", "eal_unversioned"} <= set(options) and "train/eal" not in options
    at.multiselect(key="compare_train_metrics").set_value(["eal", "eal_marginal", "eal_unversioned"]).run()
    charts = canvas_charts(at, "compare_train_")
    drawn = {}
    for key, spec in charts.items():
        name = next(n for n in ("eal_unversioned", "eal_marginal", "eal") if n in key)
        drawn[name] = {s["name"] for s in spec["series"] if s["faint"]}
    assert drawn == {"eal": {"spec-0.9.0 · train/eal"}, "eal_marginal": {"spec-0.8.1 · train/eal"},
                     "eal_unversioned": {"spec-8b · train/eal"}}
    text = page_text(at)
    assert "speculators >= 0.9.0" in text and "no bonus" in text
