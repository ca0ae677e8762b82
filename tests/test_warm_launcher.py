"""Evals forked from the warm process (tracker/jobs/launchers/warm.py), against real evals of the tiny
hybrid target: each job's result is the fresh process's, bit for bit, whatever the job before it did
(failed, was cancelled), and the warm process never outlives its worker."""

import json
import os
import subprocess
import sys

import psutil
import pytest

from tiny import hybrid_eval_files
from tracker import events
from tracker.jobs.launchers.local import LocalLauncher
from tracker.jobs.queue import CANCELLED, FAILED, RUNNING, SUCCEEDED, JobQueue
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
    long = queue.submit("eval", _params(files, "long", max_new_tokens=490, budgets=[4, 8, 16, 32, 64, 128]))
    after = queue.submit("eval", _params(files, "after"))
    worker_threads(queue.uri)
    running = wait_until(lambda: (j := queue.get(long.id)).state == RUNNING and j.pid and
                         events.PREFIX + '{"event": "progress", "stage": "target' in queue.log_tail(long.id, 50) and j,
                         STARTUP_S, what="the long eval in its target stage")
    warm = psutil.Process(running.pid).parent()
    assert warm.pid != os.getpid() and "warm" in " ".join(warm.cmdline())  # forked, not a fresh interpreter
    queue.request_cancel(long.id)
    wait_until(lambda: queue.get(after.id).state in (SUCCEEDED, FAILED), STARTUP_S, what="the job after the cancel")

    assert queue.get(broken.id).state == FAILED and queue.get(broken.id).error.startswith("exit code 2; last output:")
    assert queue.get(long.id).state == CANCELLED
    done = queue.get(after.id)
    assert done.state == SUCCEEDED, done.error
    assert warm.is_running()  # the failure and the cancel took their own processes only
    tau = Tracker(store).client.get_run(done.mlflow_run_id).data.metrics["tau"]
    assert tau == _fresh_tau(files, tmp_path)  # exactly the fresh process's number
    assert not [r for r in Tracker(store).find_runs() if r.info.run_name == "long"]  # a cancelled eval logs nothing


def test_the_warm_process_ends_with_its_launcher_and_is_not_used_for_other_commands(tmp_path, monkeypatch):
    from conftest import script_entry

    assert LocalLauncher(script_entry("pass"))._warm is None  # a custom entry runs as given
    monkeypatch.setenv("DRAFTBOARD_WARM_EVALS", "0")
    assert LocalLauncher()._warm is None and LocalLauncher().describe() == "local"
    monkeypatch.delenv("DRAFTBOARD_WARM_EVALS")
    launcher = LocalLauncher()
    assert launcher.describe() == "local (forked from a warm process)"
    assert launcher.devices() == LocalLauncher([sys.executable, "-m", "tracker.cli"]).devices()  # its torch's
    pid, stream, child = launcher._warm.start("tracker.cli", ["--help"], dict(os.environ))
    server = psutil.Process(pid).parent()
    assert child.ended.wait(STARTUP_S) and child.returncode == 0 and stream.read().startswith("usage: draftboard")
    launcher.close()
    wait_until(lambda: not server.is_running() or server.status() == psutil.STATUS_ZOMBIE, 10, what="the server gone")
