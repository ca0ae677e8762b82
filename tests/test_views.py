"""The dashboard's data layer: SQL histories, run index, lineage, tables, reference choice, env matrix,
metric docs, escaping, launch checks."""

import os
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from tracker import config
from tracker.dashboard import lineage, metric_docs
from tracker.dashboard.charts import REFERENCE_COLOR, ddtree_vs_budget, run_colors
from tracker.dashboard.compare import (
    checkpoint_steps,
    best_evals,
    closest_reference,
    common_budgets,
    compare_data,
    ema,
    outside_budgets,
    reference_label,
)
from tracker.dashboard.envmatrix import fingerprint_matrix, pairs_frame, reeval_plan, training_environment
from tracker.errors import DraftboardError
from tracker.jobs.queue import QUEUED, RUNNING, Job
from tracker.dashboard.launch_form import (
    LaunchForm,
    check_path,
    describe_job,
    eval_params,
    parse_budgets,
)
from tracker.store.history import (
    history_signature,
    is_database_uri,
    load_histories,
)
from tracker.store import names
from tracker.dashboard.index import RunIndex, RunInfo, load_run_index, local_artifact_dir, same_target
from tracker.dashboard.lineage import mismatches, summarize_rows, train_eval_pairs
from tracker.dashboard.tables import (checkpoints_frame, default_selection, filter_runs, mlflow_ui_url, runs_display,
                                      runs_table, tau_of)

# --------------------------------------------------------------------------- hand-made fingerprints and runs


def fp(path="fallback", dtype="fp32", device="cpu", gpu=None, torch="2.6.0", cpu="Xeon", source=None):
    out = {
        "software": {"python": "3.11.9", "torch": torch, "transformers": "5.2.0", "flash-linear-attention": None},
        "hardware": {"device": device, "gpu_name": gpu, "gpu_count": 0 if gpu is None else 1, "cpu": cpu},
        "numerics": {"dtype": dtype, "linear_attention_path": path, "attn_implementation": "sdpa",
                     "tf32_matmul": False},
        "code": {"git_commit": "abc", "dirty": False},
    }
    if source:
        out["source"] = source
    return out


def run(run_id, kind, fingerprint=None, *, target="/models/Qwen3.5-4B", train=None, step=None, metrics=None,
        name=None, start=0, params=None, metric_steps=None, ref_name=None):
    tags = {"draftboard.kind": kind}
    if target:
        tags["draftboard.target"] = target
    if train:
        tags["draftboard.train_run_id"] = train
    if step is not None:
        tags["draftboard.checkpoint_step"] = str(step)
    if ref_name:
        tags["draftboard.reference_name"] = ref_name
    if fingerprint is not None:
        n = fingerprint["numerics"]
        tags.update({"env.linear_attn": str(n["linear_attention_path"]), "env.dtype": str(n["dtype"]),
                     "env.device": str(fingerprint["hardware"]["device"])})
    return RunInfo(run_id=run_id, name=name or run_id, kind=kind, status="FINISHED", experiment_id="1",
                   start_time=start, end_time=None, artifact_uri="", tags=tags, params=params or {},
                   metrics=metrics or {}, metric_steps=metric_steps or {}, fingerprint_file=fingerprint)


# --------------------------------------------------------------------------- SQL histories


@pytest.fixture(scope="module")
def history_runs(tracker):
    """Two runs with NaN, inf, a repeated step, irregular steps, and an eval run with one point."""
    with tracker.training_run("hist-a", {}, "/m/T", fingerprint=fp()) as a:
        for step in range(50):
            a.log_step(step * 10 + 5, loss=1.0 / (step + 1), acc=step / 50)
        a.log_step(100, loss=float("nan"))
        a.log_step(110, loss=float("inf"), acc=-float("inf"))
        a.log_step(55, loss=0.123)  # the same step again, later
    with tracker.training_run("hist-b", {}, "/m/T", fingerprint=fp()) as b:
        for step in (0, 1, 2, 7, 30, 31, 1000):
            b.log_step(step, loss=step * 0.5, grad_norm=2.0)
    with tracker.eval_run("hist-eval", target="/m/T", fingerprint=fp()) as e:
        e.log_metrics({"tau": 3.5, "accept_rate_pos1": 0.8}, step=400)
    return [a.run_id, b.run_id, e.run_id]


def _history_frame(client, run_ids):
    rows = []
    for run_id in run_ids:
        for key in client.get_run(run_id).data.metrics:
            rows.extend((run_id, key, m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))
    frame = pd.DataFrame(rows, columns=["run_id", "key", "step", "value", "timestamp"])
    return frame.sort_values(["run_id", "key", "step", "timestamp", "value"], ignore_index=True)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a = a.sort_values(["run_id", "key", "step", "timestamp", "value"], ignore_index=True)
    b = b.sort_values(["run_id", "key", "step", "timestamp", "value"], ignore_index=True)
    assert list(a["run_id"]) == list(b["run_id"]) and list(a["key"]) == list(b["key"])
    assert list(a["step"]) == list(b["step"]) and list(a["timestamp"]) == list(b["timestamp"])
    np.testing.assert_array_equal(a["value"].to_numpy(float), b["value"].to_numpy(float))  # NaN == NaN here


def test_sql_histories_equal_get_metric_history(store_uri, history_runs):
    client = MlflowClient(store_uri)
    expected = _history_frame(client, history_runs)
    got = load_histories(store_uri, history_runs)
    assert list(got.columns) == ["run_id", "key", "step", "value", "timestamp"]
    _same(got, expected)
    assert got["value"].isna().sum() == 1 and (got["step"] == 55).sum() == 3  # NaN kept, duplicate step kept
    only_loss = load_histories(store_uri, history_runs, keys=["loss"])
    _same(only_loss, expected[expected["key"] == "loss"])
    # The http fallback (client calls from a thread pool) gives the same rows.
    _same(load_histories("http://unused.invalid", history_runs, client=client), expected)


def test_signature_changes_with_new_steps_and_empty_inputs(tracker, store_uri, tmp_path):
    with tracker.training_run("sig", {}, "/m/T", fingerprint=fp()) as r:
        r.log_step(1, loss=1.0)
    before = history_signature(store_uri, [r.run_id])
    with tracker.training_run("sig2", {}, "/m/T", fingerprint=fp()) as r2:
        r2.log_step(1, loss=1.0)
    assert history_signature(store_uri, [r.run_id]) == before
    MlflowClient(store_uri).log_metric(r.run_id, "loss", 0.5, step=2)
    assert history_signature(store_uri, [r.run_id]) != before
    assert load_histories(store_uri, []).empty
    missing = f"sqlite:///{tmp_path / 'nothing.db'}"
    assert load_histories(missing, ["x"]).empty and not (tmp_path / "nothing.db").exists()
    assert is_database_uri("postgresql+psycopg2://u@h/db") and not is_database_uri("http://h:5000")


# --------------------------------------------------------------------------- run index from a real store


def test_load_run_index_reads_lineage_fingerprints_and_checkpoints(dashboard_store):
    from tracker import Tracker

    tracker = Tracker(dashboard_store.uri)
    index = load_run_index(tracker)
    ids = dashboard_store.ids
    assert set(ids.values()) <= set(index.runs)
    v4 = index.runs[ids["v4"]]
    assert v4.fingerprint["numerics"]["linear_attention_path"] == "fast" and v4.steps == 300
    assert [e.run_id for e in index.evals_of(ids["v5"])] == [ids["v5@100"], ids["v5@200"]]
    assert index.runs[ids["published"]].published and not index.runs[ids["ref"]].published
    found = mismatches(index, v4)
    assert [m.eval.run_id for m in found] == [ids["v4@200"]] and found[0].train is v4
    assert {r.field for r in found[0].critical} >= {"numerics.linear_attention_path", "numerics.dtype"}
    assert mismatches(index, index.runs[ids["v4@200"]]) == found  # the same pair, seen from the eval
    assert mismatches(index, index.runs[ids["v5"]]) == []
    # The metric steps come from the store (the latest step of each metric).
    assert v4.metric_steps["loss"] == 300 and index.runs[ids["v5@100"]].checkpoint_step == 100
    table = checkpoints_frame(index, v4, tracker.checkpoints(ids["v4"]))
    assert list(table["step"]) == [100, 200] and table["sha256"].str.len().eq(16).all()
    assert table.set_index("step").loc[100, "evals"] == "not evaluated"
    assert table.set_index("step")["critical"].to_dict() == {100: 0, 200: 1}
    assert local_artifact_dir(v4.artifact_uri).is_dir()


def test_mlflow_ui_url_format():
    r = run("abc123", "train", fp())
    assert mlflow_ui_url(r, "http://h:5000/") == "http://h:5000/#/experiments/1/runs/abc123"
    assert mlflow_ui_url(r, config.mlflow_ui_url({config.MLFLOW_UI_VAR: "https://m.example/ui/"})) == (
        "https://m.example/ui/#/experiments/1/runs/abc123")


# --------------------------------------------------------------------------- runs table


def _lineage_index():
    train_fast = run("t4", "train", fp(path="fast", dtype="bf16"), name="v4", metric_steps={"loss": 900})
    train_same = run("t5", "train", fp(), name="v5", metric_steps={"loss": 500, "acc": 499})
    return RunIndex([
        train_fast, train_same,
        run("e4", "eval", fp(), train="t4", step=200, metrics={"tau": 2.0}),
        run("e5a", "eval", fp(), train="t5", step=100, metrics={"tau": 2.5}, start=1),
        run("e5b", "eval", fp(), train="t5", step=200, metrics={"tau": 2.2}, start=2),
        run("ref", "reference", fp(), metrics={"tau": 3.0}, ref_name="z-lab"),
    ])


def test_runs_table_marks_critical_lineage_mismatches_and_taus():
    index = _lineage_index()
    table = runs_table(index, list(index.runs.values())).set_index("run_id")
    # A short reason, without the row's own name: a training run's row says at which step.
    assert table.loc["t4", "env check"] == "🔴 @ 200: linear-attn fallback vs training: fast; dtype fp32 vs training: bf16"
    assert table.loc["e4", "env check"] == "🔴 linear-attn fallback vs training: fast; dtype fp32 vs training: bf16"
    assert table.loc["e4", "env check"].startswith("🔴") and table.loc["t5", "env check"] == "✓ evals as trained"
    # what matches says so (an empty cell read as "not checked"); a run with nothing to compare with stays empty
    assert table.loc["e5a", "env check"] == "✓ as trained" and table.loc["ref", "env check"] == ""
    # Mismatches are counted from the diff's severities, not from how the cell is drawn.
    assert table["critical"].to_dict() == {"t4": 1, "t5": 0, "e4": 1, "e5a": 0, "e5b": 0, "ref": 0}
    assert tau_of(index, index.runs["t5"]) == (2.2, 2.5)  # latest checkpoint, best
    assert table.loc["t5", "steps"] == 500 and table.loc["e5a", "steps"] == 100
    assert [r.run_id for r in filter_runs(index, kinds=["eval"], search="e5")] == ["e5a", "e5b"]
    # Missing numbers read "—", never None / nan; the table itself keeps numbers (CSV, sorting).
    shown = runs_display(table.reset_index()).set_index("run_id")
    assert "None" not in shown.to_string() and "nan" not in shown.to_string() and table.loc["ref", "steps"] is pd.NA
    assert (shown.loc["ref", "steps"], shown.loc["ref", "tau latest"]) == ("—", "3.000")
    assert all(isinstance(v, str) for v in shown["tau best"])  # as text: number columns print None


def test_runs_table_puts_the_teams_runs_first_and_published_references_last():
    published = run("pub", "reference", fp(source={"kind": "published"}), target="Qwen/Qwen3-8B", start=9)
    index = RunIndex([published, *_lineage_index().runs.values()])  # the newest run is the published one
    table = runs_table(index, list(index.runs.values()))
    assert list(table["run_id"]) == ["t4", "t5", "e4", "e5a", "e5b", "ref", "pub"]
    assert [r.run_id for r in filter_runs(index, tags=["env.linear_attn=fast"])] == ["t4"]


def test_summaries_name_the_headline_field_first():
    from tracker.environment import fingerprint as fpm

    rows = fpm.diff(fp(path="fallback", dtype="fp32"), fp(path="fast", dtype="bf16"))
    assert summarize_rows(rows, "e", "ref") == "e: linear-attn fallback vs ref: fast; dtype fp32 vs ref: bf16"


# --------------------------------------------------------------------------- references


def test_closest_reference_prefers_same_target_then_fewest_critical_then_warnings():
    train = run("t", "train", fp(), name="v5")
    ev = run("e", "eval", fp(), train="t", step=100, metrics={"tau": 2.0})
    fast = run("r-fast", "reference", fp(path="fast"), start=5)
    gpu = run("r-cpu2", "reference", fp(torch="2.6.1"), start=1)  # patch version: a warning
    other = run("r-other", "reference", fp(), target="/models/Llama-3-8B", start=9)
    published = run("r-pub", "reference", fp(path=None, dtype=None, device=None, torch=None,
                                             source={"kind": "published"}), target="Qwen/Qwen3.5-4B", start=3)

    choice = closest_reference(RunIndex([train, ev, fast, gpu, other, published]), ["t"])
    assert choice.run_id == "r-cpu2" and choice.critical == 0 and choice.warning == 1 and choice.matches
    assert choice.candidates[-1] == "r-fast" and "r-other" not in choice.candidates

    choice = closest_reference(RunIndex([train, ev, fast, other, published]), ["t"])
    assert choice.run_id == "r-pub" and "published" in choice.message  # unknown fields are warnings

    choice = closest_reference(RunIndex([train, ev, fast, other]), ["t"])
    assert choice.run_id == "r-fast" and not choice.matches and "no reference matches" in choice.message

    choice = closest_reference(RunIndex([train, ev, other]), ["t"])
    assert choice.run_id is None and "no reference was evaluated for Qwen3.5-4B" in choice.message
    choice = closest_reference(RunIndex([train, ev]), ["t"])  # shown escaped: plain words, no code span
    assert choice.run_id is None and "`" not in choice.message and "--reference NAME" in choice.message
    assert same_target("/a/Qwen3.5-4B", "Qwen/qwen3.5-4b") and not same_target("/a/X", None)
    index = RunIndex([published])
    assert reference_label(index, published) == "r-pub · published · Qwen3.5-4B"
    tagged = run("r-tag", "reference", fp())
    tagged = RunInfo(**{**tagged.__dict__, "tags": {**tagged.tags, "draftboard.published": "1"}})
    assert tagged.published and tagged.kind_label == "reference · published"


def test_compare_data_dashes_and_names_mismatches_against_the_reference():
    index = RunIndex([
        run("t4", "train", fp(path="fast"), name="v4"),
        run("e4a", "eval", fp(), train="t4", step=100, metrics={"tau": 2.0, "accept_rate_pos1": 0.5,
                                                                  "ddtree_tau_b8": 2.5}),
        run("e4b", "eval", fp(), train="t4", step=200, metrics={"tau": 2.4, "accept_rate_pos1": 0.6,
                                                                  "ddtree_tau_b8": 2.9}),
        run("e4c", "eval", fp(path="fast"), train="t4", step=200, metrics={"tau": 2.9}, name="reeval"),
        run("ref", "reference", fp(path="fast"), metrics={"tau": 3.0, "accept_rate_pos1": 0.7}, ref_name="z"),
    ])
    hist = pd.DataFrame({"run_id": ["t4"] * 3, "key": ["loss"] * 3, "step": [0, 1, 2], "value": [3.0, 2.0, 1.0],
                         "timestamp": [0, 0, 0]})
    data = compare_data(index, ["t4"], "ref", hist)
    assert set(data.eval_points["series"]) == {"v4 [fallback/cpu/fp32]", "v4 [fast/cpu/fp32]"}
    dashed = data.eval_points.groupby("series")["dashed"].first()
    assert dashed["v4 [fallback/cpu/fp32]"] and not dashed["v4 [fast/cpu/fp32]"]
    # Step 200's fallback eval was answered by its fast re-evaluation (lineage.resolved_by): one point
    # at step 200, the re-evaluation's; only step 100's mismatch is left to say.
    assert data.eval_points.query("key == 'tau'")[["series", "step"]].values.tolist() == [
        ["v4 [fallback/cpu/fp32]", 100], ["v4 [fast/cpu/fp32]", 200]]
    assert data.banner == ["v4 [fallback/cpu/fp32] @ step 100 (eval): linear-attn fallback vs reference: fast"]
    assert data.lineage_banner == ["v4 [fallback/cpu/fp32] @ step 100 (eval): linear-attn fallback vs its "
                                   "training run: fast"]
    assert not data.train_curves["dashed"].any() and data.reference_values["tau"] == 3.0
    # One dashing rule, its reason on every series: the fallback evals differ from their training run.
    reasons = data.eval_points.groupby("series")["reason"].first()
    assert reasons["v4 [fallback/cpu/fp32]"] == "≠ training: linear-attn" and reasons["v4 [fast/cpu/fp32]"] == ""
    # By position / DDTree: the eval closest to the reference by default (the fast re-eval, which has no
    # per-position data), else the checkpoint chosen for every run.
    assert data.picked == {"t4": "e4c"} and list(data.accept_by_position["series"]) == [
        "reference: z · fast/cpu/fp32 · Qwen3.5-4B"]
    data = compare_data(index, ["t4"], "ref", hist, step=100)
    assert list(data.accept_by_position["series"]) == ["v4 @ step 100 [fallback/cpu/fp32]",
                                                       "reference: z · fast/cpu/fp32 · Qwen3.5-4B"]
    assert data.accept_by_position["reason"].tolist() == ["≠ training: linear-attn", ""]
    assert set(data.accept_by_position["owner"]) == {"t4", "ref"}
    assert data.ddtree["budget"].tolist() == [8] and "tau" in data.eval_metrics and data.train_metrics == ["loss"]
    export = data.export_frame()
    assert {"training curve", "eval over checkpoints", "reference", "acceptance by position",
            "ddtree vs budget"} == set(export["chart"])


def test_one_checkpoint_drawn_for_every_run_and_a_run_without_it_said():
    """Compare's one "Checkpoint drawn" control: its choices are the steps any chosen run evaluated, with how
    many did; a step draws each run's eval there, and a run with none is left out of the per-checkpoint views
    with its reason, never drawn at another step beside the others."""
    index = RunIndex([
        run("ta", "train", fp(), name="a"), run("tb", "train", fp(), name="b"),
        run("a1", "eval", fp(), train="ta", step=100, metrics={"tau": 2.0, "accept_rate_pos1": 0.5}),
        run("a2", "eval", fp(), train="ta", step=200, metrics={"tau": 2.5, "accept_rate_pos1": 0.6}),
        run("b1", "eval", fp(), train="tb", step=100, metrics={"tau": 2.2, "accept_rate_pos1": 0.55}),
    ])
    assert checkpoint_steps(index, ["ta", "tb", "a1"]) == {200: 1, 100: 2}
    hist = pd.DataFrame(columns=["run_id", "key", "step", "value"])
    assert compare_data(index, ["ta", "tb"], None, hist).picked == {"ta": "a2", "tb": "b1"}  # each its latest
    assert compare_data(index, ["ta", "tb"], None, hist, step=100).picked == {"ta": "a1", "tb": "b1"}
    data = compare_data(index, ["ta", "tb"], None, hist, step=200)
    assert data.picked == {"ta": "a2"} and set(data.accept_by_position["owner"]) == {"ta"}
    assert data.not_picked == ["b: no eval at step 200"] and not data.not_drawn


def test_an_eval_matching_its_training_run_is_solid_where_the_training_run_differs_from_the_reference():
    """The headline flow's end: a run trained on the fallback, re-evaluated on the fallback, is the
    drafter as trained (solid); the run's difference from a fast-kernel reference is said once, on
    its training curve (dashed) and in the banner. Its fast-kernel eval of the same step is answered
    by the matching one (one point per step); at another step it stays, dashed against training."""
    index = RunIndex([
        run("t3", "train", fp(), name="v3"),
        run("e3", "eval", fp(), train="t3", step=100, metrics={"tau": 2.0}),
        run("e3f", "eval", fp(path="fast"), train="t3", step=100, metrics={"tau": 2.2}),
        run("e3g", "eval", fp(path="fast"), train="t3", step=200, metrics={"tau": 2.4}),
        run("ref", "reference", fp(path="fast"), metrics={"tau": 3.0}, ref_name="z"),
    ])
    hist = pd.DataFrame({"run_id": ["t3"] * 2, "key": ["loss"] * 2, "step": [0, 1], "value": [3.0, 2.0],
                         "timestamp": [0, 0]})
    data = compare_data(index, ["t3"], "ref", hist)
    reasons = data.eval_points.groupby("series")["reason"].first()
    assert reasons.to_dict() == {"v3 [fallback/cpu/fp32]": "", "v3 [fast/cpu/fp32]": "≠ training: linear-attn"}
    assert data.eval_points.query("key == 'tau'")[["series", "step"]].values.tolist() == [
        ["v3 [fallback/cpu/fp32]", 100], ["v3 [fast/cpu/fp32]", 200]]
    assert set(data.train_curves["reason"]) == {"≠ reference: linear-attn"} and data.train_curves["dashed"].all()
    assert "v3 (training): linear-attn fallback vs reference: fast" in data.banner
    # The latest evaluated step is drawn by default (issue 39: a re-evaluation of an earlier step once moved
    # the default there without a word); the step-100 drafter as trained stays one pick away.
    assert data.picked == {"t3": "e3g"}
    assert [e.run_id for e in best_evals(index, index.runs["t3"], index.runs["ref"])] == ["e3g", "e3"]


def test_a_small_sampled_check_never_replaces_the_full_greedy_eval_of_a_checkpoint():
    """Issue 52: a 4-prompt sampled test at step 200, newer than the 16-prompt greedy eval, was drawn as the
    checkpoint (tau 1.755 for 4.200). At one step the run's own protocol comes first; the side test stays a pick
    away and its own series."""
    def tagged(info, **proto):
        info.tags.update({names.protocol_tag(k): v for k, v in proto.items()})
        return info

    index = RunIndex([
        run("t", "train", fp(), name="v5"),
        tagged(run("full", "eval", fp(), train="t", step=200, metrics={"tau": 4.2}, start=1),
               datasets='{"gsm8k": 16}', temperature="0.0"),
        tagged(run("side", "eval", fp(), train="t", step=200, metrics={"tau": 1.755}, start=2),
               datasets='{"gsm8k": 4}', temperature="1.0", top_p="1.0", top_k="0", samples="16"),
    ])
    assert [e.run_id for e in best_evals(index, index.runs["t"], None)] == ["full", "side"]
    data = compare_data(index, ["t"], None, pd.DataFrame(columns=["run_id", "key", "step", "value", "timestamp"]))
    assert data.picked == {"t": "full"}
    assert data.eval_points.query("key == 'tau'")["series"].nunique() == 2  # two protocols, two lines
    # An engine's eval of the same checkpoint (the demo's served pair) is its own line, and the offline walk the
    # checkpoint drawn, however new the served one.
    served = tagged(run("served", "eval", fp(), train="t", step=200, metrics={"tau": 4.3}, start=3),
                    datasets='{"gsm8k": 16}', temperature="0.0", scoring="engine")
    index = RunIndex([*index.runs.values(), served])
    assert [e.run_id for e in best_evals(index, index.runs["t"], None)] == ["full", "served", "side"]


def test_an_eval_without_a_step_is_off_the_step_axis_and_a_run_with_nothing_to_draw_says_so():
    """Issue 52: an eval run as the README shows (no training run, no step) was drawn at checkpoint step 0 beside
    the training curves, and a chosen training run with no eval vanished from the charts without a word."""
    index = RunIndex([run("t", "train", fp(), name="v6"), run("cli", "eval", fp(), metrics={"tau": 3.1}, name="cli"),
                      run("t2", "train", fp(), name="v7"),
                      run("e", "eval", fp(), train="t2", step=40, metrics={"tau": 2.0})])
    empty = pd.DataFrame(columns=["run_id", "key", "step", "value", "timestamp"])
    data = compare_data(index, ["t", "cli", "t2"], None, empty)
    assert data.eval_points["run_id"].tolist() == ["e"] and data.eval_points["step"].tolist() == [40]
    assert data.not_drawn == [
        "cli: no checkpoint step (it names no training run and step), so it is off the step axis; its numbers are "
        "in the tables below", "v6: nothing to draw, no eval of its checkpoints yet"]
    assert compare_data(index, ["t2"], None, empty).not_drawn == []


def test_a_re_evaluation_answering_a_mismatch_is_said_once_and_keeps_the_default_checkpoint():
    """Issue 39: after the demo's re-evaluation (step 40, in the training environment), Compare drew step 40
    instead of 200 and added a red banner line for the re-eval beside its resolution note."""
    trained = fp(path="fast", dtype="bf16")
    index = RunIndex([
        run("t", "train", trained, name="v3"),
        *(run(f"e{s}", "eval", fp(), train="t", step=s, metrics={"tau": 2.0}) for s in (40, 200)),
        run("re40", "eval", trained, train="t", step=40, metrics={"tau": 2.1}, start=9),  # the re-evaluation
        run("ref", "reference", fp(), metrics={"tau": 3.0}, ref_name="z"),
    ])
    data = compare_data(index, ["t"], "ref", pd.DataFrame(columns=["run_id", "key", "step", "value"]))
    assert data.picked == {"t": "e200"}
    assert len(data.resolution_notes) == 1 and data.resolution_notes[0].startswith("v3 @ step 40")
    assert not [line for line in data.banner if "step 40" in line], data.banner


def test_default_selection_is_the_teams_training_runs_not_the_references_own():
    index = RunIndex([  # newest first, as the store lists them
        run("e1", "eval", fp(), train="t1", step=100, start=6),
        run("r", "reference", fp(), train="tr", step=600, ref_name="ref", start=5),
        run("tr", "train", fp(), name="reference drafter", start=4),  # trained to be the reference
        run("t3", "train", fp(), name="v3", start=3), run("t2", "train", fp(), name="v2", start=2),
        run("t1", "train", fp(), name="v1", start=1),
    ])
    assert default_selection(index) == ["t3", "t2", "t1"]
    # Runs of two targets are never comparable: the page starts on the newest run's target.
    older = RunIndex([*index.runs.values(), run("q", "train", fp(), target="/m/qwen3-tiny-served", name="q", start=0)])
    assert default_selection(older) == ["t3", "t2", "t1"]
    newer = RunIndex([run("q", "train", fp(), target="/m/qwen3-tiny-served", name="q", start=7), *index.runs.values()])
    assert default_selection(newer) == ["q"]


def test_a_reference_for_another_target_is_said_first_and_warnings_are_named():
    train = run("t", "train", fp(), name="v5")
    ev = run("e", "eval", fp(), train="t", step=100, metrics={"tau": 2.0})
    other = run("r8", "reference", fp(), target="Qwen/Qwen3-8B", name="z-lab 8B")
    data = compare_data(RunIndex([train, ev, other]), ["t"], "r8", pd.DataFrame(columns=["run_id", "key", "step",
                                                                                          "value", "timestamp"]))
    assert data.target_note.startswith("Different target: the reference z-lab 8B was evaluated for Qwen3-8B, "
                                       "the chosen runs for Qwen3.5-4B.")
    assert compare_data(RunIndex([train, ev]), ["t"], None, pd.DataFrame()).target_note is None
    minor = run("r-cpu2", "reference", fp(torch="2.6.1"))  # a patch version apart: one warning
    choice = closest_reference(RunIndex([train, ev, minor]), ["t"])
    assert choice.message == "r-cpu2: same target, closest environment (1 warning difference(s), none critical: torch)"


def test_every_run_keeps_one_colour_and_evals_take_their_training_runs():
    index = _lineage_index()
    colors = run_colors(index)
    assert colors["e4"] == colors["t4"] and colors["e5a"] == colors["e5b"] == colors["t5"] != colors["t4"]
    assert colors["ref"] == REFERENCE_COLOR  # a reference with no training run
    later = RunIndex([*index.runs.values(), run("t6", "train", fp(), name="v6", start=99)])
    assert {k: v for k, v in run_colors(later).items() if k != "t6"} == colors  # a new run recolours nothing


def test_probe_differences_read_in_plain_words():
    from tracker.environment import fingerprint as fpm

    def probed(absmax2):
        out = fp()
        out["probe"] = {"digest": f"d{absmax2}", "seed": 0, "length": 16, "layers": {
            "1": {"mean": 0.5, "std": 1.0, "absmax": 4.0}, "2": {"mean": 0.1, "std": 2.0, "absmax": absmax2}}}
        return out

    train, ev = probed(10.0), probed(10.057)  # |10.057 - 10| / 10.057 = 5.67e-3, at layer 2
    assert lineage.probe_words(ev, train) == "hidden states differ by up to 5.7e-3 (relative) at layer 2"
    rows = [r for r in fpm.diff(ev, train) if r.severity == "critical"]
    text = summarize_rows(rows, "", "training", probe=lineage.probe_words(ev, train))
    assert text == "hidden states differ by up to 5.7e-3 (relative) at layer 2" and "d10" not in text
    assert lineage.probe_words(fp(), train) is None


def test_ema_by_hand():
    assert ema([1.0, 3.0, 5.0], 0.5) == [1.0, 2.0, 3.5]
    assert ema([1.0, float("nan"), 5.0], 0.5) == [1.0, 1.0, 3.0]  # a NaN step is carried past
    assert ema([2.0, 4.0], 0.0) == [2.0, 4.0]


def test_ddtree_axis_spans_the_common_budgets():
    trees = pd.DataFrame({"series": ["a"] * 3 + ["b"] * 4, "budget": [2, 4, 8, 2, 4, 8, 100000],
                          "tau": [1.0] * 7})
    assert common_budgets(trees) == (2, 8)
    assert outside_budgets(trees, (2, 8)) == ["b: 100000"]
    assert common_budgets(trees[trees["series"] == "b"]) is None  # one series: its own range
    figure = ddtree_vs_budget(trees.assign(owner=trees["series"], reason=""), span=(2, 8))
    low, high = figure.layout.xaxis.range
    assert 10 ** low < 2 and 8 < 10 ** high < 100


# --------------------------------------------------------------------------- environments


def test_fingerprint_matrix_grades_cells_by_severity():
    fps = {"base": fp(), "bf16": fp(dtype="bf16"), "patch": fp(torch="2.6.1"), "cpu": fp(cpu="EPYC"), "none": None}
    m = fingerprint_matrix(fps, "base")
    sev = m.severity
    assert sev.loc["numerics.dtype", "bf16"] == "critical" and sev.loc["numerics.dtype", "patch"] == ""
    assert sev.loc["software.torch", "patch"] == "warning" and sev.loc["hardware.cpu", "cpu"] == "info"
    assert (sev["base"] == "").all() and (sev["none"] == "warning").all()
    assert m.values.loc["numerics.dtype", "bf16"] == "bf16" and m.values.loc["numerics.dtype", "none"] == "no fingerprint"
    assert "software.transformers" not in m.values.index  # equal everywhere: hidden
    assert list(m.values.index)[0] == "numerics.dtype"  # most severe first
    assert m.counts["bf16"] == {"critical": 1, "warning": 0, "info": 0}
    assert "software.transformers" in fingerprint_matrix(fps, "base", only_differing=False).values.index
    m.styled().to_html()  # renders


def test_pairs_put_critical_first_and_reeval_uses_the_training_environment(tmp_path):
    index = _lineage_index()
    pairs = train_eval_pairs(index)
    assert [p.eval.run_id for p in pairs][0] == "e4" and len(pairs[0].critical) == 2 and pairs[0].train.run_id == "t4"
    frame = pairs_frame(index, pairs)
    assert frame.iloc[0]["check"] == "🔴" and frame.iloc[-1]["check"] == "🟢"

    params = {"target": str(tmp_path / "target"), "drafter": str(tmp_path / "ck"), "prompts": str(tmp_path / "p"),
              "max_new_tokens": "64", "budgets": "[4, 8]", "device": "cpu", "dtype": "fp32",
              "linear_attn": "auto", "batch_size": "8"}
    ev = run("e4", "eval", fp(), train="t4", step=200, params=params)
    index = RunIndex([index.runs["t4"], ev])
    plan = reeval_plan(index, "e4")
    assert plan.blocked is None and plan.changes == ["linear-attn fallback → fast", "dtype fp32 → bf16",
                                                     "drafter-precision fp32 → bf16"]
    assert plan.params == {"target": params["target"], "drafter": params["drafter"], "prompts": params["prompts"],
                           "max_new_tokens": 64, "budgets": [4, 8], "device": "cpu", "dtype": "bf16",
                           "drafter_precision": "bf16", "linear_attn": "fast", "train_run_id": "t4",
                           "checkpoint_step": 200,
                           "name": "v4 @ step 200 · bf16 · fast · cpu · 64 tok · budgets 4,8"}
    from tracker.jobs.eval_job import cli_args

    args = cli_args(plan.params)
    assert args[args.index("--linear-attn") + 1] == "fast"

    partial = RunIndex([run("t", "train", fp(path="partial")), run("e", "eval", fp(), train="t", params=params)])
    assert "cannot force" in reeval_plan(partial, "e").blocked
    assert training_environment(None)[1] == "the training run has no fingerprint"
    alone = RunIndex([run("e", "eval", fp(), params=params)])
    assert "not linked" in reeval_plan(alone, "e").blocked


# --------------------------------------------------------------------------- launch


def test_allowed_roots_and_path_checks(tmp_path, monkeypatch):
    inside = tmp_path / "root" / "ck"
    inside.mkdir(parents=True)
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", os.pathsep.join([str(tmp_path / "root"), str(tmp_path / "b")]))
    roots = config.allowed_roots()
    assert check_path(str(inside), roots, "checkpoint") == str(inside.resolve())
    with pytest.raises(DraftboardError, match="outside the allowed roots"):
        check_path(str(tmp_path / "root" / ".." / "elsewhere"), roots, "checkpoint")
    with pytest.raises(DraftboardError, match="does not exist"):
        check_path(str(tmp_path / "root" / "missing"), roots, "checkpoint")
    assert parse_budgets(" 8, 4,8 ") == [4, 8]
    for bad in ("", "a,b", "0,4"):
        with pytest.raises(DraftboardError, match="budgets"):
            parse_budgets(bad)


def test_eval_params_match_training_run_and_reference(tmp_path):
    from test_launch_form import launch_inputs

    launch_inputs(tmp_path)
    form = LaunchForm(target=str(tmp_path / "target"), prompts=str(tmp_path / "p.jsonl"),
                      checkpoint_path="/registered/ckpt", train_run_id="t", checkpoint_step=100, budgets="4,8",
                      max_new_tokens=32, linear_attn="match training run", training_fingerprint=fp(path="fast"),
                      reference=True, reference_name="z-lab v1")
    params = eval_params(form, [tmp_path])
    assert params["linear_attn"] == "fast" and params["drafter"] == "/registered/ckpt"
    assert params["reference"] == "z-lab v1" and params["checkpoint_step"] == 100 and params["budgets"] == [4, 8]
    form.training_fingerprint = fp(path="partial")
    with pytest.raises(DraftboardError, match="cannot be forced"):
        eval_params(form, [tmp_path])
    form.linear_attn, form.reference_name = "auto", " "
    with pytest.raises(DraftboardError, match="needs a name"):
        eval_params(form, [tmp_path])
    form.checkpoint_path, form.drafter, form.reference = None, "/etc", False
    with pytest.raises(DraftboardError, match="outside the allowed roots"):
        eval_params(form, [tmp_path])


def test_describe_job_for_the_queue_list():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    job = Job(id=3, kind="eval", params={"drafter": "/x/step_200", "train_run_id": "t", "checkpoint_step": 200,
                                          "linear_attn": "fast", "device": "cuda", "dtype": "bf16"},
              state=RUNNING, created_at=now - timedelta(minutes=5), started_at=now - timedelta(seconds=30),
              finished_at=None, worker_id="w", heartbeat_at=now, pid=1, log_path=None, progress=0.25,
              stage="drafter", mlflow_run_id=None, error=None, cancel_requested=False, dedup_key="k")
    view = describe_job(job, {"t": "v4"}, now)
    assert view.title == "🏃 #3 eval v4 @ step 200 · bf16 · fast · cuda · running"  # names.eval_run_name
    assert view.progress_text == "drafter · 25% of this stage" and view.when == "started 30s ago" and view.can_cancel
    # A just-started job's one-item stage ("load", 1 of 1) never reads as the eval at 100%
    loaded = describe_job(Job(**{**job.__dict__, "stage": "load", "progress": 1.0}), {"t": "v4"}, now)
    assert loaded.progress_text == "load done · the next stage starting"
    queued = describe_job(Job(**{**job.__dict__, "state": QUEUED, "started_at": None, "stage": None,
                                 "progress": 0.0}), {}, now)
    assert queued.progress_text.startswith("waiting for a worker") and queued.when == "queued 5m ago"
    # Jobs that measure differently never read alike: every setting away from the defaults is named.
    shorter = describe_job(Job(**{**job.__dict__, "params": {**job.params, "max_new_tokens": 64,
                                                             "prompts": "/data/held_out.jsonl"}}), {"t": "v4"}, now)
    assert shorter.title == "🏃 #3 eval v4 @ step 200 · bf16 · fast · cuda · 64 tok · running"
    assert shorter.when == "started 30s ago · prompts held_out.jsonl"
    gsm8k = describe_job(Job(**{**job.__dict__, "params": {
        **job.params, "prompts": "hf:openai/gsm8k:main:test", "limit_per_dataset": 16, "temperature": 1.0,
        "top_p": 0.95, "top_k": 20, "samples": 8}}), {"t": "v4"}, now)
    assert gsm8k.title == ("🏃 #3 eval v4 @ step 200 · bf16 · fast · cuda · T=1 · gsm8k · 16/dataset · top_p 0.95 · "
                           "top_k 20 · 8 draws · running")
    assert gsm8k.when == "started 30s ago"


# --------------------------------------------------------------------------- metric docs


def test_metric_docs_cover_the_fixed_names_and_families():
    assert metric_docs.describe("tau").unit == "tokens / block"
    assert "position 3" in metric_docs.describe("accept_rate_pos3").title
    assert "budget 16" in metric_docs.describe("ddtree_tau_b16").title
    assert "ddtree_tau_b8` - 1" in metric_docs.describe("dds8").definition
    assert "no definition" in metric_docs.describe("my_metric").definition
    assert metric_docs.describe("tau_gsm8k").title == "Mean acceptance length on gsm8k"
    assert metric_docs.describe("tau_pooled").title == "Mean acceptance length, pooled"
    assert metric_docs.sort_metrics(["dds16", "loss", "dds8", "tau", "zeta"]) == ["tau", "loss", "dds8", "dds16",
                                                                                  "zeta"]
    assert all(d.help().startswith("**") for d in metric_docs.glossary())


def test_run_detail_tables_read_as_text_not_markup_or_python():
    from tracker.dashboard.tables import NOT_SET, metrics_frame, params_frame

    train = run("t", "train", params={"gamma": "None", "lr": "0.0006"}, metrics={"dds8": 1.5, "tau": 2.5})
    assert params_frame(train).values.tolist() == [["gamma", NOT_SET], ["lr", "0.0006"]]
    definitions = dict(metrics_frame(train)[["metric", "definition"]].values.tolist())
    assert "`" in metric_docs.describe("dds8").definition  # Markdown where Markdown is rendered
    assert "ddtree_tau_b8 - 1" in definitions["dds8"] and not any("`" in d for d in definitions.values())


def test_the_runs_tau_says_what_makes_it_a_number():
    from tracker.dashboard.tables import tau_text

    ev = run("e", "eval", fp(), train="t", step=200, metrics={"tau": 3.2412, "tau_ci_low": 2.19, "tau_ci_high": 4.5})
    ev.tags.update({"protocol.datasets": '{"gsm8k": 10, "mbpp": 6}', "protocol.temperature": "0.0",
                    "protocol.max_new_tokens": "64"})
    published = run("p", "reference", fp(), metrics={"tau_gsm8k": 6.53, "tau_math500": 7.84})
    published.tags["protocol.datasets"] = '{"gsm8k": "unknown", "math500": "unknown"}'
    index = RunIndex([run("t", "train", fp(), name="v3"), ev, published, run("u", "train", fp())])
    assert tau_text(index, ev) == "3.24 [2.19, 4.50] · 16 prompts · T=0 · 64 tok"
    assert tau_text(index, index.runs["t"]) == "@ 200 · 3.24 [2.19, 4.50] · 16 prompts · T=0 · 64 tok"
    assert tau_text(index, published) == "gsm8k 6.53 · math500 7.84"
    assert tau_text(index, index.runs["u"]) == "—"


def test_the_ddtree_chart_says_which_drawn_eval_it_has_no_curve_for():
    """A DFlash2 drafter's selector walks one path: its eval has no DDTree, and the chart says so
    instead of leaving its series out without a word (the demo's drafter-v4)."""
    from tracker.dashboard.compare import without_ddtree

    dflash = run("e1", "eval", fp(), train="t1", step=100, metrics={"tau": 3.0, "ddtree_tau_b4": 3.4})
    dflash2 = run("e2", "eval", fp(), train="t2", step=100, metrics={"tau": 4.0})
    dflash2.tags["draftboard.drafter_family"] = "dflash2"
    index = RunIndex([run("t1", "train", fp(), name="v1"), run("t2", "train", fp(), name="v4"), dflash, dflash2])
    data = compare_data(index, ["t1", "t2"], None, pd.DataFrame(columns=["run_id", "key", "step", "value"]))
    assert set(data.ddtree["run_id"]) == {"e1"}
    assert without_ddtree(index, data) == [
        "v4 @ step 100 (DFlash2: its candidate selector picks one path; DDTree is measured for DFlash drafters)"]


def test_cells_text_shows_compare_data_as_a_reader_reads_it():
    """Issue 52 (LOW): Compare → Data showed `None` and raw floats. Blank for a cell a row does not fill, a whole
    number as one, the rest to 4 decimals (the CSV keeps every digit)."""
    from tracker.dashboard.tables import cells_text

    frame = pd.DataFrame({"step": [200.0, None], "value": [4.844626, 3.0], "series": ["v4", None],
                          "low": [float("nan"), 0.123456]})
    assert cells_text(frame).to_dict("records") == [
        {"step": "200", "value": "4.8446", "series": "v4", "low": ""},
        {"step": "", "value": "3", "series": "", "low": "0.1235"}]


def test_two_evals_of_one_step_never_read_alike_in_compares_tables():
    """Issue 52 (LOW): two evals of one step made duplicate-looking rows (vs previous checkpoint, per dataset)."""
    from tracker.dashboard.compare_deltas import by_dataset_frame, told_apart

    index = RunIndex([run("t", "train", fp(), name="v5"),
                      run("aaaaaa1", "eval", fp(), train="t", step=200, metrics={"tau": 2.0}),
                      run("bbbbbb2", "eval", fp(), train="t", step=200, metrics={"tau": 2.1}),
                      run("cccccc3", "eval", fp(), train="t", step=100, metrics={"tau": 1.5})])
    evals = index.evals_of("t")
    assert told_apart(index, evals) == {"cccccc3": "v5 @ step 100", "aaaaaa1": "v5 @ step 200 (aaaaaa)",
                                        "bbbbbb2": "v5 @ step 200 (bbbbbb)"}
    assert by_dataset_frame(index, evals)["run"].is_unique


def test_a_run_picker_offers_the_chosen_and_the_newest_runs_training_runs_first():
    """Speed at scale (issue 52): every picker option is labelled on the server and sent to the browser on every
    visit, so a 10,000-run store offers at most `limit`: what is chosen, then training runs, then the rest."""
    from tracker.dashboard.tables import picker_options

    index = RunIndex([run("e1", "eval", fp(), train="t1", step=1), run("t2", "train", fp()),
                      run("e0", "eval", fp()), run("t1", "train", fp()), run("r", "reference", fp())])
    assert picker_options(index, ("train", "eval")) == (["t2", "t1", "e1", "e0"], 0)
    assert picker_options(index, ("train", "eval"), keep=["e0", "gone"], limit=2) == (["e0", "t2"], 2)
    assert picker_options(index, ("train", "eval", "reference"), keep=["e0", "e1", "r"], limit=2) == (
        ["e0", "e1", "r"], 2)  # what is chosen always stays
