"""The job queue on real databases (a SQLite file; PostgreSQL: conftest `jobs_uri`): state machine,
dedup, atomic claims, cancel, logs."""

import sqlite3
import sys
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
    eval_command,
    jobs,
)

CMD = [sys.executable, "-c", "pass"]


@pytest.fixture
def db_uri(jobs_uri):
    return jobs_uri


@pytest.fixture
def queue(db_uri):
    q = JobQueue(db_uri)
    yield q
    q.close()


def test_default_queue_file_lives_in_home_and_uses_wal(tmp_path, monkeypatch):
    monkeypatch.delenv("DRAFTBOARD_JOBS_URI", raising=False)
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    q = JobQueue()
    q.submit("eval", {"x": 1}, CMD)
    q.close()
    with sqlite3.connect(tmp_path / "home" / "jobs.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT kind, state FROM jobs").fetchall() == [("eval", "queued")]


def test_unusable_uri_is_a_draftboard_error():
    with pytest.raises(DraftboardError, match="cannot open job queue"):
        JobQueue("nosuchdialect://x")


def test_submit_returns_a_plain_job(queue):
    job = queue.submit("eval", {"target": "t", "budgets": [4, 8]}, CMD)
    assert isinstance(job, Job) and not job.existing
    assert (job.kind, job.state, job.params, job.command) == ("eval", QUEUED, {"target": "t", "budgets": [4, 8]}, CMD)
    assert job.created_at.tzinfo == timezone.utc
    assert job.progress == 0.0 and job.cancel_requested is False and not job.finished
    assert queue.get(job.id) == job


def test_submit_refuses_shell_strings_and_non_json_params(queue):
    with pytest.raises(DraftboardError, match="not a shell string"):
        queue.submit("eval", {}, "python -c 'print(1)'")
    with pytest.raises(DraftboardError, match="non-empty list"):
        queue.submit("eval", {}, [])
    with pytest.raises(DraftboardError, match="plain JSON"):
        queue.submit("eval", {"x": object()}, CMD)


def test_legal_path_queued_running_succeeded(queue):
    job = queue.submit("eval", {"n": 1}, CMD)
    claimed = queue.claim("w1")
    assert claimed.id == job.id and claimed.state == RUNNING and claimed.worker_id == "w1"
    assert claimed.started_at is not None and claimed.heartbeat_at == claimed.started_at
    queue.update_progress(job.id, 0.5, "target")
    assert (queue.get(job.id).progress, queue.get(job.id).stage) == (0.5, "target")
    done = queue.finish(job.id, SUCCEEDED, mlflow_run_id="abc")
    assert (done.state, done.mlflow_run_id, done.progress, done.finished) == (SUCCEEDED, "abc", 1.0, True)
    assert done.finished_at >= done.started_at


def test_illegal_transitions_raise(queue):
    job = queue.submit("eval", {"n": 2}, CMD)
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
    job = queue.submit("eval", {"n": 3}, CMD)
    queue.claim("w1")
    with pytest.raises(DraftboardError, match="between 0 and 1"):
        queue.update_progress(job.id, 1.5, "target")
    queue.finish(job.id, FAILED)
    queue.update_progress(job.id, 0.3, "late")
    assert queue.get(job.id).stage is None


def test_dedup_returns_the_existing_job_until_it_fails_or_is_cancelled(queue):
    first = queue.submit("eval", {"target": "t", "drafter": "d", "out": None}, CMD)
    again = queue.submit("eval", {"drafter": "d", "target": "t"}, CMD)  # other order, None dropped
    assert again.id == first.id and again.existing
    assert queue.submit("train", {"drafter": "d", "target": "t"}, CMD).id != first.id
    assert queue.submit("eval", {"drafter": "d", "target": "t2"}, CMD).id != first.id

    queue.claim("w1")  # running: still the same work
    assert queue.submit("eval", {"target": "t", "drafter": "d"}, CMD).existing
    queue.finish(first.id, SUCCEEDED)  # succeeded: "already evaluated"
    assert queue.submit("eval", {"target": "t", "drafter": "d"}, CMD).id == first.id

    failed = queue.submit("eval", {"target": "f"}, CMD)
    while (claimed := queue.claim("w1")).id != failed.id:
        queue.finish(claimed.id, SUCCEEDED)
    queue.finish(failed.id, FAILED, error="oom")
    retry = queue.submit("eval", {"target": "f"}, CMD)
    assert retry.id != failed.id and not retry.existing
    queue.request_cancel(retry.id)
    assert queue.submit("eval", {"target": "f"}, CMD).id not in (failed.id, retry.id)
    assert dedup_key("eval", {"a": 1, "b": None}) == dedup_key("eval", {"a": 1})


def test_concurrent_submits_of_the_same_params_make_one_job(db_uri):
    queues = [JobQueue(db_uri) for _ in range(6)]
    barrier = threading.Barrier(len(queues))
    ids = []

    def submit(q):
        barrier.wait()
        ids.append(q.submit("eval", {"target": "same"}, CMD).id)

    threads = [threading.Thread(target=submit, args=(q,)) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == len(queues) and len(set(ids)) == 1
    assert len(queues[0].list()) == 1


def test_two_claimers_take_each_job_exactly_once(db_uri, queue):
    submitted = {queue.submit("eval", {"i": i}, CMD).id for i in range(50)}
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
    a = queue.submit("eval", {"i": "a"}, CMD)
    b = queue.submit("eval", {"i": "b"}, CMD)
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
    queued = queue.submit("eval", {"i": 1}, CMD)
    cancelled = queue.request_cancel(queued.id)
    assert cancelled.state == CANCELLED and cancelled.finished_at is not None
    assert queue.claim("w") is None  # never handed to a worker

    running = queue.submit("eval", {"i": 2}, CMD)
    queue.claim("w")
    flagged = queue.request_cancel(running.id)
    assert (flagged.state, flagged.cancel_requested) == (RUNNING, True)
    assert queue.heartbeat(running.id, "w").cancel_requested
    assert queue.finish(running.id, CANCELLED).state == CANCELLED


def test_heartbeat_only_counts_for_the_owner(queue):
    job = queue.submit("eval", {"i": 1}, CMD)
    claimed = queue.claim("owner")
    other = queue.heartbeat(job.id, "intruder")
    assert other.worker_id == "owner" and other.heartbeat_at == claimed.heartbeat_at
    assert queue.heartbeat(job.id, "owner").heartbeat_at > claimed.heartbeat_at


def test_list_filters_newest_first(queue):
    ids = [queue.submit("eval", {"i": i}, CMD).id for i in range(5)]
    queue.claim("w")
    assert [j.id for j in queue.list()] == ids[::-1]
    assert [j.id for j in queue.list(states=[RUNNING])] == [ids[0]]
    assert [j.id for j in queue.list(states=[QUEUED], limit=2)] == [ids[4], ids[3]]
    with pytest.raises(DraftboardError, match="unknown job state"):
        queue.list(states=["done"])


def test_log_tail(queue, tmp_path):
    job = queue.submit("eval", {"i": 1}, CMD)
    assert queue.log_tail(job, 5) == ""  # no log before a worker runs it
    log = tmp_path / "job.log"
    log.write_text("".join(f"line {i}\n" for i in range(20000)))
    queue.claim("w")
    queue.attach_process(job.id, "w", 123, str(log))
    assert queue.log_tail(job.id, 3) == "line 19997\nline 19998\nline 19999"
    assert queue.log_tail(queue.get(job.id), 1) == "line 19999"
    assert queue.get(job.id).pid == 123
    log.unlink()
    assert queue.log_tail(job.id, 3) == ""


def test_eval_command_keeps_values_literal():
    nasty = "v4; rm -rf ~ && echo $(whoami) 'x' \"y\""
    argv = eval_command({
        "target": "/models/Qwen3.5-4B", "drafter": nasty, "prompts": "p.jsonl", "budgets": [4, 8, 16],
        "max_new_tokens": 64, "linear_attn": "fallback", "checkpoint_step": 1200, "out": None,
        "reference": "z-lab",
    })
    assert argv[:4] == [sys.executable, "-m", "tracker.cli", "eval"]
    pairs = dict(zip(argv[4::2], argv[5::2]))
    assert pairs == {
        "--target": "/models/Qwen3.5-4B", "--drafter": nasty, "--prompts": "p.jsonl", "--max-new-tokens": "64",
        "--budgets": "4,8,16", "--linear-attn": "fallback", "--checkpoint-step": "1200", "--reference": "z-lab",
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"target": "t", "drafter": "d"}, "needs prompts"),
        ({"target": "t", "drafter": "d", "prompts": "p", "temperature": 0}, "unknown eval param"),
        ({"target": "t", "drafter": "d", "prompts": "p", "budgets": "4,8"}, "list of positive integers"),
        ({"target": "t", "drafter": "d", "prompts": "p", "max_new_tokens": True}, "non-negative integer"),
        ({"target": "t", "drafter": "--no-log", "prompts": "p"}, "starts with '-'"),
        ({"target": "t", "drafter": "", "prompts": "p"}, "non-empty string"),
    ],
)
def test_eval_command_rejects_bad_params(params, message):
    with pytest.raises(DraftboardError, match=message):
        eval_command(params)
