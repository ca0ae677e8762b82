"""Compare's Config view, aliased curves and step units (tracker/dashboard/recipe.py), on hand-built runs.

The runs carry what the run index holds for them: a draftboard run's params, a SpecForge legacy
run's `vars(args)` and the in-memory tool tags the index adds (`adoption.listing_tags`), a
speculators run's config as step-0 metrics.
"""

from __future__ import annotations

import pandas as pd
import pytest

from tracker import redact
from tracker.dashboard import recipe
from tracker.dashboard.compare import TRAIN_COLUMNS
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.store import adoption, names


def _run(run_id, name, kind="train", params=None, metrics=None, tags=None) -> RunInfo:
    return RunInfo(run_id=run_id, name=name, kind=kind, status="FINISHED", experiment_id="1", start_time=0,
                   end_time=None, artifact_uri="", tags={names.KIND: kind, **(tags or {})}, params=params or {},
                   metrics=metrics or {}, metric_steps={})


def _foreign(run_id, name, tool, params=None, metrics=None) -> RunInfo:
    return _run(run_id, name, params=params, metrics=metrics,
                tags={names.TOOL: tool, names.STEP_UNIT: adoption.TOOLS[tool].steps.unit})


OURS = {"block_size": "16", "target_layer_ids": "[1, 9, 17, 25, 35]", "num_target_layers": "36",
        "mask_token_id": "151669", "lr": "0.0006", "gamma": "7.0", "seed": "0"}


@pytest.fixture
def index() -> RunIndex:
    base = _run("base", "v4", params=OURS)
    tapped = _run("tapped", "v5", params={**OURS, "block_size": "8", "target_layer_ids": "[1, 9, 17, 25, 35]",
                                          "num_target_layers": "36", "seed": "1"})
    legacy = _foreign("legacy", "train_dflash", adoption.SPECFORGE_LEGACY,
                      params={"block_size": "16", "mask_token_id": "151669", "learning_rate": "0.0006",
                              "loss_decay_gamma": "7.0", "hub_token": "hf_SECRET"})
    spec = _foreign("spec", "2026-12-01T10:00", adoption.SPECULATORS,
                    metrics={"dflash/block_size": 16.0, "draft/mask_token_id": 151670.0, "train/loss": 1.0})
    ev = _run("ev", "v5 @ 200", kind="eval", tags={names.TRAIN_RUN_ID: "tapped", names.CHECKPOINT_STEP: "200"})
    return RunIndex([base, tapped, legacy, spec, ev])


def test_a_changed_block_size_is_critical_and_a_tapped_last_layer_is_named_with_its_reason(index):
    view = recipe.config_view(index, ["ev"], "base")  # an eval stands for its training run
    table = view.table.set_index("key")
    assert list(view.table.columns) == ["group", "key", "severity", "reference", "v5", "reason", "logged as"]
    row = table.loc["★ block_size"]
    assert (row["severity"], row["reference"], row["v5"]) == ("🔴 critical", "16", "8")
    assert "acceptance is capped at block_size" in row["reason"]
    assert table.loc["seed", "severity"] == "🔵 info"  # not a DFlash key: listed, not flagged
    assert "★ mask_token_id" not in table.index  # same value: hidden by default
    assert view.counts == {"critical": 1, "warning": 0, "info": 1}
    assert view.summary == "2 keys differ: 1 critical, 1 info"
    assert view.critical_keys == ["block_size"]
    # 35 is layer 36-1, the target's last: flagged on both runs, with why it is a shortcut.
    tapped = view.lints[view.lints["key"] == "target_layer_ids"]
    assert sorted(tapped["run"]) == ["v4", "v5"]
    assert all("tapped layer 35 is the target's last layer" in r and "lm_head" in r for r in tapped["reason"])
    assert view.severities.tolist() == ["critical", "info"]
    assert "★ mask_token_id" in recipe.config_view(index, ["tapped"], "base", diff_only=False).table["key"].tolist()


def test_keys_are_aliased_across_tools_and_secrets_stay_masked(index):
    view = recipe.config_view(index, ["legacy", "spec"], "base", diff_only=False)
    table = view.table.set_index("key")
    # speculators logged its mask token as a metric: read back as the integer it was, and critical.
    mask = table.loc["★ mask_token_id"]
    assert (mask["train_dflash"], mask["2026-12-01T10:00"], mask["severity"]) == ("151669", "151670", "🔴 critical")
    assert mask["logged as"] == "draft/mask_token_id"
    assert table.loc["★ block_size", "logged as"] == "dflash/block_size"
    assert table.loc["★ lr", "train_dflash"] == "0.0006" and table.loc["★ lr", "logged as"] == "learning_rate"
    assert table.loc["★ loss_decay_gamma", "logged as"] == "gamma"  # ours; SpecForge uses the key itself
    assert table.loc["hub_token", "train_dflash"] == redact.MASK
    assert "hf_SECRET" not in view.table.to_csv()
    # speculators' list-valued config never reaches MLflow: the lint says where to read it.
    assert any("aux_hidden_state_layer_ids" in r for r in view.lints["reason"])


def test_the_default_recipe_reference_is_the_training_run_behind_compares_reference(index):
    ref = _run("ref", "z-lab v1", kind="reference", tags={names.TRAIN_RUN_ID: "base"})
    both = RunIndex([*index.runs.values(), ref])
    assert recipe.default_reference(both, ["tapped"], "ref") == "base"
    assert recipe.default_reference(both, ["ev", "legacy"], None) == "tapped"
    assert recipe.default_reference(both, [], None) is None
    assert recipe.reference_choices(both, ["tapped", "legacy"], "ref") == (["base", "tapped", "legacy"], "base")
    assert recipe.reference_choices(both, ["ev", "tapped"], None) == (["tapped"], "tapped")


def test_a_run_named_like_a_column_keeps_its_own_column(index):
    renamed = RunIndex([*index.runs.values(), _run("odd", "reason", params={**OURS, "block_size": "4"})])
    view = recipe.config_view(renamed, ["odd"], "base")
    assert "reason (odd)" in view.table.columns
    assert view.table.set_index("key").loc["★ block_size", "reason (odd)"] == "4"


def _curves(rows) -> pd.DataFrame:
    return pd.DataFrame([{"series": s, "owner": r, "run_id": r, "key": k, "step": st, "value": v, "dashed": False,
                          "reason": ""} for s, r, k, st, v in rows], columns=TRAIN_COLUMNS)


def test_foreign_curves_are_drawn_under_our_names_with_both_names_in_the_series(index):
    curves = _curves([
        ("v4", "base", "acc", 1, 0.1), ("v4", "base", "loss", 1, 3.0),
        ("train_dflash", "legacy", "train/accuracy", 50, 0.2), ("train_dflash", "legacy", "train/loss", 50, 2.0),
        ("2026-12-01T10:00", "spec", "train/loss", 0, 1.5), ("2026-12-01T10:00", "spec", "dflash/block_size", 0, 16),
        ("2026-12-01T10:00", "spec", "train/position_3_acc", 0, 0.4), ("2026-12-01T10:00", "spec", "train/xyz", 0, 1),
    ])
    out = recipe.alias_curves(curves, index)
    got = sorted(zip(out["key"], out["series"]))
    assert got == [("acc", "train_dflash · train/accuracy"), ("acc", "v4"), ("acc_pos3", "2026-12-01T10:00 · "
                                                                                           "train/position_3_acc"),
                   ("loss", "2026-12-01T10:00 · train/loss"), ("loss", "train_dflash · train/loss"), ("loss", "v4"),
                   ("train/xyz", "2026-12-01T10:00")]  # no alias: as logged; config metric: dropped
    assert list(out.columns) == TRAIN_COLUMNS
    ours = curves[curves["run_id"] == "base"]
    assert recipe.alias_curves(ours, index) is ours  # nothing foreign: untouched
    assert recipe.alias_curves(curves.iloc[:0], index).empty


def test_step_units_label_axes_and_runs(index):
    assert recipe.step_axis_title(index, ["base", "tapped", "ev"]) == "training step (optimizer steps)"
    assert recipe.step_axis_title(index, ["legacy"]) == "training step (micro-batches)"
    assert recipe.step_axis_title(index, ["base", "legacy", "spec"]) == (
        "training step (micro-batches: train_dflash; optimizer steps: v4, 2026-12-01T10:00)")
    assert recipe.step_unit_note(index.runs["legacy"]) == " · step = micro-batch"
    assert recipe.step_unit_note(index.runs["base"]) == ""
