"""Plotly figures of tracker.dashboard.charts, read back from the figure."""

import pandas as pd

from tracker.dashboard import charts


def _curves(n_series: int) -> pd.DataFrame:
    return pd.DataFrame([{"series": f"run {i}", "owner": f"r{i}", "run_id": f"r{i}", "key": "loss", "step": step,
                          "value": 1.0 / (step + 1) + i, "dashed": False, "reason": ""}
                         for i in range(n_series) for step in range(5)])


def test_smoothed_curves_keep_the_raw_one_faint_behind_them_while_few_runs_are_drawn():
    few = charts.step_curves(_curves(2), "loss", smoothing=0.5)
    faint = [t for t in few.data if t.showlegend is False]
    assert len(few.data) == 4 and len(faint) == 2 and {t.opacity for t in faint} == {0.25}
    # The smoothed trace is the EMA of the raw one: 0.5 x previous + 0.5 x own.
    named = next(t for t in few.data if t.name == "run 0")
    assert list(named.y[:2]) == [1.0, 0.5 * 1.0 + 0.5 * 0.5]
    many = charts.step_curves(_curves(charts.RAW_BEHIND_MAX_SERIES + 1), "loss", smoothing=0.5)
    assert len(many.data) == charts.RAW_BEHIND_MAX_SERIES + 1 and all(t.showlegend is not False for t in many.data)
    raw = charts.step_curves(_curves(2), "loss", smoothing=0.0)
    assert [list(t.y) for t in raw.data] == [[1.0, 0.5, 1 / 3, 0.25, 0.2], [2.0, 1.5, 4 / 3, 1.25, 1.2]]
