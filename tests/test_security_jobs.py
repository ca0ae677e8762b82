"""Issue 10's findings about the job system, each tried as the attacker or careless user tried it,
and each now failing safely: a queued shell command never runs, log tails stay inside the logs
folder, a symlink out of an allowed folder is refused, absurd budgets are refused, a read-only
dashboard creates no queue, and a Ray job's runtime_env carries no password.

Real pieces throughout: SQLite queues (one made with the schema of revision 0001, as older
draftboards made them), a real worker running `draftboard eval` subprocesses, the Launch page
through Streamlit's AppTest.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timezone

import pytest

from tracker.cli import main
from tracker.dashboard.launch_form import LaunchForm, check_path, eval_params, parse_budgets
from tracker.errors import DraftboardError
from tracker.jobs.queue import FAILED, JobQueue
from tracker.jobs.schema import upgrade_schema
from tracker.jobs.worker import run_worker
from conftest import FAST_WORKER, insert_job_row


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An allowed root holding a (bogus) target, drafter and prompts; the worker's roots are set."""
    home = tmp_path / "home"
    root = home / "models"
    for name in ("target", "drafter"):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")
    (root / "prompts.jsonl").write_text('{"id": 1, "input_ids": [1, 2, 3]}\n')
    monkeypatch.setenv("DRAFTBOARD_HOME", str(home))
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(root))
    for name in ("DRAFTBOARD_JOBS_URI", "DRAFTBOARD_READONLY"):
        monkeypatch.delenv(name, raising=False)
    return home


def in_root(home, **extra) -> dict:
    root = home / "models"
    return {"target": str(root / "target"), "drafter": str(root / "drafter"), "prompts": str(root / "prompts.jsonl"),
            "no_log": True, **extra}


def shell(marker) -> list[str]:
    return ["/bin/sh", "-c", f"id > {marker}"]


def test_a_shell_command_queued_in_an_old_queue_is_never_run(home, tmp_path):
    """Revision 0001 stored the argv each job ran. A row holding `/bin/sh -c 'id > FILE'` with in-root
    params, as queued in the issue, is migrated: the command is dropped, the eval runs from its params
    alone (and fails on these bogus files with the eval's one error line), and FILE never appears."""
    import sqlalchemy as sa

    marker = tmp_path / "pwned"
    path = home / "jobs.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    upgrade_schema(engine, "0001")  # a queue as draftboard made it before jobs were data
    with engine.begin() as conn:
        for i, (kind, params) in enumerate([("eval", in_root(home)), ("eval", {"i": 1}), ("shell", in_root(home))]):
            conn.execute(sa.text(
                "INSERT INTO jobs (kind, params, command, state, created_at, progress, cancel_requested, dedup_key) "
                "VALUES (:kind, :params, :command, 'queued', :now, 0, 0, :key)"),
                dict(kind=kind, params=json.dumps(params), command=json.dumps(shell(marker)),
                     now=datetime.now(timezone.utc).replace(tzinfo=None), key=f"{i:064d}"))
    engine.dispose()

    queue = JobQueue(f"sqlite:///{path}")  # migrates to the newest revision
    with sqlite3.connect(path) as raw:
        assert "command" not in [col[1] for col in raw.execute("PRAGMA table_info(jobs)")]
    assert run_worker(queue.uri, once=True, **FAST_WORKER) == 3
    from_params, bad_params, unknown_kind = (queue.get(i) for i in (1, 2, 3))

    assert not marker.exists()
    assert from_params.state == FAILED and from_params.pid  # the eval itself ran, and said what was wrong
    log = queue.log_tail(from_params, 100)
    assert '"-m", "tracker.cli", "eval", "--target"' in log and "/bin/sh" not in log
    assert "error: " in from_params.error, from_params.error
    assert bad_params.state == FAILED and bad_params.pid is None
    assert bad_params.error.startswith("refused: unknown eval param(s) i; ") and bad_params.error.endswith(
        "nothing was run")
    assert unknown_kind.state == FAILED and unknown_kind.pid is None
    assert unknown_kind.error == "refused: unknown job kind 'shell'; this draftboard runs eval jobs; nothing was run"


def test_a_shell_command_written_into_the_current_queue_is_never_run(home, tmp_path):
    marker = tmp_path / "pwned"
    queue = JobQueue()
    with pytest.raises(DraftboardError, match="unknown job kind 'shell'"):
        queue.submit("shell", in_root(home))
    with pytest.raises(DraftboardError, match="unknown eval param.* command"):
        queue.submit("eval", in_root(home, command=shell(marker)))
    # Around the API, straight into the table: the command as a param, and as an unknown kind.
    smuggled = insert_job_row(queue.uri, kind="eval", params=in_root(home, command=shell(marker)), dedup_key="1" * 64)
    other_kind = insert_job_row(queue.uri, kind="shell", params={"command": shell(marker)}, dedup_key="2" * 64)
    assert run_worker(queue.uri, once=True, **FAST_WORKER) == 2
    for job_id in (smuggled, other_kind):
        job = queue.get(job_id)
        assert job.state == FAILED and job.pid is None and job.error.startswith("refused: unknown ")
        assert job.error in queue.log_tail(job, 1)
    assert not marker.exists()


def test_log_tail_pointed_at_etc_passwd_is_refused(home):
    queue = JobQueue()
    job = queue.submit("eval", in_root(home))
    queue.claim("w")
    queue.attach_process(job.id, "w", None, "/etc/passwd")
    tail = queue.log_tail(job.id, 30)
    assert "root:" not in tail and "not shown: /etc/passwd is outside the logs folder" in tail


def test_a_symlink_inside_an_allowed_drafter_folder_pointing_outside_is_refused(home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"secret weights")
    drafter = home / "models" / "drafter"
    (drafter / "model.safetensors").symlink_to(outside / "model.safetensors")

    roots = [(home / "models").resolve()]
    with pytest.raises(DraftboardError, match=r"checkpoint: .*drafter: .*model.safetensors leads to .*outside"):
        check_path(str(drafter), roots, "checkpoint")  # the Launch form
    queue = JobQueue()
    job = queue.submit("eval", in_root(home))  # around the form: the worker checks at run time
    assert run_worker(queue.uri, once=True, **FAST_WORKER) == 1
    done = queue.get(job.id)
    assert done.state == FAILED and done.pid is None
    assert done.error.startswith(f"refused: --drafter {drafter.resolve()}: {drafter.resolve()}/model.safetensors "
                                 f"leads to {outside.resolve()}/model.safetensors, outside the allowed roots")


def test_budgets_of_a_million_are_refused_everywhere(home, capsys):
    with pytest.raises(DraftboardError, match="each budget must be an integer from 1 to 4096"):
        JobQueue().submit("eval", in_root(home, budgets=[10**6]))
    with pytest.raises(DraftboardError, match="budgets: each budget must be an integer from 1 to 4096"):
        parse_budgets(str(10**6))
    form = LaunchForm(**{k: v for k, v in in_root(home).items() if k != "no_log"}, budgets=f"4,{10**6}")
    with pytest.raises(DraftboardError, match="from 1 to 4096"):
        eval_params(form, [(home / "models").resolve()])
    with pytest.raises(SystemExit) as exit_:
        main(["eval", *sum(([f"--{k}", v] for k, v in in_root(home).items() if k != "no_log"), []),
              "--budgets", str(10**6)])
    assert exit_.value.code == 2 and "from 1 to 4096" in capsys.readouterr().err
    assert not (home / "jobs.db").exists() or JobQueue().list() == []


def test_read_only_dashboard_leaves_no_jobs_db(home, tmp_path, monkeypatch):
    from apptest import page_text, run_page

    from tracker import Tracker

    store = f"sqlite:///{tmp_path / 'store' / 'draftboard.db'}"
    Tracker(store).find_experiment(create=True)  # a store made by a writer (a read-only one creates none)
    monkeypatch.setenv("DRAFTBOARD_READONLY", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    at = run_page("pages/launch.py")
    assert "Cannot open the job queue: no job queue at" in page_text(at)
    assert not (home / "jobs.db").exists()


def test_ray_runtime_env_never_carries_the_password(monkeypatch):
    pytest.importorskip("ray.job_submission", exc_type=ImportError)
    from tracker.jobs.launchers.ray import RayLauncher, ray_env

    environ = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_TRACKING_USERNAME": "edit",
               "MLFLOW_TRACKING_PASSWORD": "hunter2", "MLFLOW_TRACKING_TOKEN": "t0k", "DRAFTBOARD_HOME": "/h",
               "DRAFTBOARD_JOBS_URI": "postgresql://u:pw@db/jobs"}
    assert ray_env(environ) == {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "DRAFTBOARD_HOME": "/h",
                                "PYTHONUNBUFFERED": "1", "DRAFTBOARD_JOB_EVENTS": "1"}
    for options in ({"env": ["MLFLOW_TRACKING_PASSWORD"]}, {"env": ["HF_TOKEN"]},
                    {"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": "k"}}}):
        # Refused before any connection is tried (this address has nothing listening).
        with pytest.raises(DraftboardError, match="are set on the Ray nodes instead"):
            RayLauncher("http://127.0.0.1:9", **options)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2")
    assert main(["worker", "--launcher", "ray", "--address", "http://127.0.0.1:9", "--once",
                 "--ray-env", "MLFLOW_TRACKING_PASSWORD"]) == 2
