"""Tracker against a real MLflow sqlite store, read back with a plain MlflowClient."""

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from tracker import Tracker
from tracker.environment import fingerprint
from tracker.store.checkpoints import Checkpoint, digest, HubOrigin, hub_origin
from tracker.errors import DraftboardError
from tracker.store.retry import RetryPolicy
from tracker.store.tracker import local_artifact_location
from waiting import wait_until


def _history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def _artifact_json(client, run_id, path, tmp_path):
    return json.loads(Path(client.download_artifacts(run_id, path, str(tmp_path))).read_text())


def test_training_run_reads_back_with_plain_mlflow(tracker, store_uri, machine_fp, tmp_path):
    params = {"lr": 3e-4, "block_size": 16, "data": {"name": "ultrachat", "n": 800}}
    steps = 1200  # 3 metrics a step: more than one 1000-metric batch
    with tracker.training_run("v4", params, "Qwen/Qwen3.5-4B", tags={"team": "a"}, fingerprint=machine_fp) as run:
        for step in range(steps):
            run.log_step(step, loss=1.0 / (step + 1), acc=step / steps, streak=float(step % 7))

    client = MlflowClient(tracking_uri=store_uri)
    got = client.get_run(run.run_id)
    assert got.info.status == "FINISHED"
    assert got.data.params == {"lr": "0.0003", "block_size": "16", "data.name": "ultrachat", "data.n": "800"}
    tags = got.data.tags
    assert tags["draftboard.kind"] == "train" and tags["draftboard.target"] == "Qwen/Qwen3.5-4B"
    assert tags["team"] == "a" and tags["mlflow.runName"] == "v4"
    assert {k: tags[k] for k in fingerprint.env_tags(machine_fp)} == fingerprint.env_tags(machine_fp)
    assert _history(client, run.run_id, "loss") == [(s, 1.0 / (s + 1)) for s in range(steps)]
    assert [s for s, _ in _history(client, run.run_id, "streak")] == list(range(steps))
    assert _artifact_json(client, run.run_id, "fingerprint.json", tmp_path) == machine_fp
    assert tracker.fingerprint(run.run_id) == machine_fp


def test_fingerprint_is_captured_when_not_given(tracker):
    with tracker.training_run("captured", {}, "t") as run:
        pass
    fp = tracker.fingerprint(run.run_id)
    assert fp["source"]["kind"] == "captured"
    assert tracker.run(run.run_id).data.tags["env.hash"] == fingerprint.env_tags(fp)["env.hash"]


def test_checkpoints_are_registered_with_size_and_digest(tracker, store_uri, machine_fp, tmp_path):
    weights = tmp_path / "drafter.safetensors"
    weights.write_bytes(b"\x01" * 1000)
    ckpt_dir = tmp_path / "checkpoint-20"
    (ckpt_dir / "sub").mkdir(parents=True)
    (ckpt_dir / "model.safetensors").write_bytes(b"w" * 300)
    (ckpt_dir / "sub" / "config.json").write_text("{}")
    with tracker.training_run("ckpts", {}, "t", fingerprint=machine_fp) as run:
        run.log_step(10, loss=1.0)
        late = run.log_checkpoint(ckpt_dir, 20)
        early = run.log_checkpoint(weights, 10)

    assert early == Checkpoint(10, str(weights), 1000, hashlib.sha256(b"\x01" * 1000).hexdigest())
    assert late.size_bytes == 302 and late.path == str(ckpt_dir)
    assert tracker.checkpoints(run.run_id) == [early, late]
    client = MlflowClient(tracking_uri=store_uri)
    assert client.get_run(run.run_id).data.tags["draftboard.checkpoints"] == "2"
    assert _artifact_json(client, run.run_id, "checkpoints/step_20.json", tmp_path)["sha256"] == late.sha256
    (ckpt_dir / "sub" / "config.json").rename(ckpt_dir / "config.json")  # same bytes, other layout
    assert digest(ckpt_dir) != (late.size_bytes, late.sha256)


def test_missing_checkpoint_is_a_draftboard_error(tracker, machine_fp, tmp_path):
    with tracker.training_run("missing-ckpt", {}, "t", fingerprint=machine_fp) as run:
        with pytest.raises(DraftboardError, match="does not exist"):
            run.log_checkpoint(tmp_path / "nope", 5)


def test_crash_marks_failed_and_keeps_every_logged_step(tracker, store_uri, machine_fp):
    with pytest.raises(ZeroDivisionError):
        with tracker.training_run("crash", {}, "t", fingerprint=machine_fp) as run:
            for step in range(300):
                run.log_step(step, loss=float(step))
            1 / 0
    got = MlflowClient(tracking_uri=store_uri).get_run(run.run_id)
    assert got.info.status == "FAILED"
    assert got.data.tags["draftboard.error"] == "ZeroDivisionError: division by zero"
    assert [s for s, _ in _history(MlflowClient(tracking_uri=store_uri), run.run_id, "loss")] == list(range(300))


@pytest.mark.parametrize(
    "step, metrics, message",
    [
        (-1, {"loss": 1.0}, "step must be an integer >= 0"),
        (1.5, {"loss": 1.0}, "step must be an integer >= 0"),
        (True, {"loss": 1.0}, "step must be an integer >= 0"),
        (1, {"loss": "high"}, "metric 'loss' must be a number"),
        (1, {"loss": None}, "metric 'loss' must be a number"),
        (1, {"bad(name)": 1.0}, "invalid metric name"),
    ],
)
def test_log_step_rejects_bad_input(tracker, machine_fp, step, metrics, message):
    with tracker.training_run("bad-input", {}, "t", fingerprint=machine_fp) as run:
        with pytest.raises(DraftboardError, match=message):
            run.log_step(step, **metrics)
        run.log_step(0, nan=float("nan"), inf=float("inf"), count=3)  # numbers of any kind are fine
    with pytest.raises(DraftboardError, match="closed"):
        run.log_step(1, loss=1.0)


def test_eval_run_carries_lineage_and_artifacts(tracker, store_uri, machine_fp, tmp_path):
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"abc")
    with tracker.training_run("v5", {}, "Qwen/Qwen3.5-4B", fingerprint=machine_fp) as train:
        ckpt = train.log_checkpoint(weights, 400)
    results = {"schema": "draftboard.eval/1", "tau": 6.1, "prompts": [{"id": "a", "acceptance_lengths": [3, 4]}]}
    with tracker.eval_run(
        "v5@400", target="Qwen/Qwen3.5-4B", train_run_id=train.run_id, checkpoint=ckpt,
        params={"budgets": [4, 8]}, fingerprint=machine_fp,
    ) as ev:
        ev.log_metrics({"tau": 6.1, "streak": 5.1})
        ev.log_metrics({"tau": 6.3}, step=400)
        ev.log_json("eval_results.json", results)
        ev.log_table("per_prompt.json", [{"id": "a", "tau": 6.0}, {"id": "b", "tau": 6.2}])

    client = MlflowClient(tracking_uri=store_uri)
    got = client.get_run(ev.run_id)
    assert got.info.status == "FINISHED"
    assert {k: v for k, v in got.data.tags.items() if k.startswith("draftboard.")} == {
        "draftboard.kind": "eval",
        "draftboard.target": "Qwen/Qwen3.5-4B",
        "draftboard.train_run_id": train.run_id,
        "draftboard.checkpoint": str(weights),
        "draftboard.checkpoint_step": "400",
        "draftboard.checkpoint_sha256": ckpt.sha256,
    }
    assert got.data.params == {"budgets": "[4, 8]"}
    assert _history(client, ev.run_id, "tau") == [(0, 6.1), (400, 6.3)]
    assert _artifact_json(client, ev.run_id, "eval_results.json", tmp_path) == results
    table = _artifact_json(client, ev.run_id, "per_prompt.json", tmp_path)
    assert table["columns"] == ["id", "tau"] and table["data"] == [["a", 6.0], ["b", 6.2]]
    assert tracker.fingerprint(ev.run_id) == machine_fp
    # The dashboard's reader: from disk (sqlite), through the server's artifact proxy (server), alike.
    from tracker.dashboard.index import read_json_artifact

    artifact_uri = got.info.artifact_uri
    assert artifact_uri.startswith("mlflow-artifacts:" if store_uri.startswith("http") else ("/", "file:"))
    assert read_json_artifact(client, ev.run_id, artifact_uri, "eval_results.json") == results
    assert read_json_artifact(client, ev.run_id, artifact_uri, "fingerprint.json") == machine_fp
    assert read_json_artifact(client, ev.run_id, artifact_uri, "no-such.json") is None


def test_ending_a_run_writes_nothing_to_stdout(tracker, machine_fp, capfd):
    """Against a server MLflow prints `🏃 View run ... at: URL` as a run ends; stdout belongs to the
    commands (a --json document), so the Tracker leaves it out."""
    capfd.readouterr()
    with tracker.training_run("quiet", {}, "t", fingerprint=machine_fp) as run:
        run.log_step(1, loss=1.0)
    assert capfd.readouterr().out == ""


def test_eval_run_rejects_an_unknown_training_run(tracker, machine_fp):
    with pytest.raises(DraftboardError, match="no run with id"):
        tracker.eval_run("x", target="t", train_run_id="f" * 32, fingerprint=machine_fp)


def test_set_kind_promotes_and_demotes_references(tracker, machine_fp):
    with tracker.eval_run("z-lab", target="t", reference_name="z-lab dflash", fingerprint=machine_fp) as ev:
        ev.log_metrics({"tau": 6.5})
    references = lambda: {r.info.run_id for r in tracker.find_runs(kind="reference")}  # noqa: E731
    assert ev.run_id not in references()
    tracker.set_kind(ev.run_id, "reference")
    assert ev.run_id in references()
    assert tracker.run(ev.run_id).data.tags["draftboard.reference_name"] == "z-lab dflash"
    tracker.set_kind(ev.run_id, "eval")
    assert ev.run_id not in references()
    with tracker.training_run("train", {}, "t", fingerprint=machine_fp) as train:
        pass
    with pytest.raises(DraftboardError, match="only eval runs"):
        tracker.set_kind(train.run_id, "reference")
    with pytest.raises(DraftboardError, match="kind must be"):
        tracker.set_kind(ev.run_id, "gold")


def test_find_runs_filters_by_kind_and_mlflow_filter(tracker, machine_fp):
    with tracker.training_run("findable", {"marker": "find-me"}, "t", fingerprint=machine_fp) as run:
        pass
    found = tracker.find_runs(kind="train", filter="params.marker = 'find-me'")
    assert [r.info.run_id for r in found] == [run.run_id]
    assert tracker.find_runs(kind="eval", filter="params.marker = 'find-me'") == []


def test_unknown_run_id_is_a_draftboard_error(tracker):
    for call in (tracker.run, tracker.fingerprint, tracker.checkpoints):
        with pytest.raises(DraftboardError, match="no run with id"):
            call("0" * 32)


def test_run_logged_outside_draftboard_has_no_fingerprint_and_no_checkpoints(tracker):
    run_id = tracker.client.create_run(tracker.experiment_id, run_name="plain-mlflow").info.run_id
    with pytest.raises(DraftboardError, match="no readable fingerprint.json .not logged by draftboard"):
        tracker.fingerprint(run_id)
    assert tracker.checkpoints(run_id) == []


def test_local_artifact_location(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_artifact_location("http://mlflow.internal:5000") is None
    assert local_artifact_location("sqlite:///x.db") == (tmp_path / "mlartifacts").as_uri()


@pytest.mark.sqlite_only(reason="a server keeps artifacts where its --artifacts-destination says "
                                "(tests/test_server_mode.py checks that)")
def test_artifacts_live_next_to_the_sqlite_file(tracker, store_uri):
    db = Path(store_uri[len("sqlite:///") :])
    experiment = MlflowClient(tracking_uri=store_uri).get_experiment(tracker.experiment_id)
    assert experiment.name == "draftboard"
    assert experiment.artifact_location == (db.parent / "mlartifacts").as_uri()


def test_trackers_on_other_experiments_do_not_mix(tracker, store_uri, machine_fp):
    other = Tracker(store_uri, experiment="other-team")
    with other.training_run("theirs", {}, "t", fingerprint=machine_fp) as run:
        pass
    assert [r.info.run_id for r in other.find_runs()] == [run.run_id]
    assert run.run_id not in {r.info.run_id for r in tracker.find_runs()}


class _FlakyTransport:
    """Wraps MlflowClient.log_batch (the store boundary): fails chosen metric batches."""

    def __init__(self, client, fail_first: int, error: Exception):
        self.real, self.fail_first, self.error = client.log_batch, fail_first, error
        self.metric_calls = 0
        self.failures = 0

    def __call__(self, run_id, metrics=(), **kwargs):
        if metrics:
            self.metric_calls += 1
            if self.failures < self.fail_first:
                self.failures += 1
                raise self.error
        return self.real(run_id, metrics=metrics, **kwargs)


def _flaky_tracker(store_uri, fail_first, error, window_s):
    flaky = Tracker(store_uri, retry=RetryPolicy(window_s=window_s, first_delay_s=0.05, max_delay_s=0.2))
    transport = _FlakyTransport(flaky.client, fail_first, error)
    flaky.client.log_batch = transport
    return flaky, transport


def test_flusher_retries_failed_batches_without_losing_or_reordering(store_uri, machine_fp):
    outage = requests.exceptions.ConnectionError("connection refused")
    flaky, transport = _flaky_tracker(store_uri, fail_first=4, error=outage, window_s=30)
    with flaky.training_run("outage", {}, "t", fingerprint=machine_fp) as run:
        for step in range(1500):
            run.log_step(step, loss=float(step), acc=step / 1500)
    assert transport.failures == 4 and transport.metric_calls >= 4 + 3
    client = MlflowClient(tracking_uri=store_uri)
    assert _history(client, run.run_id, "loss") == [(s, float(s)) for s in range(1500)]
    assert client.get_run(run.run_id).info.status == "FINISHED"


def test_flusher_gives_up_after_the_retry_window_and_fails_the_run(store_uri, machine_fp):
    outage = requests.exceptions.ConnectionError("connection refused")
    flaky, _ = _flaky_tracker(store_uri, fail_first=10**9, error=outage, window_s=0.3)
    with pytest.raises(DraftboardError, match=r"20 metric values could not be sent .* connection refused"):
        with flaky.training_run("dead-store", {}, "t", fingerprint=machine_fp) as run:
            for step in range(20):
                run.log_step(step, loss=1.0)
    got = flaky.run(run.run_id)
    assert got.info.status == "FAILED" and "could not be sent" in got.data.tags["draftboard.error"]


def test_permanent_store_errors_are_not_retried(store_uri, machine_fp):
    rejected = MlflowException("bad metric", error_code=INVALID_PARAMETER_VALUE)
    flaky, transport = _flaky_tracker(store_uri, fail_first=1, error=rejected, window_s=60)
    start = time.monotonic()
    with pytest.raises(DraftboardError, match="bad metric"):
        with flaky.training_run("rejected", {}, "t", fingerprint=machine_fp) as run:
            run.log_step(0, loss=1.0)
    assert time.monotonic() - start < 10 and transport.metric_calls == 1


class _SlowStore:
    """Wraps MlflowClient.log_batch (the store boundary): a slow store; notes how far the loop ran ahead."""

    def __init__(self, client):
        self.real, self.produced, self.sent, self.ahead = client.log_batch, 0, 0, []

    def __call__(self, run_id, metrics=(), **kwargs):
        if metrics:
            self.ahead.append(self.produced - self.sent)  # steps queued or in this batch
            time.sleep(0.02)
            self.sent += len(metrics)
        return self.real(run_id, metrics=metrics, **kwargs)


def test_bounded_training_run_waits_for_the_store_instead_of_growing(store_uri, machine_fp):
    bounded = Tracker(store_uri)
    store = bounded.client.log_batch = _SlowStore(bounded.client)
    with bounded.training_run("bounded", {}, "t", fingerprint=machine_fp, max_pending_steps=50) as run:
        for step in range(3000):
            run.log_step(step, loss=float(step))
            store.produced = step + 1
    # Unbounded, the loop would be 3000 steps ahead at the first batch; bounded, at most 50 queued
    # (51 while log_step waits) plus the batch being sent, which took no more than the queue held.
    assert store.ahead and max(store.ahead) < 120
    assert [s for s, _ in _history(MlflowClient(tracking_uri=store_uri), run.run_id, "loss")] == list(range(3000))


def test_find_experiment_is_none_until_someone_writes(store_uri, machine_fp):
    fresh = Tracker(store_uri, experiment=f"fresh-{time.time_ns()}")
    assert fresh.find_experiment() is None and fresh.find_runs() == []
    created = fresh.experiment_id
    assert fresh.find_experiment() == created


def _creating(uri: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys; from tracker.store.tracker import create_whole; "
                             "create_whole(sys.argv[1])", uri], cwd=cwd)


def test_a_store_whose_creator_was_killed_midway_is_created_whole_by_the_next(tmp_path, machine_fp):
    # A cancelled eval that logs first to a new store used to leave it half-migrated, and every
    # later process failed on it ("duplicate column name").
    db = tmp_path / "store" / "mlflow.db"
    uri = f"sqlite:///{db}"
    creator = _creating(uri, tmp_path)
    building = db.with_name(f".{db.name}.{creator.pid}.new")

    def begun() -> bool:  # MLflow has begun writing its tables (or it finished, which fails the test below)
        try:
            return creator.poll() is not None or building.stat().st_size > 0
        except FileNotFoundError:
            return False

    wait_until(begun, 120, interval=0.01, what="the creator building its store")
    creator.kill()
    assert creator.wait() == -signal.SIGKILL, "it finished before the kill: nothing was tested"
    assert not db.exists()

    with Tracker(uri).training_run("after", {"lr": 1e-4}, "t", fingerprint=machine_fp) as run:
        run.log_step(0, loss=1.0)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run.run_id).data.params == {"lr": "0.0001"}
    # What the killed one built stays where it was built, under its hidden name, and nothing else.
    assert sorted(p.name for p in db.parent.iterdir() if not p.name.startswith(f".{db.name}.{creator.pid}.")) == [
        "mlartifacts", "mlflow.db"]


def test_processes_creating_one_store_at_once_all_get_it_whole(tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    creators = [_creating(uri, tmp_path) for _ in range(3)]
    assert [c.wait(timeout=300) for c in creators] == [0, 0, 0]
    assert [p.name for p in tmp_path.iterdir()] == ["mlflow.db"]  # no one's copy left behind
    # As MLflow would have made it itself, in the same working directory: every table and migration,
    # the Default experiment where MLflow puts it.
    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "theirs.db"
    ours, made = (MlflowClient(tracking_uri=f"sqlite:///{path}") for path in (db, theirs))
    assert ours.get_experiment("0").artifact_location == made.get_experiment("0").artifact_location
    tables = "select name from sqlite_master where type='table' order by name"
    with sqlite3.connect(db) as a, sqlite3.connect(theirs) as b:
        assert a.execute(tables).fetchall() == b.execute(tables).fetchall()
        version = "select version_num from alembic_version"
        assert a.execute(version).fetchall() == b.execute(version).fetchall()


def test_hub_origin_reads_the_hub_caches_own_layout(tmp_path):
    from huggingface_hub.file_download import repo_folder_name

    commit = "2274357" + "ab" * 16 + "0"
    snapshot = tmp_path / "hub" / repo_folder_name(repo_id="z-lab/Qwen3.5-27B-DFlash", repo_type="model") / "snapshots" / commit
    snapshot.mkdir(parents=True)
    assert hub_origin(snapshot) == HubOrigin("z-lab/Qwen3.5-27B-DFlash", commit)
    assert hub_origin(f"{snapshot}/") == hub_origin(snapshot)
    (tmp_path / "link").symlink_to(snapshot)
    assert hub_origin(tmp_path / "link") == hub_origin(snapshot)  # a link to the snapshot is the snapshot
    assert hub_origin(tmp_path / "hub") is None and hub_origin(snapshot.parent / "main") is None
    assert hub_origin(tmp_path / "models--z-lab--X" / "snapshots" / "not-a-commit") is None


def test_a_postgresql_store_is_read_with_the_driver_installed_and_a_dead_one_is_one_line(postgres_uri, capsys):
    """Issue 64, F13: docker-compose and DEPLOY.md write a plain `postgresql://` store; SQLAlchemy 2.1 reads it as
    psycopg 3, which the `postgres` extra does not install. And a store that does not answer was a traceback of
    some 200 lines."""
    from conftest import postgres_schema
    from tracker.cli import main

    assert postgres_uri.startswith("postgresql://")
    for uri in postgres_schema(postgres_uri):
        tracker = Tracker(uri)
        with tracker.training_run("on postgres", {"lr": 1e-3}, "t", fingerprint={"software": {}}) as run:
            run.log_step(1, loss=1.0)
        assert tracker.run(run.run_id).data.metrics["loss"] == 1.0
        assert tracker.uri.startswith(("postgresql+psycopg2://", "postgresql://"))
    dead = "postgresql://someone:hunter2@127.0.0.1:1/nothing"
    with pytest.raises(DraftboardError, match="cannot open tracking store .*127.0.0.1:1/nothing: OperationalError"):
        Tracker(dead)
    capsys.readouterr()
    assert main(["import-log", __file__, "--name", "x", "--tracking-uri", dead]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot open tracking store") and "hunter2" not in err[0]
