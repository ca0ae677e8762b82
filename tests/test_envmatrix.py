"""Re-evaluation plans (tracker.dashboard.envmatrix): which flags reproduce a training run's numerics,
and when a re-evaluation is pointless (same environment) or already done (an identical eval exists)."""

import dataclasses

from test_views import fp, run
from tracker.dashboard.envmatrix import reeval_plan, training_environment
from tracker.dashboard.index import RunIndex


def autocast_fp(**kw) -> dict:
    """A mixed-precision training run's fingerprint: target fp32, drafter under bf16 autocast."""
    out = fp(path="fallback", dtype="fp32", **kw)
    out["numerics"]["drafter_precision"] = "bf16-autocast"
    return out


def settings(tmp_path, **extra) -> dict:
    return {"target": str(tmp_path / "target"), "drafter": str(tmp_path / "ck"), "prompts": str(tmp_path / "p.jsonl"),
            "max_new_tokens": "64", "budgets": "[4, 8]", "device": "cpu", "dtype": "fp32",
            "linear_attn": "fallback", **extra}


def test_training_environment_reads_the_drafter_precision():
    assert training_environment(autocast_fp()) == (
        {"linear_attn": "fallback", "dtype": "fp32", "drafter_precision": "bf16-autocast", "device": "cpu"}, None)
    # Before the field existed a fingerprint had one dtype for target and drafter (both cast).
    assert training_environment(fp(path="fast", dtype="bf16"))[0]["drafter_precision"] == "bf16"
    odd = autocast_fp()
    odd["numerics"]["drafter_precision"] = "fp8"
    assert "drafter precision is fp8" in training_environment(odd)[1]


def test_reeval_of_an_autocast_run_keeps_the_target_fp32_and_autocasts_the_drafter(tmp_path):
    index = RunIndex([run("t", "train", autocast_fp()),
                      run("e", "eval", fp(), train="t", step=200, params=settings(tmp_path))])
    plan = reeval_plan(index, "e")
    assert plan.blocked is None and plan.existing is None
    assert plan.changes == ["drafter-precision fp32 → bf16-autocast"]
    assert plan.params["dtype"] == "fp32" and plan.params["drafter_precision"] == "bf16-autocast"


def test_reeval_is_refused_when_nothing_would_change(tmp_path):
    index = RunIndex([run("t", "train", fp()), run("e", "eval", fp(), train="t", step=200,
                                                   params=settings(tmp_path))])
    plan = reeval_plan(index, "e")
    assert plan.params is None and plan.changes == []
    assert plan.blocked.startswith("this eval already ran in its training run's environment (linear-attn fallback")


def test_a_done_reevaluation_is_linked_instead_of_queued_again(tmp_path):
    matched_fp = autocast_fp()
    done_params = settings(tmp_path, drafter_precision="bf16-autocast")
    original = run("e", "eval", fp(), train="t", step=200, params=settings(tmp_path))
    original.tags["protocol.last_block"] = "cut"
    done = run("e2", "eval", matched_fp, train="t", step=200, params=done_params)
    done.tags["protocol.last_block"] = "cut"
    index = RunIndex([run("t", "train", autocast_fp()), original, done])
    plan = reeval_plan(index, "e")
    assert plan.existing == "e2" and plan.params is None and plan.blocked is None
    assert plan.changes == ["drafter-precision fp32 → bf16-autocast"]

    # Not the same measurement: another protocol, other settings, another step, another environment.
    for change in ({"tags": {"protocol.last_block": "full"}}, {"params": {"max_new_tokens": "32"}},
                   {"step": 100}, {"fingerprint": fp()}):
        # a run as the store would give it (a RunInfo is read once: its protocol tags are kept)
        other = dataclasses.replace(done, tags={**done.tags, **change.get("tags", {})},
                                    params={**done.params, **change.get("params", {})})
        if "step" in change:
            other.tags["draftboard.checkpoint_step"] = str(change["step"])
        if "fingerprint" in change:
            other = run("e2", "eval", change["fingerprint"], train="t", step=200, params=done_params)
            other.tags["protocol.last_block"] = "cut"
        plan = reeval_plan(RunIndex([run("t", "train", autocast_fp()), original, other]), "e")
        assert plan.existing is None and plan.params is not None, change


def test_runs_without_a_fingerprint_are_listed_with_the_command_that_fixes_each():
    from tracker.redact import shown_uri
    from tracker.dashboard.envmatrix import unfingerprinted

    index = RunIndex([run("t", "train", fp(), start=3), run("e", "eval", None, start=2),
                      run("f", "train", None, name="train dflash; rm -rf ~", start=1)])
    table = unfingerprinted(index, "sqlite:////srv/draftboard db/store.db")
    assert list(table["run_id"]) == ["f", "e"]  # training runs first
    # The command is copied into a shell: the store path is quoted, the run id passed as it is.
    assert table["fix"][0] == "draftboard fingerprint --attach f --tracking-uri 'sqlite:////srv/draftboard db/store.db'"
    assert table["run"][0] == "train dflash; rm -rf ~"
    # Credentials in the store URI never reach the page; MLflow reads them from its env vars.
    assert shown_uri("https://alice:s3cret@mlflow.example:8443/x") == "https://mlflow.example:8443/x"
    assert "s3cret" not in unfingerprinted(index, "https://alice:s3cret@mlflow.example/").to_csv()


def test_an_eval_redone_in_its_training_environment_no_longer_counts_as_a_mismatch(tmp_path):
    from tracker.dashboard.envmatrix import pairs_frame
    from tracker.dashboard.lineage import train_eval_pairs

    cast = fp()
    cast["numerics"]["drafter_precision"] = "fp32"  # what every eval records: the drafter cast to fp32
    original = run("e", "eval", cast, train="t", step=200, params=settings(tmp_path))
    redo = run("e2", "eval", autocast_fp(), train="t", step=200, name="t @ step 200 · fp32 · drafter bf16-autocast",
               params=settings(tmp_path, drafter_precision="bf16-autocast"))
    index = RunIndex([run("t", "train", autocast_fp()), original, redo])
    table = pairs_frame(index, train_eval_pairs(index)).set_index("eval_run_id")
    assert table.loc["e", "re-evaluated as"] == "t @ step 200 · fp32 · drafter bf16-autocast"
    assert table.loc["e2", "critical"] == 0 and table.loc["e2", "re-evaluated as"] == ""
    # Issue 39: the answered row reads as answered (green, as on Runs); issue 52: its critical count is of open
    # differences (0), the differences it had still named, as answered.
    assert table.loc["e", "check"] == "🟢" and table.loc["e2", "check"] == "🟢"
    assert table.loc["e", "critical"] == 0 and table.loc["e", "differences"].startswith("answered: drafter precision")
    # Another measurement (fewer tokens) answers nothing: the mismatch stays open.
    other = run("e2", "eval", autocast_fp(), train="t", step=200,
                params=settings(tmp_path, drafter_precision="bf16-autocast", max_new_tokens="32"))
    index = RunIndex([run("t", "train", autocast_fp()), original, other])
    assert pairs_frame(index, train_eval_pairs(index)).set_index("eval_run_id").loc["e", "re-evaluated as"] == ""
    assert pairs_frame(index, train_eval_pairs(index)).set_index("eval_run_id").loc["e", "check"] == "🔴"  # still open


def test_a_resolved_mismatch_reads_as_resolved_everywhere_it_is_counted(tmp_path):
    """lineage.resolved_by is the one rule: Runs' counts and env cells, Run detail's banners (mismatches /
    resolutions) and Compare's series (current_evals) all read the answered eval as answered."""
    from tracker.dashboard import compare, lineage, tables

    cast = fp()
    cast["numerics"]["drafter_precision"] = "fp32"
    original = run("e", "eval", cast, train="t", step=200, params=settings(tmp_path))
    other_step = run("e100", "eval", cast, train="t", step=100, params=settings(tmp_path))
    redo = run("e2", "eval", autocast_fp(), train="t", step=200, name="t @ step 200 · redo",
               params=settings(tmp_path, drafter_precision="bf16-autocast"))
    train = run("t", "train", autocast_fp())
    index = RunIndex([train, original, other_step, redo])
    assert lineage.resolved_by(index, original) is redo and lineage.resolved_by(index, other_step) is None
    assert lineage.mismatches(index, original) == []
    assert [p.eval.run_id for p in lineage.mismatches(index, train)] == ["e100"]  # step 100 is still open
    assert [(p.eval.run_id, by.run_id) for p, by in lineage.resolutions(index, train)] == [("e", "e2")]
    table = tables.runs_table(index, list(index.runs.values())).set_index("run_id")
    assert table.loc["e", "critical"] == 0 and table.loc["e", "env check"] == "🟢 re-evaluated as t @ step 200 · redo"
    assert table.loc["e100", "critical"] == 1 and table.loc["t", "critical"] == 1
    assert "@ 100" in table.loc["t", "env check"] and "@ 200" not in table.loc["t", "env check"]
    # Compare: step 200 is one point, the re-evaluation's.
    assert [ev.run_id for ev in compare.current_evals(index, train)] == ["e100", "e2"]
    # Run detail's Checkpoints tab: step 200 reads answered, step 100 still open.
    checkpoints = tables.checkpoints_frame(index, train, []).set_index("step")
    assert checkpoints.loc[200, "critical"] == 0 and "🟢" in checkpoints.loc[200, "env check"]
    assert checkpoints.loc[100, "critical"] == 1 and checkpoints.loc[100, "env check"].startswith("🔴")


def test_a_reevaluation_that_differs_from_the_reference_says_so_and_names_the_one_that_matches(tmp_path):
    from tracker.dashboard.compare import resolution_notes

    cast = fp()
    cast["numerics"]["drafter_precision"] = "fp32"
    train = run("t", "train", autocast_fp(), name="v3")
    original = run("e", "eval", cast, train="t", step=200, params=settings(tmp_path))
    redo = run("e2", "eval", autocast_fp(), train="t", step=200, params=settings(tmp_path, drafter_precision="bf16-autocast"))
    fp32_ref = run("r32", "reference", cast, ref_name="fp32")
    autocast_ref = run("rac", "reference", autocast_fp(), ref_name="autocast")
    index = RunIndex([train, original, redo, fp32_ref, autocast_ref])
    (note,) = resolution_notes(index, [train], fp32_ref)
    assert note == ("v3 @ step 200 is the drafter as trained, but differs from the reference (drafter precision): "
                    "autocast · fallback/cpu/fp32 · Qwen3.5-4B matches it: choose it as the reference.")
    assert resolution_notes(index, [train], autocast_ref) == []  # it matches this one: nothing to say
    (alone,) = resolution_notes(RunIndex([train, original, redo, fp32_ref]), [train], fp32_ref)
    assert alone.endswith("no reference in the store matches it: evaluate one in this environment.")


def test_an_eval_made_after_the_matching_one_is_an_exploration_not_a_resolved_mismatch(tmp_path):
    from tracker.dashboard import lineage

    cast = fp()
    cast["numerics"]["drafter_precision"] = "fp32"
    matching = run("m", "eval", autocast_fp(), train="t", step=200, start=1,
                   params=settings(tmp_path, drafter_precision="bf16-autocast"))
    later = run("x", "eval", cast, train="t", step=200, start=2, params=settings(tmp_path))
    index = RunIndex([run("t", "train", autocast_fp()), matching, later])
    assert lineage.resolved_by(index, later) is None  # tried in fp32 after the matching eval: still shown
    assert [p.eval.run_id for p in lineage.mismatches(index, index.runs["t"])] == ["x"]


def _imported_fallback() -> dict:
    """A training run imported from its console, which stated transformers 5's fallback for every piece."""
    from tracker.environment import fingerprint
    from tracker.environment.evidence import console, decide

    lines = ["[transformers] `causal_conv1d_fn` is falling back to its reference PyTorch implementation because "
             "`causal_conv1d` is not installed.",
             "[transformers] `chunk_gated_delta_rule` is falling back to its reference PyTorch implementation because "
             "`flash-linear-attention` is not installed.",
             "[pip3] causal-conv1d==1.5.0"]
    facts = console.read([(i, line, False) for i, line in enumerate(lines, 1)], "train.log")
    return fingerprint.imported("train.log", "kv", evidence=decide.decide(facts))


def test_an_imported_run_is_reevaluated_on_what_its_files_state_and_nothing_else(tmp_path):
    imported = _imported_fallback()
    assert training_environment(imported) == ({"linear_attn": "fallback"}, None)  # dtype, device: unknown, not forced
    index = RunIndex([run("t", "train", imported),
                      run("e", "eval", fp(path="fast", dtype="bf16", device="cuda", gpu="H100"), train="t", step=200,
                          params=settings(tmp_path, dtype="bf16", device="cuda", linear_attn="fast"))])
    plan = reeval_plan(index, "e")
    assert plan.blocked is None and plan.changes == ["linear-attn fast → fallback"]
    assert plan.params["linear_attn"] == "fallback" and plan.params["dtype"] == "bf16" and plan.params["device"] == "cuda"
    unknown = fingerprint_imported_without_path()
    assert "unknown (an imported run whose files do not say" in training_environment(unknown)[1]


def fingerprint_imported_without_path() -> dict:
    from tracker.environment import fingerprint

    return fingerprint.imported("train.log", "kv")


def test_environments_cites_where_an_imported_value_comes_from():
    from tracker.dashboard.envmatrix import EVIDENCE_COLUMNS, evidence_frame

    frame, conflicts = evidence_frame({"trainer": _imported_fallback(), "eval": fp()})
    assert list(frame.columns) == EVIDENCE_COLUMNS and set(frame["run"]) == {"trainer"}
    row = frame[frame["field"] == "numerics.linear_attention.functions.causal_conv1d_fn"].iloc[0]
    assert row["value"] == "torch" and row["source"] == "train.log:1" and row["quoted"].startswith("[transformers]")
    path = frame[frame["field"] == "numerics.linear_attention.linear_attention_path"]
    assert set(path["value"]) == {"fallback"}
    ((label, text),) = conflicts
    assert label == "trainer" and "causal-conv1d 1.5.0 is installed (train.log:3)" in text
