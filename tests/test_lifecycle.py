"""tracker/lifecycle.py with real processes: `draftboard ui`, its worker and server, a worker and its eval.

Each test starts the real commands, signals them as a supervisor, the OOM killer or a second user
would, and waits on conditions with deadlines: nothing started may outlive what started it.
The evals are real `draftboard eval` runs on the tiny hybrid target (tests/tiny.py), long enough
(490 new tokens, budgets up to 128) to be killed while they run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from tiny import hybrid_eval_files
from uiprocess import STARTUP_S, gone
from waiting import wait_until

from tracker import events, lifecycle
from tracker.jobs.queue import RUNNING, JobQueue
from tracker.store.tracker import Tracker

KILL_DEADLINE_S = 5.0  # issue 15: after SIGKILL of a parent, its children are gone within 5 s


# --------------------------------------------------------------------------- draftboard ui


def test_sigterm_stops_the_worker_then_the_server_and_leaves_no_descendant(start_ui):
    ui, descendants = start_ui(children=3)
    names = sorted("server" if "tracker.serve" in " ".join(p.cmdline()) else "warm" if "launchers.warm" in
                   " ".join(p.cmdline()) else "worker" for p in descendants)
    # the server, the worker and the worker's warm process (tracker/jobs/launchers/warm.py)
    assert names == ["server", "warm", "worker"], [p.cmdline() for p in descendants]
    # Issue 39: the dashboard's worker scans checkpoint watches, so one registered on Run detail runs.
    assert [p.cmdline()[-2:] for p in descendants if p.cmdline()[-2:] == ["worker", "--watch"]], \
        [p.cmdline() for p in descendants]
    started = time.monotonic()
    ui.proc.send_signal(signal.SIGTERM)
    assert ui.proc.wait(timeout=2 * lifecycle.STOP_GRACE_S) == 0
    wait_until(lambda: all(gone(p) for p in descendants), 2 * lifecycle.STOP_GRACE_S - (time.monotonic() - started),
               what="every descendant gone")
    out = ui.output()
    stages = [out.index(line) for line in ("stopping worker…", "stopping server…", "done")]
    assert stages == sorted(stages), out
    assert "killing it" not in out, out  # both stopped on SIGTERM, within the grace period


def test_sigint_from_a_terminal_is_an_ordered_stop_too(start_ui):
    ui, descendants = start_ui("--no-worker", children=1)
    ui.proc.send_signal(signal.SIGINT)
    assert ui.proc.wait(timeout=lifecycle.STOP_GRACE_S) == 0
    wait_until(lambda: all(gone(p) for p in descendants), lifecycle.STOP_GRACE_S, what="server gone")
    assert "stopping server…" in ui.output() and "stopping worker…" not in ui.output()


def _running() -> subprocess.Popen:
    """A child that runs until it is stopped: it waits on a pipe nobody writes to (no fixed sleep)."""
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)


def test_a_child_that_already_ended_is_not_said_to_stop():
    """Issue 65 LOW: a second start reusing the built demo printed "stopping demo build…" on Ctrl-C, though the
    demo's check had ended long before."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=30)
    server = _running()
    said: list[str] = []
    lifecycle.Supervisor([lifecycle.Child("demo build", ended), lifecycle.Child("server", server)],
                         main=lifecycle.Child("server", server), say=said.append).stop_all()
    assert said == ["stopping server…", "done"] and server.poll() is not None


def test_sigkill_of_ui_takes_its_children_within_5_s(start_ui):
    ui, descendants = start_ui(children=3)  # the server, the worker and its warm process
    ui.proc.send_signal(signal.SIGKILL)
    ui.proc.wait(timeout=10)
    wait_until(lambda: all(gone(p) for p in descendants), KILL_DEADLINE_S, interval=0.05,
               what="children of a SIGKILLed ui gone")


def test_second_ui_on_a_taken_port_exits_2_naming_the_earlier_draftboard(start_ui, tmp_path):
    ui, _ = start_ui("--no-worker", children=1)
    started = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "tracker.cli", "ui", "--port", str(ui.port), "--home",
                             str(tmp_path / "other")], capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr == (f"error: port {ui.port} is already in use by an earlier `draftboard ui` "
                             f"(pid {ui.proc.pid}); stop it with `kill {ui.proc.pid}`\n")
    assert time.monotonic() - started < 30  # at once: nothing was started (no Streamlit import)
    assert not (tmp_path / "other").exists()


def test_port_held_by_another_program_is_one_line_without_a_pid(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "tracker.cli", "ui", "--port", str(port), "--home",
                              str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr == f"error: port {port} is already in use: choose another --port\n"


# --------------------------------------------------------------------------- a worker and its eval


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = hybrid_eval_files(tmp_path_factory.mktemp("lifecycle-models"))
    return dict(root=root, target=str(root / "target"), drafter=str(root / "drafter"),
                prompts=str(root / "prompts.jsonl"), store=f"sqlite:///{root / 'store' / 'draftboard.db'}")


def long_eval(models: dict, name: str) -> dict:
    """Params of a real eval that runs for seconds on the tiny target (a kill lands mid-run)."""
    return {"target": models["target"], "drafter": models["drafter"], "prompts": models["prompts"],
            "max_new_tokens": 490, "budgets": [4, 8, 16, 32, 64, 128], "device": "cpu", "linear_attn": "fallback",
            "name": name}


# A progress line of the eval's target stage (`tracker.events`): the eval has loaded and is working.
TARGET_STAGE = events.PREFIX + '{"event": "progress", "stage": "target'


def runs_named(store: str, name: str) -> list:
    return [r for r in Tracker(store).find_runs() if r.info.run_name == name]


def test_sigkill_of_a_worker_running_an_eval_takes_the_eval_and_logs_no_run(models, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))  # the job logs the test reads are under it
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = queue.submit("eval", long_eval(models, "worker killed"))
    env = {**os.environ, "DRAFTBOARD_ALLOWED_ROOTS": str(models["root"]), "MLFLOW_TRACKING_URI": models["store"]}
    worker = subprocess.Popen([sys.executable, "-m", "tracker.cli", "worker", "--jobs-uri", queue.uri, "--poll", "0.1"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    eval_proc = None
    try:
        running = wait_until(lambda: (j := queue.get(job.id)).state == RUNNING and j.pid and
                             TARGET_STAGE in queue.log_tail(job.id, 50) and j, STARTUP_S,
                             what="eval in its target stage")
        eval_proc = psutil.Process(running.pid)
        # The eval runs in a host forked by the worker's warm server (tracker/jobs/launchers/warm.py): both go.
        family = psutil.Process(worker.pid).children(recursive=True)
        assert eval_proc in family and eval_proc.parent() in family
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        wait_until(lambda: all(gone(p) for p in family), KILL_DEADLINE_S, interval=0.05,
                   what="the warm process and the eval of a killed worker gone")
        assert queue.get(job.id).state == RUNNING  # as the dead worker left it (until a stale check fails it)
        assert not runs_named(models["store"], "worker killed")
    finally:
        if worker.poll() is None:
            worker.kill()
        if eval_proc is not None and not gone(eval_proc):
            eval_proc.kill()


# A parent that starts a real eval with only the portable fallback (parent_env, no PR_SET_PDEATHSIG),
# prints the eval's pid, and waits for it.
FALLBACK_PARENT = """
import subprocess, sys
from tracker import lifecycle
eval_proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "eval", *sys.argv[2:]],
                             env={**__import__("os").environ, **lifecycle.parent_env()},
                             stdout=open(sys.argv[1], "w"), stderr=subprocess.DEVNULL, start_new_session=True)
print(eval_proc.pid, flush=True)
eval_proc.wait()
"""


def test_an_eval_whose_parent_vanished_stops_by_the_liveness_fallback_and_logs_no_run(models, tmp_path):
    params = long_eval(models, "orphaned eval")
    argv = ["--target", params["target"], "--drafter", params["drafter"], "--prompts", params["prompts"],
            "--max-new-tokens", "490", "--budgets", "4,8,16,32,64,128", "--device", "cpu", "--linear-attn",
            "fallback", "--tracking-uri", models["store"], "--name", params["name"]]
    out = tmp_path / "eval.out"
    env = {**os.environ, "DRAFTBOARD_HOME": str(tmp_path / "home"), events.ASKED: "1"}  # as a launcher's job
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(FALLBACK_PARENT), str(out), *argv],
                              stdout=subprocess.PIPE, text=True, env=env)
    eval_proc = psutil.Process(int(parent.stdout.readline()))
    try:
        wait_until(lambda: out.is_file() and TARGET_STAGE in out.read_text(), STARTUP_S,
                   what="eval in its target stage")
        assert not gone(eval_proc) and '"event": "result"' not in out.read_text()  # killed mid-run, not after
        parent.kill()
        parent.wait()
        wait_until(lambda: gone(eval_proc), KILL_DEADLINE_S, interval=0.05, what="orphaned eval gone")
        assert '"event": "result"' not in out.read_text()
        assert not runs_named(models["store"], "orphaned eval")
    finally:
        if not gone(eval_proc):
            eval_proc.kill()


# --------------------------------------------------------------------------- the pieces


def test_watchdog_variable_is_consumed_so_grandchildren_do_not_inherit_it():
    environ = {lifecycle.PARENT_PID_VAR: str(os.getppid())}
    thread = lifecycle.watch_parent_from_env(environ)
    assert thread is not None and thread.daemon and thread.is_alive()
    assert lifecycle.PARENT_PID_VAR not in environ
    assert lifecycle.watch_parent_from_env(environ) is None  # nothing to watch


def test_die_with_parent_hook_sets_the_signal_the_child_gets():
    hook = lifecycle.die_with_parent_hook(signal.SIGTERM)
    if not sys.platform.startswith("linux"):
        assert hook is None
        return
    # PR_GET_PDEATHSIG (2), read back in the child after exec: the setting survives it.
    probe = "import ctypes; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v)); print(v.value)"
    got = subprocess.run([sys.executable, "-c", probe], preexec_fn=hook, capture_output=True, text=True, check=True)
    assert json.loads(got.stdout) == int(signal.SIGTERM)


def test_a_child_that_ends_first_is_reaped_while_the_main_one_runs():
    """Issue 52 (LOW): the finished demo build stayed a zombie under `draftboard ui` until the ui stopped. The
    supervisor (run here in the main thread, as `draftboard ui` runs it) reaps a child the moment it ends."""
    import threading

    quick = lifecycle.Child("demo build", subprocess.Popen([sys.executable, "-c", "pass"]))
    main = lifecycle.Child("server", _running())
    supervisor = lifecycle.Supervisor([quick, main], main=main, grace_s=5, say=lambda line: None)
    seen = {}

    def watch():  # while the supervisor runs: is the ended child still a zombie?
        wait_until(lambda: quick.proc.returncode is not None, 10, 0.1, "the ended child to be reaped")
        seen["zombie"] = psutil.pid_exists(quick.proc.pid) and \
            psutil.Process(quick.proc.pid).status() == psutil.STATUS_ZOMBIE
        seen["main running"] = main.proc.poll() is None
        supervisor._on_signal(signal.SIGTERM, None)  # then stop, as a SIGTERM would

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert supervisor.run() == 0
    watcher.join()
    assert seen == {"zombie": False, "main running": True} and main.proc.returncode is not None
