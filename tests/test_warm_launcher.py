"""Evals in warm eval processes (tracker/jobs/launchers/warm.py), against real evals of the tiny hybrid
target: each job's result is the fresh process's, bit for bit, whatever the job before it did (failed,
was cancelled, succeeded in the same process), and no warm process outlives its worker."""

import json
import os
import subprocess
import sys

import psutil
import pytest

from tiny import hybrid_eval_files
from tracker import events
from tracker.jobs.launchers.local import LocalLauncher
from tracker.dashboard.index import read_json_artifact
from tracker.jobs.queue import CANCELLED, FAILED, RUNNING, SUCCEEDED, JobQueue
from tracker.store.names import EVAL_RESULTS_ARTIFACT
from tracker.store.tracker import Tracker
from waiting import wait_until

STARTUP_S = 180.0  # the warm process imports torch, the harness and MLflow before its first fork


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = hybrid_eval_files(tmp_path_factory.mktemp("warm-launcher"))
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text("{not json")
    return root


def _params(files, name: str, **extra) -> dict:
    return {"target": str(files / "target"), "drafter": str(files / "drafter"), "prompts": str(files / "prompts.jsonl"),
            "max_new_tokens": 12, "budgets": [2, 8], "device": "cpu", "name": name, **extra}


def _fresh_tau(files, tmp_path) -> float:
    """The same eval as a fresh `python -m tracker.cli eval` process."""
    out = tmp_path / "fresh.json"
    p = _params(files, "fresh")
    subprocess.run([sys.executable, "-m", "tracker.cli", "eval", "--target", p["target"], "--drafter", p["drafter"],
                    "--prompts", p["prompts"], "--max-new-tokens", "12", "--budgets", "2,8", "--device", "cpu",
                    "--no-log", "--cache-dir", str(tmp_path / "fresh-cache"), "--out", str(out)],
                   check=True, capture_output=True, env={**os.environ, "DRAFTBOARD_HOME": str(tmp_path / "fresh")})
    return json.loads(out.read_text())["tau"]


def test_a_failed_and_a_cancelled_job_leave_the_next_result_exact(files, tmp_path, monkeypatch, worker_threads):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    broken = queue.submit("eval", _params(files, "broken", drafter=str(files / "broken")))
    # Long enough that the cancel lands in its target stage: 3 prompts x 64 sampled draws of 490 tokens.
    long = queue.submit("eval", _params(files, "long", max_new_tokens=490, budgets=[4], temperature=1.0, samples=64))
    after = queue.submit("eval", _params(files, "after"))
    again = [queue.submit("eval", _params(files, f"again {i}")) for i in range(2)]
    worker_threads(queue.uri)
    running = wait_until(lambda: (j := queue.get(long.id)).state == RUNNING and j.pid and
                         events.PREFIX + '{"event": "progress", "stage": "target' in queue.log_tail(long.id, 50) and j,
                         STARTUP_S, what="the long eval in its target stage")
    warm = psutil.Process(running.pid).parent()
    assert warm.pid != os.getpid() and "warm" in " ".join(warm.cmdline())  # forked, not a fresh interpreter
    assert queue.get(broken.id).pid != running.pid  # the failed job retired its process
    queue.request_cancel(long.id)
    wait_until(lambda: queue.get(again[-1].id).state in (SUCCEEDED, FAILED), STARTUP_S,
               what="the jobs after the cancel")

    assert queue.get(broken.id).state == FAILED and queue.get(broken.id).error.startswith("exit code 2; last output:")
    assert queue.get(long.id).state == CANCELLED
    done = queue.get(after.id)
    assert done.state == SUCCEEDED, done.error
    assert done.pid != running.pid and not psutil.pid_exists(running.pid)  # the cancel ended its process
    assert warm.is_running()  # the failure and the cancel took their own processes only
    tau = Tracker(store).client.get_run(done.mlflow_run_id).data.metrics["tau"]
    assert tau == _fresh_tau(files, tmp_path)  # exactly the fresh process's number
    # The next evals of the same target ran in the same process: the first (its target work cached
    # now) read the heads, the second used the heads the first had read.
    jobs = [queue.get(job.id) for job in again]
    assert [(job.state, job.pid) for job in jobs] == [(SUCCEEDED, done.pid)] * 2, jobs
    timing = [_results(store, job.mlflow_run_id)["timing"] for job in (done, *jobs)]
    assert [(t["loaded"], t["heads_held"]) for t in timing] == [("model", False), ("heads", False), ("heads", True)]
    assert [Tracker(store).client.get_run(job.mlflow_run_id).data.metrics["tau"] for job in jobs] == [tau] * 2
    assert not [r for r in Tracker(store).find_runs() if r.info.run_name == "long"]  # a cancelled eval logs nothing


def _results(store: str, run_id: str) -> dict:
    tracker = Tracker(store)
    run = tracker.client.get_run(run_id)
    return read_json_artifact(tracker.client, run_id, run.info.artifact_uri, EVAL_RESULTS_ARTIFACT)


# A job module the warm process can import (its PYTHONPATH names the folder): it reports what a fresh
# process would find, changes it, and may leave a process running.
JOBS = """
import os, signal, subprocess, sys

def main(args):
    if args[0] == "look":
        print(os.environ.get("LEFT_BY_A_JOB"), os.getcwd(), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
              flush=True)
        os.environ["LEFT_BY_A_JOB"] = "1"
        os.chdir("/")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return 0
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(leftover.pid, flush=True)
    return 0
"""


def test_a_warm_process_runs_each_job_as_a_fresh_one_would(tmp_path, monkeypatch):
    """Jobs that succeed share a process; what one changed in it (environment, working directory,
    signal handlers) the next does not see; one that leaves a process running retires the warm process,
    and the leftover goes with it; jobs given other GPUs run in other processes."""
    (tmp_path / "draftboard_test_jobs.py").write_text(JOBS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    launcher = LocalLauncher()
    try:
        def run(what: str, **env) -> tuple[int, str]:
            pid, stream, child = launcher._warm.start("draftboard_test_jobs", [what], {**os.environ, **env})
            assert child.ended.wait(STARTUP_S) and child.returncode == 0
            return pid, stream.read().strip()

        first, second = run("look"), run("look")
        fresh = f"None {os.getcwd()} True"
        assert first == (first[0], fresh) and second == (first[0], fresh)  # one process, fresh each time
        host, said = run("spawn")
        assert host == first[0]
        leftover = psutil.Process(int(said))
        wait_until(lambda: not psutil.pid_exists(host), 10, what="the warm process that ran it retired")
        wait_until(lambda: not leftover.is_running() or leftover.status() == psutil.STATUS_ZOMBIE, 10,
                   what="the process the job left behind gone")
        assert run("look")[0] not in (host, leftover.pid)  # the next job gets a new process
        # issue 63: CUDA reads CUDA_VISIBLE_DEVICES once per process, so a process serves one set of GPUs
        on_0, on_1 = run("look", CUDA_VISIBLE_DEVICES="0")[0], run("look", CUDA_VISIBLE_DEVICES="1")[0]
        assert on_0 != on_1 and run("look", CUDA_VISIBLE_DEVICES="0")[0] == on_0
        assert run("look", CUDA_VISIBLE_DEVICES="")[0] not in (on_0, on_1)
    finally:
        launcher.close()


def test_the_warm_process_ends_with_its_launcher_and_is_not_used_for_other_commands(tmp_path, monkeypatch):
    from conftest import script_entry

    assert LocalLauncher(script_entry("pass"))._warm is None  # a custom entry runs as given
    monkeypatch.setenv("DRAFTBOARD_WARM_EVALS", "0")
    assert LocalLauncher()._warm is None and LocalLauncher().describe() == "local"
    monkeypatch.delenv("DRAFTBOARD_WARM_EVALS")
    launcher = LocalLauncher()
    assert launcher.describe() == "local (warm eval processes)"
    assert launcher.devices() == LocalLauncher([sys.executable, "-m", "tracker.cli"]).devices()  # its torch's
    pid, stream, child = launcher._warm.start("tracker.cli", ["--help"], dict(os.environ))
    server = psutil.Process(pid).parent()
    assert child.ended.wait(STARTUP_S) and child.returncode == 0 and stream.read().startswith("usage: draftboard")
    host = psutil.Process(pid)
    assert host.is_running()  # a job that succeeded leaves its process for the next one
    launcher.close()
    for process, what in ((server, "the server"), (host, "its eval process")):
        wait_until(lambda: not process.is_running() or process.status() == psutil.STATUS_ZOMBIE, 10, what=f"{what} gone")
