"""evaluators/engines/load.py: a load sweep's requests in flight, its records and its flags, on replies as
vLLM writes them (`metrics.speculative_decoding` of a completion with per-request metrics detailed)."""

from __future__ import annotations

import threading
import time

import pytest

from evaluators.engines import busy, load, vllm
from evaluators.engines.base import InFlightCounts
from tracker.cli import main


def vllm_reply(ids: list[int] | None, per_step: list[int], block: int = 8):
    """A reply's counts through vLLM's client, from the stats object vLLM 0.32 attaches to a completion
    (`ids`: its tokens, by default as many as its steps made: the prefill's, then accepted + 1 per step)."""
    ids = list(range(1 + sum(a + 1 for a in per_step))) if ids is None else ids
    histogram = [per_step.count(k) for k in range(block)]
    stats = {"num_spec_steps": len(per_step), "num_draft_tokens": len(per_step) * (block - 1),
             "num_accepted_draft_tokens": sum(per_step), "acceptance_histogram": histogram,
             "per_step_accepted": per_step, "mean_acceptance_length": 1 + sum(per_step) / max(len(per_step), 1)}
    return vllm._from_request_stats(ids, stats, {"time_to_first_token_ms": 3.0})


def test_requests_are_in_flight_level_at_a_time_and_come_back_in_order():
    live, most, lock = [0], [0], threading.Lock()

    def send(r):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
        return [int(r.id)] * 3, None

    requests = [load.Request(str(i), [i], vllm_reply(None, [1, 1, 1])) for i in range(10)]
    seen = []
    arm = load.in_flight(requests, 4, send, seen.append)
    assert most[0] == 4 and [s.id for s in arm.served] == [str(i) for i in range(10)]
    assert sorted(seen) == list(range(1, 11)) and arm.completion_tokens == 30
    assert arm.tokens_per_s == pytest.approx(30 / arm.wall_s) and arm.wall_s >= 0.05 * 3


QUIET = busy.Window(0.0, 0.0)


def _arm(replies, latency=0.5, wall=2.0, box=QUIET):
    served = [load.Served(str(i), r.completion_ids, InFlightCounts.of(r), latency) for i, r in enumerate(replies)]
    return load.Arm(served, wall, box, steps=sum(r.drafts for r in replies))


def _alone(ids, wall, box=QUIET):
    return load.Arm([load.Served(str(i), c, None, 1.0) for i, c in enumerate(ids)], wall, box)


def test_a_level_record_pools_its_requests_own_counts_and_divides_the_two_arms():
    """Hand-worked: two requests, 3 + 1 steps accepting 4+2+0 and 7 tokens: 1 + 13 / 4 = 4.25; 21
    completion tokens in 2 s with the drafter, in 5 s alone: 10.5 vs 4.2 tok/s, speedup 2.5."""
    replies = [vllm_reply(list(range(12)), [4, 2, 0]), vllm_reply(list(range(9)), [7])]
    alone = _alone([r.completion_ids for r in replies], 5.0)
    record = load.level_record(load.Level(4, [_arm(replies)], [alone]), [], checked=True)
    assert record["engine_mean_acceptance_length"] == pytest.approx(1 + 13 / 4)
    assert (record["tokens_per_s"], record["tokens_per_s_target_alone"]) == (10.5, 4.2)
    assert record["speedup"] == pytest.approx(2.5) and record["speedup_ci"] == [pytest.approx(2.5)] * 2
    assert [p["engine_drafts"] for p in record["prompts"]] == [3, 1] and record["prompts"][0]["tokens_per_s"] == 24
    assert record["step_cost"] == pytest.approx(4.25 / 2.5) and record["engine_steps"] == 4
    assert record["prompts"][0]["engine_timings"] == {"time_to_first_token_ms": 3.0}
    assert [p["engine_accepted_per_step"] for p in record["prompts"]] == [[4, 2, 0], [7]]
    unmeasured = load.level_record(load.Level(4, [_arm(replies)], None), [], checked=False)
    assert unmeasured["speedup"] is None and unmeasured["tokens_per_s_target_alone"] is None
    assert unmeasured["step_cost"] is None and unmeasured["speedup_ci"] is None
    assert unmeasured["rounds"] == [{"tokens_per_s": 10.5, "tokens_per_s_target_alone": None, "load_average_1m": 0.0,
                                     "others_cores": 0.0, "busy": False, "engine_steps": 4,
                                     "engine_draft_tokens": 28, "engine_accepted": 13}]
    assert unmeasured["warm_up"] is None


def test_a_levels_speed_is_the_median_of_its_rounds_and_the_speedup_their_ratio_with_its_spread():
    """Hand-worked: 21 tokens per round; the drafter's rounds take 2, 3 and 1.5 s (10.5, 7, 14 tok/s: median
    10.5), the target alone's 5, 6 and 5 s (4.2, 3.5, 4.2: median 4.2): speedup 10.5 / 4.2 = 2.5, as the ratio
    of medians, not the median of ratios (2.5, 2.0, 3.33: also 2.5 here). Rounds are drawn with both arms, so a
    resample of mostly round 2 gives 7 / 3.5 = 2.0 and of mostly round 3 14 / 4.2 = 3.33: each has probability
    7/27 > 2.5%, so they are the interval's ends. The second round ran while another program took a core:
    flagged busy, its load average the larger of its two arms'."""
    replies = [vllm_reply(list(range(12)), [4, 2, 0]), vllm_reply(list(range(9)), [7])]
    ids = [r.completion_ids for r in replies]
    level = load.Level(4, [_arm(replies, wall=2.0), _arm(replies, wall=3.0, box=busy.Window(2.5, 1.0)),
                           _arm(replies, wall=1.5)],
                       [_alone(ids, 5.0), _alone(ids, 6.0, busy.Window(3.1, 0.9)), _alone(ids, 5.0)])
    record = load.level_record(level, [], checked=True)
    assert (record["tokens_per_s"], record["tokens_per_s_target_alone"]) == (10.5, 4.2)
    assert record["speedup"] == pytest.approx(2.5) and record["wall_s"] == 2.0 and record["wall_s_target_alone"] == 5.0
    low, high = record["speedup_ci"]
    assert low == pytest.approx(7 / 3.5) and high == pytest.approx(14 / 4.2)
    assert [r["tokens_per_s"] for r in record["rounds"]] == [10.5, 7.0, 14.0]
    assert [r["busy"] for r in record["rounds"]] == [False, True, False] and record["busy_rounds"] == 1
    assert record["rounds"][1]["load_average_1m"] == 3.1 and record["rounds"][1]["others_cores"] == 1.0
    assert record["load_average_1m"] == 2.5 and record["load_average_1m_target_alone"] == 3.1


def test_a_later_round_that_moved_is_flagged_with_its_round():
    a, b = list(range(10)), list(range(20, 30))
    at_1 = [vllm_reply(a, [3, 1]), vllm_reply(b, [2, 2])]
    requests = [load.Request(str(i), [i], r) for i, r in enumerate(at_1)]
    same = _arm([vllm_reply(r.completion_ids, r.accepted_per_step) for r in at_1])
    moved = _arm([vllm_reply(a[:5] + [0] + a[6:], [3, 1]), vllm_reply(b, [1, 1, 0])])
    assert load.between_rounds(requests, [same, same], greedy=True) == []
    assert load.between_rounds(requests, [same, same, moved], greedy=True) == [
        {"id": "0", "flag": "completion differs between rounds", "round": 3, "first_difference": 5},
        {"id": "1", "flag": "counts differ between rounds", "round": 3, "accepted": [2, 4]}]
    # sampled: another completion is by design (request 0, same counts); counts are still compared
    assert [(f["id"], f["flag"]) for f in load.between_rounds(requests, [same, moved], greedy=False)] == [
        ("1", "counts differ between rounds")]


def test_a_level_whose_replies_count_no_steps_takes_its_steps_from_the_counters():
    """llama.cpp: a reply's drafted and accepted tokens, no steps; the level's 4 steps are the counters'
    move, so 1 + 13 / 4 again, and each request's engine_drafts is null, not a guess."""
    own = [InFlightCounts(list(range(12)), None, 21, 6, {"prompt_ms": 1.5}), InFlightCounts(list(range(9)), None, 7, 7, {})]
    arm = load.Arm([load.Served(str(i), c.completion_ids, c, 0.5) for i, c in enumerate(own)], 2.0, QUIET, steps=4)
    record = load.level_record(load.Level(4, [arm], None), [], checked=True)
    assert record["engine_mean_acceptance_length"] == pytest.approx(1 + 13 / 4)
    assert [p["engine_drafts"] for p in record["prompts"]] == [None, None]
    assert [p["engine_draft_tokens"] for p in record["prompts"]] == [21, 7]


@pytest.mark.parametrize("speedups, crossing", [
    ({1: 2.5, 4: 1.5, 16: 0.5}, 10.0),  # 1.5 at 4, 0.5 at 16: 1 at 4 + 0.5 / 1.0 * 12 = 10
    ({1: 2.5, 4: 1.5}, None),  # still paying at the last level
    ({1: 0.8, 4: 0.6}, None),  # never paid
    ({1: 2.0, 4: 1.0}, 4.0),  # exactly even at a measured level
    ({1: 2.0, 4: None}, None),  # the target alone not measured
    ({1: 1.0, 4: 0.5}, 1.0),  # even already at the first level
])
def test_break_even_is_where_speedup_crosses_one_between_measured_levels(speedups, crossing):
    records = [{"concurrency": c, "speedup": s} for c, s in speedups.items()]
    assert load.break_even(records) == (pytest.approx(crossing) if crossing is not None else None)


def test_the_flags_name_what_moved_and_a_healthy_level_has_none():
    a, b, c = list(range(10)), list(range(20, 30)), [1] * 12
    at_1 = [vllm_reply(a, [3, 1]), vllm_reply(b, [2, 2]), vllm_reply(c, [2, 2, 1])]
    requests = [load.Request(str(i), [i], r) for i, r in enumerate(at_1)]
    healthy = _arm([vllm_reply(r.completion_ids, r.accepted_per_step) for r in at_1])
    same_alone = _alone([r.completion_ids for r in at_1], 3.0)
    assert load.flags(requests, 4, healthy, same_alone, greedy=True, cache={}) == []
    # request 0: another completion from token 3; 1: the same completion in other steps; 2: collapsed
    # (SGLang #36537's signature: accept length 1.00 over every step, with the prefix cache on)
    moved = _arm([vllm_reply(a[:3] + [0] + a[4:], [3, 1]), vllm_reply(b, [1, 1, 0]), vllm_reply(c, [0, 0, 0, 0, 0])])
    other_alone = _alone([a, b[:2] + [0] + b[3:], c], 3.0)
    found = load.flags(requests, 4, moved, other_alone, greedy=True, cache={"enable_prefix_caching": True, "dtype": "x"})
    assert [(f["id"], f["flag"]) for f in found] == [
        ("0", "completion differs from concurrency 1"), ("0", "completion differs from the target alone"),
        ("1", "counts differ from concurrency 1"), ("1", "completion differs from the target alone"),
        ("2", "counts differ from concurrency 1"), ("2", "acceptance collapse")]
    assert found[0]["first_difference"] == 3 and found[3]["first_difference"] == 2
    assert found[2]["steps"] == [3, 2] and found[5]["steps"] == 5 and found[5]["cache"] == {"enable_prefix_caching": True}
    # sampled: completions may differ by design; only the collapse is flagged
    assert [f["flag"] for f in load.flags(requests, 4, moved, other_alone, greedy=False, cache={})] == \
        ["acceptance collapse"]
    # a prompt that accepted little at concurrency 1 is not a collapse when it accepts nothing under load
    weak = [load.Request("w", [0], vllm_reply(c, [0, 0, 1, 0, 0]))]
    assert load.flags(weak, 4, _arm([vllm_reply(c, [0, 0, 0, 0, 0])]), None, greedy=False, cache={}) == []


def test_replies_without_steps_are_compared_and_flagged_by_drafted_tokens():
    """llama.cpp's reply shape (drafted and accepted tokens): 35 drafted (5 steps of 7 at concurrency 1)
    with nothing accepted is a collapse; 14 drafted (2 steps) is not yet one; other drafted tokens than
    concurrency 1's are named as draft_tokens."""
    c = [1] * 12
    requests = [load.Request("0", [0], vllm_reply(c, [2, 2, 1, 2, 1]))]
    collapsed = load.Arm([load.Served("0", c, InFlightCounts(c, None, 35, 0, {}), 0.5)], 1.0, QUIET, steps=5)
    found = load.flags(requests, 4, collapsed, None, greedy=True, cache={"cache_prompt": False})
    assert [f["flag"] for f in found] == ["counts differ from concurrency 1", "acceptance collapse"]
    assert found[0]["draft_tokens"] == [35, 35] and found[0]["accepted"] == [0, 8]
    assert found[1]["steps"] is None and found[1]["cache"] == {"cache_prompt": False}
    early = load.Arm([load.Served("0", c, InFlightCounts(c, None, 14, 0, {}), 0.5)], 1.0, QUIET, steps=2)
    assert [f["flag"] for f in load.flags(requests, 4, early, None, greedy=False, cache={})] == []


@pytest.mark.parametrize("levels, message", [
    ("0", "each concurrency level must be an integer from 1 to 64"),
    ("1,-4", "each concurrency level must be an integer from 1 to 64"),
    ("1,100000", "each concurrency level must be an integer from 1 to 64"),
    ("1,four", "concurrency must be comma-separated integers like 1,4,8"),
])
def test_bad_levels_are_one_line_before_anything_starts(levels, message, tmp_path, capsys):
    assert message in flag_refused(tmp_path, capsys, "--engine", "vllm", "--concurrency", levels)


def flag_refused(tmp_path, capsys, *flags: str) -> str:
    """`draftboard eval` with `flags` refused by the argument parser (exit 2) before anything runs: its stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--target", str(tmp_path), "--drafter", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"),
              *flags])
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    ((), "--concurrency, --repeats and --prefix-caching need --engine"),
    (("--engine", "vllm", "--repeats", "0"), "--repeats: rounds per level from 1 to 20, got 0"),
    (("--engine", "vllm", "--repeats", "21"), "--repeats: rounds per level from 1 to 20, got 21"),
    (("--engine", "sglang"), "a load sweep runs on vllm, llamacpp so far"),
    (("--engine", "llamacpp", "--engine-url", "http://127.0.0.1:9"), "llamacpp's replies carry no verify steps"),
    (("--engine", "llamacpp", "--prefix-caching"), "llamacpp's cache switch is not offered yet"),
    (("--engine", "vllm", "--engine-url", "http://127.0.0.1:9", "--prefix-caching"),
     "an attached server keeps its own setting"),
])
def test_a_sweep_without_an_engine_that_can_run_it_is_refused(extra, message, tmp_path, capsys):
    assert main(["eval", "--target", str(tmp_path), "--drafter", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"),
                 "--concurrency", "1,4", "--no-log", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1]
