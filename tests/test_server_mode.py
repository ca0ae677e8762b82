"""Server mode: an `mlflow server` (PostgreSQL store, proxied artifacts, basic auth) and a job queue
on PostgreSQL, as docs/DEPLOY.md sets them up, started by scripts/services.sh (conftest).

The tests of tracker/*, the queue and the worker run against both backends through the shared
fixtures; this file holds what only a server has (logins, permissions, proxied artifacts, the
dashboard and the worker together on it) and the queue's schema migrations on SQLite and
PostgreSQL.
"""

import json
import os
import secrets
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from apptest import serve, shown
from tracker import Tracker
from tracker.errors import DraftboardError
from tracker.jobs.queue import SUCCEEDED, JobQueue
from tracker.jobs.schema import FIRST_REVISION, VERSION_TABLE, metadata, schema_head, schema_revision, upgrade_schema
from tracker.dashboard.launch_form import WRITE_CHECK_TAG, check_can_write, submit_eval

APP = str(Path(__file__).resolve().parents[1] / "app.py")
JOB = {"target": "/models/t", "drafter": "/ckpt/d", "prompts": "/data/p.jsonl"}  # a valid eval job's params


def _fp() -> dict:
    """A small fingerprint (capturing one imports torch; these tests do not need it)."""
    return {"schema": 1, "source": {"kind": "captured"}, "software": {"torch": "2.13.0"},
            "hardware": {"device": "cpu"}, "numerics": {"dtype": "fp32", "linear_attention_path": "fallback"},
            "code": {}}


@pytest.fixture
def as_user(mlflow_server, monkeypatch):
    """Switch this process's MLflow credentials (None: no login at all) for the rest of the test."""

    def switch(user: str | None, password: str | None = None) -> None:
        for name, value in (("MLFLOW_TRACKING_USERNAME", user), ("MLFLOW_TRACKING_PASSWORD", password)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    return switch


@pytest.fixture
def reader(mlflow_server):
    """A new MLflow user with the server's default permission (READ) on the draftboard experiment."""
    from mlflow.server import get_app_client

    assert Tracker(mlflow_server.uri).experiment_id  # the experiment exists, created by the admin
    name, password = f"reader-{secrets.token_hex(4)}", secrets.token_hex(12)
    auth = get_app_client("basic-auth", tracking_uri=mlflow_server.uri)
    auth.create_user(name, password)
    yield name, password, auth
    auth.delete_user(name)


# =========================================================================== logins and permissions


def test_unauthenticated_write_is_refused_with_a_clear_error(mlflow_server, as_user):
    as_user(None)
    with pytest.raises(DraftboardError) as refused:
        with Tracker(mlflow_server.uri).training_run("no-login", {}, "t", fingerprint=_fp()):
            pass
    message = str(refused.value)
    assert "requires a login (HTTP 401)" in message and "MLFLOW_TRACKING_USERNAME" in message
    assert "\n" not in message and mlflow_server.uri in message

    as_user(mlflow_server.user, "not-the-password")
    with pytest.raises(DraftboardError, match=f"refused the login of MLflow user '{mlflow_server.user}'"):
        Tracker(mlflow_server.uri).find_runs()
    with pytest.raises(DraftboardError, match="refused the login"):
        check_can_write(mlflow_server.uri)


def test_read_only_user_reads_but_cannot_log_or_launch(mlflow_server, reader, as_user, tmp_path):
    name, password, auth = reader
    admin = Tracker(mlflow_server.uri)
    with admin.training_run("visible", {}, "t", fingerprint=_fp()) as run:
        run.log_step(0, loss=1.0)
    check_can_write(mlflow_server.uri)  # the admin may

    as_user(name, password)
    tracker = Tracker(mlflow_server.uri)
    assert run.run_id in {r.info.run_id for r in tracker.find_runs()}  # READ is enough for the dashboard
    assert tracker.fingerprint(run.run_id) == _fp()
    with pytest.raises(DraftboardError, match=r"cannot create run 'denied' .*403"):
        tracker.training_run("denied", {}, "t", fingerprint=_fp())

    with pytest.raises(DraftboardError) as refused:
        check_can_write(mlflow_server.uri, tracker)
    message = str(refused.value)
    assert message.startswith(f"not queued: MLflow user {name} may not write to experiment 'draftboard'")
    assert "grant it EDIT" in message and "\n" not in message
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    params = {"target": "/m/t", "drafter": "/m/d", "prompts": "/m/p.jsonl"}  # the store is the dashboard's
    with pytest.raises(DraftboardError, match="not queued"):
        submit_eval(queue, params, tracker)
    assert queue.list() == []

    as_user(mlflow_server.user, mlflow_server.password)
    auth.grant_user_permission(name, "experiment", admin.experiment_id, "EDIT")
    as_user(name, password)
    check_can_write(mlflow_server.uri, tracker)
    assert submit_eval(queue, params, tracker).state == "queued"
    as_user(mlflow_server.user, mlflow_server.password)
    assert WRITE_CHECK_TAG in admin.client.get_experiment(admin.experiment_id).tags


def test_local_stores_are_not_checked(tmp_path):
    check_can_write(f"sqlite:///{tmp_path / 'never-created.db'}")
    check_can_write(None)
    assert not (tmp_path / "never-created.db").exists()


def test_launch_page_refuses_a_read_only_account(mlflow_server, reader, as_user, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    name, password, _ = reader
    for path in ("target", "drafter"):
        (tmp_path / path).mkdir()
        (tmp_path / path / "config.json").write_text("{}")  # what Launch's first look asks of both
    (tmp_path / "prompts.jsonl").write_text('{"id": 0, "input_ids": [1, 2]}\n')
    serve(monkeypatch, mlflow_server.uri, tmp_path, tmp_path, allowed_roots=tmp_path)
    as_user(name, password)

    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("pages/launch.py")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    at.selectbox(key="launch_train_run").set_value(None).run()
    at.selectbox(key="launch_checkpoint").set_value("__path__")
    at.selectbox(key="launch_prompt_set").set_value("__path__").run()
    at.text_input(key="launch_drafter_path").set_value(str(tmp_path / "drafter"))  # the form's: sent on submit
    at.text_input(key="launch_target").set_value(str(tmp_path / "target"))
    at.text_input(key="launch_prompts").set_value(str(tmp_path / "prompts.jsonl"))
    at.selectbox(key="launch_linear").set_value("auto")
    at.button(key="launch_submit").click().run()
    assert not at.exception, [e.message for e in at.exception]
    errors = [shown(e.value) for e in at.error]  # as the reader sees it (user text is escaped)
    assert len(errors) == 1 and errors[0].startswith(f"not queued: MLflow user {name} may not write"), errors
    assert JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}").list() == []


# =========================================================================== the dashboard and the worker on a server


def test_artifacts_go_through_the_server_and_the_dashboard_reads_them(mlflow_server, tmp_path):
    from tracker.dashboard.index import load_run_index, read_json_artifact
    from tracker.store.names import EVAL_RESULTS_ARTIFACT

    tracker = Tracker(mlflow_server.uri)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"weights")
    with tracker.training_run("served", {"lr": 1e-3}, "/m/T", fingerprint=_fp()) as train:
        train.log_step(0, loss=1.0)
        ckpt = train.log_checkpoint(weights, 100)
    with tracker.eval_run("served@100", target="/m/T", train_run_id=train.run_id, checkpoint=ckpt,
                          fingerprint=_fp()) as ev:
        ev.log_metrics({"tau": 3.0})
        ev.log_json(EVAL_RESULTS_ARTIFACT, {"schema": "draftboard.eval/1", "tau": 3.0})

    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.artifact_location.startswith("mlflow-artifacts:")  # proxied: no client path
    services = os.environ.get("DRAFTBOARD_SERVICES_DIR")
    if services:  # the server wrote them to its --artifacts-destination
        assert list(Path(services, "artifacts").rglob(f"{train.run_id}/artifacts/checkpoints/step_100.json"))

    index = load_run_index(tracker)
    assert index.runs[train.run_id].fingerprint == _fp()
    assert [e.run_id for e in index.evals_of(train.run_id)] == [ev.run_id]
    assert tracker.checkpoints(train.run_id) == [ckpt]
    results = read_json_artifact(tracker.client, ev.run_id, index.runs[ev.run_id].artifact_uri, EVAL_RESULTS_ARTIFACT)
    assert results == {"schema": "draftboard.eval/1", "tau": 3.0}


# A job as the worker runs it: a subprocess that logs an eval run to the server with the
# worker's credentials (inherited MLFLOW_TRACKING_*) and reports its run id. It stands in for
# `draftboard eval` (its arguments, built from the job's params, are ignored).
_LOGGING_JOB = """
    import json, sys
    from tracker import Tracker, events
    uri, fp = {uri!r}, json.loads({fp!r})
    with Tracker(uri).eval_run("from-the-worker", target="/m/T", fingerprint=fp) as run:
        run.log_metrics({{"tau": 2.5}})
    events.emit(events.RESULT, run_id=run.run_id, out=None)
"""


def test_worker_on_postgresql_logs_a_job_to_the_server(mlflow_server, postgres_uri, tmp_path, monkeypatch):
    from conftest import postgres_schema

    from tracker.jobs.launchers.local import LocalLauncher
    from tracker.jobs.worker import run_worker

    schema = postgres_schema(postgres_uri)
    try:
        monkeypatch.setenv("DRAFTBOARD_JOBS_URI", next(schema))  # postgresql://..., as in DEPLOY.md
        monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path))
        queue = JobQueue()
        job = queue.submit("eval", JOB)
        launcher = LocalLauncher([sys.executable, "-c", textwrap.dedent(_LOGGING_JOB).format(
            uri=mlflow_server.uri, fp=json.dumps(_fp()))])
        assert run_worker(once=True, poll_s=0.05, heartbeat_s=0.5, launcher=launcher) == 1
        done = queue.get(job.id)
        assert done.state == SUCCEEDED, done.error
        run = Tracker(mlflow_server.uri).run(done.mlflow_run_id)
        assert run.data.metrics == {"tau": 2.5} and run.data.tags["draftboard.kind"] == "eval"
        queue.close()
    finally:
        schema.close()


# =========================================================================== job-queue schema migrations


def _schema_diff(uri: str) -> list:
    """Differences between the database's schema and tracker.jobs.queue's table definition (alembic autogenerate)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    queue = JobQueue(uri)
    try:
        with queue._engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "compare_type": True})
            return compare_metadata(context, metadata)
    finally:
        queue.close()


def _engine(uri: str) -> sa.Engine:
    from tracker.jobs.schema import engine_url

    return sa.create_engine(engine_url(uri))


def test_new_queue_is_at_head_and_matches_the_table_definition(jobs_uri):
    queue = JobQueue(jobs_uri)
    with queue._engine.connect() as conn:
        assert schema_revision(conn) == schema_head()
        assert {VERSION_TABLE, "jobs"} <= set(sa.inspect(conn).get_table_names())
    queue.close()
    assert _schema_diff(jobs_uri) == []


@pytest.mark.parametrize("start", ["base", "every revision"])
def test_an_old_revision_is_upgraded_on_open(jobs_uri, start):
    """A database left at an older revision (or none) is brought to head by the next JobQueue."""
    from alembic import command
    from alembic.script import ScriptDirectory

    from tracker.jobs.schema import _alembic_config

    revisions = [r.revision for r in ScriptDirectory.from_config(_alembic_config()).walk_revisions()]
    assert FIRST_REVISION in revisions and schema_head() == revisions[0]
    for revision in (["base"] if start == "base" else revisions):
        engine = _engine(jobs_uri)
        with engine.begin() as conn:  # every downgrade runs too: from head (or nothing) back to empty
            command.downgrade(_alembic_config(conn), "base")
        upgrade_schema(engine, revision) if revision != "base" else None
        with engine.connect() as conn:
            assert schema_revision(conn) == (None if revision == "base" else revision)
        engine.dispose()
        queue = JobQueue(jobs_uri)
        with queue._engine.connect() as conn:
            assert schema_revision(conn) == schema_head()
        assert queue.submit("eval", {**JOB, "name": f"after {revision}"}).state == "queued"
        queue.close()
    assert _schema_diff(jobs_uri) == []


def test_a_queue_made_before_migrations_is_adopted_with_its_jobs(jobs_uri):
    engine = _engine(jobs_uri)
    upgrade_schema(engine, FIRST_REVISION)  # the schema JobQueue made before tracker/jobs/migrations existed ...
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {VERSION_TABLE}"))  # ... which had no version table
        conn.execute(sa.text(  # a job written by that code, with the argv it stored
            "INSERT INTO jobs (kind, params, command, state, created_at, progress, cancel_requested, dedup_key) "
            "VALUES ('eval', :params, '[\"python\", \"-c\", \"pass\"]', 'queued', CURRENT_TIMESTAMP, 0, FALSE, :key)"),
            {"params": json.dumps(JOB), "key": "0" * 64})
    engine.dispose()

    queue = JobQueue(jobs_uri)
    with queue._engine.connect() as conn:
        assert schema_revision(conn) == schema_head()
        assert "command" not in {c["name"] for c in sa.inspect(conn).get_columns("jobs")}  # dropped by 0002
    [job] = queue.list()
    assert job.params == JOB and queue.claim("w").id == job.id
    queue.close()
    assert _schema_diff(jobs_uri) == []


def test_workers_opening_a_new_queue_together_migrate_it_once(jobs_uri):
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_queue() -> None:
        barrier.wait()
        try:
            JobQueue(jobs_uri).close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_queue) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = _engine(jobs_uri)
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [schema_head()]
    engine.dispose()


def test_a_revision_from_a_newer_draftboard_is_refused(jobs_uri):
    JobQueue(jobs_uri).close()
    engine = _engine(jobs_uri)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(DraftboardError, match="cannot migrate job queue .*9999.*newer draftboard"):
        JobQueue(jobs_uri)
