"""What a chart on a canvas draws (tracker.dashboard.curve_chart: `spec`, `eval_spec`), read back from its data."""

import math

import numpy as np
import pandas as pd
import pytest

from tracker.dashboard import curve_chart
from tracker.dashboard.curve_chart import X_DTYPE, Y_DTYPE, unpack


def _curves(n_series: int, steps=range(5)) -> pd.DataFrame:
    return pd.DataFrame([{"series": f"run {i}", "owner": f"r{i}", "run_id": f"r{i}", "key": "loss", "step": step,
                          "value": 1.0 / (step + 1) + i, "dashed": False, "reason": ""}
                         for i in range(n_series) for step in steps])


def _lines(spec: dict) -> list[tuple[str, bool, list[float]]]:
    return [(s["name"], s["faint"], unpack(s["y"], Y_DTYPE).tolist()) for s in spec["series"]]


def test_raw_curves_are_drawn_as_logged_in_float32():
    spec = curve_chart.spec(_curves(2), "loss")
    assert unpack(spec["x"], X_DTYPE).tolist() == [0, 1, 2, 3, 4]
    assert [(name, faint) for name, faint, _ in _lines(spec)] == [("run 0", False), ("run 1", False)]
    for (_, _, y), expected in zip(_lines(spec), ([1.0, 0.5, 1 / 3, 0.25, 0.2], [2.0, 1.5, 4 / 3, 1.25, 1.2])):
        assert y == pytest.approx(expected, rel=1e-7)  # float32: 7 significant digits
    assert spec["y_title"] == "loss (nats / token)" and spec["x_title"] == "training step"
    assert spec["x_range"] is None and not spec["log_x"] and not spec["zoomable"]


def test_smoothed_curves_keep_the_raw_one_faint_behind_them_while_few_runs_are_drawn():
    few = _lines(curve_chart.spec(_curves(2), "loss", smoothing=0.5))
    assert [(name, faint) for name, faint, _ in few] == [("run 0", True), ("run 0", False),
                                                         ("run 1", True), ("run 1", False)]
    raw, smoothed = few[0][2], few[1][2]
    assert raw[:2] == [1.0, 0.5]
    # EMA: 0.5 x the previous smoothed value + 0.5 x its own.
    assert smoothed[:3] == pytest.approx([1.0, 0.75, 0.5 * 0.75 + 0.5 / 3])
    many = _lines(curve_chart.spec(_curves(curve_chart.RAW_BEHIND_MAX_SERIES + 1), "loss", smoothing=0.5))
    assert len(many) == curve_chart.RAW_BEHIND_MAX_SERIES + 1 and not any(faint for _, faint, _ in many)


def test_series_share_the_union_of_their_steps_with_holes_where_one_did_not_log():
    frame = pd.concat([_curves(1, steps=[0, 10, 20]),
                       _curves(2, steps=[5, 10]).query("series == 'run 1'")])
    spec = curve_chart.spec(frame, "loss")
    assert unpack(spec["x"], X_DTYPE).tolist() == [0, 5, 10, 20]
    (_, _, first), (_, _, second) = _lines(spec)
    assert first[0] == 1.0 and math.isnan(first[1]) and first[3] == pytest.approx(1 / 21)
    assert math.isnan(second[0]) and second[1] == pytest.approx(1 / 6 + 1) and math.isnan(second[3])


def test_a_dashed_series_says_why_and_each_run_keeps_its_colour():
    frame = _curves(2)
    frame.loc[frame["series"] == "run 1", "reason"] = "≠ reference: dtype"
    spec = curve_chart.spec(frame, "loss", colors={"r0": "#111111", "r1": "#222222"})
    assert [(s["name"], s["color"], s["dashed"], s["reason"]) for s in spec["series"]] == [
        ("run 0", "#111111", False, ""), ("run 1", "#222222", True, "≠ reference: dtype")]


def test_a_log_axis_leaves_out_step_zero_and_a_zoom_spans_its_window():
    spec = curve_chart.spec(_curves(1), "loss", log_x=True, x_range=(1, 3), zoomable=True)
    assert unpack(spec["x"], X_DTYPE).tolist() == [1, 2, 3, 4]
    assert spec["x_title"] == "training step (log scale)" and spec["x_range"] == [1, 3] and spec["zoomable"]


def test_names_are_data_not_markup():
    """uPlot writes a series name with textContent: it must arrive exactly as the user wrote it, and
    nothing in the chart's code may parse a string as HTML."""
    frame = _curves(1).assign(series="<img src=x onerror=alert(1)> & co")
    assert curve_chart.spec(frame, "loss")["series"][0]["name"] == "<img src=x onerror=alert(1)> & co"
    assert not any(sink in curve_chart.JS for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval("))


def test_pack_round_trips_nan_and_large_steps():
    steps = np.array([0, 2**40, 2**53], dtype=np.int64)
    assert unpack(curve_chart.pack(steps, X_DTYPE), X_DTYPE).tolist() == [0, 2**40, 2**53]
    values = unpack(curve_chart.pack(np.array([1.5, np.nan]), Y_DTYPE), Y_DTYPE)
    assert values[0] == 1.5 and math.isnan(values[1])


def test_a_series_of_one_point_is_drawn_as_its_point():
    """Issue 39: a one-point series (an eval of one checkpoint, a run that logged once) has no line:
    it is marked `single`, and the chart draws its point instead of nothing."""
    frame = pd.concat([_curves(1, steps=[0, 10, 20]), _curves(2, steps=[10]).query("series == 'run 1'")])
    spec = curve_chart.spec(frame, "loss")
    assert [(s["name"], s["single"]) for s in spec["series"]] == [("run 0", False), ("run 1", True)]
    assert "s.single ? { show: true" in curve_chart.JS


def _evals(rows) -> pd.DataFrame:
    """Eval points as `compare.POINT_COLUMNS` holds them: (series, owner, step, value, low, high, reason)."""
    return pd.DataFrame([{"series": series, "owner": owner, "run_id": f"{series}-{step}", "train_run_id": owner,
                          "key": "tau", "step": step, "value": value, "low": low, "high": high, "scoring": "offline",
                          "dashed": bool(reason), "reason": reason, "env": "cpu · fp32"}
                         for series, owner, step, value, low, high, reason in rows])


def test_an_eval_chart_marks_each_checkpoint_with_its_interval_where_it_has_one():
    nan = float("nan")
    spec = curve_chart.eval_spec(_evals([("v1", "t1", 100, 3.0, 2.5, 3.5, ""), ("v1", "t1", 200, 4.0, nan, nan, ""),
                                         ("v1 fp32", "t1", 200, 3.8, 3.6, 4.0, "≠ training: dtype"),
                                         ("v2", "t2", 300, 5.0, 4.0, 6.0, "")]), "tau")
    assert spec["markers"] and spec["x_title"] == "checkpoint step" and spec["ticks"] == [100, 200, 300]
    by_name = {s["name"]: s for s in spec["series"]}
    # Two series of one run at one checkpoint: the second marker is smaller, so neither hides the other.
    assert [by_name[n]["marker_px"] for n in ("v1", "v1 fp32", "v2")] == [11, 8, 11]
    assert by_name["v1 fp32"]["dashed"] and by_name["v1"]["env"] == "cpu · fp32"
    low = unpack(by_name["v1"]["low"], Y_DTYPE)
    assert low[0] == 2.5 and math.isnan(low[1]) and math.isnan(low[2])  # step 200 has no interval, 300 no point
    assert spec["references"] == []


def test_an_eval_chart_ticks_each_checkpoint_only_while_they_are_few():
    rows = [("v1", "t1", step, 1.0, nan, nan, "") for step in range(0, 13 * 10, 10) for nan in [float("nan")]]
    assert curve_chart.eval_spec(_evals(rows[:12]), "tau")["ticks"] == list(range(0, 120, 10))
    assert curve_chart.eval_spec(_evals(rows), "tau")["ticks"] is None  # 13 checkpoints: the axis picks its ticks


def test_the_reference_lines_carry_their_label_band_and_style():
    spec = curve_chart.eval_spec(_evals([("v1", "t1", 100, 3.0, 2.5, 3.5, "")]), "tau", references=[
        {"value": 4.5, "label": "<b>z-lab</b> @ abc", "low": 4.2, "high": 4.8},
        {"value": 5, "label": "z-lab · avg over math500 · other prompts: shape only", "apart": True}])
    assert spec["references"] == [
        {"value": 4.5, "label": "<b>z-lab</b> @ abc", "low": 4.2, "high": 4.8, "apart": False},
        {"value": 5.0, "label": "z-lab · avg over math500 · other prompts: shape only", "low": None, "high": None,
         "apart": True}]