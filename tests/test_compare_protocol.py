"""Compare's protocol and uncertainty: per-dataset reference matching, Δτ verdicts, protocol-split
series, the Runs protocol column and the Launch prompts picker, on hand-made runs with
hand-worked numbers (tracker/dashboard/compare_deltas.py, lineage.py, compare.py, tables.py)."""

import pandas as pd
import pytest

from tracker.measurement import protocol, uncertainty
from tracker.dashboard import compare_deltas as comparisons  # Compare's Δτ tables (issue 40's name)
from tracker.dashboard import lineage, tables
from tracker.dashboard.compare import best_evals, closest_reference, compare_data, eval_series
from tracker.dashboard.compare_deltas import Estimate
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.dashboard.launch_form import PROMPT_PATH, benchmark_spec, prompt_choices
from tracker.dashboard.tables import protocol_reason

TARGET = "/models/Qwen3-4B"
FP = {"software": {"torch": "2.6.0"}, "hardware": {"device": "cpu"},
      "numerics": {"dtype": "fp32", "linear_attention_path": "n/a"}}
EVAL_PROTOCOL = dict(prompt_digest="aaaa", completions="generated", max_new_tokens=64, enable_thinking=False,
                     chat_template_digest="cccc", block_size=16, temperature=0.0, stop_token_ids=[2],
                     last_block="cut", scoring="offline", target_digest="tttt")


def make(run_id, kind, *, proto=None, metrics=None, train=None, step=None, fingerprint=FP, published=False,
         params=None, start=0):
    tags = {"draftboard.kind": kind, "draftboard.target": TARGET}
    if proto is not None:
        tags.update(proto.to_tags())
    if train:
        tags["draftboard.train_run_id"] = train
    if step is not None:
        tags["draftboard.checkpoint_step"] = str(step)
    if published:
        tags["draftboard.published"] = "1"
    return RunInfo(run_id=run_id, name=run_id, kind=kind, status="FINISHED", experiment_id="1", start_time=start,
                   end_time=None, artifact_uri="", tags=tags, params=params or {}, metrics=metrics or {},
                   metric_steps={}, fingerprint_file=fingerprint)


def eval_run(run_id, datasets, tau, ci=None, **kw):
    metrics = {"tau": tau}
    if ci:
        metrics.update({"tau_ci_low": ci[0], "tau_ci_high": ci[1]})
    proto = protocol.Protocol(datasets=datasets, **{**EVAL_PROTOCOL, **kw.pop("proto", {})})
    return make(run_id, "eval", proto=proto, metrics=metrics, **kw)


# The published z-lab Table 1 numbers for Qwen3-4B at temperature 0, as the importer logs them.
PUBLISHED = make("paper", "reference", published=True, fingerprint=None,
                 proto=protocol.Protocol(datasets={"gsm8k": "unknown", "math500": "unknown", "mt-bench": "unknown"},
                                         temperature=0, enable_thinking=False, block_size=16, max_new_tokens=2048,
                                         scoring="published"),
                 metrics={"tau": 6.54, "streak": 5.54, "tau_gsm8k": 6.53, "tau_math500": 7.84, "tau_mt_bench": 4.35})


# --------------------------------------------------------------------------- matching per dataset


LONG = {"max_new_tokens": 2048}  # the published table's generation length


def test_a_gsm8k_eval_meets_the_references_gsm8k_number_not_its_average():
    ev = eval_run("ev", {"gsm8k": 80}, 5.0, ci=(4.6, 5.4), proto=LONG)
    assert comparisons.dataset_estimates(PUBLISHED) == {
        "gsm8k": Estimate(6.53), "math500": Estimate(7.84), "mt-bench": Estimate(4.35)}
    ref_tau = comparisons.reference_tau([ev], PUBLISHED)
    assert ref_tau.estimate == Estimate(6.53) and "gsm8k" in ref_tau.note and not ref_tau.same_sets

    # The dataset rows become one warning (a sample of the same set); the rest is the plain diff.
    rows = lineage.matched_protocol_rows(lineage.protocol_diff(ev, PUBLISHED), ev, PUBLISHED)
    by_field = {r.field: r.severity for r in rows}
    assert by_field["protocol.datasets"] == "warning" and "protocol.prompt_digest" not in by_field
    # a publication's scoring says where its number came from, not how it was measured: a warning, as unknown is
    assert "protocol.max_new_tokens" not in by_field and by_field["protocol.scoring"] == "warning"
    assert not lineage.of_severity(lineage.vs_reference(ev, PUBLISHED), "critical")

    index = RunIndex([ev, PUBLISHED])
    (row,) = comparisons.reference_gap(index, ev, PUBLISHED)
    # Against a number without an interval: Δ = 5.0 - 6.53 = -1.53, interval [4.6-6.53, 5.4-6.53] < 0.
    assert (row["dataset"], row["tau"], row["reference tau"], row["delta tau"]) == (
        "gsm8k", "5.000 [4.600, 5.400]", "6.530", "-1.530")
    assert row["verdict"] == uncertainty.WORSE and "max new tokens" not in row["protocol"]
    # Issue 65 H1: a series is one protocol. A 64-token eval against the 2048-token table is not the same number.
    short = eval_run("short", {"gsm8k": 80}, 5.0, ci=(4.6, 5.4))
    assert [lineage.field_name(r.field) for r in lineage.of_severity(lineage.vs_reference(short, PUBLISHED),
                                                                     "critical")] == ["max new tokens"]
    (row,) = comparisons.reference_gap(RunIndex([short, PUBLISHED]), short, PUBLISHED)
    assert row["verdict"] == "not comparable: max new tokens" and "64 vs reference: 2048" in row["protocol"]


def test_no_matching_reference_number_is_said_plainly_and_the_average_is_not_drawn():
    ev = eval_run("ev", {"stdlib": 16}, 3.0, ci=(2.8, 3.2), proto=LONG)
    ref_tau = comparisons.reference_tau([ev], PUBLISHED)
    assert ref_tau.estimate is None
    # Issue 65 M6: its own tau is drawn apart, labelled with its prompts and protocol: shape only, never a verdict
    assert ref_tau.note == ("No reference number matches: the chosen evals ran on stdlib; the reference reports tau "
                            "for gsm8k, math500, mt-bench. Its own tau (avg over gsm8k, math500, mt-bench · 2048 tok · "
                            "T=0) is drawn apart, grey and dashed, to compare the curves' shapes, not their values.")
    (apart,) = ref_tau.lines
    assert apart.apart and apart.estimate.value == 6.54
    assert apart.label == " · avg over gsm8k, math500, mt-bench · 2048 tok · T=0 · other prompts: shape only"
    (row,) = comparisons.reference_gap(RunIndex([ev, PUBLISHED]), ev, PUBLISHED)
    assert row["verdict"] == ("no reference number for stdlib: the reference reports gsm8k, math500, mt-bench; "
                              "evaluate this checkpoint on one of them to compare")
    assert row["reference tau"] == row["delta tau"] == "—"  # never a literal None
    # Another dataset than the reference's is a critical protocol difference: dashed, named.
    assert [lineage.field_name(r.field) for r in lineage.of_severity(lineage.vs_reference(ev, PUBLISHED),
                                                                     "critical")] == ["dataset"]


def test_evals_on_several_datasets_each_meet_the_references_number_for_theirs():
    """Issue 65 M6: "No reference line for tau: the chosen evals ran on different datasets", fourth walk running. Each
    dataset the reference reports gets its line, named by the dataset; the chart draws them all."""
    train, other = make("t", "train"), make("u", "train")
    gsm = eval_run("g", {"gsm8k": 80}, 5.0, ci=(4.6, 5.4), train="t", step=100, proto=LONG)
    math = eval_run("m", {"math500": 50}, 6.0, ci=(5.5, 6.5), train="u", step=100, proto=LONG)
    ref_tau = comparisons.reference_tau([gsm, math], PUBLISHED)
    assert ref_tau.estimate is None and ref_tau.note.startswith("Reference tau: one line per dataset (gsm8k, math500)")
    assert [(line.label, line.estimate.value, line.apart) for line in ref_tau.lines] == [
        (" · gsm8k", 6.53, False), (" · math500", 7.84, False)]
    empty = pd.DataFrame(columns=["run_id", "key", "step", "value"])
    data = compare_data(RunIndex([train, other, gsm, math, PUBLISHED]), ["t", "u"], "paper", empty)
    assert [(r["label"], r["value"]) for r in data.references("tau", "paper")] == [
        ("paper · gsm8k", 6.53), ("paper · math500", 7.84)]
    from tracker.dashboard import curve_chart

    spec = curve_chart.eval_spec(data.eval_points, "tau", None, data.references("tau", "paper"))
    assert len(spec["references"]) == 2


def test_the_chart_draws_the_matched_number_and_drops_the_pooled_ones():
    train = make("t", "train")
    ev = eval_run("ev", {"gsm8k": 80}, 5.0, ci=(4.6, 5.4), train="t", step=100, proto=LONG)
    index = RunIndex([train, ev, PUBLISHED])
    empty = pd.DataFrame(columns=["run_id", "key", "step", "value"])
    data = compare_data(index, ["t"], "paper", empty)
    assert data.reference_values == {"tau": 6.53, "tau_gsm8k": 6.53, "tau_math500": 7.84, "tau_mt_bench": 4.35}
    assert "gsm8k" in data.reference_note
    tau = data.eval_points[data.eval_points["key"] == "tau"].iloc[0]
    assert (tau["value"], tau["low"], tau["high"], tau["scoring"]) == (5.0, 4.6, 5.4, "offline")
    assert "tau_ci_low" not in set(data.eval_points["key"])  # drawn as the interval, not a series
    assert not data.eval_points["dashed"].any()
    # Issue 65 H1: the same eval at 64 tokens is drawn apart (dashed) and the note says why
    short = eval_run("short", {"gsm8k": 80}, 5.0, ci=(4.6, 5.4), train="t", step=100)
    data = compare_data(RunIndex([train, short, PUBLISHED]), ["t"], "paper", empty)
    assert data.eval_points["dashed"].all() and set(data.eval_points["reason"]) == {"≠ reference: max new tokens"}


def test_a_critical_protocol_difference_dashes_the_series_and_says_why():
    train = make("t", "train")
    hot = make("hot", "reference", published=True, fingerprint=None,
               proto=protocol.Protocol(datasets={"gsm8k": "unknown"}, temperature=1, scoring="published"),
               metrics={"tau_gsm8k": 6.0})
    ev = eval_run("ev", {"gsm8k": 80}, 5.0, train="t", step=100)
    data = compare_data(RunIndex([train, ev, hot]), ["t"], "hot", pd.DataFrame(columns=["run_id", "key", "step",
                                                                                         "value"]))
    assert data.eval_points["dashed"].all() and set(data.eval_points["reason"]) == {"≠ reference: temperature"}
    assert data.banner == ["t @ step 100 (eval): temperature 0.0 vs reference: 1.0"]
    (row,) = comparisons.reference_gap(RunIndex([train, ev, hot]), ev, hot)
    assert row["verdict"] == "not comparable: temperature"


def test_closest_reference_counts_protocol_differences():
    ev = eval_run("ev", {"gsm8k": 80}, 5.0)
    hot = make("hot", "reference", proto=protocol.Protocol(datasets={"gsm8k": 80}, **{**EVAL_PROTOCOL,
                                                                                         "temperature": 1.0}))
    same = make("same", "reference", proto=protocol.Protocol(datasets={"gsm8k": 80}, **EVAL_PROTOCOL), start=-1)
    choice = closest_reference(RunIndex([ev, hot, same]), ["ev"])
    assert choice.run_id == "same" and choice.critical == 0 and choice.candidates == ("same", "hot")
    alone = closest_reference(RunIndex([ev, hot]), ["ev"])
    assert alone.critical == 1 and "temperature" in alone.message and not alone.matches


# --------------------------------------------------------------------------- Δτ and verdicts


def test_unpaired_verdicts_follow_the_intervals():
    a, b = Estimate(3.0, 2.5, 3.5), Estimate(4.0, 3.6, 4.4)
    worse = comparisons.compare(a, b)
    assert worse.verdict == uncertainty.WORSE and worse.delta == Estimate(-1.0)
    assert comparisons.compare(b, a).verdict == uncertainty.BETTER
    assert comparisons.compare(Estimate(3.0, 2.5, 3.5), Estimate(3.4, 3.1, 3.7)).verdict == uncertainty.NO_DIFFERENCE
    # 2.0 lies below the eval's interval [2.5, 3.5]: better, by 1.0.
    assert comparisons.compare(a, Estimate(2.0)).verdict == uncertainty.BETTER
    assert comparisons.compare(Estimate(3.0), Estimate(2.0)).verdict == comparisons.NO_INTERVAL
    assert comparisons.compare(a, b, critical=["dataset", "dataset"]).verdict == "not comparable: dataset"


def test_paired_comparison_on_the_same_prompts():
    prompts = {str(i): {"acceptance_lengths": [1 + i % 3, 2], "input_ids": [i, i + 1]} for i in range(12)}
    better = {k: {**r, "acceptance_lengths": [x + 1 for x in r["acceptance_lengths"]]} for k, r in prompts.items()}
    same = comparisons.compare(Estimate(2.0), Estimate(2.0), prompts, prompts)
    assert same.verdict == uncertainty.NO_DIFFERENCE and same.delta.value == 0.0 and "paired" in same.how
    gap = comparisons.compare(Estimate(3.0), Estimate(2.0), better, prompts)
    # Every prompt gains exactly 1 token per block: every resample's Δ is 1.
    assert gap.verdict == uncertainty.BETTER
    assert (gap.delta.value, gap.delta.low, gap.delta.high) == pytest.approx((1.0, 1.0, 1.0))
    other_tokens = {k: {**r, "input_ids": [0]} for k, r in prompts.items()}
    assert not comparisons.same_prompts(prompts, other_tokens)


def test_vs_previous_checkpoint_pairs_per_prompt_data_and_refuses_other_prompt_sets():
    def records(shift):
        return {"prompts": [{"id": i, "dataset": "gsm8k", "input_ids": [i], "acceptance_lengths": [2 + shift, 2]}
                            for i in range(8)]}
    e1 = eval_run("e1", {"gsm8k": 8}, 2.0, ci=(2.0, 2.0), train="t", step=100)
    e2 = eval_run("e2", {"gsm8k": 8}, 2.5, ci=(2.5, 2.5), train="t", step=200)
    e3 = eval_run("e3", {"gsm8k": 8}, 3.0, ci=(2.9, 3.1), train="t", step=300, proto={"prompt_digest": "bbbb"})
    loaded = {"e1": records(0), "e2": records(1), "e3": None}
    frame = comparisons.vs_previous_frame(RunIndex([e1, e2, e3]), [("t", [e1, e2, e3])], lambda r: loaded[r.run_id])
    assert list(frame["step"]) == [200, 300]
    first, second = frame.iloc[0], frame.iloc[1]
    assert first["delta tau"] == "+0.500 [+0.500, +0.500]" and first["verdict"] == uncertainty.BETTER
    assert first["how"] == "paired bootstrap over 8 prompts"
    assert second["verdict"] == "not comparable: prompt set"


def test_vs_previous_means_the_previous_step_never_a_second_eval_of_the_same_one():
    """Issue 26: after a second eval of step 40 the table read "step 40 vs previous step 40"."""
    e20 = eval_run("e20", {"gsm8k": 8}, 2.0, ci=(1.9, 2.1), train="t", step=20)
    e40a = eval_run("e40a", {"gsm8k": 8}, 2.5, ci=(2.4, 2.6), train="t", step=40)
    e40b = eval_run("e40b", {"gsm8k": 8}, 2.6, ci=(2.5, 2.7), train="t", step=40)
    e60 = eval_run("e60", {"gsm8k": 8}, 2.9, ci=(2.8, 3.0), train="t", step=60)
    runs = [e20, e40a, e40b, e60]
    frame = comparisons.vs_previous_frame(RunIndex(runs), [("t", runs)], None)
    assert frame[["step", "previous step"]].values.tolist() == [[40, 20], [40, 20], [60, 40]]
    assert frame.iloc[2]["previous tau"].startswith("2.600")  # step 40's latest eval


def test_by_dataset_results_and_online_gap():
    results = {"by_dataset": {"gsm8k": {"tau": 3.0, "ci": [2.5, 3.5], "n_prompts": 10},
                              "mbpp": {"tau": 4.0, "ci": [3.0, 5.0], "n_prompts": 6}},
               "offline": {"tau": 2.8}}
    online = eval_run("on", {"gsm8k": 10, "mbpp": 6}, 3.4, train="t", step=100, proto={"scoring": "online"})
    offline = eval_run("off", {"gsm8k": 10, "mbpp": 6}, 3.3, train="t", step=100)
    index = RunIndex([make("t", "train"), online, offline])
    frame = comparisons.by_dataset_frame(index, [online], lambda r: results)
    assert frame[["dataset", "prompts", "tau", "95% interval", "scoring"]].values.tolist() == [
        ["gsm8k", "10", "3.000", "[2.500, 3.500]", "online"], ["mbpp", "6", "4.000", "[3.000, 5.000]", "online"]]
    # A publication's numbers: what it does not state says so (issue 39: the cells read `None`).
    published = comparisons.by_dataset_frame(RunIndex([PUBLISHED]), [PUBLISHED])
    assert published[["prompts", "95% interval"]].drop_duplicates().values.tolist() == [["not stated", "none published"]]
    assert not published.isna().any().any()
    gaps = comparisons.online_gaps(index, [online, offline], lambda r: results if r.run_id == "on" else None)
    assert gaps["online - offline"].round(6).tolist() == [0.6, 0.1]
    assert gaps["from"].tolist() == ["the online eval's own offline score", "offline eval off"]
    assert comparisons.scoring_note(online) == " (online)" and comparisons.scoring_note(offline) == ""


# --------------------------------------------------------------------------- series, runs table, launch


def test_evals_on_other_prompt_sets_or_scored_online_are_separate_series():
    train = make("t", "train")
    a = eval_run("a", {"gsm8k": 8}, 2.0, train="t", step=100)
    b = eval_run("b", {"mbpp": 8}, 2.5, train="t", step=200, proto={"prompt_digest": "bbbb"})
    c = eval_run("c", {"gsm8k": 8}, 2.2, train="t", step=200, proto={"scoring": "online"})
    series = eval_series(RunIndex([train, a, b, c]), train)
    assert [(label, [e.run_id for e in evals]) for label, evals in series] == [
        ("t [gsm8k · prompts aaaa · offline]", ["a"]), ("t [mbpp · prompts bbbb · offline]", ["b"]),
        ("t [gsm8k · prompts aaaa · online]", ["c"])]


def test_evals_that_generated_another_length_or_ended_by_another_rule_are_separate_series():
    """Issue 65 H1: drafter-v1 at 32, 64 (twice) and 512 max new tokens was one line through 2.505 -> 3.78, its legend
    the 512-token value. A series is one protocol: each generation length, last-block rule and engine its own line,
    named by what differs; the two 64-token evals are one line, by step."""
    train = make("t", "train")
    a = eval_run("a", {"gsm8k": 8}, 2.505, train="t", step=40, proto={"max_new_tokens": 32})
    b = eval_run("b", {"gsm8k": 8}, 2.914, train="t", step=100, proto={"max_new_tokens": 64})
    c = eval_run("c", {"gsm8k": 8}, 3.0, train="t", step=160, proto={"max_new_tokens": 64})
    d = eval_run("d", {"gsm8k": 8}, 3.78, train="t", step=200, proto={"max_new_tokens": 512})
    e = eval_run("e", {"gsm8k": 8}, 3.1, train="t", step=200, proto={"max_new_tokens": 64, "last_block": "full"})
    series = eval_series(RunIndex([train, a, b, c, d, e]), train)
    assert sorted((label, tuple(ev.run_id for ev in evals)) for label, evals in series) == [
        ("t [32 tok · last block cut]", ("a",)), ("t [512 tok · last block cut]", ("d",)),
        ("t [64 tok · last block cut]", ("b", "c")), ("t [64 tok · last block full]", ("e",))]
    # The run's default protocol is the one most of its checkpoints were measured under: its latest 64-token eval
    # is what Compare draws and quotes by default (position, DDTree, by context, the legend), not the 512-token one.
    index = RunIndex([train, a, b, c, d, e])
    assert lineage.main_series(index, "t") == lineage.series_key(b)
    assert [ev.run_id for ev in best_evals(index, train, None)][:2] == ["c", "b"]


def test_runs_table_protocol_column():
    train = make("t", "train")
    a = eval_run("a", {"gsm8k": 8}, 2.0, train="t", step=100)
    b = eval_run("b", {"mbpp": 8}, 2.5, train="t", step=200, proto={"prompt_digest": "bbbb", "scoring": "online"})
    old = make("old", "eval", metrics={"tau": 2.0})
    index = RunIndex([train, a, b, old])
    # other prompts, scored online: drawn as lines apart (issue 39: never compared, never red)
    assert protocol_reason(index, train) == ("🟢 2 evals on 2 lines by protocol (drawn apart)", 0)
    assert protocol_reason(index, a) == ("a line of its own · T=0", 0)
    assert protocol_reason(index, b) == ("a line of its own · T=0 · 🔵 online", 0)
    assert protocol_reason(index, old) == ("⚪ no protocol (evaluated before protocols were recorded)", 0)
    # Nothing to flag still says what was measured: every row of a project reads filled.
    same = eval_run("s", {"gsm8k": 8}, 2.1, train="t", step=300)
    agreeing = RunIndex([train, a, same])
    assert protocol_reason(agreeing, train) == ("🟢 2 evals, one protocol", 0)
    assert protocol_reason(agreeing, same) == ("🟢 as @ 100 · T=0", 0)
    assert protocol_reason(RunIndex([train, a]), train) == ("1 eval", 0)
    assert protocol_reason(RunIndex([train]), train) == ("no evals yet", 0)
    # Issue 65 M4: its step-600 eval promoted to a reference is still a measurement of its checkpoint
    promoted = make("r", "reference", proto=protocol.Protocol(datasets={"gsm8k": 8}), train="t", step=600)
    assert protocol_reason(RunIndex([train, promoted]), train) == (
        "no evals yet · 1 reference of its checkpoints (@ 600)", 0)
    sampled = eval_run("x", {"gsm8k": 8}, 2.1, proto={"temperature": 1.0, "top_p": 0.95, "samples": 4})
    assert protocol_reason(RunIndex([sampled]), sampled) == ("🎲 T=1 top_p=0.95 x4", 0)


def test_a_sampled_or_two_prompt_eval_turns_no_greedy_eval_red():
    """Issue 39: Runs compared each eval's protocol with its training run's latest eval, so one sampled
    (or 2-prompt) eval made every greedy eval of the run a critical mismatch. A protocol is compared
    with the evals drawn on its line only."""
    train = make("t", "train")
    greedy = [eval_run(f"g{step}", {"gsm8k": 8}, 2.0, train="t", step=step, start=step) for step in (100, 200, 300)]
    sampled = eval_run("s", {"gsm8k": 8}, 2.4, train="t", step=400, start=400,
                       proto={"temperature": 1.0, "top_p": 0.95, "samples": 4})
    two = eval_run("two", {"gsm8k": 2}, 2.4, train="t", step=500, start=500, proto={"prompt_digest": "cccc"})
    index = RunIndex([train, *greedy, sampled, two])
    for ev in greedy[1:]:
        assert protocol_reason(index, ev)[1] == 0 and protocol_reason(index, ev)[0].startswith("🟢 as @ ")
    assert protocol_reason(index, greedy[0]) == ("🟢 as @ 300 · T=0", 0)
    assert protocol_reason(index, sampled) == ("a line of its own · 🎲 T=1 top_p=0.95 x4", 0)
    assert protocol_reason(index, train) == ("🟢 5 evals on 3 lines by protocol (drawn apart)", 0)
    assert sum(tables.runs_table(index, list(index.runs.values()))["critical"]) == 0


def test_launch_offers_the_named_benchmark_sets_and_the_projects_files():
    used = eval_run("u", {"p": 3}, 2.0, params={"prompts": "/data/p.jsonl"})
    choices = prompt_choices(RunIndex([used]))
    values = [c.value for c in choices]
    assert values[0] == "/data/p.jsonl" and values[-1] == PROMPT_PATH
    assert benchmark_spec("gsm8k") == "hf:openai/gsm8k:main:test"
    assert benchmark_spec("math500") == "hf:HuggingFaceH4/MATH-500:test"
    named = [c.label.split(" · ")[0] for c in choices if c.value.startswith("hf:")]
    assert named == ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"]


@pytest.mark.parametrize("value, text", [({"gsm8k": 80, "mbpp": "unknown"}, "gsm8k (80), mbpp (unknown)"),
                                         (None, "unknown"), (True, "on")])
def test_protocol_values_read_plainly(value, text):
    assert lineage.value_text(value) == text


def test_probe_digests_stand_behind_the_probe_words():
    def probed(absmax2, digest):
        out = {**FP, "probe": {"digest": digest, "seed": 0, "length": 16, "layers": {
            "2": {"mean": 0.0, "std": 1.0, "absmax": absmax2}}}}
        return out

    train = make("t", "train", fingerprint=probed(10.0, "d-train"))
    ev = make("e", "eval", fingerprint=probed(10.057, "d-eval"), train="t", step=200)
    pair = lineage.vs_training(RunIndex([train, ev]), ev)
    assert pair.probe == "hidden states differ by up to 5.7e-3 (relative) at layer 2"
    assert pair.probe_help(RunIndex([train, ev])) == "hidden-state probe digest: t @ step 200 d-eval, t d-train"
    assert lineage.probe_digests(FP, FP, "a", "b") is None  # no probe: no words, no digests


def test_eval_tables_compare_the_drawn_checkpoint_and_each_step_with_the_one_before():
    from tracker.dashboard.compare import eval_tables

    train = make("t", "train")
    e1 = eval_run("e1", {"gsm8k": 8}, 4.0, ci=(3.5, 4.5), train="t", step=100, proto=LONG)
    e2 = eval_run("e2", {"gsm8k": 8}, 6.0, ci=(5.6, 6.4), train="t", step=200, proto=LONG)
    index = RunIndex([train, e1, e2, PUBLISHED])
    data = compare_data(index, ["t"], "paper", pd.DataFrame(columns=["run_id", "key", "step", "value"]),
                        step=200)
    tables = eval_tables(index, data)
    assert tables.vs_reference[["run_id", "dataset", "reference tau", "verdict"]].values.tolist() == [
        ["e2", "gsm8k", "6.530", uncertainty.WORSE]]  # [5.6, 6.4] lies below 6.53
    # Different prompts? No per-prompt data here: the two intervals [3.5, 4.5] and [5.6, 6.4] do not overlap.
    assert tables.vs_previous[["step", "previous step", "delta tau", "verdict"]].values.tolist() == [
        [200, 100, "+2.000", uncertainty.BETTER]]
    assert tables.by_dataset[["dataset", "run_id"]].values.tolist() == [  # grouped by dataset
        ["gsm8k", "paper"], ["gsm8k", "e2"], ["math500", "paper"], ["mt-bench", "paper"]]
    assert tables.online.empty


def test_the_eval_chart_carries_each_points_interval_and_the_references_band():
    from tracker.dashboard import curve_chart
    from tracker.dashboard.curve_chart import Y_DTYPE, unpack

    train = make("t", "train")
    e1 = eval_run("e1", {"gsm8k": 8}, 4.0, ci=(3.5, 4.5), train="t", step=100)
    e2 = eval_run("e2", {"gsm8k": 8}, 6.0, ci=(5.6, 6.4), train="t", step=200)
    data = compare_data(RunIndex([train, e1, e2, PUBLISHED]), ["t"], "paper",
                        pd.DataFrame(columns=["run_id", "key", "step", "value"]))
    spec = curve_chart.eval_spec(data.eval_points, "tau", None,
                                 [{"value": 6.53, "label": "paper", "low": 6.3, "high": 6.7}])
    (line,) = spec["series"]
    assert unpack(line["y"], Y_DTYPE).tolist() == pytest.approx([4.0, 6.0])
    assert unpack(line["low"], Y_DTYPE).tolist() == pytest.approx([3.5, 5.6])
    assert unpack(line["high"], Y_DTYPE).tolist() == pytest.approx([4.5, 6.4])
    assert spec["references"] == [{"value": 6.53, "label": "paper", "low": 6.3, "high": 6.7, "apart": False}]
    # Checkpoints are whole steps: the axis ticks sit on them (one eval alone never reads 199.5).
    assert spec["ticks"] == [100, 200]
    alone = compare_data(RunIndex([train, e2]), ["t"], None, pd.DataFrame(columns=["run_id", "key", "step", "value"]))
    alone_spec = curve_chart.eval_spec(alone.eval_points, "tau")
    assert alone_spec["ticks"] == [200] and alone_spec["references"] == []
