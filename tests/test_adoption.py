"""Adoption of runs other training stacks wrote into MLflow (tracker/store/adoption.py, `draftboard adopt`).

The runs are written with a plain `MlflowClient` exactly as the tools write them (names from
../shared/research/training-stacks.md): SpecForge's legacy train_dflash.py logs `vars(args)` as
params (secrets included) and `train/*` metrics at micro-batch steps; speculators logs no params,
its flattened config as step-0 metrics and `train/position_{i}_acc` curves, in experiment `speculators`.
"""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from tracker import redact
from tracker.cli import main
from tracker.store import adoption, names
from tracker.store.adoption import RunView

pytestmark = pytest.mark.sqlite_only(reason="the foreign runs are written into their own experiments with a bare client")

LEGACY_ARGS = {
    "target_model_path": "Qwen/Qwen3-8B", "draft_config_path": "configs/qwen3-8b-dflash.json",
    "block_size": 16, "num_draft_layers": 5, "mask_token_id": 151669, "num_anchors": 512,
    "loss_type": "ce", "loss_decay_gamma": 7.0, "learning_rate": 6e-4, "num_epochs": 6, "max_length": 3072,
    "warmup_ratio": 0.04, "accumulation_steps": 4, "random_anchor": True, "attention_backend": "flex_attention",
    "wandb_key": "wk-9f8e7d6c5b4a", "hub_token": "hf_abcdefSECRET", "ckpt_dir": "out/ckpt",
}
SPECULATORS_CONFIG = {"dflash/block_size": 8, "draft/num_layers": 5, "draft/mask_token_id": 151669,
                      "data/max_anchors": 256, "optimizer/lr": 1e-3, "data/total_seq_len": 8192}


def _log(client, run_id, metrics: dict[str, float], step: int) -> None:
    client.log_batch(run_id, metrics=[Metric(k, float(v), 0, step) for k, v in metrics.items()], synchronous=True)


@pytest.fixture(scope="module")
def foreign_runs(store_uri):
    """(client, legacy run id, speculators run id) in a real sqlite MLflow store."""
    client = MlflowClient(tracking_uri=store_uri)
    legacy_exp = client.create_experiment("dflash-qwen3-8b")
    legacy = client.create_run(legacy_exp, run_name="train_dflash").info.run_id
    client.log_batch(legacy, params=[Param(k, str(v)) for k, v in LEGACY_ARGS.items()], synchronous=True)
    for step in (50, 100, 150):  # --log-interval 50, micro-batch global_step from 1
        _log(client, legacy, {"train/loss": 3.0 / step, "train/accuracy": step / 300, "train/lr": 6e-4}, step)
    spec_exp = client.get_experiment_by_name("speculators")
    spec_exp_id = spec_exp.experiment_id if spec_exp else client.create_experiment("speculators")
    spec = client.create_run(spec_exp_id, run_name="2026-12-01T10:00:00").info.run_id
    _log(client, spec, SPECULATORS_CONFIG, 0)
    for step in range(3):
        _log(client, spec, {"train/loss": 2.0 - step / 10, "train/full_acc": 0.2 + step / 10, "train/eal": 1.5,
                            "train/position_1_acc": 0.6, "train/position_7_acc": 0.1, "lr": 1e-3}, step)
    return client, legacy, spec


def _view(client, run_id) -> RunView:
    run = client.get_run(run_id)
    return RunView.of(run, client.get_experiment(run.info.experiment_id).name)


def test_detection_names_each_tool_with_its_evidence(foreign_runs):
    client, legacy, spec = foreign_runs
    found = adoption.detect(_view(client, legacy))
    assert found.tool == adoption.SPECFORGE_LEGACY and found.label == "SpecForge (train_dflash.py)"
    assert any("block_size" in e for e in found.evidence) and "metric train/accuracy" in found.evidence
    found = adoption.detect(_view(client, spec))
    assert found.tool == adoption.SPECULATORS
    assert any("experiment 'speculators'" in e for e in found.evidence)
    runtime = RunView("r", "specforge", {"tracking.report_to": "mlflow", "tracking.wandb_key": "<redacted>"},
                      {"train/loss": 1.0, "train/acc": 0.3, "eval/simulated_acc_len": 0.4}, {})
    assert adoption.detect(runtime).tool == adoption.SPECFORGE
    assert adoption.detect(RunView("r", "x", {}, {"loss": 1.0}, {})).tool is None
    # our own runs, and an adopted run's tag, win over any signature
    assert adoption.detect(RunView("r", "x", {}, {"train/full_acc": 1.0}, {names.KIND: "train"})).tool == "draftboard"
    assert adoption.detect(RunView("r", "x", {}, {}, {adoption.TOOL_TAG: "nemo"})).tool == "nemo"


def test_aliases_map_each_tools_names_to_ours_and_show_both(foreign_runs):
    client, legacy, spec = foreign_runs
    legacy_aliases = {a.source: a for a in adoption.aliases(adoption.SPECFORGE_LEGACY, _view(client, legacy).metrics)}
    assert legacy_aliases["train/accuracy"].canonical == "acc"
    assert legacy_aliases["train/accuracy"].label == "acc (train/accuracy)"
    spec_aliases = {a.source: a for a in adoption.aliases(adoption.SPECULATORS, _view(client, spec).metrics)}
    assert spec_aliases["train/position_7_acc"].canonical == "acc_pos7"
    assert spec_aliases["train/full_acc"].canonical == "acc"
    assert "dflash/block_size" not in spec_aliases  # config, not a curve
    # SpecForge's simulated_acc_len is not an acceptance length: never shown as tau
    simulated = adoption.canonical_metric(adoption.SPECFORGE, "eval/simulated_acc_len")
    assert simulated.canonical is None and "not an acceptance length" in simulated.note
    # PR #810's smooth proxies and loss composition keep their own names, each said to be what it is (issue 51)
    for key in ("train/dflash2/hard_label/expected_accepted_length", "train/dflash2/teacher/expected_accepted_length"):
        proxy = adoption.canonical_metric(adoption.SPECFORGE, key)
        assert proxy.canonical is None and proxy.note.startswith("a smooth proxy") and "not tau" in proxy.note
    for key in ("train/objective/lk_kl_weight", "position_3/objective/loss_weight_share",
                "train/dflash/objective/loss_weight_share"):
        assert "loss-composition" in adoption.canonical_metric(adoption.SPECFORGE, key).note
    # perf/* since PR #810, train/perf/* before it: both SpecForge's runtime
    for key in ("perf/step_time_s", "train/perf/step_time_s"):
        assert adoption.detect(RunView("r", "x", {}, {key: 1.0}, {})).tool == adoption.SPECFORGE
    assert adoption.TOOLS[adoption.SPECFORGE_LEGACY].steps.label == "step = micro-batch"
    assert adoption.TOOLS[adoption.SPECULATORS].steps.unit == "optimizer step"


def test_recipe_fields_from_params_and_from_step0_config_metrics(foreign_runs):
    client, legacy, spec = foreign_runs
    spec_recipe = adoption.recipe(_view(client, spec))
    assert spec_recipe["block_size"].value == "8" and spec_recipe["block_size"].source == "dflash/block_size"
    assert spec_recipe["mask_token_id"].value == "151669"
    assert spec_recipe["num_anchors"].value == "256"
    assert "train/loss" not in spec_recipe
    legacy_recipe = adoption.recipe(_view(client, legacy))
    assert legacy_recipe["lr"].value == "0.0006" and legacy_recipe["lr"].source == "learning_rate"
    assert legacy_recipe["target"].value == "Qwen/Qwen3-8B"


def test_secret_looking_params_are_masked_everywhere_they_are_shown(foreign_runs):
    client, legacy, _ = foreign_runs
    params = _view(client, legacy).params
    assert params["wandb_key"] == LEGACY_ARGS["wandb_key"]  # the tool stored it in clear
    masked = redact.mask_params(params)
    assert masked["wandb_key"] == redact.MASK and masked["hub_token"] == redact.MASK
    assert masked["mask_token_id"] == "151669" and masked["block_size"] == "16"
    shown = repr(adoption.recipe(_view(client, legacy))) + repr(adoption.recipe_diff([_view(client, legacy)],
                                                                                     _view(client, legacy)))
    assert LEGACY_ARGS["wandb_key"] not in shown and LEGACY_ARGS["hub_token"] not in shown


def test_recipe_diff_flags_a_changed_block_size_as_critical(foreign_runs):
    client, legacy, spec = foreign_runs
    diff = adoption.recipe_diff([_view(client, spec)], reference=_view(client, legacy))
    rows = {row.key: row for row in diff.shown()}
    block = rows["block_size"]
    assert block.severity == "critical" and block.reference == "16" and block.values[spec] == "8"
    assert block.reference_source == "block_size" and block.sources[spec] == "dflash/block_size"
    assert "acceptance is capped at block_size" in block.reason
    assert rows["num_anchors"].severity == "warning"
    assert "mask_token_id" not in rows  # the same under both tools' names: not a difference
    assert [r.group for r in diff.shown()][0] == "dflash"
    assert any(lint.key == "recipe" and "run.yaml" in lint.message for lint in diff.lints)


def test_lint_names_a_tapped_last_layer_with_its_reason():
    reference = RunView("ref", "draftboard", {"block_size": "16", "target_layer_ids": "[1, 17, 33]",
                                              "num_target_layers": "36", "mask_token_id": "151669"},
                        {}, {names.KIND: "train"})
    shortcut = RunView("v5", "draftboard", {"block_size": "16", "target_layer_ids": "[1, 17, 35]",
                                            "num_target_layers": "36", "mask_token_id": "151670"},
                       {}, {names.KIND: "train"})
    diff = adoption.recipe_diff([shortcut], reference)
    lints = [lint for lint in diff.lints if lint.key == "target_layer_ids"]
    assert [lint.run_id for lint in lints] == ["v5"]
    assert "35 is the target's last layer" in lints[0].message and "lm_head" in lints[0].message
    rows = {row.key: row for row in diff.shown()}
    assert rows["mask_token_id"].severity == "critical"
    assert rows["target_layer_ids"].severity == "warning"
    assert "num_target_layers" not in rows and len(diff.shown(diff_only=False)) > len(diff.shown())


def test_adopt_cli_tags_the_run_and_records_step_semantics(foreign_runs, store_uri, capsys):
    client, legacy, _ = foreign_runs
    assert main(["adopt", legacy, "--tracking-uri", store_uri]) == 0
    out = capsys.readouterr().out
    assert "SpecForge (train_dflash.py)" in out and "step = micro-batch" in out and "acc (train/accuracy)" in out
    tags = client.get_run(legacy).data.tags
    assert tags[names.KIND] == "train" and tags[adoption.TOOL_TAG] == adoption.SPECFORGE_LEGACY
    assert tags[adoption.STEP_UNIT_TAG] == "micro-batch"
    assert adoption.detect(_view(client, legacy)).tool == adoption.SPECFORGE_LEGACY  # the tag keeps it

    exp = client.create_experiment("homegrown")
    plain = client.create_run(exp).info.run_id
    _log(client, plain, {"loss": 1.0}, 1)
    assert main(["adopt", plain, "--tracking-uri", store_uri]) == 2
    assert "--tool NAME" in capsys.readouterr().err
    assert main(["adopt", plain, "--tool", "nemo", "--tracking-uri", store_uri]) == 0
    assert client.get_run(plain).data.tags[adoption.TOOL_TAG] == "nemo"
    assert client.get_run(plain).data.tags[adoption.STEP_UNIT_TAG] == "unknown"


# SpecForge after PR #810: `train/dflash/*`, `train/dflash2/selector/*` and `position_<j>/*`, every row with
# `train/optimizer_step` (docs/sections/basic_usage/training.md); its MLflow step is the tracker's row index.
SPECFORGE_810_ROW = {"train/loss": 2.0, "train/acc": 0.3,
                     "train/dflash/hard_label/unary_gold_probability_chain_length": 2.4,
                     "train/dflash/hard_label/unary_top16_recall": 0.8, "train/dflash2/selector/loss": 1.1,
                     "train/dflash2/selector/greedy_accepted_length": 2.9,
                     "position_3/selector/greedy_prefix_survival": 0.4}
SPECFORGE_OLD_ROW = {"train/loss": 2.0, "train/acc": 0.3, "train/dflash/hard_label/expected_accepted_length": 2.3,
                     "train/selector_coverage": 0.7, "train/selector_loss": 1.2,
                     "train/dflash2/selector/serving_accepted_length": 2.8}


def test_specforge_names_before_and_after_pr_810_share_our_names():
    current = RunView("new", "specforge", {}, {**SPECFORGE_810_ROW, "train/optimizer_step": 300.0}, {})
    old = RunView("old", "specforge", {}, SPECFORGE_OLD_ROW, {})
    found = adoption.detect(current)
    assert found.tool == adoption.SPECFORGE and "train/optimizer_step" in found.evidence[0]
    assert adoption.detect(old).tool == adoption.SPECFORGE  # experiment `specforge`, train/acc
    new_names = {a.canonical: a.source for a in adoption.aliases(adoption.SPECFORGE, current.metrics)}
    old_names = {a.canonical: a.source for a in adoption.aliases(adoption.SPECFORGE, old.metrics)}
    shared = {"loss", "acc", "gold_chain_length", "candidate_recall", "selector_loss", "accept_len"}
    assert shared <= set(new_names) and shared <= set(old_names)
    assert new_names["gold_chain_length"] == "train/dflash/hard_label/unary_gold_probability_chain_length"
    assert old_names["gold_chain_length"] == "train/dflash/hard_label/expected_accepted_length"
    assert new_names["survival_pos3"] == "position_3/selector/greedy_prefix_survival"
    # the optimizer step is the x axis, never a curve
    assert "train/optimizer_step" not in {a.source for a in adoption.aliases(adoption.SPECFORGE, current.metrics)}
    assert adoption.step_metric(adoption.SPECFORGE) == "train/optimizer_step"
    assert adoption.step_metric(adoption.SPECULATORS) is None


def test_specforge_pr_844_names_are_ours_and_its_removed_aliases_are_not_taken_for_them():
    logged = {"train/dflash2/selector/teacher_forced_covered_accuracy": 0.7,
              "train/dflash2/selector/self_conditioned_marginal_accuracy": 0.4,
              "train/dflash2/selector/teacher_forced_covered_gold_probability": 0.6,
              "train/dflash/hard_label/unary_top4_recall": 0.9,
              # removed by #844; measured with the gold token injected (#772), so not the covered accuracy
              "train/selector_accuracy": 0.8, "train/selector_target_probability": 0.5}
    ours = {a.source: a.canonical for a in adoption.aliases(adoption.SPECFORGE, logged)}
    assert ours["train/dflash2/selector/teacher_forced_covered_accuracy"] == "selector_covered_acc"
    assert ours["train/dflash2/selector/self_conditioned_marginal_accuracy"] == "selector_marginal_acc"
    assert ours["train/dflash2/selector/teacher_forced_covered_gold_probability"] == "selector_gold_probability"
    assert ours["train/dflash/hard_label/unary_top4_recall"] == "candidate_recall"
    assert ours["train/selector_accuracy"] is None and ours["train/selector_target_probability"] is None


def test_speculators_eal_takes_its_name_from_the_release_that_wrote_it():
    def eal(version):
        return adoption.canonical_metric(adoption.SPECULATORS, "train/eal", version).canonical

    # 0.9.0 counts the bonus token (speculators/models/metrics.py); 0.7.0 to 0.8.1 did not
    assert eal("0.9.0") == eal("v0.9.1") == eal("0.10.0.dev4+gabc") == eal("1.0") == "eal"
    assert eal("0.8.1") == eal("0.7.0.2") == "eal_marginal"
    assert eal(None) == eal("") == eal("main") == "eal_unversioned"
    assert adoption.canonical_metric(adoption.SPECULATORS, "val/eal_epoch", "0.8.0").canonical == "val_eal_marginal"
    assert adoption.parse_version("0.9.0.dev3+g1a2b") == (0, 9, 0) and adoption.parse_version("x1.2") is None


def test_adopt_records_the_tool_version_and_refuses_one_that_is_not_a_release(store_uri, capsys):
    client = MlflowClient(tracking_uri=store_uri)
    run_id = client.create_run(client.create_experiment("speculators-versioned")).info.run_id
    _log(client, run_id, {"train/full_acc": 0.3, "train/eal": 1.4}, 1)
    assert main(["adopt", run_id, "--tool-version", "main", "--tracking-uri", store_uri]) == 2
    assert "not a release number" in capsys.readouterr().err
    assert names.TOOL_VERSION not in client.get_run(run_id).data.tags and names.KIND not in client.get_run(run_id).data.tags
    assert main(["adopt", run_id, "--tracking-uri", store_uri]) == 0
    out = capsys.readouterr().out
    assert "eal_unversioned (train/eal)" in out and "--tool-version V" in out
    assert main(["adopt", run_id, "--tool-version", "0.9.0", "--tracking-uri", store_uri]) == 0
    assert "eal (train/eal)" in capsys.readouterr().out
    assert client.get_run(run_id).data.tags[names.TOOL_VERSION] == "0.9.0"


def test_automodel_dflash2_names_are_detected_and_aliased():
    logged = {"train/loss": 3.1, "train/accuracy": 0.2, "train/lr": 1e-4, "train/epoch": 0.0, "train/accept_len": 2.1,
              "train/base_loss": 2.9, "train/selector_loss": 1.4, "train/base_accuracy": 0.21,
              "train/base_accept_len": 1.9, "train/candidate_recall": 0.7, "val/accept_len": 2.0}
    view = RunView("a", "Default", {}, logged, {})
    assert adoption.detect(view).tool == adoption.AUTOMODEL
    ours = {a.source: a.canonical for a in adoption.aliases(adoption.AUTOMODEL, logged)}
    assert ours["train/selector_loss"] == "selector_loss" and ours["train/candidate_recall"] == "candidate_recall"
    assert ours["train/accept_len"] == "accept_len" and ours["val/accept_len"] == "val_accept_len"
    assert ours["train/accuracy"] == "acc" and ours["train/epoch"] is None
