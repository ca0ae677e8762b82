"""Engine clients, attached and managed mode, and every way an engine can fail, without a real engine:
the SGLang-shaped server of tests/engine_servers.py (shaped from SGLang's own sources, cited there)
and scripted managed engines that never get healthy or die mid-run. The real vLLM runs in
tests/test_engines_vllm.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from waiting import wait_until

from tracker.cli import main
from tiny import hybrid_eval_files
from engine_servers import SGLangServer, sglang_meta

HERE = Path(__file__).parent
# Per prompt, the draft tokens each verify step accepted (block 4: at most 3).
STEPS = [[3, 1, 0, 2], [0, 0, 3], [2, 2, 2, 2, 1]]


@pytest.fixture
def files(tmp_path, monkeypatch):
    root = hybrid_eval_files(tmp_path / "m", prompt_id=lambda i: f"p{i}")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DRAFTBOARD_ENGINE_URLS", raising=False)
    monkeypatch.delenv("DRAFTBOARD_VLLM_PYTHON", raising=False)
    return root


def _prompts(root: Path) -> list[list[int]]:
    return [json.loads(line)["input_ids"] for line in (root / "prompts.jsonl").read_text().splitlines()]


def sglang_for(root: Path, **info) -> SGLangServer:
    server_info = {"model_path": str(root / "target"), "speculative_algorithm": "DFLASH",
                   "speculative_draft_model_path": str(root / "drafter"), "speculative_num_draft_tokens": 4,
                   "dtype": "bfloat16", "disable_radix_cache": True, "mamba_ssm_dtype": "float32",
                   "attention_backend": "fa3", "disable_cuda_graph": False, "version": "0.5.23",
                   "launch_command": "python -m sglang.launch_server ...", **info}
    replies = {}
    for ids, steps in zip(_prompts(root), STEPS):
        meta = sglang_meta(len(ids), steps, 4)
        replies[tuple(ids)] = ([5 + (k % 50) for k in range(meta["completion_tokens"])], meta)
    return SGLangServer(server_info, replies)


def _eval_runs(store: str) -> list:
    client = MlflowClient(store)
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
            if r.data.tags.get("draftboard.kind") == "eval"]


def test_attached_sglang_eval_records_the_servers_fields(files, tmp_path, capsys, monkeypatch):
    server = sglang_for(files)
    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", f"http://other:1,{server.url}")
    out = tmp_path / "sglang.json"
    try:
        rc = main(["eval", "--engine", "sglang", "--engine-url", server.url, "--target", str(files / "target"),
                   "--drafter", str(files / "drafter"), "--prompts", str(files / "prompts.jsonl"),
                   "--max-new-tokens", "64", "--dtype", "bf16", "--out", str(out)])
    finally:
        server.close()
    assert rc == 0, capsys.readouterr().err
    results = json.loads(out.read_text())
    assert results["protocol"]["scoring"] == "engine" and results["protocol"]["temperature"] == 0
    assert results["protocol"]["last_block"] == "full"  # the engine counts its last step whole
    engine = results["engine"]
    assert (engine["name"], engine["version"], engine["method"], engine["num_speculative_tokens"]) == \
        ("sglang", "0.5.23", "dflash", 3)
    assert engine["mamba_ssm_dtype"] == "float32" and engine["disable_radix_cache"] is True
    assert engine["attention_backend"] == "fa3" and engine["managed"] is False
    # A hybrid target: the GDN record holds what the server reported; nothing from SGLang names its
    # GDN kernels here, so the pieces are unknown rather than guessed from the device.
    gdn = engine["linear_attention"]
    assert gdn["functions"] == {} and gdn["summary"].startswith("sglang: unknown")
    assert gdn["settings"]["disable_radix_cache"] is True and gdn["settings"]["mamba_ssm_cache_dtype"] == "float32"
    assert gdn["sources"] == ["the server's report"]
    for row, steps in zip(results["prompts"], STEPS):
        assert row["engine_drafts"] == len(steps) and row["engine_accepted"] == sum(steps)
        assert row["engine_draft_tokens"] == 3 * len(steps)
        assert sorted(row["acceptance_lengths"]) == sorted(a + 1 for a in steps)
        assert row["engine_steps_ordered"] is False and row["engine_accepted_per_step"] is None
        # SGLang's own number counts the prefill's token: completion_tokens / steps
        assert row["engine_reported_mean"] == pytest.approx((1 + sum(a + 1 for a in steps)) / len(steps))
    # 1 + (6 + 3 + 9) / (4 + 3 + 5) = 2.5; tau = mean of per-prompt means (2.5, 2.0, 2.8)
    assert results["engine_mean_acceptance_length"] == pytest.approx(2.5)
    assert results["tau"] == pytest.approx((2.5 + 2.0 + 2.8) / 3)
    assert results["fingerprint"]["source"]["kind"] == "engine"
    assert results["fingerprint"]["numerics"]["linear_attention_path"] == "sglang-native"  # a hybrid target
    [request] = [r for r in server.requests if r["input_ids"] == _prompts(files)[0]]
    assert request["sampling_params"]["temperature"] == 0 and request["sampling_params"]["max_new_tokens"] == 64
    assert request["sampling_params"]["stop_token_ids"] == [63]  # the target's EOS
    [run] = _eval_runs(os.environ["MLFLOW_TRACKING_URI"])
    assert run.data.metrics["engine_mean_acceptance_length"] == pytest.approx(2.5)
    assert run.data.tags["protocol.scoring"] == "engine"


def _one_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("error: ")
    return lines[-1]


def _eval_args(files: Path, *extra: str) -> list[str]:
    """A hybrid target in bf16: what vLLM's CPU GDN kernels take (fp32 is refused before a start)."""
    return ["eval", "--target", str(files / "target"), "--drafter", str(files / "drafter"),
            "--prompts", str(files / "prompts.jsonl"), "--max-new-tokens", "16", "--dtype", "bf16", *extra]


@pytest.mark.parametrize("info, message", [
    ({"model_path": "/models/Qwen3.5-27B"}, "serves /models/Qwen3.5-27B, not the target"),
    ({"speculative_draft_model_path": "/models/other-drafter"}, "drafts with /models/other-drafter"),
    ({"speculative_algorithm": None}, "runs no speculative decoding"),
    ({"speculative_num_draft_tokens": 8}, "drafts 7 tokens per step"),
    # a radix cache on a hybrid target resumes another request's recurrent state (sglang #31850)
    ({"disable_radix_cache": False}, "caches prefixes on a hybrid target"),
])
def test_a_server_that_serves_something_else_is_refused(files, capsys, monkeypatch, info, message):
    server = sglang_for(files, **info)
    try:
        rc = main(_eval_args(files, "--engine", "sglang", "--engine-url", server.url))
    finally:
        server.close()
    assert rc == 2 and message in _one_error(capsys)
    assert not server.requests  # refused before any prompt was sent
    assert not _eval_runs(os.environ["MLFLOW_TRACKING_URI"])


def test_urls_outside_the_allowed_list_and_other_bad_engine_input(files, capsys, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_URLS", "http://serving-box:30000")
    monkeypatch.delenv("DRAFTBOARD_LLAMACPP_PYTHON", raising=False)
    cases = [
        (["--engine", "sglang", "--engine-url", "http://127.0.0.1:9"], "not one of the servers this deployment allows"),
        (["--engine", "sglang", "--engine-url", "http://u:pw@serving-box:30000"], "without a user or password"),
        (["--engine", "vllm"], "needs the engine's own Python"),
        # issue 65 M8: the line that points draftboard at what scripts/llamacpp.sh installed, said where it is missing
        (["--engine", "llamacpp"], 'point draftboard at them with: eval "$(bash scripts/llamacpp.sh --exports)"'),
        (["--engine", "vllm", "--engine-python", str(files / "nothing")], "no such executable"),
        (["--engine-url", "http://serving-box:30000"], "need --engine vllm|sglang"),
        (["--engine", "vllm", "--engine-python", sys.executable, "--num-speculative-tokens", "9"],
         "must be 1..3"),
    ]
    for extra, message in cases:
        assert main(_eval_args(files, *extra)) == 2, extra
        line = _one_error(capsys)
        assert message in line and "pw" not in line, line
    # Issue 51: SGLang overwrites DFlash's acceptance with a simulated one when this is set (SGLang #32595): a
    # managed eval that would pass it on is refused before an engine starts
    monkeypatch.setenv("SGLANG_SIMULATE_ACC_LEN", "3.5")
    assert main(_eval_args(files, "--engine", "sglang", "--engine-python", sys.executable)) == 2
    assert "SGLANG_SIMULATE_ACC_LEN is set" in _one_error(capsys)
    assert not _eval_runs(os.environ["MLFLOW_TRACKING_URI"])


def scripted_python(tmp_path: Path, mode: str, mark: str) -> Path:
    """An "engine Python" that runs tests/engine_servers.py in `mode` whatever it is asked to run."""
    script = tmp_path / f"python-{mode}"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'engine_servers.py'} {mode} {mark} \"$@\"\n")
    script.chmod(0o755)
    return script


def processes_with(mark: str, *also: bytes) -> list[int]:
    """Processes whose command line holds `mark` (and each of `also`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if mark.encode() in cmdline and all(a in cmdline for a in also):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def wait_gone(mark: str, seconds: float) -> None:
    wait_until(lambda: not processes_with(mark), seconds, interval=0.1, what=f"every process marked {mark} gone")


def test_engines_that_fail_leave_an_error_line_and_no_process(files, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_ENGINE_START_S", "4")
    for mode, message in (("never-healthy", "was not healthy within 4 s"), ("dies", "server died mid-run")):
        mark = f"engine-mark-{mode}-{os.getpid()}"
        python = scripted_python(tmp_path, mode, mark)
        assert main(_eval_args(files, "--engine", "vllm", "--engine-python", str(python))) == 2
        assert message in _one_error(capsys)
        wait_gone(mark, 5)  # the engine and its own child
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        python = scripted_python(tmp_path, "dies", "engine-mark-port")
        assert main(_eval_args(files, "--engine", "vllm", "--engine-python", str(python),
                               "--engine-port", str(port))) == 2
        assert f"--engine-port {port}" in _one_error(capsys)
    assert processes_with("engine-mark-port") == []  # nothing was started
    assert not _eval_runs(os.environ["MLFLOW_TRACKING_URI"])


def _worker_with_an_engine_job(files: Path, tmp_path: Path, mark: str):
    """A real `draftboard worker` running a queued managed-vLLM eval whose engine never gets healthy."""
    from tracker.jobs import eval_job
    from tracker.jobs.queue import JobQueue

    jobs = f"sqlite:///{tmp_path / 'jobs.db'}"
    job = JobQueue(jobs).submit("eval", eval_job.validate({
        "target": str(files / "target"), "drafter": str(files / "drafter"), "prompts": str(files / "prompts.jsonl"),
        "engine": "vllm", "max_new_tokens": 16, "no_log": True, "dtype": "bf16"}))
    env = {**os.environ, "DRAFTBOARD_JOBS_URI": jobs, "DRAFTBOARD_VLLM_PYTHON": str(scripted_python(
        tmp_path, "never-healthy", mark)), "DRAFTBOARD_ENGINE_START_S": "300"}
    worker = subprocess.Popen([sys.executable, "-m", "tracker.cli", "worker", "--poll", "0.1"], env=env,
                              cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return JobQueue(jobs), job, worker


@pytest.mark.parametrize("how", ["cancel", "SIGKILL the worker"])
def test_a_cancelled_job_or_a_killed_worker_leaves_no_engine_process(files, tmp_path, how):
    """The worker runs the eval, the eval runs the engine: cancel the job, or SIGKILL the worker, and
    all of it goes within 5 s."""
    mark = f"engine-mark-worker-{how.split()[0]}-{os.getpid()}"
    queue, job, worker = _worker_with_an_engine_job(files, tmp_path, mark)
    try:
        # the engine (its command line has the port) and its child; the eval's probes of the engine's
        # Python carry the mark too, but no port, and end at once
        wait_until(lambda: len(processes_with(mark)) >= 2 and processes_with(mark, b"--port"), 120, interval=0.2,
                   what="the engine and its child started")
        assert len(processes_with(mark)) >= 2, "the engine never started"
        assert queue.get(job.id).state == "running"
        if how == "cancel":
            queue.request_cancel(job.id)
            wait_until(lambda: queue.get(job.id).state != "running", 30, interval=0.1, what="the job no longer running")
            assert queue.get(job.id).state == "cancelled"
        else:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        wait_gone(mark, 5)
    finally:
        if worker.poll() is None:
            worker.kill()
        for pid in processes_with(mark):
            os.kill(pid, signal.SIGKILL)


def test_a_managed_engine_gets_none_of_the_workers_secrets(monkeypatch):
    from evaluators.engines.server import engine_environment

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # passwords inside URI values too (issue 37, finding 2): the store's and the compose queue's
    monkeypatch.setenv("DATABASE_URL", "postgresql://board:pw@db/mlflow")
    monkeypatch.setenv("DRAFTBOARD_JOBS_URI", "postgresql+psycopg://jobs:s3cret@db/jobs")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:p'w@mlflow.internal/")
    monkeypatch.setenv("DRAFTBOARD_LOG_NOTE", "retry with password=hunter3")
    # issue 48 S2: names no deny-list foresaw, and a password with a '/' in it: an allow-list now
    monkeypatch.setenv("PGPASSWORD", "pgsecret")
    monkeypatch.setenv("PGPASSFILE", "/home/board/.pgpass")
    monkeypatch.setenv("DRAFTBOARD_ALERT_WEBHOOK", "https://hooks.example/T000/B000/hooksecret")
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.example/services/slacksecret")
    monkeypatch.setenv("VLLM_DB", "postgresql://admin:pa/sl@db/x")  # allowed by name, refused by value
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    env = engine_environment()
    for name in ("MLFLOW_TRACKING_PASSWORD", "HF_TOKEN", "DATABASE_URL", "DRAFTBOARD_JOBS_URI", "MLFLOW_TRACKING_URI",
                 "DRAFTBOARD_LOG_NOTE", "PGPASSWORD", "PGPASSFILE", "DRAFTBOARD_ALERT_WEBHOOK", "SLACK_WEBHOOK_URL",
                 "VLLM_DB"):
        assert name not in env, name
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["PATH"] == os.environ["PATH"]
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    # what the engine's own process sees (a probe runs with the same environment)
    from evaluators.engines.server import finish_probe, start_probe

    seen = finish_probe(start_probe(sys.executable, "import json, os; print(json.dumps({'env': dict(os.environ)}))"))
    leaked = [s for s in ("hunter2", "pw@", "s3cret", "hunter3", "p'w", "pgsecret", "pgpass", "hooksecret",
                          "slacksecret", "pa/sl") for v in seen["env"].values() if s in v]
    assert leaked == []


def llamacpp_server(drafted_per_request: int, accepted_per_request: int, reply_timings: tuple[int, int],
                    spec_types: str = "draft-dflash", steps_per_request: int = 2):
    """A server answering as llama.cpp's does (tools/server: /props, /metrics counters, /completion
    with `tokens`, `generation_settings` and `timings.draft_n` / `draft_n_accepted`), whose counters
    move by the given amounts per request while its replies claim `reply_timings` (a LoopbackServer)."""
    import http.server

    from loopback import LoopbackServer

    moved = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (the stdlib's name)
            n = moved["n"]
            if self.path == "/props":
                self._send(json.dumps({"model_path": "/m/target.gguf", "build_info": "b0-unknown",
                                       "default_generation_settings": {"n_ctx": 512, "params": {}}}))
            else:
                self._send("".join(f"llamacpp:{name}_total {value}\n" for name, value in (
                    ("spec_decode_num_drafts", steps_per_request * n), ("spec_decode_num_draft_tokens", drafted_per_request * n),
                    ("spec_decode_num_accepted_tokens", accepted_per_request * n))) +
                    f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {accepted_per_request * n}\n',
                    "text/plain")

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            moved["n"] += 1
            drafted, accepted = reply_timings
            self._send(json.dumps({"tokens": [5, 6, 7], "generation_settings": {"speculative.types": spec_types},
                                   "timings": {"draft_n": drafted, "draft_n_accepted": accepted}}))

        def log_message(self, *args):
            pass

    return LoopbackServer(Handler)


def test_a_llamacpp_reply_whose_counts_disagree_with_its_counters_is_refused():
    from evaluators.engines.base import EngineError, EngineRequest
    from evaluators.engines.llamacpp import LlamaCppClient

    sampling = EngineRequest(max_tokens=3, stop_token_ids=(63,))
    server = llamacpp_server(6, 2, (6, 2))  # 2 steps, 6 drafted, 2 accepted (both at position 0)
    try:
        assert LlamaCppClient(server.url).info().version is None  # `b0-unknown`: a packaged build states none
        reply = LlamaCppClient(server.url).generate([1, 2], sampling)
        assert (reply.drafts, reply.draft_tokens, reply.accepted, reply.histogram) == (2, 6, 2, [0, 2])
    finally:
        server.close()
    for timings, spec, message in (((6, 1), "draft-dflash", "its reply says 6 / 1: refused, not averaged"),
                                   ((6, 2), "none", "runs no DFlash speculative decoding")):
        server = llamacpp_server(6, 2, timings, spec)
        try:
            with pytest.raises(EngineError, match=message):
                LlamaCppClient(server.url).generate([1, 2], sampling)
        finally:
            server.close()


def test_counts_larger_than_the_completion_allows_are_refused_before_anything_is_built():
    """Issue 37, finding 4: a small, self-consistent reply claiming 10^9 verify steps for 3 tokens (each
    step adds at least one) is refused in one line, not expanded into 10^9 per-step entries."""
    from evaluators.engines.base import EngineError, EngineReply, EngineRequest
    from evaluators.engines.llamacpp import LlamaCppClient

    server = llamacpp_server(7 * 10**9, 0, (7 * 10**9, 0), steps_per_request=10**9)
    try:
        with pytest.raises(EngineError, match="1000000000 verify steps and 0 accepted tokens for 3 tokens generated"):
            LlamaCppClient(server.url).generate([1, 2], EngineRequest(max_tokens=3, stop_token_ids=(63,)))
    finally:
        server.close()
    for counts in ({"drafts": 1, "accepted": 4, "histogram": [0, 0, 0, 0, 1]}, {"drafts": -1, "accepted": 0,
                                                                                 "histogram": None}):
        with pytest.raises(EngineError, match="more than its completion allows"):
            EngineReply(completion_ids=[5, 6, 7], draft_tokens=7, **counts)


def test_no_managed_engine_is_told_to_trust_a_folders_code():
    """Issue 48 S1: vLLM and SGLang run a folder's `auto_map` code only with --trust-remote-code; no managed
    server is started with it (llama.cpp's server reads GGUF files, which hold no code)."""
    from evaluators.engines.run import ENGINES

    for name, engine in ENGINES.items():
        argv = engine.server_argv("python", "/t", "/d", 8000, 7, "float32", 512, "cpu")
        assert not [a for a in argv if "trust" in a.lower() and "remote" in a.lower()], name


def test_a_dead_servers_log_is_told_by_the_line_it_died_on(tmp_path):
    """llama.cpp's DFlash with parallel slots aborts in `get_sub_batch` (xllamacpp 2026.10.11549, measured: 3 to 4
    of 8 sweeps at 4 in flight on a busy box) and the debugger's backtrace fills the log's end: the error leads
    with the line it died on."""
    from evaluators.engines.server import log_tail

    log = tmp_path / "engine.log"
    died = ("/workspace/thirdparty/llama.cpp/common/common.cpp:2245: get_sub_batch: failed to add token 1083397536 "
            "at index 9 (error -2, n = 40)")
    log.write_text("\n".join(["I slot launch_slot_: id 1 | task 453 | processing task", died, "",
                              *(f"#{i} 0x00007fa61e2508e4 in _PyEval_EvalFrame () at ceval.c:{i}" for i in range(30)),
                              "[Inferior 1 (process 5145) detached]"]) + "\n")
    told = log_tail(log)
    assert told.startswith(died) and told.endswith("[Inferior 1 (process 5145) detached]")
    log.write_text("all fine\nthe last line\n")
    assert log_tail(log) == "all fine | the last line"  # nothing died: the tail alone
    assert log_tail(tmp_path / "none.log") == "(no log)"


def test_an_engine_eval_holding_several_gpus_splits_its_target_and_the_known_bad_table_reads_it():
    """Issue 63: a managed vLLM / SGLang eval of a job holding N GPUs serves with tensor parallelism N, recorded in
    the results' engine section; there the known-bad table's SGLang 0.5.9 TP > 1 row fires on a hybrid target.
    llama.cpp, and attached servers, are refused in one line."""
    from evaluators.doctor.serving import from_engine_eval
    from evaluators.engines import sglang, vllm
    from evaluators.engines.base import EngineError
    from evaluators.engines.run import EngineSettings
    from tracker.measurement import known_bad

    options = EngineSettings("vllm", tensor_parallel=2).server_options
    assert options == {"tensor_parallel": 2}
    argv = vllm.server_argv("python", "/t", "/d", 8000, 7, "bfloat16", 512, "cuda", **options)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--tensor-parallel-size" not in vllm.server_argv("python", "/t", "/d", 8000, 7, "bfloat16", 512, "cuda")
    argv = sglang.server_argv("python", "/t", "/d", 8000, 7, "bfloat16", 512, "cuda", tensor_parallel=4)
    assert argv[argv.index("--tp-size") + 1] == "4"
    engine = {"name": "sglang", "version": "0.5.9", "method": "DFLASH", "num_speculative_tokens": 7,
              **sglang.managed_settings("cuda", "bfloat16", 1, tensor_parallel=2)}
    assert [r.id for r in known_bad.matches(from_engine_eval(engine).record(True, "dflash"))] == \
        ["sglang-0.5.9-tp-hybrid"]
    alone = {**engine, **sglang.managed_settings("cuda", "bfloat16", 1)}
    assert "sglang-0.5.9-tp-hybrid" not in [r.id for r in known_bad.matches(from_engine_eval(alone).record(True,
                                                                                                          "dflash"))]
    for refused, message in ((dict(name="llamacpp"), "llamacpp's is not offered"),
                             (dict(name="vllm", url="http://127.0.0.1:9"), "an attached server keeps its own")):
        with pytest.raises(EngineError, match=message):
            EngineSettings(**refused, tensor_parallel=2)
