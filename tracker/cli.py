"""`draftboard` command line. Each subcommand parses, calls a library function, prints.

Every user-facing failure is a DraftboardError; `main` turns it into one `error: ...` line on
stderr and exit status 2. Heavy imports (torch, transformers, mlflow) happen inside commands so
that `draftboard --help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tracker import config
from tracker.errors import DraftboardError

EXIT_BAD_INPUT = 2
EXIT_CRITICAL_DIFF = 1


def _add_env_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=config.DEVICES, default=None, help="default: cuda if available")
    p.add_argument("--dtype", choices=config.EVAL_DTYPES, default="fp32")
    p.add_argument("--linear-attn", choices=config.LINEAR_ATTN_MODES, default="auto",
                   help="which implementation runs the Gated DeltaNet layers (see docs/DESIGN.md)")


def cmd_fingerprint(args) -> int:
    from tracker import fingerprint

    target = None
    device = args.device or fingerprint.default_device()
    if args.target:
        from evaluators.target import load_target

        target = load_target(args.target, device, args.dtype, args.linear_attn).model
    fp = fingerprint.capture(target, device, args.dtype, args.linear_attn)
    text = json.dumps(fp, indent=2, default=str)
    if args.out:
        Path(args.out).write_text(text + "\n")
        num = fp["numerics"]
        print(f"wrote {args.out}: linear_attention_path={num['linear_attention_path']} "
              f"({num['linear_attention']['reason']}), env.hash={fingerprint.env_hash(fp)}")
    else:
        print(text)
    return 0


def _load_fingerprint(ref: str, tracking_uri: str | None) -> dict:
    """A fingerprint JSON file, or the fingerprint.json of an MLflow run id."""
    path = Path(ref)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DraftboardError(f"{ref}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        # A results JSON of `draftboard eval` carries its fingerprint inside.
        return data.get("fingerprint", data) if isinstance(data, dict) else data
    if os.sep in ref or ref.endswith(".json"):
        raise DraftboardError(f"{ref}: no such file")
    from tracker.store.tracker import Tracker

    return Tracker(tracking_uri).fingerprint(ref)


def cmd_env_diff(args) -> int:
    from tracker import fingerprint

    a, b = (_load_fingerprint(ref, args.tracking_uri) for ref in (args.a, args.b))
    if not all(isinstance(fp, dict) and "software" in fp for fp in (a, b)):
        raise DraftboardError("both arguments must be fingerprints (with a 'software' section)")
    rows = fingerprint.diff(a, b)
    if not rows:
        print(f"no differences (env.hash {fingerprint.env_hash(a)})")
        return 0
    print(format_table(["field", "A", "B", "severity"], [(r.field, r.a_value, r.b_value, r.severity) for r in rows]))
    counts = {s: sum(r.severity == s for r in rows) for s in ("critical", "warning", "info")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return EXIT_CRITICAL_DIFF if fingerprint.has_critical(rows) else 0


def format_table(header: list[str], rows: list[tuple], width: int = 60) -> str:
    def cell(value) -> str:
        text = "unknown" if value is None else str(value)
        return text if len(text) <= width else text[: width - 1] + "…"

    table = [list(map(cell, header))] + [list(map(cell, r)) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_import_log(args) -> int:
    from tracker.store.importers.training_log import import_log
    from tracker.store.tracker import Tracker

    run_id = import_log(Tracker(args.tracking_uri), args.file, args.name, target=args.target)
    print(f"imported {args.file} as run {run_id}")
    return 0


def _budgets(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"budgets must be comma-separated integers, got {text!r}") from None


class _StageProgress:
    """tqdm bars for people, `@@draftboard` event lines for the job queue."""

    def __init__(self):
        self.bar, self.stage = None, None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        from tracker.events import emit

        if stage != self.stage:
            self.close()
            self.stage, self.bar = stage, tqdm(total=total, desc=stage, unit="item", file=sys.stderr)
        self.bar.n = done
        self.bar.refresh()
        emit("progress", stage=stage, done=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_eval(args) -> int:
    from evaluators.harness import EvalSettings, evaluate, log_eval
    from tracker.events import emit

    settings = EvalSettings(
        target=args.target, drafter=args.drafter, prompts=args.prompts, completions=args.completions,
        max_new_tokens=args.max_new_tokens, budgets=args.budgets, device=args.device, dtype=args.dtype,
        linear_attn=args.linear_attn, enable_thinking=args.enable_thinking, cache_dir=args.cache_dir,
    )
    if args.checkpoint_step is not None and not args.train_run_id:
        raise DraftboardError("--checkpoint-step needs --train-run-id (the run the checkpoint belongs to)")
    progress = _StageProgress()
    try:
        results = evaluate(settings, progress)
    finally:
        progress.close()
    run_id = None
    if not args.no_log:
        from tracker.store.tracker import Tracker

        run_id = log_eval(Tracker(args.tracking_uri), results, settings, train_run_id=args.train_run_id,
                          checkpoint_step=args.checkpoint_step, reference=args.reference, name=args.name)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"tau {results['tau']:.3f}  streak {results['streak']:.3f}  tau_all_anchors "
          f"{results['tau_all_anchors']:.3f}  " + "  ".join(f"ddtree_tau_b{b} {d['tau']:.3f}"
                                                      for b, d in results["ddtree"].items()))
    print(f"linear attention: {results['fingerprint']['numerics']['linear_attention_path']}  "
          f"timing: target {results['timing']['target_s']:.1f}s, drafter {results['timing']['drafter_s']:.1f}s"
          + (f"  run: {run_id}" if run_id else ""))
    emit("result", run_id=run_id, out=args.out)
    return 0


def cmd_demo(args) -> int:
    from demo.build import build_demo

    manifest = build_demo(config.home_dir(), quick=args.quick, force=args.force)
    print(f"raw runs: mlflow ui --backend-store-uri sqlite:///{Path(manifest['home']) / 'draftboard.db'}")
    return 0


def cmd_worker(args) -> int:
    import logging

    from tracker.jobs.launchers import make_launcher
    from tracker.jobs.worker import run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ray_options = {}
    if args.launcher == "ray":
        runtime_env = None
        if args.ray_runtime_env:
            text = args.ray_runtime_env
            if not text.lstrip().startswith("{"):
                try:
                    text = Path(text).read_text()
                except OSError as exc:
                    raise DraftboardError(f"--ray-runtime-env: cannot read {text}: {exc}") from exc
            try:
                runtime_env = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DraftboardError(f"--ray-runtime-env is not JSON: {exc}") from exc
        python = "python" if args.ray_python is None else (args.ray_python or None)  # "": keep argv[0]
        ray_options = dict(python=python, gpus_per_job=args.ray_gpus, env=args.ray_env,
                           runtime_env=runtime_env, poll_s=args.poll)
    elif args.address or args.ray_python is not None or args.ray_env or args.ray_runtime_env:
        raise DraftboardError("--address and --ray-* options need --launcher ray")
    launcher = make_launcher(args.launcher, args.address, **ray_options)
    claimed = run_worker(args.jobs_uri, slots=args.slots, poll_s=args.poll, stale_s=args.stale, once=args.once,
                         launcher=launcher)
    print(f"worker stopped after {claimed} job(s)")
    return 0


def cmd_ui(args) -> int:
    import subprocess

    from tracker.store.tracker import Tracker

    app = Path(__file__).resolve().parent.parent / "app.py"
    if not app.is_file():
        raise DraftboardError(f"{app} not found: run `draftboard ui` from a source checkout")
    tracker = Tracker(args.tracking_uri)
    env = dict(os.environ, MLFLOW_TRACKING_URI=tracker.uri)
    # The dashboard process reads its settings from the environment (tracker/dashboard/ui.py).
    for flag, var in (("readonly", config.READONLY_VAR), ("mlflow_ui", config.MLFLOW_UI_VAR),
                      ("jobs_uri", config.JOBS_VAR), ("allowed_roots", config.ROOTS_VAR)):
        value = getattr(args, flag)
        if value:
            env[var] = "1" if value is True else value
    print(f"store: {tracker.uri}")
    print(f"raw runs: mlflow ui --backend-store-uri {tracker.uri}")
    print(f"dashboard: http://{args.address}:{args.port}")
    # The dashboard and the worker it starts refuse the same paths.
    env.setdefault(config.ROOTS_VAR, os.pathsep.join(str(root) for root in config.allowed_roots(env)))
    # The embedded default works with one command: a local worker runs the queued evals.
    worker = None
    if not (args.no_worker or args.readonly):  # read-only dashboards launch nothing
        worker = subprocess.Popen([sys.executable, "-m", "tracker.cli", "worker"], env=env)
    cmd = [sys.executable, "-m", "tracker.serve", str(app), "--server.port", str(args.port),
           "--server.address", args.address, "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
           "--client.toolbarMode", "minimal"]
    try:
        return subprocess.call(cmd, env=env)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftboard", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fingerprint", help="print this environment's fingerprint")
    p.add_argument("--target", help="a target model directory: adds its kernel path and a numerical probe")
    _add_env_flags(p)
    p.add_argument("--out", help="write the JSON here instead of printing it")
    p.set_defaults(func=cmd_fingerprint)

    p = sub.add_parser("env-diff", help="compare two fingerprints; exit 1 on a critical difference")
    p.add_argument("a", help="fingerprint JSON file or MLflow run id")
    p.add_argument("b", help="fingerprint JSON file or MLflow run id")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_env_diff)

    p = sub.add_parser("import-log", help="import a JSON-lines or key=value training log as a train run")
    p.add_argument("file")
    p.add_argument("--name", required=True)
    p.add_argument("--target", default=None, help="the target model the drafter was trained against")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_import_log)

    p = sub.add_parser("eval", help="evaluate a drafter checkpoint against a target (teacher-forced, T=0)")
    p.add_argument("--target", required=True, help="target model directory (transformers format)")
    p.add_argument("--drafter", required=True, help="z-lab drafter directory, or a .safetensors/.pt checkpoint")
    p.add_argument("--prompts", required=True, help="JSON lines: {id, input_ids | prompt | messages}")
    p.add_argument("--completions", help="reuse fixed continuations: JSON lines or a previous results JSON")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--budgets", type=_budgets, default=(4, 8, 16, 32), help="DDTree node budgets, e.g. 4,8,16,32")
    _add_env_flags(p)
    p.add_argument("--out", help="write the results JSON here")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--train-run-id", help="the training run this checkpoint belongs to")
    p.add_argument("--checkpoint-step", type=int, help="the training step of this checkpoint")
    p.add_argument("--reference", metavar="NAME", help="log as a reference run with this name (e.g. z-lab's drafter)")
    p.add_argument("--name", help="run name (default: derived from the drafter path)")
    p.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    p.add_argument("--cache-dir", help="target continuation/feature cache (default: $DRAFTBOARD_HOME/cache)")
    p.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=None,
                   help="passed to the chat template where it supports it")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("ui", help="serve the dashboard")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--home", default=None, help="store directory (DRAFTBOARD_HOME)")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--no-worker", action="store_true", help="do not start a local eval worker")
    p.add_argument("--readonly", action="store_true", help="hide launch, cancel, re-evaluate and promote controls")
    p.add_argument("--mlflow-ui", help="base URL of a running `mlflow ui` for run links (DRAFTBOARD_MLFLOW_UI_URL)")
    p.add_argument("--jobs-uri", help="job queue database (DRAFTBOARD_JOBS_URI)")
    p.add_argument("--allowed-roots", help="os.pathsep-separated roots Launch may read (DRAFTBOARD_ALLOWED_ROOTS)")
    p.set_defaults(func=cmd_ui)

    p = sub.add_parser("demo", help="build the demo store: a tiny hybrid target, real drafter runs and evals")
    p.add_argument("--home", default=None, help="home directory (DRAFTBOARD_HOME; default: ./.draftboard)")
    p.add_argument("--quick", action="store_true", help="a smaller demo (about a minute on 2 cores)")
    p.add_argument("--force", action="store_true", help="remove the demo runs and rebuild them")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("worker", help="run queued evals")
    p.add_argument("--slots", type=int, default=1, help="evals run at once")
    p.add_argument("--jobs-uri", default=None, help="job queue database (DRAFTBOARD_JOBS_URI)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between queue polls")
    p.add_argument("--stale", type=float, default=60.0, help="fail running jobs silent for this many seconds")
    p.add_argument("--once", action="store_true", help="run what is queued now, then exit")
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
                   help="also pass this environment variable to Ray jobs (MLFLOW_* and DRAFTBOARD_* always are)")
    p.add_argument("--ray-runtime-env", default=None, metavar="JSON|FILE",
                   help="a Ray runtime_env for every job, e.g. '{\"pip\": [\"draftboard[gpu]\"]}'")
    p.set_defaults(func=cmd_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "home", None):
        os.environ[config.HOME_VAR] = str(Path(args.home).resolve())
    try:
        return args.func(args)
    except DraftboardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
