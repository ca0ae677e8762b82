"""The worker against real subprocesses and a real queue (SQLite and PostgreSQL: conftest `jobs_uri`):
logs, progress, cancel, stale jobs, and the argv it builds from a job's params.

The supervision tests give the worker a launcher whose `draftboard` is a short script
(conftest `script_entry`): it receives the arguments the worker built from the job's params, and
behaves as the test needs (waits for a gate file, ignores SIGTERM, fails)."""

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone

import pytest

from tracker import events
from tracker.errors import DraftboardError
from tracker.jobs.launchers.local import LocalLauncher
from tracker.jobs.queue import CANCELLED, FAILED, RUNNING, SUCCEEDED, JobQueue
from tracker.jobs.worker import run_worker
from conftest import FAST_WORKER, eval_params, script_entry
from waiting import wait_until

FAST = FAST_WORKER


def script(code: str) -> LocalLauncher:
    return LocalLauncher(script_entry(code))


def line(event: str, **fields) -> str:
    """A protocol line as the child will print it (built here, so the child needs no imports)."""
    return events.PREFIX + json.dumps({"event": event, **fields})


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# Loops until the test creates the gate file; prints "ready" once its signal handling is set up.
WAIT_FOR_GATE = """
    import os, sys, time
    {setup}
    print("ready", flush=True)
    while not os.path.exists({gate!r}):
        time.sleep(0.02)
"""


def ready(queue: JobQueue, job_id: int) -> bool:
    """The script printed its "ready" line (the log's header, which quotes the script, does not count)."""
    return "ready" in queue.log_tail(job_id, 5).splitlines()


def gated(gate, setup: str = "") -> LocalLauncher:
    return script(WAIT_FOR_GATE.format(setup=textwrap.dedent(setup).replace("\n", "\n    "), gate=str(gate)))


@pytest.fixture
def queue(jobs_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))  # job logs: <home>/logs
    q = JobQueue(jobs_uri)
    yield q
    q.close()


@pytest.fixture
def worker(queue, worker_threads):
    """Start a worker thread on the queue; it is stopped (and joined) at the end of the test."""
    return lambda **kw: worker_threads(queue.uri, **kw)


def test_the_job_runs_the_cli_with_arguments_built_from_its_params(queue):
    nasty = "v4; rm -rf ~ && echo $(whoami) 'x' \"y\""
    job = queue.submit("eval", eval_params(drafter=nasty, budgets=[16, 4], reference="z-lab", no_log=True))
    default = LocalLauncher()
    assert default.entry == [sys.executable, "-m", "tracker.cli"]  # what a worker runs by default
    assert run_worker(queue.uri, once=True, launcher=script("import sys, json; print(json.dumps(sys.argv[1:]))"),
                      **FAST) == 1
    done = queue.get(job.id)
    assert done.state == SUCCEEDED, done.error
    assert json.loads(queue.log_tail(done, 1)) == [
        "eval", "--target", "/models/t", "--drafter", nasty, "--prompts", "/data/p.jsonl", "--budgets", "4,16",
        "--reference", "z-lab", "--no-log"]


def test_success_streams_output_progress_and_result(queue, tmp_path):
    out_lines = ["hello from the eval"] + [line("progress", stage="target", done=i, total=4) for i in range(1, 5)]
    out_lines += [line("progress", stage="drafter", done=1, total=3), line("result", run_id="run123", out="r.json"), "bye"]
    job = queue.submit("eval", eval_params())

    launcher = script("".join(f"print({text!r})\n" for text in out_lines))
    assert run_worker(queue.uri, once=True, launcher=launcher, **FAST) == 1

    done = queue.get(job.id)
    assert done.state == SUCCEEDED and done.mlflow_run_id == "run123" and done.error is None
    assert done.progress == 1.0 and done.stage == "drafter"
    assert re.fullmatch(r".+:\d+:[0-9a-f]{6}", done.worker_id)
    assert done.pid and done.started_at <= done.finished_at
    assert done.log_path == str((tmp_path / "home" / "logs" / f"job-{job.id}.log").resolve())
    log = open(done.log_path).read()
    assert "hello from the eval" in log and line("result", run_id="run123", out="r.json") in log
    assert queue.log_tail(done, 2) == line("result", run_id="run123", out="r.json") + "\nbye"


def test_progress_and_log_are_visible_while_the_job_runs(queue, worker, tmp_path):
    gate = tmp_path / "gate"
    setup = f"print({line('progress', stage='target', done=1, total=2)!r}, flush=True)"
    job = queue.submit("eval", eval_params())
    worker(launcher=gated(gate, setup))

    running = wait_until(lambda: (j := queue.get(job.id)).progress == 0.5 and j)
    assert running.state == RUNNING and running.stage == "target"
    wait_until(lambda: ready(queue, job.id))
    gate.touch()
    assert wait_until(lambda: queue.get(job.id).finished and queue.get(job.id)).state == SUCCEEDED


def test_failing_command_reports_exit_code_and_last_lines(queue, tmp_path):
    code = """
        import sys
        for i in range(1, 31):
            print(f"line {i}")
        print("Traceback: boom", file=sys.stderr)
        sys.exit(3)
    """
    job = queue.submit("eval", eval_params())
    run_worker(queue.uri, once=True, launcher=script(code), **FAST)
    failed = queue.get(job.id)
    assert failed.state == FAILED
    assert failed.error.startswith("exit code 3; last output:")
    assert "line 30" in failed.error and "Traceback: boom" in failed.error
    assert "line 5\n" not in failed.error  # only the tail is quoted


def test_command_that_cannot_start_fails_with_the_reason(queue, tmp_path):
    job = queue.submit("eval", eval_params())
    run_worker(queue.uri, once=True, launcher=LocalLauncher([str(tmp_path / "no-such-python"), "-m", "tracker.cli"]),
               **FAST)
    failed = queue.get(job.id)
    assert failed.state == FAILED and failed.error.startswith("cannot start")
    assert "cannot start" in queue.log_tail(failed, 1)


def test_cancel_running_job_sigterm_is_honoured(queue, worker, tmp_path):
    setup = """
    import signal
    def bye(*_):
        print("got SIGTERM, cleaning up", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye)
    """
    job = queue.submit("eval", eval_params())
    worker(launcher=gated(tmp_path / "never", setup))
    wait_until(lambda: ready(queue, job.id))
    pid = queue.get(job.id).pid
    queue.request_cancel(job.id)

    cancelled = wait_until(lambda: queue.get(job.id).finished and queue.get(job.id))
    assert cancelled.state == CANCELLED and cancelled.error == "cancelled on request"
    assert "got SIGTERM, cleaning up" in queue.log_tail(job.id, 5)
    assert pid_gone(pid)


def test_cancel_child_ignoring_sigterm_is_killed_after_grace(queue, worker, tmp_path):
    setup = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    job = queue.submit("eval", eval_params())
    worker(grace_s=0.3, launcher=gated(tmp_path / "never", setup))
    wait_until(lambda: ready(queue, job.id))
    pid = queue.get(job.id).pid
    queue.request_cancel(job.id)

    cancelled = wait_until(lambda: queue.get(job.id).finished and queue.get(job.id))
    assert cancelled.state == CANCELLED
    assert cancelled.error == "cancelled on request; killed with SIGKILL after 0.3 s grace"
    assert pid_gone(pid)


def test_cancelled_queued_job_never_runs(queue, tmp_path):
    marker = tmp_path / "ran"
    job = queue.submit("eval", eval_params())
    queue.request_cancel(job.id)
    assert run_worker(queue.uri, once=True, launcher=script(f"open({str(marker)!r}, 'w').close()"), **FAST) == 0
    assert queue.get(job.id).state == CANCELLED and not marker.exists()


def test_stale_job_is_failed_with_the_reason_and_not_rerun(queue, tmp_path):
    marker = tmp_path / "ran"
    job = queue.submit("eval", eval_params())
    queue.claim("deadhost:4242:abcdef")  # a worker that claimed the job, then died
    beat = queue.get(job.id).heartbeat_at
    wait_until(lambda: datetime.now(timezone.utc) - beat > timedelta(seconds=0.3))

    launcher = script(f"open({str(marker)!r}, 'w').close()")
    assert run_worker(queue.uri, once=True, launcher=launcher, **{**FAST, "stale_s": 0.3}) == 0
    failed = queue.get(job.id)
    assert failed.state == FAILED
    assert failed.error == f"worker deadhost:4242:abcdef stopped heartbeating at {beat:%Y-%m-%d %H:%M:%S} UTC"
    assert queue.fail_stale(0.0) == [] and queue.claim("another") is None
    assert not marker.exists()


def test_worker_stops_a_job_it_lost_to_a_stale_timeout(queue, worker, tmp_path):
    job = queue.submit("eval", eval_params())
    worker(launcher=gated(tmp_path / "never"))
    wait_until(lambda: ready(queue, job.id))
    pid = queue.get(job.id).pid
    [stale] = wait_until(lambda: queue.fail_stale(0.0))  # as if its heartbeats had stopped arriving
    assert stale.id == job.id

    wait_until(lambda: pid_gone(pid))  # the worker saw it lost the job and stopped the process
    assert queue.get(job.id).error == stale.error  # and left the record alone


def test_healthy_job_outlives_the_stale_timeout(queue, worker, tmp_path):
    gate = tmp_path / "gate"
    job = queue.submit("eval", eval_params())
    worker(heartbeat_s=0.05, stale_s=0.5, launcher=gated(gate))
    started = wait_until(lambda: queue.get(job.id).pid and queue.get(job.id))
    # Twice the stale timeout later the job is still running: its heartbeats kept it alive.
    wait_until(lambda: queue.get(job.id).heartbeat_at - started.started_at > timedelta(seconds=1.0))
    assert queue.get(job.id).state == RUNNING
    gate.touch()
    assert wait_until(lambda: queue.get(job.id).finished and queue.get(job.id)).state == SUCCEEDED


def test_slots_run_jobs_side_by_side(queue, worker, tmp_path):
    gate = tmp_path / "gate"
    ids = [queue.submit("eval", eval_params(name=str(i))).id for i in range(2)]
    worker(slots=2, launcher=gated(gate))
    wait_until(lambda: all(queue.get(i).state == RUNNING and queue.get(i).pid for i in ids))
    gate.touch()
    wait_until(lambda: all(queue.get(i).state == SUCCEEDED for i in ids))


def test_two_workers_run_every_job_exactly_once(queue, tmp_path):
    record = tmp_path / "record"
    ids = [queue.submit("eval", eval_params(name=str(i))).id for i in range(8)]
    # Each job records the run name its params gave it.
    launcher = script(f"import sys; open({str(record)!r}, 'a').write(sys.argv[sys.argv.index('--name') + 1] + '\\n')")
    counts = []
    threads = [
        threading.Thread(target=lambda: counts.append(
            run_worker(queue.uri, slots=2, once=True, launcher=launcher, **FAST)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 8
    assert sorted(record.read_text().split()) == sorted(str(i) for i in range(8))
    assert {queue.get(i).state for i in ids} == {SUCCEEDED}


def test_stopping_the_worker_stops_its_jobs(queue, worker, tmp_path):
    job = queue.submit("eval", eval_params())
    thread, stop, result = worker(launcher=gated(tmp_path / "never"))
    wait_until(lambda: ready(queue, job.id))
    pid = queue.get(job.id).pid
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and result["n"] == 1
    stopped = queue.get(job.id)
    assert stopped.state == FAILED and re.fullmatch(r"worker \S+ stopped while the job ran", stopped.error)
    assert pid_gone(pid)


def test_worker_refuses_a_heartbeat_slower_than_the_stale_timeout(queue):
    with pytest.raises(DraftboardError, match="shorter than the stale timeout"):
        run_worker(queue.uri, heartbeat_s=60, stale_s=30, once=True)


def test_emit_and_parse_event_round_trip(capsys, monkeypatch):
    events.emit(events.PROGRESS, stage="target", done=3, total=16)  # not asked for: a user's own stdout
    assert capsys.readouterr().out == ""
    monkeypatch.setenv(events.ASKED, "1")  # what a launcher sets for its job
    events.emit(events.PROGRESS, stage="target", done=3, total=16)
    printed = capsys.readouterr().out
    assert printed == '@@draftboard {"event": "progress", "stage": "target", "done": 3, "total": 16}\n'
    event = events.parse_event(printed)
    assert event == {"event": "progress", "stage": "target", "done": 3, "total": 16}
    assert events.progress_fraction(event) == 3 / 16
    assert events.parse_event("loss=0.3 step=12") is None
    assert events.parse_event("@@draftboard {not json") is None
    assert events.parse_event('@@draftboard ["event"]') is None
    assert events.progress_fraction({"event": "progress", "done": 5, "total": 0}) is None
    assert events.progress_fraction({"event": "progress", "done": 20, "total": 16}) == 1.0


def test_a_worker_with_nothing_to_do_says_so_in_its_own_words(tmp_path):
    """Issue 52 (LOW): `draftboard ui`'s worker printed alembic's INFO narration of MLflow creating a new store, and
    `worker --once` with nothing queued printed a BrokenPipeError traceback from its warm eval process."""
    env = {**os.environ, "DRAFTBOARD_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 's.db'}"}
    done = subprocess.run([sys.executable, "-m", "tracker.cli", "worker", "--once", "--watch"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "worker stopped after 0 job(s)" in done.stdout
    assert "alembic" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


# Issue 63: each job its own GPUs. The child records what it was given, then waits for its own gate file.
RECORD_GPUS = """
    import os, sys, time
    name = sys.argv[sys.argv.index('--name') + 1]
    open({record!r} + '/' + name, 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))
    print("ready", flush=True)
    while not os.path.exists({record!r} + '/' + name + '.go'):
        time.sleep(0.02)
"""


def test_gpus_are_slots_each_job_holding_its_own_and_waiting_for_them(queue, worker, tmp_path):
    """A declared 4-GPU box: four 1-GPU jobs run at once, each child seeing a distinct device; a 2-GPU job waits
    until two are free (first in, first served: the 1-GPU job queued after it waits too); a CPU job is given none;
    a finished or cancelled job frees its GPUs; a job asking for more than the box has fails at once, in one line."""
    record = tmp_path / "seen"
    record.mkdir()
    launcher = script(RECORD_GPUS.format(record=str(record)))
    ones = [queue.submit("eval", eval_params(name=f"one{i}", gpus=1)).id for i in range(4)]
    two = queue.submit("eval", eval_params(name="two", gpus=2)).id
    after = queue.submit("eval", eval_params(name="after", gpus=1)).id
    worker(slots=8, launcher=launcher, gpus=("0", "1", "2", "3"))
    wait_until(lambda: all(ready(queue, i) for i in ones))
    seen = {i: (record / f"one{i}").read_text() for i in range(4)}
    assert sorted(seen.values()) == ["0", "1", "2", "3"]
    # each running job's card names the GPU it holds: the one its child was given
    from tracker.dashboard.launch_form import describe_job

    for i, job_id in enumerate(ones):
        assert queue.get(job_id).gpus == (seen[i],) and f"· GPU {seen[i]}" in describe_job(queue.get(job_id)).when
    assert queue.get(two).state == queue.get(after).state == "queued"  # no GPU free: both wait, in order
    (record / "one1.go").touch()
    queue.request_cancel(ones[3])
    wait_until(lambda: queue.get(ones[1]).state == SUCCEEDED and queue.get(ones[3]).state == CANCELLED)
    wait_until(lambda: ready(queue, two))
    assert sorted((record / "two").read_text().split(",")) == sorted([seen[1], seen[3]])
    assert queue.get(after).state == "queued"  # the 2-GPU job took both freed GPUs
    for name in ("one0", "one2", "two", "after"):
        (record / f"{name}.go").touch()
    wait_until(lambda: queue.get(after).state == SUCCEEDED)
    cpu = queue.submit("eval", eval_params(name="cpu", device="cpu")).id
    too_many = queue.submit("eval", eval_params(name="eight", gpus=8)).id
    (record / "cpu.go").touch()
    wait_until(lambda: queue.get(cpu).state == SUCCEEDED and queue.get(too_many).state == FAILED)
    assert (record / "cpu").read_text() == ""  # a CPU job sees no GPU at all
    assert queue.get(cpu).gpus == () and "· GPUs none" in describe_job(queue.get(cpu)).when
    assert queue.get(too_many).error.startswith("the job asks for 8 GPUs; worker ") and \
        queue.get(too_many).error.endswith("has 4 (0,1,2,3)")


def test_the_box_gpus_come_from_the_flag_the_deployment_or_cuda_and_bad_lists_are_one_line():
    from tracker.jobs.gpus import box_gpus

    assert box_gpus("0,1", {"DRAFTBOARD_GPUS": "5", "CUDA_VISIBLE_DEVICES": "7"}) == ("0", "1")
    assert box_gpus(None, {"DRAFTBOARD_GPUS": "5", "CUDA_VISIBLE_DEVICES": "7"}) == ("5",)
    assert box_gpus(None, {"CUDA_VISIBLE_DEVICES": "GPU-8f6e2b1c-aaaa, 3"}) == ("GPU-8f6e2b1c-aaaa", "3")
    assert box_gpus(None, {"CUDA_VISIBLE_DEVICES": ""}) == () and box_gpus(None, {}) is None
    for text, message in (("0,0", "a GPU is named twice"), ("0;rm -rf /", "is not a GPU index or UUID"),
                          (",".join(map(str, range(65))), "at most 64 GPUs")):
        with pytest.raises(DraftboardError, match=message):
            box_gpus(text, {})


def test_a_workers_declared_gpu_memory_reads_as_bytes_and_a_bad_one_is_one_line(tmp_path, capsys, monkeypatch):
    from tracker.cli import main
    from tracker.jobs.gpus import memory_bytes

    assert (memory_bytes("80GiB"), memory_bytes("40 GB"), memory_bytes("81559MiB")) == (80 * 2**30, 40 * 10**9,
                                                                                        81559 * 2**20)
    monkeypatch.setenv("DRAFTBOARD_GPU_MEMORY", "eighty")
    assert main(["worker", "--once", "--jobs-uri", f"sqlite:///{tmp_path / 'q.db'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: DRAFTBOARD_GPU_MEMORY: 'eighty' is not a GPU's memory (e.g. 80GiB, 40GB, 81559MiB)")
    assert main(["worker", "--once", "--gpu-memory", "80", "--jobs-uri", f"sqlite:///{tmp_path / 'q.db'}"]) == 2
    assert "--gpu-memory: '80' is not a GPU's memory" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "1", "--device", "cpu"], "--gpus 1 with --device cpu: a CPU eval holds no GPU"),
    (["--gpus", "2"], "--gpus 2: this process sees 0 GPU(s) (CUDA_VISIBLE_DEVICES '')"),
])
def test_an_eval_that_cannot_see_the_gpus_its_job_holds_is_refused_in_one_line(flags, message, tmp_path, capsys,
                                                                              monkeypatch):
    from tracker.cli import main

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as a worker gives a job that holds none
    assert main(["eval", "--target", str(tmp_path), "--drafter", str(tmp_path), "--prompts", str(tmp_path / "p"),
                 "--no-log", *flags]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"
