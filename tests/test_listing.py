"""tracker/store/listing.py: every run read in bulk from MLflow's database is the run MLflow's own
search returns, field for field (issue 38: the dashboard's listing at 10,000 runs)."""

from __future__ import annotations

import math

from mlflow import MlflowClient

from tracker.store import listing, names
from tracker.store.history import latest_metric_steps
from tracker.store.tracker import Tracker


def _as_search_returns(run) -> tuple:
    info = run.info
    metrics = {k: ("nan" if math.isnan(v) else v) for k, v in run.data.metrics.items()}
    return (info.run_id, info.run_name, info.experiment_id, info.user_id, info.status, info.start_time,
            info.end_time, info.lifecycle_stage, info.artifact_uri, dict(run.data.tags), dict(run.data.params),
            metrics, latest_metric_steps(run.data))


def test_runs_read_in_bulk_are_the_runs_mlflow_searches(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("v1", {"lr": 1e-3, "block_size": 16}, "/models/t") as train:
        train.log_step(10, loss=2.0, acc=0.1)
        train.log_step(20, loss=float("nan"), acc=0.2)
    with tracker.eval_run("v1 @ 20", target="/models/t", train_run_id=train.run_id, checkpoint_step=20,
                          params={"prompts": "p.jsonl"}) as ev:
        ev.log_metrics({"tau": 3.25}, step=0)
    client = MlflowClient(uri)
    foreign = client.create_experiment("specforge")
    other = client.create_run(foreign, run_name="specforge run")
    client.log_metric(other.info.run_id, "train/loss", 1.5, step=7)
    gone = client.create_run(foreign, run_name="deleted")
    client.delete_run(gone.info.run_id)

    experiments = [tracker.find_experiment(), foreign]
    listed = listing.list_runs(uri, experiments)
    searched = client.search_runs(experiments, order_by=["attributes.start_time DESC"])
    assert [_as_search_returns(r) for r in listed] == [_as_search_returns(r) for r in searched]
    assert len(listed) == 3 and gone.info.run_id not in {r.info.run_id for r in listed}
    # what the dashboard lists: draftboard's runs and the foreign training run, the same either way
    ids = [r.info.run_id for r in tracker.find_runs(foreign=True)]
    assert ids == [r.info.run_id for r in searched if names.KIND in r.data.tags or r.info.experiment_id == foreign]
    assert [r.info.run_id for r in tracker.find_runs(kind="eval")] == [ev.run_id]  # a filter still searches
    assert listing.list_runs("http://127.0.0.1:9", experiments) is None  # an http store: MLflow's search answers


def test_the_store_version_changes_with_every_write_a_listing_reads(tmp_path):
    """The dashboard re-reads its run index only when `store_version` changes: a run added or ended,
    a tag, param or metric written, a run deleted; reading changes nothing."""
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("v1", {"lr": 1e-3}, "/models/t") as train:
        train.log_step(10, loss=2.0)
    client = MlflowClient(uri)
    seen = [listing.store_version(uri)]
    assert listing.store_version(uri) == seen[-1]
    listing.list_runs(uri, [tracker.find_experiment()])
    assert listing.store_version(uri) == seen[-1]
    writes = [
        lambda: client.set_tag(train.run_id, "note", "hello"),
        lambda: client.set_tag(train.run_id, "note", "hello again"),
        lambda: client.log_param(train.run_id, "seed", "7"),
        lambda: client.log_metric(train.run_id, "loss", 1.0, step=20),
        lambda: client.create_run(tracker.find_experiment(), run_name="new"),
        lambda: client.delete_run(train.run_id),
    ]
    for write in writes:
        write()
        assert listing.store_version(uri) not in seen
        seen.append(listing.store_version(uri))
    assert listing.store_version("http://127.0.0.1:1") is None  # an http store can't say: re-read on a timer


def test_a_rewrite_of_same_length_tags_changes_the_store_version(tmp_path, machine_fp):
    """Issue 48 S6: `draftboard fingerprint --attach` rewrites the fixed-length env.* tags, which no count or
    length sees, so Runs kept the old environment verdict until Refresh. Every rewrite draftboard makes
    now writes names.CHANGED_AT, which the version reads."""
    import copy

    from tracker import fingerprint

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("v1", {}, "/models/t") as train:
        pass
    tracker.attach_fingerprint(train.run_id, machine_fp)
    before = listing.store_version(uri)
    other = copy.deepcopy(machine_fp)
    other["numerics"]["dtype"] = "bf16" if other["numerics"]["dtype"] != "bf16" else "fp16"
    old, new = fingerprint.env_tags(machine_fp), fingerprint.env_tags(other)
    assert old != new and {k: len(v) for k, v in old.items()} == {k: len(v) for k, v in new.items()}
    tracker.attach_fingerprint(train.run_id, other)
    assert listing.store_version(uri) != before
    before = listing.store_version(uri)
    tracker.set_tag(train.run_id, "note", "aaaa")
    middle = listing.store_version(uri)
    tracker.set_tag(train.run_id, "note", "bbbb")  # same length, same count
    assert len({before, middle, listing.store_version(uri)}) == 3


def test_a_sqlite_store_says_every_commit_even_one_no_count_sees(tmp_path):
    """A SQLite store's version is its own change count: a same-length tag rewrite by MLflow's client (no
    `draftboard.changed_at` beside it, no count or length changed) reads as a change, which the counts missed; a
    file put in the store's place is another version; and the connection held to ask never blocks a writer."""
    import shutil

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("v1", {}, "/models/t") as train:
        pass
    client = MlflowClient(uri)
    client.set_tag(train.run_id, "note", "aaaa")
    before = listing.store_version(uri)
    client.set_tag(train.run_id, "note", "bbbb")  # the writer commits while the version's connection is open
    after = listing.store_version(uri)
    assert after != before and listing.store_version(uri) == after  # asking again changes nothing
    shutil.copy(tmp_path / "store.db", tmp_path / "copy.db")
    (tmp_path / "copy.db").replace(tmp_path / "store.db")  # the same bytes, another file
    assert listing.store_version(uri) != after


def test_a_store_in_a_folder_named_with_uri_syntax_is_listed_and_versioned(tmp_path):
    """Both read-only opens of a SQLite store (the listing's engine, the version's connection) pass its path
    to sqlite as a URI: a `#`, space or `%` in a folder's name is encoded, never read as URI syntax (MLflow
    stores runs there; the listing opened the path cut at `#` and found no `runs` table)."""
    folder = tmp_path / "team #1 store 100%"
    folder.mkdir()
    uri = f"sqlite:///{folder / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("v1", {}, "/models/t"):
        pass
    before = listing.store_version(uri)
    assert len(listing.list_runs(uri, [tracker.find_experiment()])) == 1
    with tracker.training_run("v2", {}, "/models/t"):
        pass
    assert listing.store_version(uri) != before
    assert len(listing.list_runs(uri, [tracker.find_experiment()])) == 2


def test_a_planted_changed_at_cannot_hold_a_server_store_s_version_still(postgres_uri, machine_fp):
    """Issue 64, F8: on a database server the version read MAX(changed_at); one tag `1` any user plants sorts after
    every real value and held it still, so a re-attached fingerprint's same-length env.* tags went unseen."""
    import copy

    from conftest import postgres_schema

    for uri in postgres_schema(postgres_uri):
        tracker = Tracker(uri)
        with tracker.training_run("v1", {}, "/models/t") as train:
            pass
        tracker.attach_fingerprint(train.run_id, machine_fp)
        planted = tracker.client.create_run(tracker.experiment_id).info.run_id
        tracker.client.set_tag(planted, names.CHANGED_AT, "1")
        before = listing.store_version(uri)
        other = copy.deepcopy(machine_fp)
        other["numerics"]["dtype"] = "bf16" if other["numerics"]["dtype"] != "bf16" else "fp16"
        tracker.attach_fingerprint(train.run_id, other)  # the same tag lengths: only changed_at moves
        assert listing.store_version(uri) != before
