"""Issue 22's findings, each tried as the audit tried it against 471c4b8, and each now failing safely.

Real pieces throughout: a real `draftboard worker --once --watch` process on a real SQLite queue
and MLflow store, a loopback listener standing in for the attacker's "tracking server", rows
written straight into the queue's table, watch state planted with plain `MlflowClient` calls,
a real `draftboard ui` answering HTTP and websocket handshakes.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from mlflow import MlflowClient

from tracker import config
from tracker.cli import main
from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from tracker.jobs.queue import FAILED, JobQueue
from tracker.jobs.schema import upgrade_schema
from tracker.jobs.worker import run_worker
from tracker.store import names
from conftest import FAST_WORKER, insert_job_row
from loopback import LoopbackServer

PASSWORD = "hunter2-worker-secret"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An allowed root with (bogus) inputs, the worker's own store and MLflow login set."""
    home = tmp_path / "home"
    root = home / "models"
    for name in ("target", "drafter"):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")
    (root / "prompts.jsonl").write_text('{"id": 1, "input_ids": [1, 2, 3]}\n')
    env = {"DRAFTBOARD_HOME": str(home), "DRAFTBOARD_ALLOWED_ROOTS": str(root),
           "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'draftboard.db'}",
           "MLFLOW_TRACKING_USERNAME": "worker", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("DRAFTBOARD_JOBS_URI", "DRAFTBOARD_READONLY", "DRAFTBOARD_WATCH_EXPERIMENTS"):
        monkeypatch.delenv(name, raising=False)
    return home


def in_root(home: Path, **extra) -> dict:
    root = home / "models"
    return {"target": str(root / "target"), "drafter": str(root / "drafter"), "prompts": str(root / "prompts.jsonl"),
            "no_log": True, **extra}


def raw_insert(path: Path, **columns) -> int:
    """A row with column values SQLAlchemy's types would never write (text where a time goes)."""
    values = {"kind": "eval", "params": json.dumps({}), "state": "queued", "created_at": "2026-12-02 10:00:00.000000",
              "progress": 0, "cancel_requested": 0, "dedup_key": os.urandom(32).hex(), **columns}
    with sa.create_engine(f"sqlite:///{path}").begin() as conn:
        keys = ", ".join(values)
        return conn.execute(sa.text(f"INSERT INTO jobs ({keys}) VALUES ({', '.join(':' + k for k in values)}) "
                                    "RETURNING id"), values).scalar()


class Listener(LoopbackServer):
    """A loopback HTTP server that records every request's Authorization header."""

    def __init__(self) -> None:
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(404)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def plant_watch(client: MlflowClient, experiment_id: str, folder: Path, preset: dict) -> str:
    """A watch written with plain MlflowClient calls, as any MLflow writer can."""
    run_id = client.create_run(experiment_id, run_name="planted").info.run_id
    state = {"dir": str(folder), "preset": preset, "settle_s": 0, "seen": {}}
    client.log_text(run_id, json.dumps(state), names.WATCH_ARTIFACT)
    client.set_tag(run_id, names.WATCH, str(folder))
    return run_id


def test_a_foreign_store_in_a_job_row_and_a_planted_watch_borrow_nothing(home, tmp_path):
    """Item 1 and 2, and the issue's "done when": a real `draftboard worker --once --watch` meets a row
    naming the attacker's listener as its store and watches planted on a folder outside the roots;
    it sends no credential anywhere, registers nothing and runs nothing."""
    from tracker import Tracker

    listener = Listener()
    outside = tmp_path / "outside"
    (outside / "epoch_0_step_5").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (outside / "epoch_0_step_5" / name).write_text("{}")
    tracker = Tracker()
    client = tracker.client
    preset = {"target": str(home / "models" / "target"), "prompts": str(home / "models" / "prompts.jsonl")}
    ours = plant_watch(client, tracker.experiment_id, outside, preset)  # in the deployment's experiment
    theirs = plant_watch(client, client.create_experiment("attacker"), home / "models", preset)  # theirs
    borrowed = plant_watch(client, tracker.experiment_id, home / "models",
                           {**preset, "tracking_uri": listener.url})  # in the roots, a store of its own
    jobs = f"sqlite:///{home / 'jobs.db'}"
    queue = JobQueue(jobs)
    row = insert_job_row(jobs, kind="eval", params=in_root(home, tracking_uri=listener.url,
                                                    drafter=str(outside / "epoch_0_step_5"), train_run_id=ours))
    try:
        done = subprocess.run([sys.executable, "-m", "tracker.cli", "worker", "--once", "--watch", "--jobs-uri", jobs,
                               "--poll", "0.05"], capture_output=True, text=True, timeout=240)
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert listener.seen == []  # nothing reached the listener, with or without the password
    job = queue.get(row)
    assert job.state == FAILED and job.pid is None
    assert job.error.startswith("refused: unknown eval param(s) tracking_uri")
    assert [j.id for j in queue.list()] == [row]  # no watch queued anything
    for run_id in (ours, theirs, borrowed):
        assert tracker.checkpoints(run_id) == []  # registered nothing
    refused = {r: client.get_run(r).data.tags.get(names.WATCH_REFUSED) for r in (ours, theirs, borrowed)}
    assert "outside the allowed roots" in refused[ours]
    assert "unknown eval param(s) tracking_uri" in refused[borrowed]
    assert refused[theirs] is None  # not this deployment's experiment: never even read
    assert PASSWORD not in done.stderr + done.stdout + queue.log_tail(job, 100)


def test_migration_strips_the_store_from_queued_rows(home):
    path = home / "jobs.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    upgrade_schema(engine, "0003")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO jobs (kind, params, state, created_at, progress, cancel_requested, dedup_key) "
                             "VALUES ('eval', :p, 'queued', '2026-12-01 10:00:00.000000', 0, 0, :k)"),
                     {"p": json.dumps(in_root(home, tracking_uri="http://u:pw@evil:5000")), "k": "k" * 64})
    engine.dispose()
    [job] = JobQueue(f"sqlite:///{path}").list()
    assert job.params == in_root(home) and job.problem is None
    assert eval_job.FIELDS["tracking_uri"].job is False
    with pytest.raises(DraftboardError, match="unknown eval param.* tracking_uri"):
        JobQueue(f"sqlite:///{path}").submit("eval", in_root(home, tracking_uri="sqlite:////tmp/x.db"))


def test_hf_local_builders_are_refused_before_datasets_is_imported(home, tmp_path):
    """Item 3: `hf:csv:train` read the working directory's `creds.csv` into MLflow."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    assert set(_PACKAGED_DATASETS_MODULES) <= config.LOCAL_DATASET_BUILDERS  # datasets' own list, as installed
    (tmp_path / "creds.csv").write_text("prompt\nAKIA-SECRET\n")
    code = ("import sys; from tracker.cli import main; rc = main(sys.argv[1:]); "
            "print('datasets imported' if 'datasets' in sys.modules else 'datasets not imported'); sys.exit(rc)")
    for spec in ("hf:csv:train", "hf:JSON:train", "hf:parquet:default:train"):
        done = subprocess.run([sys.executable, "-c", code, "eval", "--target", str(home / "models" / "target"),
                               "--drafter", str(home / "models" / "drafter"), "--prompts", spec, "--no-log"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "datasets not imported" in done.stdout, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("error: ") and "local" in line and "builder" in line
        with pytest.raises(DraftboardError, match="builder"):  # the Launch form's and the worker's check
            eval_job.check_path("--prompts", spec, config.allowed_roots())
    assert eval_job.check_path("--prompts", "hf:openai/gsm8k:main:test", config.allowed_roots()) is None


def test_credentials_in_store_uris_never_show(home, capsys, monkeypatch):
    """Item 4: store errors, the CLI's error line, a job's stored error and a Ray job's env."""
    from tracker import Tracker
    from tracker.jobs.launchers.ray import ray_env

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # nothing listens there: fail at once
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")

    secret_uri = f"http://admin:{PASSWORD}@127.0.0.1:9/"
    with pytest.raises(DraftboardError) as refused:
        Tracker(secret_uri).find_experiment()
    assert PASSWORD not in str(refused.value) and "127.0.0.1:9" in str(refused.value)
    assert main(["env-diff", "nope-a", "nope-b", "--tracking-uri", secret_uri]) == 2
    assert PASSWORD not in capsys.readouterr().err
    queue = JobQueue()
    job = queue.submit("eval", in_root(home))
    queue.claim("w")
    assert PASSWORD not in queue.finish(job.id, FAILED, error=str(refused.value)).error
    assert ray_env({"MLFLOW_TRACKING_URI": secret_uri}) == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9/",
                                                            "PYTHONUNBUFFERED": "1", "DRAFTBOARD_JOB_EVENTS": "1"}


def test_a_quantization_config_does_not_switch_off_the_size_check(tmp_path):
    """Item 5: a folder of 17,172 weights whose config (claiming quantization) builds a 100M model."""
    from safetensors.torch import save_file
    import torch
    from transformers import Qwen3Config

    from evaluators.target import check_weights

    folder = tmp_path / "quantized"
    folder.mkdir()
    cfg = Qwen3Config(vocab_size=32000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=6,
                      num_attention_heads=8, num_key_value_heads=8, head_dim=128)
    cfg_dict = cfg.to_dict() | {"architectures": ["Qwen3ForCausalLM"],
                                "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    (folder / "config.json").write_text(json.dumps(cfg_dict))
    save_file({"packed": torch.zeros(17_172, dtype=torch.uint8)}, str(folder / "model.safetensors"))
    with pytest.raises(DraftboardError, match="config and weights do not belong together"):
        check_weights(folder)


def test_poison_rows_fail_their_job_and_break_no_reader(home):
    """Item 9 and 10: rows the audit wrote stopped `draftboard worker` and the Launch page."""
    from tracker.dashboard.launch_form import describe_job

    queue = JobQueue()
    path = home / "jobs.db"
    garbage_time = raw_insert(path, params=json.dumps(in_root(home)), created_at="garbage")
    not_object = raw_insert(path, params="[1, 2, 3]")
    not_json = raw_insert(path, params="{not json")
    running = raw_insert(path, params=json.dumps(in_root(home)), state="running", started_at="garbage",
                         heartbeat_at="garbage", worker_id="gone", log_path="/tmp/x\0y")
    huge = insert_job_row(queue.uri, kind="eval", params=in_root(home), state="failed", error="x" * 30_000_000)

    jobs = {job.id: job for job in queue.list()}  # reading every row works
    assert set(jobs) >= {garbage_time, not_object, not_json, running, huge}
    for job in jobs.values():
        view = describe_job(job)  # the Launch page's queue
        assert view.title
    assert jobs[running].started_at is None and jobs[garbage_time].problem == "created_at is not a time"
    assert describe_job(jobs[not_object]).error.startswith("malformed job row: params are not a JSON object")
    assert len(jobs[huge].error) <= config.MAX_ERROR_CHARS
    assert queue.log_tail(jobs[running]).startswith("[draftboard] log not shown")

    assert run_worker(queue.uri, once=True, **FAST_WORKER) == 3  # the three queued ones, each refused
    for job_id in (garbage_time, not_object, not_json):
        job = queue.get(job_id)
        assert job.state == FAILED and job.pid is None and job.error.startswith("refused: malformed job row: "), job
    job = queue.submit("eval", in_root(home, name="n"))
    assert queue.claim("w").id == job.id
    stored = queue.finish(job.id, FAILED, error="y" * 10**6).error
    assert len(stored) <= config.MAX_ERROR_CHARS and stored.endswith("the whole text is in the job's log]")


def test_a_readonly_dashboard_on_a_missing_store_creates_nothing(tmp_path, monkeypatch):
    """Item 11: rendering the pages with DRAFTBOARD_READONLY=1 created draftboard.db (65 tables)."""
    from apptest import page_text, run_page, serve

    home = tmp_path / "home"
    home.mkdir()
    store = home / "draftboard.db"
    serve(monkeypatch, f"sqlite:///{store}", home, home)
    monkeypatch.setenv("DRAFTBOARD_READONLY", "1")
    for page in ("pages/runs.py", "pages/compare.py", "pages/environments.py", "pages/launch.py"):
        at = run_page(page)
        assert "read-only, so it creates nothing" in page_text(at)
    assert sorted(p.name for p in home.iterdir()) == []


def test_a_forged_demo_manifest_deletes_no_run_of_the_team(home):
    """Item 12: a manifest listing the team's runs made `demo --force` delete them."""
    from demo.build import DEMO_DIR, MANIFEST, MANIFEST_SCHEMA, remove_demo
    from tracker import Tracker

    tracker = Tracker()
    with tracker.training_run("the team's v4", {}, "t", fingerprint={}) as team:
        pass
    with tracker.training_run("demo run", {}, "t", fingerprint={}, tags={names.DEMO: "1"}) as demo_run:
        pass
    root = home / DEMO_DIR
    root.mkdir()
    (root / MANIFEST).write_text(json.dumps({"schema": MANIFEST_SCHEMA, "files": [], "complete": True,
                                             "runs": [team.run_id, demo_run.run_id]}))
    said = []
    remove_demo(home, tracker, said.append)
    assert tracker.client.get_run(team.run_id).info.lifecycle_stage == "active"
    assert tracker.client.get_run(demo_run.run_id).info.lifecycle_stage == "deleted"
    assert any(team.run_id in line and "not tagged" in line for line in said)


def test_the_dashboard_answers_only_its_own_host_names(start_ui):
    """Item 6, DNS rebinding: `Host: evil.example` (a name an attacker's page made resolve to
    127.0.0.1) gets 403 on every route but health, and its websocket handshake is refused."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    from test_security_ui import status

    ui, _ = start_ui("--no-worker", children=1, env={config.UI_HOSTS_VAR: "board.example.org"})
    base = f"http://127.0.0.1:{ui.port}"
    assert status(base + "/launch", {"Host": "evil.example"}) == 403
    assert status(base + "/", {"Host": f"evil.example:{ui.port}"}) == 403
    assert status(base + "/_stcore/health", {"Host": "evil.example"}) == 200
    assert status(base + "/launch") == 200 and status(base + "/", {"Host": f"localhost:{ui.port}"}) == 200
    assert status(base + "/", {"Host": "board.example.org"}) == 200  # configured for a public bind
    stream = f"ws://127.0.0.1:{ui.port}/_stcore/stream"
    for host, headers in (("evil.example", {}), ("127.0.0.1", {"Origin": "http://evil.example"})):
        # The rebinding browser's request: to 127.0.0.1, under the attacker's name.
        sock = socket.create_connection(("127.0.0.1", ui.port), timeout=10)
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://{host}:{ui.port}/_stcore/stream", sock=sock, additional_headers=headers,
                    open_timeout=10).close()
        assert refused.value.response.status_code == 403
    with connect(stream, additional_headers={"Origin": f"http://localhost:{ui.port}"}, open_timeout=10) as ws:
        assert ws.response.status_code == 101


def test_a_prompts_file_swapped_after_the_workers_check_is_not_read(home, tmp_path):
    """Item 7: the worker checked a plain prompts file, the file then became a symlink to an outside
    file, and the eval read that file into eval_results.json. The eval's own read is now the check."""
    from evaluators.prompts import attach_completions, read_jsonl
    from tracker.jobs.worker import job_args

    secret = tmp_path / "outside.jsonl"
    secret.write_text('{"id": "s", "input_ids": [7], "completion_ids": [7]}\n')
    prompts = home / "models" / "prompts.jsonl"
    job = JobQueue(f"sqlite:///{home / 'jobs.db'}").submit("eval", eval_job.validate(in_root(home)))
    assert "--prompts" in job_args(job)  # the check at claim time passes: a plain file under the root
    assert [row for _, row in read_jsonl(prompts)] == [{"id": 1, "input_ids": [1, 2, 3]}]

    prompts.unlink()
    prompts.symlink_to(secret)  # the swap, after the check
    for read in (read_jsonl, lambda p: attach_completions([], p, 10)):
        with pytest.raises(DraftboardError, match="outside the allowed roots") as err:
            read(prompts)
        assert "AKIA" not in str(err.value) and str(secret) in str(err.value)
    os.environ.pop(config.ROOTS_VAR)  # a CLI eval with no roots configured follows the link as before
    assert [row["id"] for _, row in read_jsonl(prompts)] == ["s"]


def test_a_fifo_for_a_prompts_file_does_not_hang_the_eval(home):
    from evaluators.prompts import read_jsonl

    fifo = home / "models" / "prompts.fifo"
    os.mkfifo(fifo)
    with pytest.raises(DraftboardError, match="not a regular file"):
        read_jsonl(fifo)
    # Issue 64, F4: the first look at a job's inputs (the worker at claim, Launch at submit) follows the same rule.
    from tracker.jobs.inputs import prompts_problem

    assert "not a regular file" in prompts_problem(str(fifo))
