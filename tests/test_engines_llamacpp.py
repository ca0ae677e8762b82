"""The real llama.cpp (xllamacpp's embedded server, scripts/test.sh) on the demo's Qwen3 pair: the GGUF
files made by llama.cpp's own converter (from the llama-cpp-python sdist), a managed eval with default
settings checked against the server's own counters and the offline eval of the same prompts, the
draft length capped at 3, and engines that cannot be used.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from demo.serving_pair import MAX_NEW_TOKENS
from test_engine_clients import processes_with
from tracker.cli import main


def _args(root: Path, *extra: str) -> list[str]:
    return ["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"),
            "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), *extra]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """One draftboard home for the module: its cache holds the GGUF conversions, made once."""
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("llamacpp-home")
        mp.setenv("DRAFTBOARD_HOME", str(root))
        mp.delenv("DRAFTBOARD_ENGINE_URLS", raising=False)
        yield root


@pytest.fixture(scope="module")
def served(serving_pair, llamacpp_python, home, tmp_path_factory) -> dict:
    """A managed `draftboard eval --engine llamacpp` of the Qwen3 pair, with default settings, swept at 1
    and 2 requests in flight (a 2-slot server on the --engine-port it is given, and the target alone on the same
    settings beside it, on a free port of its own). At 4 in flight this
    llama.cpp build aborts now and then (`get_sub_batch: failed to add token`: 3 to 4 of 8 sweeps on a busy box,
    none of 6 on a quiet one; 2 in flight: 8 of 8 fine on the busy box), which would make the suite flaky: the
    eval reports such a death in one line, led by that line (test_engine_clients)."""
    from evaluators.engines.server import free_port

    out, port = tmp_path_factory.mktemp("llamacpp-eval") / "engine.json", free_port()
    assert main(_args(serving_pair, "--engine", "llamacpp", "--engine-python", llamacpp_python, "--no-log",
                      "--engine-port", str(port), "--concurrency", "1,2", "--repeats", "2", "--out", str(out))) == 0
    return {"path": out, "results": json.loads(out.read_text()), "port": port}


def test_a_managed_llamacpp_eval_counts_as_llamacpp_counts(served, serving_pair, home, capsys):
    assert processes_with(str(home)) == []  # the server (its GGUF files live under this home) is gone
    results, offline = served["results"], json.loads((serving_pair / "offline.json").read_text())
    engine = results["engine"]
    assert engine["url"] == f"http://127.0.0.1:{served['port']}"  # the drafter's server took the port it was given
    # issue 65 M5: no acceptance by context from llama.cpp's replies, and the results say why
    assert results["engine_tau_by_context"] is None
    assert results["engine_tau_by_context_unavailable"].startswith(
        f"{len(results['prompts'])} of {len(results['prompts'])} replies give no per-step acceptance in order")
    assert (engine["name"], engine["method"], engine["num_speculative_tokens"]) == ("llamacpp", "draft-dflash", 7)
    assert engine["gguf_type"] == "f32" and engine["converter"].startswith("convert_hf_to_gguf.py tree sha256:")
    assert Path(engine["target_gguf"]).is_file() and Path(engine["drafter_gguf"]).is_relative_to(home)
    assert engine["spec_draft_p_min"] == 0.0 and engine["cache_prompt"] is False
    assert results["fingerprint"]["engine"]["packages"]["xllamacpp"] == "2026.10.11549"
    # Issue 65 LOW: the wheel's server states build `b0-unknown`; the version shown is the wheel's
    assert engine["version"] is None and results["fingerprint"]["engine"]["version"] == "xllamacpp 2026.10.11549"
    for row in results["prompts"]:
        # each request's drafted and accepted tokens equalled the deltas of llama.cpp's own counters
        assert row["engine_source"] == "llama.cpp /metrics deltas = timings.draft_n"
        assert row["engine_steps_ordered"] is False and len(row["acceptance_lengths"]) == row["engine_drafts"]
        assert sum(a - 1 for a in row["acceptance_lengths"]) == row["engine_accepted"]
    assert [p["completion_ids"] for p in results["prompts"]] == [p["completion_ids"] for p in offline["prompts"]]

    capsys.readouterr()
    assert main(["reconcile", str(served["path"]), str(serving_pair / "offline.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completions_equal"] == 8 and report["unexplained"] == 0.0, report["verdict"]
    assert report["gap"] == pytest.approx(sum(report["parts"].values()))


def test_a_llamacpp_load_sweep_counts_each_request_and_takes_each_levels_steps_from_its_counters(served):
    """Issue 49 on llama.cpp: each reply's own drafted and accepted tokens at 1 and 2 in flight (its
    `timings`), their sums equal to what the server's counters moved, the level's verify steps from those
    counters (replies carry none), and the speedup from the two arms of the same eval: the ratio of their medians
    over 2 interleaved rounds, inside its interval (issue 66)."""
    results = served["results"]
    assert results["engine"]["n_parallel"] == 2
    alone = {p["id"]: p for p in results["prompts"]}  # the eval's own pass, one request at a time
    assert [level["concurrency"] for level in results["load"]] == [1, 2]
    for level in results["load"]:
        assert level["counters_checked"] is True
        drafted = sum(p["engine_draft_tokens"] for p in level["prompts"])
        accepted = sum(p["engine_accepted"] for p in level["prompts"])
        assert all(p["engine_drafts"] is None and "prompt_ms" in p["engine_timings"] for p in level["prompts"])
        assert level["engine_mean_acceptance_length"] == pytest.approx(1 + accepted / level["engine_steps"])
        assert drafted >= level["engine_steps"] * 1 and level["speedup"] == pytest.approx(
            level["tokens_per_s"] / level["tokens_per_s_target_alone"])
        assert level["step_cost"] == pytest.approx(level["engine_mean_acceptance_length"] / level["speedup"])
        assert len(level["rounds"]) == 2 and level["speedup_ci"][0] <= level["speedup"] <= level["speedup_ci"][1]
        unflagged = {p["id"] for p in level["prompts"]} - {f["id"] for f in level["flags"]}
        for i in unflagged:  # what no flag names is what concurrency 1 gave, token for token and count for count
            p = next(p for p in level["prompts"] if p["id"] == i)
            assert (p["completion_ids"], p["engine_draft_tokens"], p["engine_accepted"]) == \
                (alone[i]["completion_ids"], alone[i]["engine_draft_tokens"], alone[i]["engine_accepted"])
        print(f"llama.cpp concurrency {level['concurrency']}: tau {level['engine_mean_acceptance_length']:.3f}, "
              f"{level['tokens_per_s']:.1f} tok/s with the drafter, {level['tokens_per_s_target_alone']:.1f} alone: "
              f"{level['speedup']:.2f}x; flags {[(f['id'], f['flag']) for f in level['flags']]}")
    at_1 = results["load"][0]
    assert at_1["flags"] == [] and at_1["engine_steps"] == sum(p["engine_drafts"] for p in results["prompts"])


def test_llamacpps_default_draft_length_caps_acceptance(served, serving_pair, llamacpp_python, home, tmp_path,
                                                        capsys):
    """llama.cpp's own default --spec-draft-n-max is 3: served so, the drafter's block of 8 accepts at
    most 4 tokens a step, and the engine eval reports the lower number (the conversions are reused)."""
    out = tmp_path / "n3.json"
    assert main(_args(serving_pair, "--engine", "llamacpp", "--engine-python", llamacpp_python,
                      "--num-speculative-tokens", "3", "--no-log", "--out", str(out))) == 0
    capped = json.loads(out.read_text())
    assert capped["engine"]["num_speculative_tokens"] == 3
    assert max(a for p in capped["prompts"] for a in p["acceptance_lengths"]) <= 4
    assert capped["engine_mean_acceptance_length"] < served["results"]["engine_mean_acceptance_length"]
    assert capped["engine"]["target_gguf"] == served["results"]["engine"]["target_gguf"]
    # doctor on that serving box says why, and how to serve what was evaluated
    capsys.readouterr()
    assert main(["doctor", "--target", str(serving_pair / "target"), "--drafter", str(serving_pair / "drafter"),
                 "--serving-config", str(out), "--json", "--n-prompts", "2", "--max-new-tokens", "16"]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    length = checks["speculation_length"]
    assert length["severity"] == "warning" and "acceptance is capped at 4" in length["verdict"]
    assert length["fix"] == "set --spec-draft-n-max=7 to serve what was evaluated"
    assert checks["serving_method"]["severity"] == "ok" and checks["draft_kv_cache"]["severity"] == "ok"
    # the GGUF llama.cpp's converter wrote taps the checkpoint's layers; xllamacpp reports no build (b0)
    assert checks["gguf_target_layers"]["severity"] == "ok", checks["gguf_target_layers"]
    assert checks["llamacpp_build"]["severity"] == "info"


def test_engines_that_cannot_be_used_say_why_in_one_line(serving_pair, llamacpp_python, home, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")

    def error(*extra: str, root: Path = serving_pair) -> str:
        capsys.readouterr()
        assert main(_args(root, "--engine", "llamacpp", *extra)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines and lines[-1].startswith("error: ")
        return lines[-1]

    assert "--engine-python /nonexistent/python: no such executable" in error("--engine-python", "/nonexistent/python")
    monkeypatch.delenv("DRAFTBOARD_LLAMACPP_PYTHON", raising=False)
    assert "DRAFTBOARD_LLAMACPP_PYTHON" in error()
    # A target without the demo's tokenizer.model: the stock converter refuses its byte-level BPE
    # (no merges, a pre-tokenizer it does not know), and says so in one line.
    bare = tmp_path / "bare"
    shutil.copytree(serving_pair / "target", bare / "target")
    (bare / "target" / "tokenizer.model").unlink()
    for name in ("drafter", "prompts.jsonl"):
        (bare / name).symlink_to((serving_pair / name).resolve())
    refused = error("--engine-python", llamacpp_python, root=bare)
    assert refused.startswith(f"error: llama.cpp's converter refused {(bare / 'target').resolve()}: ")
    monkeypatch.setenv("DRAFTBOARD_LLAMACPP_CONVERTER", str(tmp_path))
    assert f"DRAFTBOARD_LLAMACPP_CONVERTER {tmp_path}: no convert_hf_to_gguf.py there" in error(
        "--engine-python", llamacpp_python)
    assert processes_with(str(serving_pair / "target")) == [] and not (tmp_path / "store.db").exists()


def test_a_drafter_folder_that_names_other_code_never_reaches_the_converter(serving_pair, llamacpp_python, home,
                                                                            tmp_path, capsys, monkeypatch):
    """Issue 48 S1, the audit's exploit: a drafter draftboard reads as DFlash whose text_config names
    DreamModel and whose index names other weights; llama.cpp's converter read the folder as Dream and its
    vocabulary reader imported the folder's tokenizer code (on b69d0d4 the marker file appeared). The folder
    is refused in one line now, before the converter or a server starts; nothing of it runs."""
    from hostile import hostile_drafter

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    marker = tmp_path / "code-ran"
    root = tmp_path / "pair"
    hostile_drafter(serving_pair / "drafter", serving_pair / "target", root / "drafter", marker)
    for name in ("target", "prompts.jsonl"):
        (root / name).symlink_to((serving_pair / name).resolve())
    before = sorted(home.rglob("drafter-*.gguf"))
    capsys.readouterr()
    assert main(_args(root, "--engine", "llamacpp", "--engine-python", llamacpp_python, "--no-log")) == 2
    *_, line = capsys.readouterr().err.strip().splitlines()  # after the eval's progress lines
    assert line.startswith("error: drafter ") and "declares DreamModel" in line and "refused" in line
    assert not marker.exists() and processes_with(str(root)) == []
    assert sorted(home.rglob("drafter-*.gguf")) == before and not list(home.rglob(".*.part"))  # nothing converted


def test_an_eval_stopped_while_it_converts_leaves_no_converter(serving_pair, llamacpp_python, tmp_path):
    """Issue 48 (also): a cancel reaches an eval while llama.cpp's converter runs (a fresh cache, so the
    target converts first). The eval is sent SIGTERM alone, as a worker's cancel does first: it exits through
    its cleanup (the converter killed, its partial file and the staged folders removed), no server starts."""
    import signal
    import subprocess
    import sys

    from test_engine_clients import wait_gone
    from waiting import wait_until

    home = tmp_path / "home"
    env = {**os.environ, "DRAFTBOARD_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 's.db'}"}
    eval_ = subprocess.Popen([sys.executable, "-m", "tracker.cli", *_args(serving_pair, "--engine", "llamacpp",
                                                                         "--engine-python", llamacpp_python, "--no-log")],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: processes_with(str(home), b"convert_hf_to_gguf.py"), timeout=120, what="the converter")
        eval_.send_signal(signal.SIGTERM)
        assert eval_.wait(timeout=30) != 0
        wait_gone(str(home), 10)  # converter (its argv names the cache) and any server: gone
        # the cancel ran the eval's cleanup: no GGUF, finished or partial, and no staged folder
        assert not list(home.rglob("*.gguf*")) and not list(home.rglob("staged/*"))
    finally:
        if eval_.poll() is None:
            eval_.kill()
        for pid in processes_with(str(home)):
            os.kill(pid, signal.SIGKILL)


def test_the_servers_own_log_imports_to_the_engine_evals_number(served, home, tmp_path):
    """llama.cpp's per-request log lines of the managed eval's server (`import-results --format
    llamacpp-log`) give the pooled mean the eval computed from its counters, and the same draft rate: over
    every request that server answered, the eval's own pass and its load sweep's levels."""
    from mlflow import MlflowClient

    log = min((p for p in (home / "logs").glob("engine-llamacpp-*.log") if "-alone-" not in p.name),
              key=lambda p: p.stat().st_mtime)  # the first eval's drafter server
    store = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["import-results", str(log), "--format", "llamacpp-log", "--tracking-uri", store]) == 0
    client = MlflowClient(store)
    [run] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    results = served["results"]
    # every pass that server answered: the eval's own, and at each level the drafter's warm-up and its rounds
    passes = [p for level in results["load"] for p in (level["warm_up"], *level["rounds"])]
    steps = sum(p["engine_drafts"] for p in results["prompts"]) + sum(p["engine_steps"] for p in passes)
    accepted = sum(p["engine_accepted"] for p in results["prompts"]) + sum(p["engine_accepted"] for p in passes)
    drafted = sum(p["engine_draft_tokens"] for p in results["prompts"]) + sum(p["engine_draft_tokens"] for p in passes)
    assert run.data.metrics["engine_mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert run.data.metrics["draft_acceptance_rate"] == pytest.approx(accepted / drafted)
    requests = len(results["prompts"]) * (1 + len(passes))
    assert run.data.tags["protocol.backend"] == "llamacpp" and run.data.tags["protocol.window"] == f"{requests} requests"


def test_llamacpp_and_vllm_on_one_checkpoint_come_apart_through_the_offline_eval(served, vllm_served_pair,
                                                                                 serving_pair, capsys):
    """The same checkpoint and prompts served by vLLM and by llama.cpp: every difference named (the end of
    generation each engine counts, the settings each states), nothing unexplained where both report
    their steps."""
    capsys.readouterr()
    assert main(["reconcile", str(vllm_served_pair), str(served["path"]), "--offline",
                 str(serving_pair / "offline.json"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    vllm_mean = json.loads(vllm_served_pair.read_text())["engine_mean_acceptance_length"]
    assert report["gap"] == pytest.approx(vllm_mean - served["results"]["engine_mean_acceptance_length"])
    assert report["unexplained"] == 0.0 and report["completions_equal"] == 8
    assert report["gap"] == pytest.approx(sum(report["parts"].values()))
    diff = {d["field"]: (d["a_value"], d["b_value"]) for d in report["settings_diff"]}
    assert diff["last_block"] == ("full", "cut") and "num_speculative_tokens" not in diff  # both 7
    assert "end of generation" in report["verdict"] and report["verdict"].endswith("nothing unexplained")


def test_a_server_that_dies_at_a_level_is_started_again_and_its_death_counted_there(serving_pair, llamacpp_python,
                                                                                   home):
    """Issue 66: llama.cpp's DFlash aborts now and then with parallel slots (`get_sub_batch: failed to add token`).
    Such a death is counted at the level where it happened, never hidden by lowering the level: here the drafter's
    engine is killed (SIGKILL, as an abort ends it) once a request of the first round at 2 in flight returned; the
    server is started again on the same settings, the level measured from its warm-up, every count checked."""
    import signal

    from evaluators.engines.run import EngineSettings, evaluate_engine
    from evaluators.settings import EvalSettings

    killed = []

    def progress(stage: str, done: int, total: int) -> None:
        if not killed and stage == "llamacpp: concurrency 2, round 1/1, drafter" and done >= 1:
            [engine] = [pid for pid in processes_with(str(home), b'"drafter": "')
                        if b"evaluators.engines.server" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
            os.kill(engine, signal.SIGKILL)
            killed.append(engine)

    s = EvalSettings(target=str(serving_pair / "target"), drafter=str(serving_pair / "drafter"),
                     prompts=str(serving_pair / "prompts.jsonl"), max_new_tokens=MAX_NEW_TOKENS)
    results = evaluate_engine(s, EngineSettings("llamacpp", python=llamacpp_python, concurrency=(1, 2), repeats=1),
                              progress)
    at_1, at_2 = results["load"]
    assert killed and at_1["aborts"] == [] and [a["server"] for a in at_2["aborts"]] == ["drafter"]
    assert at_2["aborts"][0]["exit_code"] != 0 and at_2["counters_checked"] and len(at_2["rounds"]) == 1
    assert at_2["speedup"] > 0 and processes_with(str(home)) == []  # measured after the restart; nothing left
