"""The Ray launcher against a real local Ray head (loopback Jobs API, CPU only) and a real SQLite queue.

One module-scoped head serves every test here (starting one takes ~10 s on 2 cores), started as a cluster node would
be (tests/raycluster.py); tests/test_ray_cluster.py adds a worker node.
"""

import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from waiting import wait_until

# CI sets DRAFTBOARD_REQUIRE_RAY=1 so that a missing or broken Ray fails instead of skipping.
if not os.environ.get("DRAFTBOARD_REQUIRE_RAY"):
    pytest.importorskip("ray.job_submission", reason="the Ray launcher tests need ray[default]",
                        exc_type=ImportError)

from tracker.errors import DraftboardError
from tracker.jobs import eval_job
from tracker.jobs.launchers import make_launcher
from tracker.jobs.launchers.local import LocalLauncher
from tracker.jobs.launchers.ray import RayLauncher, ray_env, ray_gpus
from tracker.jobs.queue import CANCELLED, FAILED, QUEUED, SUCCEEDED, JobQueue
from tracker.jobs.worker import run_worker
import raycluster
from conftest import eval_params
from uiprocess import free_port

FAST = dict(poll_s=0.05, heartbeat_s=0.2, stale_s=30.0, grace_s=5.0)


@pytest.fixture(scope="module")
def ray_head(request):
    """A Ray head on this machine: Jobs API on 127.0.0.1, 2 CPUs, no GPU; stopped at the end."""
    raycluster.server_credentials_first(request)
    yield from raycluster.cluster(cpus=2, gpus=0)


@pytest.fixture
def queue(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))  # job logs: <home>/logs
    q = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield q
    q.close()


@pytest.fixture
def ray_launcher(ray_head):
    """make(code=None, **options): `raycluster.launcher` on the test head."""
    return lambda code=None, **options: raycluster.launcher(ray_head, code, **options)


@pytest.fixture
def launcher(ray_launcher):
    return ray_launcher()


def ray_job(ray_head, launcher, index: int = -1):
    """The Ray job of the launcher's index-th submission, as the Jobs API's JSON (None before it exists).

    Raw JSON: the SDK's JobDetails model drops some fields.
    """
    import requests

    if not launcher.submitted:
        return None
    r = requests.get(f"{ray_head.address}/api/jobs/{launcher.submitted[index]['submission_id']}", timeout=10)
    return SimpleNamespace(**r.json()) if r.ok else None


@pytest.fixture
def worker_thread(queue, tmp_path):
    started = []

    def start(launcher, **kw):
        stop = threading.Event()
        thread = threading.Thread(target=run_worker, args=(queue.uri,), daemon=True,
                                  kwargs={**FAST, "stop_event": stop, "launcher": launcher, **kw})
        thread.start()
        started.append((thread, stop))
        return thread, stop

    yield start
    for thread, stop in started:
        stop.set()
        thread.join(timeout=60)


# --------------------------------------------------------------------------- no cluster needed


def test_gpu_request_and_passed_environment():
    assert ray_gpus({"device": "cuda"}) == 1 and ray_gpus({"device": "cuda"}, 2) == 2
    assert ray_gpus({"device": "cpu"}) == 0 and ray_gpus({}) == 0
    env = ray_env({"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_TRACKING_TOKEN": "t",
                   "MLFLOW_S3_ENDPOINT_URL": "http://s3", "DRAFTBOARD_HOME": "/h",
                   "DRAFTBOARD_JOBS_URI": "postgresql://u:secret@db/jobs", "AWS_REGION": "eu", "HOME": "/root"},
                  extra=["AWS_REGION", "UNSET"])
    assert env == {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_S3_ENDPOINT_URL": "http://s3",
                   "DRAFTBOARD_HOME": "/h", "AWS_REGION": "eu", "PYTHONUNBUFFERED": "1",
                   "DRAFTBOARD_JOB_EVENTS": "1"}  # no token: a secret
    assert isinstance(make_launcher("local"), LocalLauncher)
    with pytest.raises(DraftboardError, match="unknown launcher"):
        make_launcher("slurm")


def test_unreachable_jobs_api_is_a_clear_error():
    with pytest.raises(DraftboardError, match="cannot reach the Ray Jobs API at http://127.0.0.1:"):
        RayLauncher(f"http://127.0.0.1:{free_port()}")


# --------------------------------------------------------------------------- against a Ray head


def test_entrypoint_quotes_every_argument_and_uses_the_cluster_python(ray_head, launcher):
    name = "x; touch /tmp/pwned $(id) `id` 'q' \"d\" && |"
    args = eval_job.cli_args(eval_params(reference=name, device="cuda"))
    line = launcher.header(launcher.command(args))
    assert shlex.split(line) == ["python", "-m", "tracker.cli", *args]  # /bin/sh sees the argv, one word each
    assert line.startswith("python -m tracker.cli eval ")
    assert RayLauncher(ray_head.address, python="/opt/venv/bin/python").entry[0] == "/opt/venv/bin/python"
    assert RayLauncher(ray_head.address, python=None).entry[0] == sys.executable  # the worker's own interpreter


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny Qwen3.5 target, a z-lab-format drafter and token-id prompts (as tests/test_harness.py)."""
    from tiny import hybrid_eval_files

    return hybrid_eval_files(tmp_path_factory.mktemp("ray-models"), prompt_id=int)


def test_eval_through_ray_lands_in_mlflow_like_a_local_one(ray_head, launcher, tiny_models, tracker, store_uri,
                                                          tmp_path, monkeypatch):
    import mlflow

    home = tmp_path / "home"
    # The eval learns where to log and where its cache lives from the worker's environment,
    # passed to the Ray job as runtime_env env_vars.
    monkeypatch.setenv("DRAFTBOARD_HOME", str(home))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)
    with tracker.training_run("train-for-ray-eval", {"lr": 1e-3}, str(tiny_models / "target")) as train:
        train.log_step(0, loss=1.0)
    params = {"target": str(tiny_models / "target"), "drafter": str(tiny_models / "drafter"),
              "prompts": str(tiny_models / "prompts.jsonl"), "max_new_tokens": 12, "budgets": [2, 8],
              "device": "cpu", "train_run_id": train.run_id, "checkpoint_step": 100}
    ray_queue = JobQueue(f"sqlite:///{tmp_path / 'ray-jobs.db'}")
    job = ray_queue.submit("eval", params)

    started = time.monotonic()
    assert run_worker(ray_queue.uri, once=True, launcher=launcher, **FAST) == 1
    print(f"eval through ray: {time.monotonic() - started:.1f} s", file=sys.stderr)

    done = ray_queue.get(job.id)
    log = Path(done.log_path).read_text()
    assert done.state == SUCCEEDED, f"{done.error}\n{log}"
    assert done.error is None and done.mlflow_run_id and done.pid is None
    assert done.progress == 1.0 and done.stage == "drafter", log  # progress lines were read from the Ray job's log
    assert f"ray job draftboard-job-{job.id}-" in log and "tau " in log and '"event": "result"' in log
    assert (home / "cache").is_dir()  # DRAFTBOARD_HOME reached the eval

    info = ray_job(ray_head, launcher)
    assert info.status == "SUCCEEDED" and info.entrypoint.startswith("python -m tracker.cli eval ")
    assert info.runtime_env["env_vars"]["MLFLOW_TRACKING_URI"] == store_uri
    assert info.metadata["draftboard_job"] == str(job.id)
    [submitted] = launcher.submitted
    assert submitted["entrypoint_num_gpus"] == 0 and submitted["entrypoint_num_cpus"] == 1  # device=cpu

    client = mlflow.MlflowClient(store_uri)
    run = client.get_run(done.mlflow_run_id)
    assert run.data.tags["draftboard.kind"] == "eval" and run.data.tags["draftboard.train_run_id"] == train.run_id
    assert run.data.tags["draftboard.checkpoint_step"] == "100"
    logged = json.loads(Path(client.download_artifacts(done.mlflow_run_id, "eval_results.json",
                                                       str(tmp_path / "a"))).read_text())
    assert run.data.metrics["tau"] == pytest.approx(logged["tau"])
    assert {"ddtree_tau_b2", "dds8", "accept_rate_pos1", "tau_all_anchors"} <= set(run.data.metrics)

    # The same job through the local launcher gives the same numbers.
    local_queue = JobQueue(f"sqlite:///{tmp_path / 'local-jobs.db'}")
    local = local_queue.submit("eval", params)
    started = time.monotonic()
    assert run_worker(local_queue.uri, once=True, launcher=LocalLauncher(), **FAST) == 1
    print(f"eval through the local launcher: {time.monotonic() - started:.1f} s", file=sys.stderr)
    local = local_queue.get(local.id)
    assert local.state == SUCCEEDED and local.stage == done.stage
    local_run = client.get_run(local.mlflow_run_id)
    assert local_run.data.metrics == run.data.metrics
    assert {k: v for k, v in local_run.data.tags.items() if k.startswith(("draftboard.", "env."))} == \
        {k: v for k, v in run.data.tags.items() if k.startswith(("draftboard.", "env."))}


def test_shell_metacharacters_in_arguments_stay_literal(ray_head, ray_launcher, queue, tmp_path):
    marks = [tmp_path / f"pwned{i}" for i in range(5)]
    params = eval_params(target=f"x; touch {marks[0]}", drafter=f"$(touch {marks[1]})", prompts=f"`touch {marks[2]}`",
                         reference=f"a' ; touch {marks[3]}; '", name=f"&& touch {marks[4]} | cat")
    job = queue.submit("eval", params)
    run_worker(queue.uri, once=True, launcher=ray_launcher("import sys, json; print(json.dumps(sys.argv[1:]))"), **FAST)
    done = queue.get(job.id)
    assert done.state == SUCCEEDED, done.error
    assert json.dumps(eval_job.cli_args(params)) in Path(done.log_path).read_text()
    assert not any(mark.exists() for mark in marks)


def test_failing_ray_job_reports_exit_code_and_last_lines(ray_head, ray_launcher, queue, tmp_path):
    code = """
        import sys
        for i in range(1, 31):
            print(f"line {i}")
        print("Traceback: boom", file=sys.stderr)
        sys.exit(3)
    """
    job = queue.submit("eval", eval_params())
    run_worker(queue.uri, once=True, launcher=ray_launcher(code), **FAST)
    failed = queue.get(job.id)
    assert failed.state == FAILED
    assert failed.error.startswith(f"exit code 3 (Ray job draftboard-job-{job.id}-")
    assert "line 30" in failed.error and "Traceback: boom" in failed.error and "line 5\n" not in failed.error


def test_cancel_stops_the_running_ray_job(ray_head, ray_launcher, queue, worker_thread, tmp_path):
    code = """
        import signal, sys, time
        def bye(*_):
            print("got SIGTERM, cleaning up", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """
    job = queue.submit("eval", eval_params())
    launcher = ray_launcher(code)
    worker_thread(launcher)
    wait_until(lambda: "ready" in queue.log_tail(job.id, 5).splitlines())  # the line, not the header quoting it
    queue.request_cancel(job.id)

    cancelled = wait_until(lambda: queue.get(job.id).finished and queue.get(job.id))
    assert cancelled.state == CANCELLED and cancelled.error == "cancelled on request"
    assert "got SIGTERM, cleaning up" in Path(cancelled.log_path).read_text()
    assert ray_job(ray_head, launcher).status == "STOPPED"


def test_gpu_job_waits_for_a_gpu_and_can_be_cancelled_while_pending(ray_head, ray_launcher, queue, worker_thread):
    job = queue.submit("eval", eval_params(device="cuda"))
    launcher = ray_launcher("print('started:' + 'yes')")
    worker_thread(launcher)
    wait_until(lambda: (info := ray_job(ray_head, launcher)) is not None and info.status == "PENDING")
    assert launcher.submitted[0]["entrypoint_num_gpus"] == 1  # this head has none: the job waits for one
    queue.request_cancel(job.id)

    # Ray cannot stop a PENDING job (ray-project/ray#58353); the queue's job is cancelled anyway.
    cancelled = wait_until(lambda: queue.get(job.id).finished and queue.get(job.id))
    assert cancelled.state == CANCELLED
    assert re.fullmatch(r"cancelled on request; Ray job draftboard-job-\d+-\w+ was still PENDING; .+", cancelled.error)
    assert "started:yes" not in Path(cancelled.log_path).read_text()


def test_no_job_is_claimed_while_the_cluster_is_unreachable(ray_head, launcher, queue, tmp_path, monkeypatch):
    def down():
        raise ConnectionError("connection refused")

    monkeypatch.setattr(launcher.client, "get_version", down)
    job = queue.submit("eval", eval_params())
    assert run_worker(queue.uri, once=True, launcher=launcher, **FAST) == 0
    assert queue.get(job.id).state == QUEUED  # kept for when the cluster is back, not failed


def test_worker_cli_runs_jobs_on_ray(ray_head, queue, tmp_path, monkeypatch, capsys):
    from tracker.cli import main

    monkeypatch.setenv("SHARED_SETTING", "s3")
    # --ray-python: the interpreter on the node; this one only reports what it was given.
    python = tmp_path / "python"
    seen = tmp_path / "seen.txt"  # what the job was given, read here rather than through Ray's log collection
    python.write_text('#!/bin/sh\necho env "$EXTRA" "$SHARED_SETTING" "secret:${MLFLOW_TRACKING_PASSWORD:-none}" "$@"'
                      f' > {seen}\n')
    python.chmod(0o755)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2")  # the worker's own: never sent to the cluster
    job = queue.submit("eval", eval_params())
    assert main(["worker", "--launcher", "ray", "--address", ray_head.address, "--jobs-uri", queue.uri, "--once",
                 "--poll", "0.2", "--ray-env", "SHARED_SETTING", "--ray-python", str(python),
                 "--ray-runtime-env", '{"env_vars": {"EXTRA": "from-runtime-env"}}']) == 0
    done = queue.get(job.id)
    assert done.state == SUCCEEDED, done.error
    # The worker's own password never travels; what a node has in its own environment is the node's
    # (docs/RAY.md: secrets are set on the nodes).
    given = seen.read_text()
    assert given.startswith("env from-runtime-env s3 secret:") and "secret:hunter2" not in given
    assert "-m tracker.cli eval --target /models/t" in given
    assert done.log_path.startswith(str(tmp_path / "home" / "logs"))
    assert "worker stopped after 1 job(s)" in capsys.readouterr().out

    assert main(["worker", "--address", ray_head.address, "--once"]) == 2
    assert "need --launcher ray" in capsys.readouterr().err
