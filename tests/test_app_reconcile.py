"""Run detail draws an engine eval's reconciliation with an offline eval of the same checkpoint and
prompts: the hand-worked pair of tests/test_reconcile.py, logged as two eval runs of a real store."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

import pytest
from apptest import page_text, run_page, serve
from test_reconcile import _hybrid, evals

from evaluators.logging import load_metric_values
from tracker.store import names
from tracker.store.tracker import Tracker


def _values(array) -> list:
    """A plotly figure's array as sent to the browser (a list, or plotly's typed-array encoding)."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def log_eval(uri: str, checkpoint: Path, name: str, results: dict, scoring: str) -> str:
    """One eval of `checkpoint` on the pair's prompt set, scored `scoring`: its run id."""
    tags = {names.protocol_tag("scoring"): scoring, names.protocol_tag("prompt_digest"): "abc123"}
    with Tracker(uri).eval_run(name, target="t", checkpoint=str(checkpoint), tags=tags, fingerprint=results.get(
                               "fingerprint"), params={"engine": "vllm"} if scoring == "engine" else {}) as run:
        run.log_metrics({"tau": results["tau"], **load_metric_values(results)}, step=0)
        run.log_json(names.EVAL_RESULTS_ARTIFACT, results)
    return run.run_id


def log_pair(tmp_path, engine: dict, offline: dict) -> tuple[str, dict[str, str]]:
    """The two evals as runs of one checkpoint on one prompt set, in a store of their own."""
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    checkpoint = tmp_path / "drafter"
    checkpoint.mkdir()
    return uri, {name: log_eval(uri, checkpoint, name, results, scoring)
                 for name, results, scoring in (("served", engine, "engine"), ("offline", offline, "offline"))}


def served_detail(tmp_path, monkeypatch, engine: dict, offline: dict):
    """Run detail of the engine eval, the pair logged and served: (page, its text, store, run ids)."""
    uri, ids = log_pair(tmp_path, engine, offline)
    serve(monkeypatch, uri, tmp_path / "home", tmp_path)
    at = run_page("pages/run_detail.py", run=ids["served"])
    assert not at.exception, [e.message for e in at.exception]
    return at, page_text(at), uri, ids


def test_run_detail_reconciles_an_engine_eval_with_its_offline_twin(tmp_path, monkeypatch):
    engine, offline = evals()
    engine["prompts"][0]["id"] = offline["prompts"][0]["id"] = "<img src=x onerror=alert(1)>"  # a user's id
    at, text, _, ids = served_detail(tmp_path, monkeypatch, engine, offline)
    assert "engine 3.300 vs offline tau 2.500 (gap +0.800)" in text and "nothing unexplained" in text
    parts, prompts = [df.value for df in at.dataframe if "part" in df.value.columns or "prompt" in df.value.columns]
    assert list(parts["part"]) == ["pooling", "end of generation", "acceptance", "numerics", "unexplained"]
    assert abs(parts["change of the pooled mean"].sum() - 0.8) < 1e-9
    assert list(prompts["cause"]) == ["end_of_generation", "acceptance", "numerics", "every block agrees"]
    assert "<img" not in text  # ids reach tables only, never markdown

    at = run_page("pages/run_detail.py", run=ids["offline"])  # an offline eval has no such section
    assert "Served vs offline" not in page_text(at)


def test_compare_tables_the_served_gap_of_each_engine_eval(tmp_path, monkeypatch):
    from tracker.dashboard.compare_deltas import served_gaps
    from tracker.dashboard.index import load_run_index

    engine, offline = evals()
    uri, ids = log_pair(tmp_path, engine, offline)
    loaded = {ids["served"]: engine, ids["offline"]: offline}
    index = load_run_index(Tracker(uri))
    frame = served_gaps(index, list(index.runs.values()), lambda run: loaded.get(run.run_id))
    [row] = frame.to_dict("records")
    assert row["checkpoint"].endswith("(served by vllm)") and abs(row["gap"] - 0.8) < 1e-12
    assert row["engine mean acceptance length"] == 3.3 and row["offline tau"] == 2.5
    assert row["unexplained"] == 0.0 and "nothing unexplained" in row["verdict"]
    # Issue 65 LOW: a second offline eval of the checkpoint (a repeat, named alike) is a row of its own, told apart
    again = log_eval(uri, tmp_path / "drafter", "offline", offline, "offline")
    loaded[again] = offline
    index = load_run_index(Tracker(uri))
    frame = served_gaps(index, list(index.runs.values()), lambda run: loaded.get(run.run_id))
    assert sorted(frame["offline eval"]) == sorted(f"offline ({r[:6]})" for r in (ids["offline"], again))


def test_a_served_hybrid_shows_its_gdn_code_per_piece_and_its_causes(tmp_path, monkeypatch):
    from tracker.dashboard.compare_deltas import served_gaps
    from tracker.dashboard.index import load_run_index

    engine, offline = _hybrid(*evals(), engine_dtype="bf16", offline_dtype="fp32")
    engine["fingerprint"]["engine"] = {"name": "vllm", "version": "0.32.0"}
    for fp in (engine["fingerprint"], offline["fingerprint"]):
        fp["software"] = {}  # the shape `fingerprint.check` asks of a stored fingerprint
    engine["fingerprint"]["numerics"]["linear_attention"]["functions"]["gated_norm"] = "vllm torch <b>n</b>"
    at, text, uri, ids = served_detail(tmp_path, monkeypatch, engine, offline)
    assert "Gated DeltaNet, per piece" in text and "not the same protocol: the engine ran bf16" in text
    assert "dtype: the engine ran the target in bf16, the offline eval in fp32" in text
    [gdn] = [df.value for df in at.dataframe if "piece" in df.value.columns]
    assert list(gdn.columns) == ["piece", "offline eval", "vllm serving", "severity"]
    row = gdn.set_index("piece").loc["chunk rule (prefill)"]
    assert (row["offline eval"], row["vllm serving"], row["severity"]) == ("torch", "vllm C++ kernel k", "critical")
    assert gdn.set_index("piece").loc["gated norm", "vllm serving"] == "vllm torch <b>n</b>"  # a table cell, as written
    # the engine's own words reach markdown escaped: shown as written, never rendered as HTML
    assert "vllm torch <b>n</b>" in text and not any("<b>" in el.value for el in at.markdown)

    loaded = {ids["served"]: engine, ids["offline"]: offline}
    index = load_run_index(Tracker(uri))
    [row] = served_gaps(index, list(index.runs.values()), lambda run: loaded.get(run.run_id)).to_dict("records")
    assert row["hybrid"] == ("GDN code differs: chunk rule (prefill), gated norm; not the same protocol: "
                             "engine bf16, offline fp32")


def test_compare_draws_every_engine_of_one_checkpoint_side_by_side(tmp_path, monkeypatch):
    """Compare's Engines view: the offline tau and each engine's own number, each row naming its
    definition, and the gap between the engines in parts with the settings that differ (the hand-worked
    pair of test_reconcile: vLLM counts a full last block, llama.cpp takes no step without room)."""
    from test_reconcile import _two_engines

    vllm, llama, offline = _two_engines()
    vllm["prompts"][0]["id"] = llama["prompts"][0]["id"] = offline["prompts"][0]["id"] = "<b>a</b>"
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    (tmp_path / "drafter").mkdir()
    tracker, ids = Tracker(uri), {}
    for name, results in (("vllm", vllm), ("llamacpp", llama), ("offline", offline)):
        tags = {names.protocol_tag("scoring"): results["protocol"]["scoring"],
                names.protocol_tag("prompt_digest"): "abc123"}
        with tracker.eval_run(name, target="t", checkpoint=str(tmp_path / "drafter"), tags=tags) as run:
            run.log_metrics({"tau": results["tau"], **load_metric_values(results)}, step=0)
            run.log_json(names.EVAL_RESULTS_ARTIFACT, results)
            ids[name] = run.run_id
    serve(monkeypatch, uri, tmp_path / "home", tmp_path)
    at = run_page("pages/compare.py", runs=f"{ids['vllm']},{ids['llamacpp']}", compare_view="Engines")
    numbers, gaps = [df.value for df in at.dataframe if {"definition"} <= set(df.value.columns)
                     or "A − B" in df.value.columns]
    assert list(numbers["measured by"]) == ["offline", "vllm", "llamacpp"]
    assert list(numbers["number"]) == ["tau", "engine mean acceptance length", "engine mean acceptance length"]
    assert list(numbers["value"]) == [offline["tau"], 23 / 6, 17 / 5]
    [row] = gaps.to_dict("records")
    assert row["A − B"] == row["end of generation"] == pytest.approx(23 / 6 - 17 / 5)
    assert row["acceptance"] == row["numerics"] == row["unexplained"] == 0.0
    assert "last_block: full vs cut" in row["settings that differ"]
    assert row["verdict"].endswith("nothing unexplained")
    assert "<b>" not in "".join(el.value for el in at.markdown)

    at = run_page("pages/compare.py", runs=ids["offline"], compare_view="Engines")  # no engine eval chosen
    assert "No engine evals among these runs" in page_text(at)


def test_run_detail_tables_a_load_sweep_per_level_and_names_its_flags(tmp_path, monkeypatch):
    """Issue 49: a served eval's `load` section, one row per level with the numbers' definitions as column
    help, and every flag a sentence (the prompt id is user text, escaped)."""
    from evaluators.engines import busy, load
    from evaluators.engines.base import InFlightCounts
    from test_load import vllm_reply

    engine, offline = evals()
    hostile = "<img src=x onerror=alert(1)>"
    at_1 = [vllm_reply(list(range(10)), [3, 1])]
    requests = [load.Request(hostile, [1], at_1[0])]
    quiet, loaded = busy.Window(0.4, 0.0), busy.Window(2.2, 1.0)
    healthy = load.Arm([load.Served(hostile, at_1[0].completion_ids, InFlightCounts.of(at_1[0]), 0.5)], 1.0, quiet, 2)
    collapsed = vllm_reply(list(range(10)), [0, 0, 0, 0, 0])
    slow = load.Arm([load.Served(hostile, collapsed.completion_ids, InFlightCounts.of(collapsed), 0.9)], 2.0, quiet, 5)
    slower = load.Arm(slow.served, 4.0, loaded, 5)  # a round another program slowed: 2.5 tok/s
    alone = load.Arm([load.Served(hostile, list(range(10)), None, 1.0)], 4.0, quiet)
    at_8 = load.Level(8, [slow, slower, slow], [alone, alone, alone])
    engine["load"] = [load.level_record(load.Level(1, [healthy], [alone]),
                                        load.flags(requests, 1, healthy, alone, True, {}), True),
                      load.level_record(at_8, load.flags(requests, 8, slow, alone, True, {}), True)]
    engine["load_break_even_concurrency"] = 6.5
    # Issue 50: the engine's steps by context length (a 10-token prompt, blocks 3, 1, 4: contexts 11, 14, 15)
    from tracker.measurement.context import by_context, walk_contexts
    engine["engine_tau_by_context"] = by_context([(walk_contexts(10, [3, 1, 4]), [3, 1, 4])], [0, 12, 16])
    at, text, _, ids = served_detail(tmp_path, monkeypatch, engine, offline)
    [table] = [df.value for df in at.dataframe if "requests in flight" in df.value.columns]
    assert list(table["requests in flight"]) == [1, 8] and list(table["speedup"]) == [4.0, 2.0]
    assert list(table["flags"]) == [0, 2] and "Under load" in text and "Flagged under load" in text
    assert list(table["step cost"]) == [pytest.approx(3 / 4), pytest.approx(1 / 2)]  # tau / speedup
    # issue 66: the median of 3 rounds (5, 2.5, 5 tok/s against 2.5 alone), its interval over rounds, the busy round
    assert list(table["speedup 95% interval"]) == ["4.00–4.00", "1.00–2.00"]
    assert list(table["rounds"]) == ["1", "3 (1 busy)"]
    assert "speedup crosses 1 at about 6.5 requests in flight" in text
    [by_context] = [df.value for df in at.dataframe if "context (tokens)" in df.value.columns]
    assert list(by_context["context (tokens)"]) == ["[0, 12)", "[12, 16)", "[16, ∞)"]
    assert list(by_context["blocks"]) == [1, 2, 0] and by_context["tau (engine steps)"].tolist()[:2] == [3.0, 2.5]
    assert f"concurrency 8: prompt {hostile}: acceptance collapse over 5 steps" in text  # as a reader sees it
    [flagged] = [w.value for w in at.warning if "Flagged under load" in w.value]
    assert "\\<img" in flagged and "<img" not in flagged.replace("\\<img", "")  # its source: escaped, inert

    # Compare's "Under load": speedup, served acceptance and step cost against concurrency, from the logged
    # load_c{C}_{field} metrics, one line for the eval; an offline eval alone has no sweep to draw
    at = run_page("pages/compare.py", runs=ids["served"], compare_view="Under load")
    assert not at.exception, [e.message for e in at.exception]
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert [c["layout"]["yaxis"]["title"]["text"].split(" (")[0] for c in charts] == [
        "speedup", "served mean acceptance length", "step cost"]
    line, band = charts[0]["data"]  # the speedup, and its interval over rounds as a band of its colour
    assert (_values(line["x"]), _values(line["y"])) == ([1, 8], [4.0, 2.0])
    assert _values(line["error_y"]["arrayminus"]) == [0.0, 1.0] and _values(line["error_y"]["array"]) == [0.0, 0.0]
    assert (_values(band["x"]), _values(band["y"])) == ([1, 8, 8, 1], [4.0, 2.0, 1.0, 4.0])
    assert band["fill"] == "toself" and band["fillcolor"] == line["line"]["color"]
    assert "break-even" in json.dumps(charts[0]["layout"]["annotations"])
    at = run_page("pages/compare.py", runs=ids["offline"], compare_view="Under load")
    assert "No load sweeps among these runs" in page_text(at)
    # Compare's "By context": the engine's steps by context bucket, the empty bucket left out
    at = run_page("pages/compare.py", runs=ids["served"], compare_view="By context")
    [chart] = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    [line] = chart["data"]
    assert (_values(line["x"]), _values(line["y"])) == (["[0, 12)", "[12, 16)"], [3.0, 2.5])
    assert "(served by vllm)" in line["name"]
