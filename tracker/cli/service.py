"""`draftboard ui`, `worker` and `demo`: the dashboard, the process that runs queued evals, and the demo store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tracker import config, redact
from tracker.cli.common import json_argument, port_number
from tracker.errors import DraftboardError


def cmd_demo(args) -> int:
    from demo.build import build_demo

    store = config.store_uri(args.tracking_uri)
    build_demo(config.home_dir(), store=store, quick=args.quick, force=args.force, resume=args.resume)
    print(f"raw runs: mlflow ui --backend-store-uri {redact.shown_uri(store)}")
    return 0


def cmd_worker(args) -> int:
    import logging

    from tracker.jobs.gpus import MEMORY_VAR, box_gpus, memory_bytes
    from tracker.jobs.launchers import make_launcher
    from tracker.jobs.worker import run_worker

    from tracker.jobs.schema import quiet_alembic

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    quiet_alembic()  # MLflow migrating a new store narrates through alembic too
    ray_options = {}
    if args.launcher == "ray":
        runtime_env = json_argument("--ray-runtime-env", args.ray_runtime_env) if args.ray_runtime_env else None
        python = "python" if args.ray_python is None else (args.ray_python or None)  # "": the worker's own
        ray_options = dict(python=python, gpus_per_job=args.ray_gpus, env=args.ray_env,
                           runtime_env=runtime_env, poll_s=args.poll)
    elif args.address or args.ray_python is not None or args.ray_env or args.ray_runtime_env:
        raise DraftboardError("--address and --ray-* options need --launcher ray")
    # The box's GPUs (--gpus, DRAFTBOARD_GPUS, CUDA_VISIBLE_DEVICES), parsed before anything starts; a Ray worker
    # takes no list from its own environment, and run_worker refuses one given it.
    gpus = box_gpus(args.gpus, os.environ if args.launcher == "local" else {})
    gpu_memory = memory_bytes(args.gpu_memory, "--gpu-memory") if args.gpu_memory else \
        memory_bytes(os.environ[MEMORY_VAR], MEMORY_VAR) if os.environ.get(MEMORY_VAR) else None
    launcher = make_launcher(args.launcher, args.address, **ray_options)
    launcher.prepare()  # a worker is there to run jobs: the first one need not wait for its imports
    claimed = run_worker(args.jobs_uri, slots=args.slots, poll_s=args.poll, stale_s=args.stale, once=args.once,
                         launcher=launcher, watch_s=args.watch_interval if args.watch else None, gpus=gpus,
                         gpu_memory=gpu_memory)
    print(f"worker stopped after {claimed} job(s)")
    return 0


def cmd_ui(args) -> int:
    import subprocess

    from tracker import lifecycle, serve

    app = Path(__file__).resolve().parents[2] / "app.py"
    if not app.is_file():
        raise DraftboardError(f"{app} not found: run `draftboard ui` from a source checkout")
    if args.demo and args.readonly:
        raise DraftboardError("--demo writes the demo store: not with --readonly")
    if not (args.readonly or args.auth or _is_loopback(args.address)):
        raise DraftboardError(f"--address {args.address} lets other machines in: add --auth (a login) or "
                              "--readonly (no launch controls), or serve on 127.0.0.1")
    env = dict(os.environ)
    if args.auth:
        serve.credentials_from_env(env)  # refuse before anything starts
        env[serve.AUTH_VAR] = "basic"
    taken = lifecycle.port_in_use(args.address, args.port)
    if taken:
        raise DraftboardError(taken)
    # The store's URI as configured, without opening it: a read-only dashboard writes nothing.
    env[config.STORE_VAR] = config.store_uri(args.tracking_uri, env)
    if args.demo and not env[config.STORE_VAR].startswith("sqlite:///"):  # the demo builds into the store shown
        raise DraftboardError(f"--demo builds into a local SQLite store, not {redact.shown_uri(env[config.STORE_VAR])}: "
                              "unset MLFLOW_TRACKING_URI or pass --tracking-uri sqlite:///demo.db")
    # The dashboard process reads its settings from the environment (tracker/dashboard/ui.py).
    for flag, var in (("readonly", config.READONLY_VAR), ("mlflow_ui", config.MLFLOW_UI_VAR),
                      ("jobs_uri", config.JOBS_VAR), ("allowed_roots", config.ROOTS_VAR)):
        value = getattr(args, flag)
        if value:
            env[var] = "1" if value is True else value
    shown = redact.shown_uri(env[config.STORE_VAR])
    print(f"store: {shown}")
    print(f"raw runs: mlflow ui --backend-store-uri {shown}")
    print(f"dashboard: http://{args.address}:{args.port}" + (" (basic auth)" if args.auth else ""))
    # The dashboard and the worker it starts refuse the same paths.
    env.setdefault(config.ROOTS_VAR, os.pathsep.join(str(root) for root in config.allowed_roots(env)))
    # Both children die with this process (lifecycle.py) and are stopped by it in order: the worker
    # first, so that it hands back or finishes its job while the dashboard is still there.
    env.update(lifecycle.parent_env())
    children = []
    worker_env = {k: v for k, v in env.items() if k not in (serve.PASSWORD_VAR, serve.AUTH_VAR)}
    if args.demo:  # before the server, so that its first page already finds the progress file
        children.append(_start_demo_build(worker_env))
    if not (args.no_worker or args.readonly):  # read-only dashboards launch nothing
        children.append(lifecycle.Child("worker", subprocess.Popen(
            # --watch: a checkpoint watch registered on Run detail runs without another process to start.
            [sys.executable, "-m", "tracker.cli", "worker", "--watch"], env=worker_env, **lifecycle.child_popen_kwargs())))
    cmd = [sys.executable, "-m", "tracker.serve", str(app), "--server.port", str(args.port),
           "--server.address", args.address, *serve.STREAMLIT_OPTIONS]
    server = lifecycle.Child("server", subprocess.Popen(cmd, env=env, **lifecycle.child_popen_kwargs()))
    return lifecycle.Supervisor([*children, server], main=server).run()


def _start_demo_build(env: dict):
    """`draftboard demo --resume` in the background, its output in <home>/logs/demo.log; the page shows
    its progress (tracker/jobs/demo_progress.py) and it stops with the dashboard (tracker/lifecycle.py)."""
    import subprocess

    from tracker import lifecycle
    from tracker.jobs import demo_progress

    home, log = config.home_dir(env), config.logs_dir(env) / "demo.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "demo", "--resume"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **lifecycle.child_popen_kwargs())
    if hasattr(os, "setpriority"):  # on busy cores the page answers first; the build takes what is left
        os.setpriority(os.PRIO_PROCESS, proc.pid, 10)
    shown = demo_progress.read_progress(home)
    if shown is not None and shown.state == demo_progress.DONE:  # a built demo reads as built while it is checked
        print(f"demo: the demo store is built, reused (checked in the background; log: {log})")
    else:
        # Written here, not by the build itself, so that it is there before the server's first page.
        demo_progress.ProgressWriter(home, env[config.STORE_VAR], pid=proc.pid, log=str(log)).update()
        print(f"demo: building in the background, progress on the page (log: {log})")
    return lifecycle.Child("demo build", proc)


def _is_loopback(address: str) -> bool:
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


def add_commands(sub) -> None:
    p = sub.add_parser("ui", help="serve the dashboard")
    p.add_argument("--port", type=port_number, default=8501)
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--home", default=None, help="store directory (DRAFTBOARD_HOME)")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--no-worker", action="store_true", help="do not start a local eval worker")
    p.add_argument("--readonly", action="store_true", help="hide launch, cancel, re-evaluate and promote controls")
    p.add_argument("--auth", action="store_true",
                   help="require HTTP basic auth: DRAFTBOARD_UI_USER (default draftboard) / DRAFTBOARD_UI_PASSWORD; "
                        "needed (or --readonly) for a non-loopback --address (docs/SECURITY.md)")
    p.add_argument("--mlflow-ui", help="base URL of a running `mlflow ui` for run links (DRAFTBOARD_MLFLOW_UI_URL)")
    p.add_argument("--jobs-uri", help="job queue database (DRAFTBOARD_JOBS_URI)")
    p.add_argument("--allowed-roots", help="os.pathsep-separated roots Launch may read (DRAFTBOARD_ALLOWED_ROOTS)")
    p.add_argument("--demo", action="store_true",
                   help="build the demo store in the background while serving, its progress on the page "
                        "(./scripts/run.sh); a built one is reused")
    p.set_defaults(func=cmd_ui)

    p = sub.add_parser("demo", help="build the demo store: a tiny hybrid target, real drafter runs and evals")
    p.add_argument("--home", default=None, help="home directory (DRAFTBOARD_HOME; default: ./.draftboard)")
    p.add_argument("--tracking-uri", default=None,
                   help="the local SQLite store to build into (default: the configured store, as `ui` shows)")
    p.add_argument("--quick", action="store_true", help="a smaller demo (about a minute on 2 cores)")
    p.add_argument("--force", action="store_true", help="remove the demo runs and rebuild them")
    p.add_argument("--resume", action="store_true",
                   help="rebuild a build that did not finish (stopped with its dashboard); keep a finished one")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("worker", help="run queued evals")
    p.add_argument("--slots", type=int, default=1, help="evals run at once")
    p.add_argument("--gpus", default=None, metavar="0,1,2,3",
                   help="the box's GPUs, each job given its own (CUDA_VISIBLE_DEVICES) and waiting for them (default: "
                        "DRAFTBOARD_GPUS, else this process's CUDA_VISIBLE_DEVICES; neither: jobs are not pinned)")
    p.add_argument("--gpu-memory", default=None, metavar="80GiB",
                   help="each GPU's memory (GiB, GB, MiB, MB or bytes; default: DRAFTBOARD_GPU_MEMORY): Launch refuses "
                        "a job whose target's weights alone do not fit the GPUs it asks for")
    p.add_argument("--jobs-uri", default=None, help="job queue database (DRAFTBOARD_JOBS_URI)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between queue polls")
    p.add_argument("--stale", type=float, default=60.0, help="fail running jobs silent for this many seconds")
    p.add_argument("--once", action="store_true", help="run what is queued now, then exit")
    p.add_argument("--watch", action="store_true",
                   help="also scan the store's watched checkpoint folders (`draftboard watch`) and queue their evals")
    p.add_argument("--watch-interval", type=float, default=60.0, help="seconds between scans with --watch")
    p.add_argument("--home", default=None, help="store directory (DRAFTBOARD_HOME)")
    p.add_argument("--launcher", choices=["local", "ray"], default="local",
                   help="where evals run: subprocesses here, or Ray jobs on a cluster (docs/RAY.md)")
    p.add_argument("--address", default=None,
                   help="Ray Jobs API of the cluster's head, e.g. http://head:8265 (default: $RAY_ADDRESS, "
                        "else http://127.0.0.1:8265)")
    p.add_argument("--ray-python", default=None, metavar="PYTHON",
                   help="interpreter that runs the eval on the cluster (default: python on the node's PATH; "
                        "'' keeps the worker's own path)")
    p.add_argument("--ray-gpus", type=float, default=1.0, metavar="N", help="GPUs a --device cuda eval requests")
    p.add_argument("--ray-env", action="append", default=[], metavar="NAME",
                   help="also pass this environment variable to Ray jobs (MLFLOW_* and DRAFTBOARD_* always are); "
                        "never a secret: those are set on the Ray nodes (docs/RAY.md)")
    p.add_argument("--ray-runtime-env", default=None, metavar="JSON|FILE",
                   help="a Ray runtime_env for every job, e.g. '{\"pip\": [\"draftboard[gpu]\"]}'")
    p.set_defaults(func=cmd_worker)
