"""`draftboard compare RUN_A RUN_B [--fail-if-worse]` on eval runs in a real MLflow store."""

from __future__ import annotations

import random
import re

import pytest

from tracker.cli import main
from tracker.measurement.protocol import Protocol


def results(lengths: dict[str, list[int]], protocol: Protocol | None = None, shift: int = 0) -> dict:
    prompts = [{"id": pid, "input_ids": [len(pid) + shift, 7], "acceptance_lengths": acc}
               for pid, acc in lengths.items()]
    out = {"schema": "draftboard.eval/1", "tau": 0.0, "prompts": prompts}
    if protocol is not None:
        out["protocol"] = protocol.to_dict()
    return out


def log(tracker, machine_fp, doc: dict, name: str = "eval") -> str:
    with tracker.eval_run(name, target="tiny", fingerprint=machine_fp) as ev:
        ev.log_json("eval_results.json", doc)
    return ev.run_id


@pytest.fixture(scope="module")
def base():
    rng = random.Random(0)
    return {f"p{i}": [rng.randint(1, 5) for _ in range(8)] for i in range(40)}


def better(base):
    rng = random.Random(1)
    return {pid: [x + rng.choice((0, 1, 1)) for x in acc] for pid, acc in base.items()}


def compare(store_uri, a, b, *flags):
    return main(["compare", a, b, "--tracking-uri", store_uri, *flags])


def test_an_eval_against_itself(tracker, store_uri, machine_fp, base, capsys):
    run = log(tracker, machine_fp, results(base))
    assert compare(store_uri, run, run, "--fail-if-worse") == 0
    out = capsys.readouterr().out
    assert "delta tau (B - A) +0.000  95% CI [+0.000, +0.000]  paired bootstrap over 40 prompts" in out
    assert "verdict: no detectable difference at this sample size" in out


def test_better_and_worse(tracker, store_uri, machine_fp, base, capsys):
    a, b = log(tracker, machine_fp, results(base)), log(tracker, machine_fp, results(better(base)))
    assert compare(store_uri, a, b, "--fail-if-worse") == 0
    out = capsys.readouterr().out
    assert "verdict: B is better" in out and f"A {a}: tau " in out and "95% CI [" in out
    assert compare(store_uri, b, a) == 0  # worse, but no gate asked for
    assert "verdict: B is worse" in capsys.readouterr().out
    assert compare(store_uri, b, a, "--fail-if-worse") == 1
    assert compare(store_uri, b[:8], a[:8], "--fail-if-worse") == 1  # unique prefixes, as Runs' search takes them
    assert compare(store_uri, "0123456789", a) == 2 and "no run with id '0123456789' (or an id starting so)" in \
        capsys.readouterr().err


def test_a_protocol_difference_that_changes_tau_is_refused(tracker, store_uri, machine_fp, base, capsys):
    a = log(tracker, machine_fp, results(base, Protocol(enable_thinking=True, scoring="offline", max_new_tokens=64)))
    b = log(tracker, machine_fp, results(base, Protocol(enable_thinking=False, scoring="offline", max_new_tokens=64)))
    assert compare(store_uri, a, b) == 2
    err = capsys.readouterr().err
    assert err == ("error: the evals' protocols differ critically (protocol.enable_thinking: True vs False): their "
                   "taus are not comparable\n")
    # Issue 65 M7 / H1: a series is one protocol. A 256-token and a 64-token eval of one checkpoint, or an offline
    # and an online one, are two series: no verdict across them.
    for other, field in ((Protocol(enable_thinking=True, scoring="offline", max_new_tokens=256),
                          "protocol.max_new_tokens: 64 vs 256"),
                         (Protocol(enable_thinking=True, scoring="online", max_new_tokens=64),
                          "protocol.scoring: offline vs online")):
        c = log(tracker, machine_fp, results(base, other))
        assert compare(store_uri, a, c) == 2 and field in capsys.readouterr().err
    same = log(tracker, machine_fp, results(base, Protocol(enable_thinking=True, scoring="offline", max_new_tokens=64)))
    assert compare(store_uri, a, same) == 0


@pytest.mark.parametrize("change, message", [
    (lambda base: {**{k: v for k, v in base.items() if k != "p3"}, "q9": [2]},
     "not run on the same prompts: 1 prompt id.s. only in A, 1 only in B"),
    (None, "prompt 'p0' has different token ids in the two evals"),
])
def test_different_prompt_sets_are_bad_input(tracker, store_uri, machine_fp, base, capsys, change, message):
    a = log(tracker, machine_fp, results(base))
    other = results(change(base)) if change else results(base, shift=1)
    b = log(tracker, machine_fp, other)
    assert compare(store_uri, a, b, "--fail-if-worse") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(message, err) and err.count("\n") == 1


def test_runs_without_eval_results(tracker, store_uri, machine_fp, base, capsys):
    a = log(tracker, machine_fp, results(base))
    with tracker.training_run("train", {}, "tiny", fingerprint=machine_fp) as train:
        pass
    assert compare(store_uri, a, train.run_id) == 2
    assert "has no readable eval_results.json" in capsys.readouterr().err
    assert compare(store_uri, a, "0" * 32) == 2
    assert "no run with id" in capsys.readouterr().err
    broken = log(tracker, machine_fp, {"schema": "draftboard.eval/1", "prompts": [{"id": "x"}]})
    assert compare(store_uri, a, broken) == 2
    assert "no per-prompt scores" in capsys.readouterr().err


def test_the_same_mean_worse_at_long_contexts_is_shown_per_bucket_and_fails_the_gate(tracker, store_uri, machine_fp,
                                                                                     capsys):
    """Issue 50: A walks 1,4,4 and B 3,3,3 on 10-token prompts (contexts 11,12,16 and 11,14,17; edges 0,16): the
    means agree (3.0), B accepts more below 16 tokens of context (3.0 vs 2.5) and less from 16 on (3.0 vs 4.0)."""
    def doc(walk):
        return {"schema": "draftboard.eval/1", "tau": 3.0, "context_buckets": [0, 16],
                "prompts": [{"id": f"p{i}", "input_ids": list(range(10)), "acceptance_lengths": walk} for i in range(8)]}

    a, b = log(tracker, machine_fp, doc([1, 4, 4])), log(tracker, machine_fp, doc([3, 3, 3]))
    assert compare(store_uri, a, b) == 0
    out = capsys.readouterr().out
    assert "verdict: no detectable difference at this sample size" in out
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if line.startswith("[")]
    assert rows == [["[0, 16)", "16/16", "2.500", "3.000", "+0.500 [+0.500, +0.500]", "better"],
                    ["[16, ∞)", "8/8", "4.000", "3.000", "-1.000 [-1.000, -1.000]", "worse"]]
    assert "intervals Bonferroni over the 2 buckets compared" in out
    assert compare(store_uri, a, b, "--fail-if-worse") == 1
