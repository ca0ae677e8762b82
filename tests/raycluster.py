"""A real Ray cluster on this machine for the tests: a head (`ray start --head`) and, where a test needs one, worker
nodes (`ray start --address`), each with its own temp dir and declared resources.

Every node is started the way a cluster node would be set up: the venv's `python` first on PATH and the source tree
on PYTHONPATH stand for "draftboard is installed on the nodes". Each runs as `ray start --block` in its own session,
so stopping that process stops exactly that node (`ray stop` would stop every Ray on the machine); whatever outlives
it under its own temp dir is killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from uiprocess import free_port
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0


def _ray_bin() -> str:
    ray_bin = Path(sys.executable).parent / "ray"
    found = str(ray_bin) if ray_bin.exists() else shutil.which("ray")
    if not found:
        pytest.fail("ray is importable but its `ray` command is not installed")
    return found


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(RAY_USAGE_STATS_ENABLED="0",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p))
    return env


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Node:
    """One `ray start --block` process and its temp dir."""

    def __init__(self, args: list[str], cpus: int, gpus: int):
        self.temp_dir = tempfile.mkdtemp(prefix="dbray-", dir="/tmp")  # short: Ray puts unix sockets under it
        self.log = open(Path(self.temp_dir) / "ray-start.log", "w")
        # Every port this node would otherwise take at a fixed default gets a free one, so two nodes (and two test
        # sessions) on one machine do not collide.
        cmd = [_ray_bin(), "start", "--block", "--node-ip-address", "127.0.0.1", *args,
               "--dashboard-agent-listen-port", str(free_port()), "--num-cpus", str(cpus), "--num-gpus", str(gpus),
               "--disable-usage-stats", "--include-log-monitor", "false", "--temp-dir", self.temp_dir]
        self.proc = subprocess.Popen(cmd, env=_env(), cwd=self.temp_dir, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def check(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"ray start exited with {self.proc.returncode}:\n"
                        + (Path(self.temp_dir) / "ray-start.log").read_text()[-3000:])

    def stop(self) -> None:
        try:
            self.proc.terminate()  # `ray start --block` stops the processes of its node on SIGTERM
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in _processes_mentioning(self.temp_dir):  # anything of this node that outlived it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def server_credentials_first(request) -> None:
    """Where an MLflow test server is configured, set up its fixture (its credentials in this environment) before a
    node starts: a secret is the nodes' own (docs/RAY.md), never sent with a job, so a node started first could not
    log there."""
    from conftest import SERVER_ENV

    if all(os.environ.get(name) for name in SERVER_ENV):
        request.getfixturevalue("mlflow_server")


def cluster(cpus: int = 2, gpus: int = 0, workers: tuple[tuple[int, int], ...] = ()):
    """A generator for a fixture: a head of `cpus` CPUs and `gpus` declared GPUs, then one worker node per
    (cpus, gpus) in `workers`, joined; yields SimpleNamespace(address (the Jobs API), client, gcs, head, nodes
    (the worker nodes' ids, in order)); stops every node at the end."""
    from ray.job_submission import JobSubmissionClient

    dashboard_port, gcs_port = free_port(), free_port()
    started = time.monotonic()
    head = Node(["--head", "--port", str(gcs_port), "--dashboard-host", "127.0.0.1", "--dashboard-port",
                 str(dashboard_port), "--ray-client-server-port", str(free_port())], cpus, gpus)
    nodes: list[Node] = []
    try:
        address = f"http://127.0.0.1:{dashboard_port}"

        def jobs_api():
            head.check()
            try:
                client = JobSubmissionClient(address)
                client.list_jobs()
                return client
            except Exception:
                return None

        client = wait_until(jobs_api, START_TIMEOUT_S, interval=0.2, what=f"the Ray Jobs API at {address} answering")
        for n_cpus, n_gpus in workers:
            nodes.append(Node(["--address", f"127.0.0.1:{gcs_port}"], n_cpus, n_gpus))
        ids = wait_until(lambda: _worker_ids(address, len(workers), nodes), START_TIMEOUT_S, interval=0.5,
                         what=f"{len(workers)} worker node(s) joining") if workers else []
        print(f"ray cluster of {1 + len(workers)} node(s) ready in {time.monotonic() - started:.1f} s",
              file=sys.stderr)
        yield SimpleNamespace(address=address, client=client, gcs=f"127.0.0.1:{gcs_port}", head=head,
                              temp_dir=head.temp_dir, nodes=ids)
    finally:
        for node in [*nodes, head]:
            node.stop()


def launcher(cluster, code: str | None = None, **options):
    """A RayLauncher on `cluster` running `draftboard` (or, given code, that script: conftest `script_entry`);
    `.submitted` records each submit_job's arguments (the Jobs API does not report a job's entrypoint resources
    back)."""
    from conftest import script_entry
    from tracker.jobs.launchers.ray import RayLauncher

    made = RayLauncher(cluster.address, poll_s=0.2, entry=script_entry(code) if code else None, **options)
    made.submitted = []
    real = made.client.submit_job

    def spy(**kwargs):
        made.submitted.append(kwargs)
        return real(**kwargs)

    made.client.submit_job = spy
    return made


def _worker_ids(address: str, count: int, nodes: list[Node]) -> list[str] | None:
    """The alive non-head nodes' ids once `count` have joined (Ray's state API), else None."""
    from ray.util.state import list_nodes

    for node in nodes:
        node.check()
    try:
        listed = list_nodes(address=address)
    except Exception:
        return None
    workers = [n.node_id for n in listed if n.state == "ALIVE" and not n.is_head_node]
    return workers if len(workers) >= count else None
