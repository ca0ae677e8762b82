"""tracker/measurement/known_bad.py: the known-bad table as data. Every row is checked to hold for a box that has
what it names and not for one that lacks it; hand-worked boxes for the rows doctor reads through its own checks
(tests/test_doctor.py) and for the ones added with the table."""

from __future__ import annotations

import json

import pytest

from evaluators.doctor import serving
from tracker.measurement import known_bad
from tracker.measurement.known_bad import ROWS, Serving, evaluate, matches, release


def _having(wanted):
    """A value that satisfies a `when` condition."""
    if isinstance(wanted, list):
        return wanted[0]
    if isinstance(wanted, dict) and "prefix" in wanted:
        return wanted["prefix"][0] + "8_0"
    if isinstance(wanted, dict) and "min" in wanted:
        return wanted["min"]
    return wanted


def _lacking(wanted):
    """A value that does not."""
    if isinstance(wanted, bool):
        return not wanted
    if isinstance(wanted, dict) and "min" in wanted:
        return wanted["min"] - 1
    return "something else"


def _version(row) -> str | None:
    v = row.versions
    if "exact" in v:
        return v["exact"]
    if "below" in v:
        low = release(v["below"])
        return "0.0.1" if low > (0, 0, 1) else None
    return v.get("from", "1.0.0")


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_row_holds_for_a_box_that_has_what_it_names_and_only_then(row):
    box = Serving(row.engine, _version(row), {k: _having(w) for k, w in row.when.items()})
    assert row in matches(box)
    for key, wanted in row.when.items():  # any one condition not met: the row does not hold
        assert row not in matches(Serving(row.engine, box.version, {**box.settings, key: _lacking(wanted)}))
        undecided = [f for f in evaluate(Serving(row.engine, box.version, {**box.settings, key: None}))
                     if f.row == row]
        assert [(f.state, f.missing) for f in undecided] == [(known_bad.UNDECIDED, (key,))]
    assert row not in matches(Serving("another engine", box.version, box.settings))
    if row.versions:
        assert row not in matches(Serving(row.engine, "999.0.0", box.settings))
    assert row.source and row.fix and row.severity in ("critical", "warning")


def test_versions_compare_as_releases():
    (gates,) = [r for r in ROWS if r.id == "vllm-gdn-gates-before-0.28"]
    hybrid = {"hybrid": True}
    assert [gates in matches(Serving("vllm", v, hybrid)) for v in ("0.27.1rc2.dev3+cu128", "0.28.0", "0.28", "1.0")] \
        == [True, False, False, False]
    assert [f.state for f in evaluate(Serving("vllm", "nightly", hybrid)) if f.row == gates] == [known_bad.UNDECIDED]
    # Issue 64, F5: a version an attached server or a log reports is untrusted text: never a crash.
    assert known_bad.release("0.²8.0") is None
    assert known_bad.release("0." + "9" * 5000) is None and known_bad.release("٣.1.0") is None
    assert [f.state for f in evaluate(Serving("vllm", "0.²8.0", hybrid)) if f.row == gates] == [known_bad.UNDECIDED]


@pytest.mark.parametrize("config, hybrid, family, check, severity, source", [
    # SGLang 0.5.9 with TP > 1 on a hybrid: garbage (sglang #21039); TP 1, or another release: fine
    ({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8, "sglang_version": "0.5.9", "tp_size": 2},
     True, None, "engine_version", "critical", "sglang #21039"),
    ({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8, "sglang_version": "0.5.9", "tp_size": 1},
     True, None, "engine_version", "ok", None),
    # the radix cache's extra_buffer strategy on a hybrid (sglang #36537): the lazy one is the fix
    ({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8, "disable_radix_cache": False,
      "mamba_radix_cache_strategy": "extra_buffer"}, True, None, "prefix_cache", "warning", "sglang #36537"),
    # DFlash2 on vLLM's V1 runner is served as base DFlash (club-3090 #1064); on V2 it is not that row's
    ({"speculative_config": {"method": "dflash", "num_speculative_tokens": 7}, "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}},
     None, "dflash2", "model_runner", "critical", "club-3090 #1064"),
    ({"speculative_config": {"method": "dflash", "num_speculative_tokens": 7}, "env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}},
     None, "dflash", "model_runner", "ok", None),
])
def test_doctor_reads_the_rows_added_with_the_table(tmp_path, config, hybrid, family, check, severity, source):
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(config))
    box = serving.read_serving_config(path)
    found = serving.known_bad_check(check, box, hybrid, family)
    assert found.severity == severity, found
    if source:
        assert source in found.verdict
    else:
        assert found.verdict.startswith("no known-bad")
