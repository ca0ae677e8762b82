"""`draftboard demo --quick` builds a store a plain MLflow client can read, with honest data."""

import json
import time

import mlflow
import pytest

from demo.build import REFERENCE_NAME, build_demo
from tracker.cli import main


@pytest.fixture(scope="module")
def client(demo_home):
    return mlflow.MlflowClient(f"sqlite:///{demo_home / 'draftboard.db'}")


def _runs(client, kind):
    exp = client.get_experiment_by_name("draftboard")
    return client.search_runs([exp.experiment_id], f"tags.`draftboard.kind` = '{kind}'", max_results=1000)


def test_training_runs_have_step_metrics_and_checkpoints(client):
    train = _runs(client, "train")
    assert len(train) >= 3
    for run in train:
        history = client.get_metric_history(run.info.run_id, "loss")
        assert len(history) == int(run.data.params["steps"])
        assert {"loss", "acc", "streak", "dds8"} <= set(run.data.metrics)
        assert int(run.data.tags["draftboard.checkpoints"]) >= 1
        assert run.info.status == "FINISHED"


def test_every_training_run_has_evals_that_show_learning(client):
    evals = _runs(client, "eval")
    for run in _runs(client, "train"):
        if run.data.tags.get("draftboard.kind") != "train" or "reference" in run.info.run_name:
            continue
        mine = [e for e in evals if e.data.tags["draftboard.train_run_id"] == run.info.run_id]
        assert mine, run.info.run_name
        steps = sorted(int(e.data.tags["draftboard.checkpoint_step"]) for e in mine)
        assert steps[-1] == int(run.data.params["steps"])
        best = max(e.data.metrics["tau"] for e in mine)
        assert best > 1.3, (run.info.run_name, best)  # the drafters actually learned
        results = json.loads(open(client.download_artifacts(mine[0].info.run_id, "eval_results.json")).read())
        assert results["tau"] == pytest.approx(mine[0].data.metrics["tau"])


def test_reference_run(client):
    refs = [r for r in _runs(client, "reference") if r.info.run_name == REFERENCE_NAME]
    assert len(refs) == 1
    assert refs[0].data.metrics["tau"] > 1.3
    assert "z-lab" not in refs[0].info.run_name


def test_env_diff_finds_the_bf16_training_run_mismatch(client, demo_home, capsys):
    bf16 = next(r for r in _runs(client, "train") if r.data.params["dtype"] == "bf16")
    ev = next(e for e in _runs(client, "eval") if e.data.tags["draftboard.train_run_id"] == bf16.info.run_id)
    uri = f"sqlite:///{demo_home / 'draftboard.db'}"
    assert main(["env-diff", bf16.info.run_id, ev.info.run_id, "--tracking-uri", uri]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("numerics.dtype"))
    assert "bf16" in line and "fp32" in line and "critical" in line


def test_second_build_returns_at_once(demo_home, client):
    before = len(_runs(client, "eval"))
    t = time.perf_counter()
    build_demo(demo_home, quick=True, report=lambda line: None)
    assert time.perf_counter() - t < 5
    assert len(_runs(client, "eval")) == before


def test_store_stays_small(demo_home):
    size = sum(p.stat().st_size for p in demo_home.rglob("*") if p.is_file())
    assert size < 200 * 2**20
