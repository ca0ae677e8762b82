"""reconcile() on a hand-worked pair of evals: every part of the gap computed by hand below."""

from __future__ import annotations

import pytest

from tracker.measurement.reconcile import reconcile
from tracker.errors import DraftboardError

# max_new_tokens 10, `cut`. Offline walks and the engine's, per prompt:
#   a: equal completions (10 tokens); offline [3, 4, 2] is cut at the limit (3+4+2 = 10-1); counted
#      as the engine counts, the offline blocks say [3, 4, 5], as the engine does -> end_of_generation
#   b: equal completions (7 tokens, EOS); offline [2, 2, 2], engine [2, 3, 2] -> acceptance, block 1
#   c: completions differ; offline [1, 1], engine [2]                       -> numerics, block 0
#   d: [4, 4, 4] on both                                                    -> agree
OFFLINE = {"a": [3, 4, 2], "b": [2, 2, 2], "c": [1, 1], "d": [4, 4, 4]}
AS_ENGINE = {**OFFLINE, "a": [3, 4, 5]}
ENGINE = {"a": [3, 4, 5], "b": [2, 3, 2], "c": [2], "d": [4, 4, 4]}
COMPLETIONS = {"a": list(range(10)), "b": list(range(7)), "c": [1, 2, 3], "d": list(range(13))}


def evals(ordered: bool = True) -> tuple[dict, dict]:
    offline = {"tau": 2.5, "protocol": {"scoring": "offline", "last_block": "cut"},
               "prompts": [{"id": k, "completion_ids": COMPLETIONS[k], "acceptance_lengths": w,
                            "acceptance_lengths_as_engine": AS_ENGINE[k]} for k, w in OFFLINE.items()]}
    engine = {"engine_mean_acceptance_length": 3.3, "tau": 0.0, "protocol": {"scoring": "engine"},
              "prompts": [{"id": k, "completion_ids": COMPLETIONS[k] if k != "c" else [1, 2, 4],
                           "acceptance_lengths": w, "engine_steps_ordered": ordered} for k, w in ENGINE.items()]}
    return engine, offline


def test_the_gap_comes_apart_into_its_causes():
    report = reconcile(*evals())
    # offline tau = mean(3, 2, 1, 4) = 2.5; pooled = (9+6+2+12)/11 = 29/11
    assert report["offline_tau_pooled"] == pytest.approx(29 / 11)
    parts = report["parts"]
    assert parts["pooling"] == pytest.approx(29 / 11 - 2.5)
    assert parts["end_of_generation"] == pytest.approx(32 / 11 - 29 / 11)  # a's last block 2 -> 5, offline's own
    assert parts["acceptance"] == pytest.approx(33 / 11 - 32 / 11)  # b: 6 -> 7 tokens in 3 blocks
    assert parts["numerics"] == pytest.approx(33 / 10 - 3.0)  # c: 2 blocks of 1 -> 1 block of 2
    assert report["gap"] == pytest.approx(0.8) and report["unexplained"] == 0.0
    assert report["offline_as_engine"] == pytest.approx(32 / 11)
    assert (report["completions_equal"], report["blocks_agree"], report["end_of_generation"],
            report["acceptance_differs"], report["acceptance_differs_as_engine"]) == (3, 1, 1, 2, 1)
    assert report["offline_as_engine_exact"] is True
    assert report["first_differences"] == [  # anchors: the tokens the offline walk produced before the block
        {"id": "a", "block": 2, "engine": 4, "offline": 1, "anchor": 3 + 4, "cause": "end_of_generation"},
        {"id": "b", "block": 1, "engine": 2, "offline": 1, "anchor": 2, "cause": "acceptance"},
        {"id": "c", "block": 0, "engine": 1, "offline": 0, "anchor": 0, "cause": "numerics"}]
    [c] = [p for p in report["prompts"] if p["id"] == "c"]
    assert c["first_token_difference"] == 2
    assert "1 prompt(s) with equal completions accept differently (first at block 1)" in report["verdict"]
    assert report["verdict"].endswith("1 completion(s) differ; nothing unexplained")


def test_walks_that_agree_as_the_engine_counts_say_so():
    engine, offline = evals()
    for p in engine["prompts"]:
        p["acceptance_lengths"] = AS_ENGINE[p["id"]]
        p["completion_ids"] = COMPLETIONS[p["id"]]
    engine["engine_mean_acceptance_length"] = 32 / 11
    report = reconcile(engine, offline)
    assert report["first_differences"] == [{"id": "a", "block": 2, "engine": 4, "offline": 1, "anchor": 7,
                                            "cause": "end_of_generation"}]
    assert report["blocks_agree"] == 3 and report["parts"]["acceptance"] == report["parts"]["numerics"] == 0.0
    assert "every block agrees, counted as the engine counts (1 prompt(s) differ only where the offline walk " \
           "stops at the limit); nothing unexplained" in report["verdict"]


def test_an_offline_eval_without_the_engines_count_says_what_it_cannot_tell_apart():
    engine, offline = evals()
    for p in offline["prompts"]:
        del p["acceptance_lengths_as_engine"]
    report = reconcile(engine, offline)
    assert report["offline_as_engine_exact"] is False and report["parts"]["end_of_generation"] == 0.0
    assert report["parts"]["acceptance"] == pytest.approx(33 / 11 - 29 / 11)  # a's last block now lands here
    assert report["unexplained"] == 0.0 and "end of generation is not told apart" in report["verdict"]


def test_steps_out_of_order_are_never_matched_block_by_block():
    """A histogram (SGLang) gives each step's count but not their order: no block is named."""
    report = reconcile(*evals(ordered=False))
    assert report["steps_ordered"] is False
    assert {d["id"]: (d["block"], d["cause"]) for d in report["first_differences"]} == {
        "a": (None, "end_of_generation"), "b": (None, "acceptance"), "c": (None, "numerics")}
    assert report["unexplained"] == 0.0


def test_mismatched_evals_are_refused():
    engine, offline = evals()
    with pytest.raises(DraftboardError, match="give the engine eval first"):
        reconcile(offline, engine)
    offline["prompts"] = offline["prompts"][:3]
    with pytest.raises(DraftboardError, match="different prompts"):
        reconcile(engine, offline)


def test_results_it_cannot_use_get_one_line_saying_which_field():
    engine, offline = evals()
    cases = [
        (lambda e, o: e.pop("engine_mean_acceptance_length"), "the engine eval: 'engine_mean_acceptance_length'"),
        (lambda e, o: o.update(tau="2.5"), "the offline eval: 'tau' must be a number"),
        (lambda e, o: o["prompts"][0].update(acceptance_lengths=["3"]), "prompt 'a' needs completion_ids"),
        (lambda e, o: e["prompts"][1].update(completion_ids=None), "prompt 'b' needs completion_ids"),
        (lambda e, o: o["prompts"][2].update(acceptance_lengths_as_engine=[0]), "must be a list of positive"),
    ]
    for spoil, message in cases:
        engine, offline = evals()
        spoil(engine, offline)
        with pytest.raises(DraftboardError, match=message.replace("(", r"\(")):
            reconcile(engine, offline)
    with pytest.raises(DraftboardError, match="two eval results"):
        reconcile([], offline)


def _hybrid(engine: dict, offline: dict, *, engine_dtype: str, offline_dtype: str, scoring: str = "offline"):
    """The hand-worked pair on a hybrid target: the engine ran vLLM's CPU GDN code, offline the torch reference."""
    engine["fingerprint"] = {"numerics": {"dtype": engine_dtype, "linear_attention_path": "vllm-native",
                                          "linear_attention": {"functions": {
                                              "torch_chunk_gated_delta_rule": "vllm C++ kernel k",
                                              "gated_norm": "vllm torch n", "spec_decode": "vllm C++ kernel s"}}}}
    engine["engine"] = {"linear_attention": {"settings": {"enable_prefix_caching": "True"}}}
    offline["fingerprint"] = {"numerics": {"dtype": offline_dtype, "linear_attention_path": "fallback",
                                           "linear_attention": {"functions": {
                                               "torch_chunk_gated_delta_rule": "torch", "gated_norm": "vllm torch n"}}}}
    offline["protocol"]["scoring"] = scoring
    return engine, offline


def test_a_hybrid_names_its_causes_where_the_data_shows_them():
    report = reconcile(*_hybrid(*evals(), engine_dtype="bf16", offline_dtype="bf16"))
    hybrid = report["hybrid"]
    assert [(r["piece"], r["severity"]) for r in hybrid["gdn"] if r["severity"] != "ok"] == \
        [("chunk rule (prefill)", "critical")]
    assert hybrid["dtypes"] == {"engine": "bf16", "offline": "bf16"}
    notes = hybrid["notes"]
    assert notes[0] == "Gated DeltaNet code differs: chunk rule (prefill): engine vllm C++ kernel k, offline torch"
    # c's completions differ (numerics), a's last step counted whole, b accepts differently (teacher-forced)
    assert notes[1].startswith("numerics: 1 completion(s) differ") and "different GDN code" in notes[1]
    assert notes[2] == "end of generation: the engine counts its last step whole"
    assert notes[3].startswith("acceptance: 1 prompt(s) with equal completions; the offline walk is teacher-forced")
    assert notes[4].startswith("prefix caching was on")
    assert "not the same protocol" not in report["verdict"]

    online = reconcile(*_hybrid(*evals(), engine_dtype="bf16", offline_dtype="fp32", scoring="online"))
    assert online["hybrid"]["notes"][0].startswith("dtype: the engine ran the target in bf16, the offline eval in fp32")
    assert any("cached loop" in n and "#49036" in n for n in online["hybrid"]["notes"])
    assert online["verdict"].endswith("not the same protocol: the engine ran bf16, the offline eval fp32")
    assert reconcile(*evals())["hybrid"] is None  # no GDN layers on either side: nothing to name


def test_a_llamacpp_eval_is_counted_as_llamacpp_counts():
    """llama.cpp drafts at most the tokens still to come less one and takes no step where that is none
    (`last_block` cut): a `cut` offline walk run to the limit loses a last block anchored at N - 2.
    Hand-worked, N = 10: a: [3, 4, 2] sums to 9 = N - 1, its last block starts at 7 = N - 3: kept;
    b: [4, 4, 1] starts its last block at 8 = N - 2: llama.cpp took no step there, so [4, 4]."""
    offline = {"tau": (3 + 3) / 2, "protocol": {"scoring": "offline", "last_block": "cut"},
               "prompts": [{"id": "a", "completion_ids": list(range(10)), "acceptance_lengths": [3, 4, 2],
                            "acceptance_lengths_as_engine": [3, 4, 5]},
                           {"id": "b", "completion_ids": list(range(10)), "acceptance_lengths": [4, 4, 1],
                            "acceptance_lengths_as_engine": [4, 4, 3]}]}
    engine = {"engine_mean_acceptance_length": 1 + (2 + 3 + 1 + 3 + 3) / 5, "tau": 0.0,
              "protocol": {"scoring": "engine", "last_block": "cut"},
              "prompts": [{"id": "a", "completion_ids": list(range(10)), "acceptance_lengths": [3, 4, 2],
                           "engine_steps_ordered": False},
                          {"id": "b", "completion_ids": list(range(10)), "acceptance_lengths": [4, 4],
                           "engine_steps_ordered": False}]}
    report = reconcile(engine, offline)
    assert report["offline_as_engine"] == pytest.approx(17 / 5) and report["offline_as_engine_exact"] is True
    assert report["parts"]["end_of_generation"] == pytest.approx(17 / 5 - 18 / 6)
    assert report["unexplained"] == 0.0 and report["acceptance_differs_as_engine"] == 0
    assert "every block agrees, counted as the engine counts" in report["verdict"]
    # a `full` offline eval has no `cut` walk to count from: the measured walk stands in, and says so
    offline["protocol"]["last_block"] = "full"
    assert reconcile(engine, offline)["offline_as_engine_exact"] is False


def _two_engines():
    """One offline `cut` eval (N = 10) and two engines of the same prompts: vLLM counts its last step
    whole (a: [3, 4, 5], b: [4, 4, 3]); llama.cpp takes no step without room to draft (a: [3, 4, 2],
    b: [4, 4]). Pooled: offline 18/6 = 3, vLLM 23/6, llama.cpp 17/5."""
    offline = {"tau": 3.0, "protocol": {"scoring": "offline", "last_block": "cut"},
               "prompts": [{"id": k, "completion_ids": list(range(10)), "acceptance_lengths": cut,
                            "acceptance_lengths_as_engine": full}
                           for k, cut, full in (("a", [3, 4, 2], [3, 4, 5]), ("b", [4, 4, 1], [4, 4, 3]))]}

    def engine(name, rule, walks, **settings):
        return {"engine_mean_acceptance_length": sum(map(sum, walks)) / sum(map(len, walks)), "tau": 0.0,
                "protocol": {"scoring": "engine", "last_block": rule}, "engine": {"name": name, **settings},
                "prompts": [{"id": k, "completion_ids": list(range(10)), "acceptance_lengths": w,
                             "engine_steps_ordered": name == "vllm"} for k, w in zip("ab", walks)]}

    vllm = engine("vllm", "full", [[3, 4, 5], [4, 4, 3]], num_speculative_tokens=7, enable_prefix_caching="False")
    llama = engine("llamacpp", "cut", [[3, 4, 2], [4, 4]], num_speculative_tokens=3, cache_prompt=False,
                   spec_draft_p_min=0.0)
    return vllm, llama, offline


def test_two_engines_come_apart_through_their_common_offline_eval():
    from tracker.measurement.reconcile import reconcile_engines

    vllm, llama, offline = _two_engines()
    report = reconcile_engines(vllm, llama, offline)
    assert report["gap"] == pytest.approx(23 / 6 - 17 / 5)
    # (vLLM - offline) - (llama.cpp - offline), part by part: pooling cancels, the rest is the last step
    assert report["parts"] == {"end_of_generation": pytest.approx(23 / 6 - 17 / 5), "acceptance": 0.0,
                               "numerics": 0.0}
    assert report["unexplained"] == 0.0 and report["completions_equal"] == 2 and report["steps_agree"] == 0
    diff = {d["field"]: (d["a_value"], d["b_value"]) for d in report["settings_diff"]}
    assert diff["last_block"] == ("full", "cut") and diff["num_speculative_tokens"] == (7, 3)
    assert "prefix_cache" not in diff  # off on both, whatever each engine calls it
    assert diff["spec_draft_p_min"] == (None, 0.0)  # llama.cpp's own switch: in the table, not the verdict
    assert report["verdict"] == ("vllm 3.833 vs llamacpp 3.400 (gap +0.433): end of generation +0.433; differs: "
                                 "last_block full vs cut; num_speculative_tokens 7 vs 3; nothing unexplained")
    alone = reconcile_engines(vllm, llama)
    assert alone["parts"] == {} and alone["unexplained"] is None and "(--offline)" in alone["verdict"]
    with pytest.raises(DraftboardError, match="the second eval is not an engine eval"):
        reconcile_engines(vllm, offline)


def test_a_stored_number_its_own_steps_contradict_is_refused():
    """Issue 37, finding 12: the engine number is recomputed from the per-step counts the eval holds; a
    summary that disagrees with them (edited, or another tool's) is refused in one line, never reconciled."""
    from tracker.measurement.reconcile import reconcile_engines

    engine, offline = evals()
    engine["engine_mean_acceptance_length"] = 5.0  # its steps give 3.3
    with pytest.raises(DraftboardError, match=r"engine_mean_acceptance_length 5 is not what its own steps give \(3\.3"):
        reconcile(engine, offline)
    vllm, llama, offline = _two_engines()
    llama["engine_mean_acceptance_length"] += 1e-3
    with pytest.raises(DraftboardError, match="the second eval: engine_mean_acceptance_length"):
        reconcile_engines(vllm, llama, offline)


def test_the_cli_reconciles_two_engine_evals(tmp_path, capsys):
    import json

    from tracker.cli import main

    files = {}
    for name, results in zip(("vllm", "llama", "offline"), _two_engines()):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(results))
    assert main(["reconcile", str(files["vllm"]), str(files["llama"]), "--offline", str(files["offline"]),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parts"]["end_of_generation"] == pytest.approx(23 / 6 - 17 / 5)
    for argv, message in (([str(files["vllm"]), str(files["llama"]), "--margins"], "--margins reads an offline"),
                          ([str(files["vllm"]), str(files["offline"]), "--offline", str(files["offline"])],
                           "--offline is the common reference of two engine evals")):
        assert main(["reconcile", *argv]) == 2
        assert message in capsys.readouterr().err


def test_the_served_curve_is_compared_with_the_offline_one_bucket_by_bucket_and_where_they_part_is_named():
    """Issue 50: 4 prompts of 10 tokens, equal completions; offline walks 3,3,3 (contexts 11, 14, 17), the
    engine's steps 3,3,1 (the same contexts); edges 0,16. [0,16): 3 and 3 on both sides, Δ 0; [16,∞): offline 3,
    engine 1 on every prompt, Δ -2: the curves part there, and only there."""
    completion = list(range(9))
    offline = {"tau": 3.0, "protocol": {"scoring": "offline", "last_block": "full"}, "context_buckets": [0, 16],
               "prompts": [{"id": f"p{i}", "input_ids": list(range(10)), "completion_ids": completion,
                            "acceptance_lengths": [3, 3, 3], "acceptance_lengths_as_engine": [3, 3, 3]}
                           for i in range(4)]}
    engine = {"engine_mean_acceptance_length": 7 / 3, "tau": 7 / 3, "protocol": {"scoring": "engine"},
              "prompts": [{"id": f"p{i}", "input_ids": list(range(10)), "completion_ids": completion,
                           "acceptance_lengths": [3, 3, 1], "engine_steps_ordered": True} for i in range(4)]}
    report = reconcile(engine, offline)
    assert [(r["from"], r["tau_a"], r["tau_b"], r["delta"], r["verdict"]) for r in report["by_context"]] == [
        (0, 3.0, 3.0, 0.0, "no detectable difference at this sample size"), (16, 3.0, 1.0, -2.0, "worse")]
    assert "by context the curves part at [16, ∞) engine 1.000 vs offline 3.000" in report["verdict"]
    for p in engine["prompts"]:
        p["engine_steps_ordered"] = False  # a histogram has no order: no curve to compare
    assert reconcile(engine, offline)["by_context"] is None
