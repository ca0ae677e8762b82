"""Shape-preserving decimation of metric histories (`tracker.store.history.decimate`), the step window
Compare zooms with, and both over histories read from a real sqlite MLflow store."""

import numpy as np
import pandas as pd
import pytest

from tracker.store.history import decimate, decimated, load_histories, window


def test_each_bucket_keeps_its_minimum_and_maximum_and_the_ends():
    # Steps 0..9 in 2 buckets: floor(step * 2 / 9) puts 0-4 in the first, 5-9 in the second.
    values = np.array([0, 5, 1, 1, 9, 1, 1, -3, 1, 2], dtype=float)
    kept = decimate(np.arange(10), values, 2)
    # First bucket: min 0 (step 0), max 9 (step 4); second: min -3 (step 7), max 2 (step 9, also the last).
    assert kept.tolist() == [0, 4, 7, 9]


def test_a_single_step_spike_survives_any_reduction():
    steps = np.arange(0, 100_000, 10)
    values = np.ones(len(steps))
    values[4321] = 50.0
    values[8765] = -7.0
    kept = decimate(steps, values, 100)
    assert len(kept) <= 202
    assert 4321 in kept and 8765 in kept
    assert kept[0] == 0 and kept[-1] == len(steps) - 1


def test_short_histories_are_kept_whole():
    assert decimate(np.arange(6), np.arange(6.0), 2).tolist() == [0, 1, 2, 3, 4, 5]  # 6 <= 2 * 2 + 2
    assert decimate(np.array([5]), np.array([1.0]), 3).tolist() == [0]
    with pytest.raises(ValueError):
        decimate(np.arange(3), np.arange(3.0), 0)


def test_nan_is_neither_minimum_nor_maximum_but_an_all_nan_bucket_keeps_a_point():
    # Steps 0..11 in 3 buckets of 4: [nan 2 nan 1] [nan nan nan nan] [3 nan 8 4].
    nan = np.nan
    values = np.array([nan, 2, nan, 1, nan, nan, nan, nan, 3, nan, 8, 4])
    kept = decimate(np.arange(12), values, 3).tolist()
    assert {1, 3} <= set(kept) and {8, 10} <= set(kept)  # each bucket's max and min, not its NaNs
    assert any(4 <= i <= 7 for i in kept)  # the gap stays a gap
    assert kept[0] == 0 and kept[-1] == 11


def test_random_histories_keep_every_buckets_extremes():
    rng = np.random.default_rng(7)
    steps = np.cumsum(rng.integers(1, 5, 5000))
    values = rng.normal(size=5000)
    buckets = 37
    kept = decimate(steps, values, buckets)
    assert len(kept) <= 2 * buckets + 2 and np.all(np.diff(kept) > 0)
    bucket = np.minimum((steps - steps[0]) * buckets // (steps[-1] - steps[0]), buckets - 1)
    for b in range(buckets):
        inside = values[bucket == b]
        kept_inside = values[kept][bucket[kept] == b]
        assert kept_inside.min() == inside.min() and kept_inside.max() == inside.max()


def test_window_is_inclusive_on_both_ends():
    steps = np.array([0, 10, 20, 30])
    assert window(steps, 10, 20) == slice(1, 3)
    assert window(steps, 11, 19) == slice(2, 2)  # empty
    assert window(steps, None, 10) == slice(0, 2) and window(steps) == slice(0, 4)
    assert window(steps, 40, 50) == slice(4, 4)


def test_decimated_frame_cuts_each_history_on_its_own():
    frame = pd.DataFrame({"run_id": ["a"] * 6 + ["b"] * 3, "key": ["x"] * 3 + ["y"] * 3 + ["x"] * 3,
                          "step": [0, 1, 2, 0, 1, 2, 1, 2, 3], "value": np.arange(9.0), "timestamp": 0})
    out = decimated(frame, 1, 1, 2)  # every history: 2 points in the window, within 2 * 1 + 2
    assert list(zip(out["run_id"], out["key"], out["step"])) == [
        ("a", "x", 1), ("a", "x", 2), ("a", "y", 1), ("a", "y", 2), ("b", "x", 1), ("b", "x", 2)]
    assert decimated(frame.iloc[:0], 3).empty


def test_a_zoom_into_a_real_store_shows_every_logged_point(tmp_path):
    from tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with Tracker(uri).training_run("long", {}, "/m/T") as run:
        for step in range(3000):
            run.log_step(step, loss=100.0 if step == 1234 else 1.0 / (step + 1))
    full = load_histories(uri, [run.run_id])
    overview = decimated(full, 50)
    assert len(overview) <= 102 and 1234 in set(overview["step"])  # the spike survives
    zoomed = decimated(full, 50, 1200, 1299)  # 100 steps: every logged point
    assert zoomed["step"].tolist() == list(range(1200, 1300))
    assert zoomed["value"].tolist() == full[full["step"].between(1200, 1299)]["value"].tolist()


def _rows(run_id, key, steps, values):
    return pd.DataFrame({"run_id": run_id, "key": key, "step": np.asarray(steps, dtype="int64"),
                         "value": np.asarray(values, dtype=float), "timestamp": np.zeros(len(steps), dtype="int64")})


def test_a_step_metric_becomes_the_x_axis_of_its_run_only():
    from tracker.store.history import on_step_metric

    axis = "train/optimizer_step"
    specforge = pd.concat([_rows("sf", axis, [0, 1, 2], [100, 200, 300]),
                           _rows("sf", "train/loss", [0, 1, 2], [3.0, 2.0, 1.0]),
                           _rows("sf", "eval/avg_acc", [1, 5], [0.4, 0.9])])  # row 5 has no optimizer step
    ours = _rows("ours", "loss", [1, 2], [2.0, 1.0])
    old = _rows("sf-old", "train/loss", [50, 100], [2.5, 1.5])  # written before the tool logged its axis
    out = on_step_metric(pd.concat([specforge, ours, old]), {"sf": axis, "sf-old": axis})
    by = {(r, k): list(zip(g["step"], g["value"])) for (r, k), g in out.groupby(["run_id", "key"])}
    assert by[("sf", "train/loss")] == [(100, 3.0), (200, 2.0), (300, 1.0)]
    assert by[("sf", "eval/avg_acc")] == [(200, 0.4)]
    assert ("sf", axis) not in by
    assert by[("ours", "loss")] == [(1, 2.0), (2, 1.0)] and by[("sf-old", "train/loss")] == [(50, 2.5), (100, 1.5)]
    # a downsampled frame is placed from the axis read in full
    thin = _rows("sf", "train/loss", [2], [1.0])
    assert on_step_metric(thin, {"sf": axis}, specforge)["step"].tolist() == [300]
