"""A real two-node Ray cluster on loopback (tests/raycluster.py): a head with 2 CPUs and no GPU, and a worker node
with its own temp dir that declares 2 GPUs. A job that asks for a GPU lands on the node that has them; a sharded eval
(`shards` 2) spreads its shards over both nodes as Ray tasks and merges them into exactly the one-process eval,
logged to the MLflow server with proxied artifacts; nothing is left running."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

if not os.environ.get("DRAFTBOARD_REQUIRE_RAY"):
    pytest.importorskip("ray.job_submission", reason="the Ray cluster tests need ray[default]", exc_type=ImportError)

import raycluster
from conftest import eval_params
from test_ray_launcher import FAST, ray_job

from tracker.jobs.queue import SUCCEEDED, JobQueue
from tracker.jobs.worker import run_worker


@pytest.fixture(scope="module")
def two_nodes(request):
    raycluster.server_credentials_first(request)
    yield from raycluster.cluster(cpus=2, gpus=0, workers=((2, 2),))


def test_a_gpu_job_lands_on_the_node_that_has_the_gpus(two_nodes, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = queue.submit("eval", eval_params(device="cuda"))
    seen = tmp_path / "seen"  # read here rather than through Ray's log collection, which may lag a short job
    launcher = raycluster.launcher(two_nodes, f"import os, pathlib; pathlib.Path({str(seen)!r}).write_text("
                                    "os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))")
    assert run_worker(queue.uri, once=True, launcher=launcher, **FAST) == 1
    done = queue.get(job.id)
    assert done.state == SUCCEEDED, done.error
    info = ray_job(two_nodes, launcher)
    assert info.driver_node_id == two_nodes.nodes[0]  # the head has no GPU: the worker node ran it
    assert seen.read_text() in ("0", "1")  # Ray gave the job one of the node's two GPUs


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from tiny import hybrid_eval_files

    return hybrid_eval_files(tmp_path_factory.mktemp("ray-cluster-models"), prompt_id=int)


def test_a_sharded_eval_spreads_over_both_nodes_and_equals_one_process(two_nodes, tiny_models, mlflow_server,
                                                                       tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from tracker.cli import main

    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)  # proxied artifacts: no path shared for them
    params = {"target": str(tiny_models / "target"), "drafter": str(tiny_models / "drafter"),
              "prompts": str(tiny_models / "prompts.jsonl"), "max_new_tokens": 12, "budgets": [2, 8],
              "device": "cpu", "shards": 2}
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = queue.submit("eval", params)
    launcher = raycluster.launcher(two_nodes)
    started = time.monotonic()
    assert run_worker(queue.uri, once=True, launcher=launcher, **FAST) == 1
    print(f"sharded eval through a two-node cluster: {time.monotonic() - started:.1f} s", file=sys.stderr)
    done = queue.get(job.id)
    assert done.state == SUCCEEDED, f"{done.error}\n{Path(done.log_path).read_text()[-3000:]}"
    assert launcher.submitted[0]["entrypoint_num_gpus"] == 0  # the shards ask for their own
    client = MlflowClient(mlflow_server.uri)
    sharded = json.loads(Path(client.download_artifacts(done.mlflow_run_id, "eval_results.json",
                                                        str(tmp_path / "a"))).read_text())
    head_id = next(n for n in _nodes(two_nodes) if n not in two_nodes.nodes)
    assert {s["node"] for s in sharded["shards"]} == {head_id, two_nodes.nodes[0]}  # one shard on each node

    one = tmp_path / "one.json"
    assert main(["eval", "--target", params["target"], "--drafter", params["drafter"], "--prompts",
                 params["prompts"], "--max-new-tokens", "12", "--budgets", "2,8", "--device", "cpu", "--no-log",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(one)]) == 0
    one = json.loads(one.read_text())
    for key in set(one) - {"timing", "settings", "fingerprint", "shards"}:
        assert sharded[key] == one[key], key
    # Nothing of the job is left on either node: its driver and both tasks ended.
    from ray.util.state import list_tasks

    tasks = list_tasks(address=two_nodes.address, filters=[("name", "=", "_score_task")])
    assert tasks and all(t.state == "FINISHED" for t in tasks)


def _nodes(cluster) -> list[str]:
    from ray.util.state import list_nodes

    return [n.node_id for n in list_nodes(address=cluster.address) if n.state == "ALIVE"]


def test_cancelling_a_sharded_eval_stops_its_shards_on_every_node(two_nodes, tiny_models, tmp_path, monkeypatch):
    import threading

    from ray.util.state import list_tasks
    from waiting import wait_until

    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    prompts = tmp_path / "many.jsonl"  # enough work that the shards are still running when the cancel comes
    prompts.write_text("".join(json.dumps({"id": i, "input_ids": [2 + (i * 7 + k) % 50 for k in range(9)]}) + "\n"
                               for i in range(400)))
    params = {"target": str(tiny_models / "target"), "drafter": str(tiny_models / "drafter"), "prompts": str(prompts),
              "max_new_tokens": 480, "device": "cpu", "shards": 2}
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = queue.submit("eval", params)
    stop = threading.Event()
    thread = threading.Thread(target=run_worker, args=(queue.uri,), daemon=True,
                              kwargs={**FAST, "stop_event": stop, "launcher": raycluster.launcher(two_nodes)})
    thread.start()
    try:
        def running_tasks():
            return [t for t in list_tasks(address=two_nodes.address, filters=[("name", "=", "_score_task")])
                    if t.state == "RUNNING"]

        assert len(wait_until(lambda: len(running_tasks()) == 2 and running_tasks(), 120, 0.5,
                              "both shards running")) == 2
        queue.request_cancel(job.id)
        wait_until(lambda: queue.get(job.id).finished, 60, 0.2, "the job to end")
        assert queue.get(job.id).state == "cancelled"
        wait_until(lambda: not running_tasks(), 60, 0.5, "no shard running on any node")
    finally:
        stop.set()
        thread.join(timeout=60)
