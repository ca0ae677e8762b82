"""z-lab's cached online loop (evaluators/online.py) and `draftboard check-lossless`."""

import json

import pytest

from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from evaluators.online import OnlineRun, lossless_row
from online_loop import hybrid_pair
from tracker.cli import main
from tracker.errors import DraftboardError

MAX_NEW = 40


def test_lossless_row_on_a_hand_worked_case():
    # Blocks produce 2, 3, 1, 2 tokens: completion positions 1-2, 3-5, 6, 7-8 (0 is the prefill's).
    run = OnlineRun([5, 6, 7, 8, 9, 1, 2, 3, 4], [2, 3, 1, 2], [(False, 1e-6), (True, 0.02), (False, 3e-6)])
    greedy = [5, 6, 7, 8, 9, 1, 0, 3, 4]
    row = lossless_row("p", run, greedy)
    assert (row.equals_greedy, row.first_divergence, row.blocks_agreeing, row.n_blocks) == (False, 6, 2, 4)
    assert row.max_gap_after_accept == 3e-6 and row.max_gap_after_reject == 0.02
    same = lossless_row("q", OnlineRun([5, 6], [1], []), [5, 6])
    assert same.equals_greedy and same.first_divergence is None and same.blocks_agreeing == 1
    assert same.max_gap_after_accept is None and same.max_gap_after_reject is None
    # A completion that stops early differs at the first position greedy has and it lacks.
    assert lossless_row("r", OnlineRun([5], [], []), [5, 6]).first_divergence == 1


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("lossless")
    hybrid_pair(root, MAX_NEW)
    return root


def test_check_lossless_names_the_prompts_that_leave_greedy_on_a_hybrid_target(hybrid, tmp_path, capsys):
    out = tmp_path / "lossless.json"
    rc = main(["check-lossless", "--target", str(hybrid / "target"), "--drafter", str(hybrid / "drafter"),
               "--prompts", str(hybrid / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW), "--device", "cpu",
               "--out", str(out)])
    report = json.loads(out.read_text())
    rows = report["prompts"]
    diverged = [r["id"] for r in rows if not r["equals_greedy"]]
    # Measured on this fixture (transformers 5.24, fp32, CPU): p2 leaves greedy at completion
    # position 5; gaps after accepted blocks <= 2.1e-5, after rejected drafts up to 1.7e-3.
    assert diverged and rc == 1 and report["n_diverged"] == len(diverged)
    printed = capsys.readouterr().out
    assert f"{len(diverged)}/{len(rows)} completions leave greedy decoding" in printed
    assert all(f"{d} " in printed and "NO" in printed for d in diverged)
    for r in rows:
        if not r["equals_greedy"]:
            assert r["first_divergence"] is not None and r["blocks_agreeing"] < r["n_blocks"]
    after_accept = [r["max_gap_after_accept"] for r in rows if r["max_gap_after_accept"] is not None]
    after_reject = [r["max_gap_after_reject"] for r in rows if r["max_gap_after_reject"] is not None]
    # The recurrent state crop cannot roll back: only blocks after rejected drafts see large gaps.
    assert after_accept and max(after_accept) < 1e-4
    assert max(after_reject) > 1e-3


def test_online_scoring_reports_the_cached_loop_beside_the_offline_numbers(hybrid, tmp_path):
    res = evaluate(EvalSettings(str(hybrid / "target"), str(hybrid / "drafter"), str(hybrid / "prompts.jsonl"),
                                max_new_tokens=MAX_NEW, budgets=(2,), device="cpu", cache_dir=str(tmp_path),
                                scoring="online"))
    assert res["protocol"]["scoring"] == "online" and set(res["offline"]) == {"tau", "tau_pooled"}
    # The cached loop leaves greedy on this hybrid target (see above), so its completions and
    # acceptance differ from the offline walk's somewhere.
    assert any(r["acceptance_lengths"] != r["offline_acceptance_lengths"] for r in res["prompts"])
    assert sum(res["accept_len_histogram"]) == sum(len(r["acceptance_lengths"]) for r in res["prompts"])
    with pytest.raises(DraftboardError, match="drop --completions"):
        EvalSettings("t", "d", "p", completions="c.jsonl", scoring="online")
