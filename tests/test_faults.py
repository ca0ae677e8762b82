"""Faults: a process dies, a service goes away, a disk fills up. Each test asserts nothing is lost,
or that the loss is reported in one clear line, and that what comes next still works.

Real processes throughout: `draftboard eval` subprocesses run by a real worker on a real SQLite
queue, a worker subprocess killed with SIGKILL, the Streamlit Launch page (AppTest) rendered
before and after a "restart", a real `mlflow server` stopped for 30 s, and a real file-size
limit (RLIMIT_FSIZE). Synchronization always waits on a condition with a deadline.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from waiting import wait_until
from mlflow import MlflowClient
from tiny import hybrid_eval_files
from conftest import eval_params, script_entry

from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from tracker import events
from tracker.cli import main
from tracker.errors import DraftboardError
from tracker.jobs.launchers.local import LocalLauncher
from tracker.jobs.queue import FAILED, RUNNING, SUCCEEDED, JobQueue
from tracker.store.retry import RetryPolicy
from tracker.store.tracker import Tracker

APP = str(Path(__file__).resolve().parents[1] / "app.py")
OUTAGE_S = 30.0




# A job's script learns which job it is from its run name (`--name`, set in the job's params).
JOB_NAME = "sys.argv[sys.argv.index('--name') + 1]"


def pid_gone(pid: int) -> bool:
    """No such process, or only its zombie (an orphan's zombie may wait long for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def finished(queue: JobQueue, job_id: int):
    job = queue.get(job_id)
    return job if job.finished else None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny hybrid target, a drafter for it, three prompts, and an SQLite store of this module's own."""
    root = hybrid_eval_files(tmp_path_factory.mktemp("fault-models"), prompt_id=lambda i: f"p{i}")
    store = f"sqlite:///{root / 'store' / 'draftboard.db'}"
    return dict(root=root, target=str(root / "target"), drafter=str(root / "drafter"),
                prompts=str(root / "prompts.jsonl"), store=store)


class MlflowServer:
    """`mlflow server` on a fixed port with an SQLite backend: start, stop, start again on the same port."""

    def __init__(self, root: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.root, self.log = root, root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 's.db'}",
               "--default-artifact-root", str(self.root / "a"), "--host", "127.0.0.1", "--port", str(self.port),
               "--workers", "1"]
        # Without MLflow's GenAI job runner (a handful of huey consumer processes draftboard never uses),
        # the server starts in half the time.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 120.0) -> None:
        def up():
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            return self.ready()

        wait_until(up, timeout, interval=0.1, what="mlflow server up")

    def stop(self) -> None:
        """SIGTERM to the server's process group (the CLI and its uvicorn), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        wait_until(lambda: not self.ready(), 10, what="mlflow server down")


@pytest.fixture(scope="module", autouse=True)
def mlflow_server(tmp_path_factory):
    """Started as the module begins (it takes ~10 s), used by the last tests, which wait until it is up."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def worker(worker_threads):
    return worker_threads


# --------------------------------------------------------------------------- 1. eval killed mid-run

# `draftboard eval`, unchanged except that it parks (as a slow eval would) once the first prompt is
# scored and reported, so the SIGKILL lands mid-scoring for certain. The job named "next" only
# reports a result.
PARK_IN_DRAFTER_STAGE = """
import sys, threading
if "next" in sys.argv:
    print({result!r})
    sys.exit(0)
import evaluators.harness as harness
real, calls = harness.score_anchors, []
def score_then_park(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        print("parked", "mid-scoring", flush=True)  # (split: the log's header quotes this source)
        threading.Event().wait()
    return real(*args, **kwargs)
harness.score_anchors = score_then_park
from tracker.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_eval_killed_mid_run_fails_its_job_keeps_the_log_and_the_queue_goes_on(models, worker, tmp_path,
                                                                               monkeypatch):
    """An eval opens its MLflow run only after scoring (`log_eval` at the end), so a kill while scoring
    leaves no run at all: nothing half-written that would need marking FAILED. The job says how it
    died and keeps its log; the next job in the queue runs."""
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))  # the eval's cache: $DRAFTBOARD_HOME/cache
    monkeypatch.setenv("MLFLOW_TRACKING_URI", models["store"])  # the worker's store, so its evals'
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    params = {"target": models["target"], "drafter": models["drafter"], "prompts": models["prompts"],
              "max_new_tokens": 12, "budgets": [2, 8], "device": "cpu", "linear_attn": "fallback",
              "name": "killed mid-run"}
    killed = queue.submit("eval", params)
    after = queue.submit("eval", {**params, "name": "next"})
    result = events.PREFIX + json.dumps({"event": "result", "run_id": "next-run", "out": None})
    launcher = LocalLauncher(script_entry(PARK_IN_DRAFTER_STAGE.format(result=result)))
    worker(queue.uri, slots=1, launcher=launcher)  # one slot: the next job starts once the killed one is recorded

    wait_until(lambda: "parked mid-scoring" in queue.log_tail(killed.id, 5), 60, what="eval parked")
    running = queue.get(killed.id)
    assert running.state == RUNNING and running.stage == "drafter" and running.progress == pytest.approx(1 / 3)
    os.kill(running.pid, signal.SIGKILL)

    dead = wait_until(lambda: finished(queue, killed.id), what="killed job finished")
    assert dead.state == FAILED and dead.error.startswith("killed by SIGKILL; last output:"), dead.error
    assert "parked mid-scoring" in dead.error
    assert dead.stage == "drafter" and dead.progress == pytest.approx(1 / 3)  # where it died, as last reported
    log = Path(dead.log_path).read_text()
    assert events.PREFIX + json.dumps({"event": "progress", "stage": "drafter", "done": 1, "total": 3}) in log
    assert not [r for r in Tracker(models["store"]).find_runs() if r.info.run_name == "killed mid-run"]

    done = wait_until(lambda: finished(queue, after.id), what="next job finished")
    assert done.state == SUCCEEDED and done.mlflow_run_id == "next-run" and done.started_at >= dead.finished_at


# --------------------------------------------------------------------------- 2. worker killed

WORKER = "import sys, json; from tracker.jobs.worker import run_worker; " \
         "from tracker.jobs.launchers.local import LocalLauncher; " \
         "run_worker(sys.argv[1], poll_s=0.05, heartbeat_s=0.1, stale_s=1.0, launcher=LocalLauncher(json.loads(sys.argv[2])))"


def test_killed_worker_job_is_failed_by_heartbeat_timeout_and_never_rerun(worker, tmp_path):
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    record, gate = tmp_path / "record", tmp_path / "never"
    # Job "first" records its start and waits; job "next" records itself.
    entry = script_entry(f"""
        import os, sys, time
        name = {JOB_NAME}
        open({str(record)!r}, "a").write(name + "\\n")
        if name == "first":
            print("job", "ready", flush=True)
            while not os.path.exists({str(gate)!r}):
                time.sleep(0.02)
    """)
    job = queue.submit("eval", eval_params(name="first"))
    doomed = subprocess.Popen([sys.executable, "-c", WORKER, queue.uri, json.dumps(entry)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # DRAFTBOARD_HOME: the fixture's
    job_pid = None
    try:
        running = wait_until(lambda: "job ready" in queue.log_tail(job.id, 5) and (j := queue.get(job.id)).pid and j,
                             30, what="job ready")
        job_pid, dead_worker = running.pid, running.worker_id
        assert running.state == RUNNING and dead_worker.split(":")[1] == str(doomed.pid)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=10)
        # The job does not outlive its worker (PR_SET_PDEATHSIG), so it cannot log anything the queue never hears of.
        wait_until(lambda: pid_gone(job_pid), 10, what="orphaned job gone")

        worker(queue.uri, stale_s=1.0, launcher=LocalLauncher(entry))  # another worker: fail_stale finds the job
        failed = wait_until(lambda: finished(queue, job.id), 30, what="stale job failed")
        assert failed.state == FAILED and failed.worker_id == dead_worker  # failed in place, never reclaimed
        beat = failed.heartbeat_at
        assert failed.error == f"worker {dead_worker} stopped heartbeating at {beat:%Y-%m-%d %H:%M:%S} UTC"
        nxt = queue.submit("eval", eval_params(name="next"))
        ran = wait_until(lambda: finished(queue, nxt.id), 30, what="next job finished")
        assert ran.state == SUCCEEDED and ran.worker_id != dead_worker
        assert record.read_text().split() == ["first", "next"]  # the killed worker's job ran once
    finally:
        if doomed.poll() is None:
            doomed.kill()
        if job_pid and not pid_gone(job_pid):
            os.kill(job_pid, signal.SIGKILL)


# --------------------------------------------------------------------------- 3. dashboard restarted


def test_dashboard_restart_shows_the_same_running_job_and_progress(models, worker, tmp_path, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    for name, value in {"MLFLOW_TRACKING_URI": models["store"], "DRAFTBOARD_HOME": str(tmp_path),
                        "DRAFTBOARD_JOBS_URI": queue.uri}.items():
        monkeypatch.setenv(name, value)
    for name in ("DRAFTBOARD_READONLY", "DRAFTBOARD_ALLOWED_ROOTS"):  # (the job's drafter path is made up)
        monkeypatch.delenv(name, raising=False)
    gate = tmp_path / "gate"
    progress = events.PREFIX + json.dumps({"event": "progress", "stage": "target: features", "done": 3, "total": 4})
    job = queue.submit("eval", eval_params(drafter="/ckpt/v9/step_300", device="cpu", dtype="fp32",
                                           linear_attn="fallback"))
    worker(queue.uri, launcher=LocalLauncher(script_entry(f"""
        import os, time
        print({progress!r}, flush=True)
        while not os.path.exists({str(gate)!r}):
            time.sleep(0.02)
    """)))
    running = wait_until(lambda: (j := queue.get(job.id)).progress == 0.75 and j, what="progress recorded")

    def dashboard():
        """A fresh dashboard process as far as Streamlit can tell: no session, no cached resources."""
        st.cache_data.clear()
        st.cache_resource.clear()
        at = AppTest.from_file(APP, default_timeout=60)
        at.switch_page("pages/launch.py")
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        # Titles are markdown-escaped where shown (`\#1 eval step\_300`): compare their plain text.
        titles = [m.value.replace("\\", "") for m in at.markdown if f"#{job.id} eval" in m.value.replace("\\", "")]
        return titles, [(p.value, p.text.replace("\\", "")) for p in at.get("progress")]

    before = dashboard()
    (title,), (bar,) = before
    assert "step_300" in title and title.rstrip("*").endswith("running"), title
    assert bar == (75, "target: features · 75% of this stage"), bar
    assert dashboard() == before  # restarted: the queue lives in the database, not in the dashboard
    still = queue.get(job.id)
    assert (still.state, still.pid, still.worker_id, still.started_at) == \
        (RUNNING, running.pid, running.worker_id, running.started_at)

    gate.touch()
    wait_until(lambda: finished(queue, job.id), what="job finished")
    (title,), (bar,) = dashboard()
    assert "step_300" in title and title.rstrip("*").endswith("succeeded") and bar[0] == 100, (title, bar)


# --------------------------------------------------------------------------- 4. 100 jobs from 10 threads


def test_100_jobs_from_10_threads_each_run_exactly_once(worker, tmp_path):
    uri = f"sqlite:///{tmp_path / 'jobs.db'}"
    JobQueue(uri).close()  # the table exists before the race
    record = tmp_path / "record"
    barrier, submitted, errors = threading.Barrier(10), [], []

    def submitter(t: int) -> None:
        queue = JobQueue(uri)  # its own connections, as another dashboard would have
        try:
            barrier.wait(timeout=30)
            for k in range(10):
                i = t * 10 + k
                job = queue.submit("eval", eval_params(name=str(i)))
                submitted.append((i, job.id, job.existing))
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            queue.close()

    # Each job records its name and reports the run id run-<name>.
    launcher = LocalLauncher(script_entry(f"""
        import json, sys
        name = {JOB_NAME}
        open({str(record)!r}, "a").write(name + "\\n")
        print({events.PREFIX!r} + json.dumps({{"event": "result", "run_id": "run-" + name, "out": None}}))
    """))
    workers = [worker(uri, slots=4, launcher=launcher) for _ in range(2)]  # already polling while jobs arrive
    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors

    queue = JobQueue(uri)
    jobs = wait_until(lambda: (js := queue.list(limit=1000)) and all(j.finished for j in js) and js, 90,
                      what="every job finished")
    assert len(jobs) == 100 and len(submitted) == 100 and not any(existing for _, _, existing in submitted)
    assert {j.id for j in jobs} == {job_id for _, job_id, _ in submitted}
    assert all(j.state == SUCCEEDED and j.mlflow_run_id == f"run-{j.params['name']}" for j in jobs)
    assert sorted(map(int, record.read_text().split())) == list(range(100))  # each ran exactly once
    for _, stop, _ in workers:
        stop.set()
    for thread, _, result in workers:
        thread.join(timeout=30)
    assert sum(result["n"] for _, _, result in workers) == 100


# --------------------------------------------------------------------------- 6. unwritable / full disk


def test_unwritable_artifact_dir_is_one_error_line_and_a_failed_run(models, tmp_path, capsys):
    store = tmp_path / "store"
    store.mkdir()
    (store / "mlartifacts").write_text("a file where the artifact directory should be")
    uri = f"sqlite:///{store / 'draftboard.db'}"
    args = ["eval", "--target", models["target"], "--drafter", models["drafter"], "--prompts", models["prompts"],
            "--max-new-tokens", "12", "--budgets", "2", "--device", "cpu", "--linear-attn", "fallback",
            "--cache-dir", str(tmp_path / "cache"), "--tracking-uri", uri, "--name", "unwritable"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot start run 'unwritable' in sqlite:") and "Not a directory" in err[-1]
    assert not any("Traceback" in line for line in err)
    [run] = Tracker(uri).find_runs()
    assert run.info.run_name == "unwritable" and run.info.status == "FAILED"
    assert "Not a directory" in run.data.tags["draftboard.error"]


def test_artifact_dir_lost_mid_run_fails_the_run_at_once_keeping_its_steps(models, tmp_path, machine_fp):
    tracker = Tracker(models["store"])  # the default retry window (120 s): must not be spent on a broken disk
    checkpoint = tmp_path / "step_10.pt"
    checkpoint.write_bytes(b"weights")
    started = time.monotonic()
    with pytest.raises(DraftboardError, match=r"registering checkpoint .*step_10.pt in file://.* failed: "
                                              r"NotADirectoryError: \[Errno 20\] Not a directory") as err:
        with tracker.training_run("artifacts lost", {}, models["target"], fingerprint=machine_fp) as run:
            for step in range(10):
                run.log_step(step, loss=1.0 / (step + 1))
            artifacts = Path(tracker.client.get_run(run.run_id).info.artifact_uri.removeprefix("file://"))
            (artifacts / "checkpoints").write_text("not a directory")  # the artifact directory is broken
            run.log_checkpoint(checkpoint, 10)
    assert time.monotonic() - started < 10 and "\n" not in str(err.value)
    got = tracker.run(run.run_id)
    assert got.info.status == "FAILED" and "Not a directory" in got.data.tags["draftboard.error"]
    history = MlflowClient(models["store"]).get_metric_history(run.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(10))  # the steps logged before the failure are kept


DISK_FULL = """
import json, resource, sys
from evaluators.settings import EvalSettings
from evaluators.logging import log_eval
from tracker.errors import DraftboardError
from tracker.store.tracker import Tracker
results = json.loads(open(sys.argv[1]).read())
tracker = Tracker(sys.argv[2])
tracker.experiment_id  # the store is reachable; then the disk fills up
limit = len(json.dumps(results["fingerprint"], indent=2)) + 1024  # fingerprint.json fits, eval_results.json not
assert len(json.dumps(results, indent=2)) > limit
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    log_eval(tracker, results, EvalSettings(**results["settings"]), name="disk full")
except DraftboardError as exc:
    print(f"error: {exc}")
    sys.exit(2)
"""


def test_disk_full_while_logging_an_eval_is_a_clear_error_and_a_failed_run(models, mlflow_server, tmp_path):
    """The file-size limit (EFBIG) stands in for a full disk (ENOSPC): both are refused at once, not retried."""
    settings = EvalSettings(target=models["target"], drafter=models["drafter"], prompts=models["prompts"],
                            max_new_tokens=12, budgets=(2, 8), device="cpu", linear_attn="fallback",
                            cache_dir=str(tmp_path / "cache"))
    results = tmp_path / "results.json"
    results.write_text(json.dumps(evaluate(settings)))
    mlflow_server.wait_ready()  # the runs live on the server; the artifacts are written by the eval's process
    done = subprocess.run([sys.executable, "-c", DISK_FULL, str(results), mlflow_server.url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("error: writing eval_results.json to ") and "[Errno 27] File too large" in line, line
    assert "Traceback" not in done.stderr

    client = MlflowClient(mlflow_server.url)
    [run] = client.search_runs([Tracker(mlflow_server.url).experiment_id], "attributes.run_name = 'disk full'")
    assert run.info.status == "FAILED" and "File too large" in run.data.tags["draftboard.error"]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["fingerprint.json"]  # no half result


# --------------------------------------------------------------------------- 5. MLflow server down for 30 s


@pytest.mark.slow
def test_mlflow_server_down_for_30_s_loses_no_step_and_keeps_the_order(mlflow_server, machine_fp, monkeypatch):
    # MLflow's own HTTP retries (7, backing off up to 2 min) would only hide the outage inside one call;
    # with them off, draftboard's RetryPolicy alone must ride it out: the default window, faster polls.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    policy = dataclasses.replace(RetryPolicy(), first_delay_s=0.1, max_delay_s=1.0)
    assert policy.window_s >= OUTAGE_S + 60  # the window covers the outage and a slow restart
    mlflow_server.wait_ready()
    tracker = Tracker(mlflow_server.url, retry=policy)
    sent, failed = [], []
    real_log_batch = tracker.client.log_batch

    def transport(run_id, metrics=(), **kwargs):  # records what reached the server, in order
        try:
            result = real_log_batch(run_id, metrics=metrics, **kwargs)
        except Exception:
            failed.append(len(metrics))
            raise
        sent.extend(m.step for m in metrics)
        return result

    tracker.client.log_batch = transport
    step = 0

    def log_steps_until(condition, server_running: bool = True, timeout: float = 120.0) -> None:
        """The training loop: one step about every 10 ms for as long as the scenario lasts."""
        nonlocal step
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or (server_running and mlflow_server.proc.poll() is not None):
                pytest.fail(f"stuck at step {step}; server log:\n{mlflow_server.log.read_text()[-3000:]}")
            run.log_step(step, loss=float(step))
            step += 1
            time.sleep(0.01)

    with tracker.training_run("server outage", {"outage_s": OUTAGE_S}, "t", fingerprint=machine_fp) as run:
        log_steps_until(lambda: sent)  # steps are reaching the server
        mlflow_server.stop()
        stopped = time.monotonic()
        log_steps_until(lambda: time.monotonic() - stopped >= OUTAGE_S, server_running=False)
        assert failed, "the flusher never hit the stopped server"
        logged_while_down = step
        mlflow_server.start()  # same port, same database
        log_steps_until(lambda: len(sent) >= logged_while_down)  # the backlog is through
        outage = time.monotonic() - stopped
        log_steps_until(lambda: step >= logged_while_down + 50)

    assert sent == list(range(step))  # every step sent once, in the order logged
    history = MlflowClient(mlflow_server.url).get_metric_history(run.run_id, "loss")
    by_step = sorted(history, key=lambda m: m.step)
    assert [(m.step, m.value) for m in by_step] == [(s, float(s)) for s in range(step)]  # none lost or doubled
    assert [m.timestamp for m in by_step] == sorted(m.timestamp for m in by_step)  # stored in logging order
    assert tracker.run(run.run_id).info.status == "FINISHED"
    print(f"{step} steps; backlog through {outage:.0f} s after the stop ({OUTAGE_S:.0f} s down, then the restart)",
          file=sys.stderr)
