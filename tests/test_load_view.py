"""tracker/dashboard/load_view.py: a load sweep as Run detail and Compare show it, from a real store."""

from __future__ import annotations

import pytest

from tracker.dashboard.index import load_run_index
from tracker.dashboard.load_view import load_curves
from tracker.store import names


def test_two_sweeps_of_one_checkpoint_are_two_lines_never_one_zigzag(tracker):
    """Issue 65 M3: the same checkpoint swept twice (a busy box moved 0.69 -> 0.60 at 1 and 1.05 -> 1.61 at 2) drew
    as one line through four points. Each eval is its own line, told apart by its run id, with its interval."""
    with tracker.training_run("drafter", {"lr": 1e-4}, target="t") as train:
        pass
    evals = []
    for at_1, at_2 in ((0.69, 1.05), (0.60, 1.61)):
        with tracker.eval_run("drafter @ step 200", target="t", train_run_id=train.run_id, checkpoint_step=200,
                              params={"engine": "llamacpp"}) as run:
            run.log_metrics({names.load_metric(1, "speedup"): at_1, names.load_metric(2, "speedup"): at_2,
                             names.load_metric(2, "speedup_ci_low"): at_2 - 0.1,
                             names.load_metric(2, "speedup_ci_high"): at_2 + 0.1}, step=200)
            evals.append(run.run_id)
    index = load_run_index(tracker)
    frame = load_curves(index, [index.runs[train.run_id]])
    lines = {series: part for series, part in frame.groupby("series")}
    assert len(lines) == 2 and all(any(ev[:8] in series for series in lines) for ev in evals)
    assert sorted(tuple(part.sort_values("concurrency")["speedup"]) for part in lines.values()) == \
        [(0.6, 1.61), (0.69, 1.05)]
    assert sorted(frame["speedup_ci_high"].dropna()) == pytest.approx([1.15, 1.71])
