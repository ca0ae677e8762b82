"""The job queue on real databases (a SQLite file; PostgreSQL: conftest `jobs_uri`): state machine,
dedup, atomic claims, cancel, logs, validated params, read-only opening."""

import sqlite3
import threading
from datetime import timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from tracker.errors import DraftboardError
from tracker.jobs.queue import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Job,
    JobQueue,
    claim_statement,
    dedup_key,
    jobs,
)
from conftest import eval_params

P = eval_params


@pytest.fixture
def db_uri(jobs_uri):
    return jobs_uri


@pytest.fixture
def queue(db_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))  # log tails are read from <home>/logs
    q = JobQueue(db_uri)
    yield q
    q.close()


def test_default_queue_file_lives_in_home_and_uses_wal(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTBOARD_JOBS_URI", raising=False)
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    q = JobQueue()
    q.submit("eval", P())
    q.close()
    with sqlite3.connect(tmp_path / "home" / "jobs.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT kind, state FROM jobs").fetchall() == [("eval", "queued")]


def test_unusable_uri_is_a_draftboard_error():
    with pytest.raises(DraftboardError, match="cannot open job queue"):
        JobQueue("nosuchdialect://x")


def test_submit_returns_a_plain_job_holding_validated_params(queue):
    job = queue.submit("eval", P(budgets=[8, 4, 8], device=None))
    assert isinstance(job, Job) and not job.existing
    assert (job.kind, job.state, job.params) == ("eval", QUEUED, P(budgets=[4, 8]))  # normalized, None dropped
    assert job.created_at.tzinfo == timezone.utc
    assert job.progress == 0.0 and job.cancel_requested is False and not job.finished
    assert queue.get(job.id) == job


def test_submit_refuses_unknown_kinds_and_params_that_do_not_validate(queue):
    with pytest.raises(DraftboardError, match="unknown job kind 'shell'; this draftboard runs eval jobs"):
        queue.submit("shell", P())
    with pytest.raises(DraftboardError, match="unknown eval param.* command"):
        queue.submit("eval", P(command=["/bin/sh", "-c", "id"]))
    with pytest.raises(DraftboardError, match="eval param budgets each budget must be an integer from 1 to 4096"):
        queue.submit("eval", P(budgets=[10**6]))
    with pytest.raises(DraftboardError, match="must be a JSON object"):
        queue.submit("eval", "python -c 'print(1)'")
    assert queue.list() == []


def test_legal_path_queued_running_succeeded(queue):
    job = queue.submit("eval", P(name="1"))
    claimed = queue.claim("w1")
    assert claimed.id == job.id and claimed.state == RUNNING and claimed.worker_id == "w1"
    assert claimed.started_at is not None and claimed.heartbeat_at == claimed.started_at
    queue.update_progress(job.id, 0.5, "target")
    assert (queue.get(job.id).progress, queue.get(job.id).stage) == (0.5, "target")
    done = queue.finish(job.id, SUCCEEDED, mlflow_run_id="abc")
    assert (done.state, done.mlflow_run_id, done.progress, done.finished) == (SUCCEEDED, "abc", 1.0, True)
    assert done.finished_at >= done.started_at


def test_illegal_transitions_raise(queue):
    job = queue.submit("eval", P(name="2"))
    with pytest.raises(DraftboardError, match=f"job {job.id} is queued and cannot become succeeded"):
        queue.finish(job.id, SUCCEEDED)
    with pytest.raises(DraftboardError, match="not 'running'"):
        queue.finish(job.id, RUNNING)
    queue.claim("w1")
    queue.finish(job.id, FAILED, error="boom")
    for state in (SUCCEEDED, FAILED, CANCELLED):
        with pytest.raises(DraftboardError, match="is failed and cannot become .* it has finished"):
            queue.finish(job.id, state)
    with pytest.raises(DraftboardError, match="already failed; there is nothing to cancel"):
        queue.request_cancel(job.id)
    assert queue.get(job.id).error == "boom"
    with pytest.raises(DraftboardError, match="no job 999"):
        queue.finish(999, FAILED)


def test_progress_must_be_a_fraction_and_is_ignored_after_finish(queue):
    job = queue.submit("eval", P(name="3"))
    queue.claim("w1")
    with pytest.raises(DraftboardError, match="between 0 and 1"):
        queue.update_progress(job.id, 1.5, "target")
    queue.finish(job.id, FAILED)
    queue.update_progress(job.id, 0.3, "late")
    assert queue.get(job.id).stage is None


def test_dedup_returns_the_existing_job_until_it_fails_or_is_cancelled(queue):
    first = queue.submit("eval", {"target": "t", "drafter": "d", "prompts": "p", "device": None})
    again = queue.submit("eval", {"prompts": "p", "drafter": "d", "target": "t"})  # other order, None dropped
    assert again.id == first.id and again.existing
    assert queue.submit("eval", {"prompts": "p", "drafter": "d", "target": "t", "budgets": [8]}).id != first.id
    assert queue.submit("eval", {"prompts": "p", "drafter": "d", "target": "t2"}).id != first.id

    queue.claim("w1")  # running: still the same work
    assert queue.submit("eval", {"target": "t", "drafter": "d", "prompts": "p"}).existing
    queue.finish(first.id, SUCCEEDED)  # succeeded: "already evaluated"
    assert queue.submit("eval", {"target": "t", "drafter": "d", "prompts": "p"}).id == first.id

    failed = queue.submit("eval", P(target="f"))
    while (claimed := queue.claim("w1")).id != failed.id:
        queue.finish(claimed.id, SUCCEEDED)
    queue.finish(failed.id, FAILED, error="oom")
    retry = queue.submit("eval", P(target="f"))
    assert retry.id != failed.id and not retry.existing
    queue.request_cancel(retry.id)
    assert queue.submit("eval", P(target="f")).id not in (failed.id, retry.id)
    assert dedup_key("eval", {"a": 1, "b": None}) == dedup_key("eval", {"a": 1})


def test_concurrent_submits_of_the_same_params_make_one_job(db_uri):
    queues = [JobQueue(db_uri) for _ in range(6)]
    barrier = threading.Barrier(len(queues))
    ids = []

    def submit(q):
        barrier.wait()
        ids.append(q.submit("eval", P(target="same")).id)

    threads = [threading.Thread(target=submit, args=(q,)) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == len(queues) and len(set(ids)) == 1
    assert len(queues[0].list()) == 1


def test_two_claimers_take_each_job_exactly_once(db_uri, queue):
    submitted = {queue.submit("eval", P(name=str(i))).id for i in range(50)}
    barrier = threading.Barrier(2)
    got: dict[str, list[int]] = {"a": [], "b": []}

    def claimer(name):
        q = JobQueue(db_uri)  # its own engine and connections, as a separate worker would have
        barrier.wait()
        while (job := q.claim(name)) is not None:
            got[name].append(job.id)
            q.finish(job.id, SUCCEEDED)
        q.close()

    threads = [threading.Thread(target=claimer, args=(name,)) for name in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got["a"] + got["b"]) == sorted(submitted)
    assert not set(got["a"]) & set(got["b"])
    owners = {job.id: job.worker_id for job in queue.list(limit=100)}
    assert all(owners[i] == name for name, ids in got.items() for i in ids)


def test_claim_takes_the_oldest_and_none_when_empty(queue):
    a = queue.submit("eval", P(name="a"))
    b = queue.submit("eval", P(name="b"))
    assert [queue.claim("w").id, queue.claim("w").id] == [a.id, b.id]
    assert queue.claim("w") is None


def test_claim_statement_locks_on_postgresql_only():
    from datetime import datetime

    stmt = claim_statement("w", datetime.now(timezone.utc))
    pg = str(stmt.compile(dialect=postgresql.dialect()))
    assert "FOR UPDATE SKIP LOCKED" in pg and "RETURNING" in pg
    assert "FOR UPDATE" not in str(stmt.compile(dialect=sqlite.dialect()))
    # The one table definition, partial unique index included, also compiles for PostgreSQL.
    ddl = [str(sa.schema.CreateIndex(ix).compile(dialect=postgresql.dialect())) for ix in jobs.indexes]
    assert any("UNIQUE" in d and "WHERE state IN ('queued', 'running', 'succeeded')" in d for d in ddl)


def test_cancel_queued_is_immediate_and_running_is_a_request(queue):
    queued = queue.submit("eval", P(name="1"))
    cancelled = queue.request_cancel(queued.id)
    assert cancelled.state == CANCELLED and cancelled.finished_at is not None
    assert queue.claim("w") is None  # never handed to a worker

    running = queue.submit("eval", P(name="2"))
    queue.claim("w")
    flagged = queue.request_cancel(running.id)
    assert (flagged.state, flagged.cancel_requested) == (RUNNING, True)
    assert queue.heartbeat(running.id, "w").cancel_requested
    assert queue.finish(running.id, CANCELLED).state == CANCELLED


def test_heartbeat_only_counts_for_the_owner(queue):
    job = queue.submit("eval", P(name="1"))
    claimed = queue.claim("owner")
    other = queue.heartbeat(job.id, "intruder")
    assert other.worker_id == "owner" and other.heartbeat_at == claimed.heartbeat_at
    assert queue.heartbeat(job.id, "owner").heartbeat_at > claimed.heartbeat_at


def test_list_filters_newest_first(queue):
    ids = [queue.submit("eval", P(name=str(i))).id for i in range(5)]
    queue.claim("w")
    assert [j.id for j in queue.list()] == ids[::-1]
    assert [j.id for j in queue.list(states=[RUNNING])] == [ids[0]]
    assert [j.id for j in queue.list(states=[QUEUED], limit=2)] == [ids[4], ids[3]]
    with pytest.raises(DraftboardError, match="unknown job state"):
        queue.list(states=["done"])


def test_log_tail_reads_only_inside_the_logs_folder(queue, tmp_path):
    job = queue.submit("eval", P())
    assert queue.log_tail(job, 5) == ""  # no log before a worker runs it
    logs = tmp_path / "home" / "logs"
    logs.mkdir(parents=True)
    log = logs / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(20000)))
    queue.claim("w")
    queue.attach_process(job.id, "w", 123, str(log))
    assert queue.log_tail(job.id, 3) == "line 19997\nline 19998\nline 19999"
    assert queue.log_tail(queue.get(job.id), 1) == "line 19999"
    assert queue.get(job.id).pid == 123
    log.unlink()
    assert queue.log_tail(job.id, 3) == ""

    secret = tmp_path / "secret.txt"  # next to the logs folder, as /etc/passwd would be
    secret.write_text("root:x:0:0\n")
    (logs / "escape.log").symlink_to(secret)
    for path in (str(secret), str(logs / ".." / "secret.txt"), str(logs / "escape.log")):
        queue.attach_process(job.id, "w", 123, path)
        tail = queue.log_tail(job.id, 3)
        assert "root:x" not in tail and tail == f"[draftboard] log not shown: {path} is outside the logs folder {logs}"


def test_read_only_queue_never_creates_or_migrates_and_refuses_writes(tmp_path):
    path = tmp_path / "jobs.db"
    with pytest.raises(DraftboardError, match="no job queue at .*jobs.db yet; a read-only dashboard does not create"):
        JobQueue(f"sqlite:///{path}", readonly=True)
    assert not path.exists()

    JobQueue(f"sqlite:///{path}").submit("eval", P())
    reader = JobQueue(f"sqlite:///{path}", readonly=True)
    assert [j.params for j in reader.list()] == [P()]
    with pytest.raises(sa.exc.OperationalError, match="readonly database"):
        reader.submit("eval", P(name="another"))
    with sqlite3.connect(path) as raw:  # a queue at an older revision is not migrated by a reader
        raw.execute("UPDATE draftboard_jobs_version SET version_num = '0001'")
    with pytest.raises(DraftboardError, match="at schema revision 0001, this draftboard reads 0007; a read-only"):
        JobQueue(f"sqlite:///{path}", readonly=True)
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT version_num FROM draftboard_jobs_version").fetchall() == [("0001",)]
