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
from tracker.jobs import eval_job  # the one declaration of the eval's flags (light: config and errors only)

EXIT_BAD_INPUT = 2
EXIT_CRITICAL_DIFF = 1


def _add_env_flags(p: argparse.ArgumentParser) -> None:
    eval_job.add_eval_arguments(p, eval_job.ENV_FIELDS)  # declared once, with the eval's other flags


def cmd_fingerprint(args) -> int:
    from tracker import fingerprint, linear_attn

    target = None
    device = args.device or fingerprint.default_device()
    if args.target:
        from evaluators.target import load_target

        target = load_target(args.target, device, args.dtype, args.linear_attn).model  # applies the mode
    else:  # what a hybrid target loaded here with this mode would run
        linear_attn.apply(args.linear_attn, device, linear_attn.DEFAULT_MODULE)
    fp = fingerprint.capture(target, device, args.dtype)
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
            data = json.loads(path.read_bytes())
        except json.JSONDecodeError as exc:
            raise DraftboardError(f"{ref}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        except UnicodeDecodeError as exc:
            raise DraftboardError(f"{ref}: not a JSON text file ({exc.reason} at byte {exc.start})") from exc
        except OSError as exc:
            raise DraftboardError(f"{ref}: cannot read: {exc.strerror}") from exc
        # A results JSON of `draftboard eval` carries its fingerprint inside.
        return data.get("fingerprint", data) if isinstance(data, dict) else data
    if os.sep in ref or ref.endswith(".json"):
        raise DraftboardError(f"{ref}: no such file")
    from tracker.store.tracker import Tracker

    return Tracker(tracking_uri).fingerprint(ref)


def cmd_env_diff(args) -> int:
    from tracker import fingerprint

    a, b = (_load_fingerprint(ref, args.tracking_uri) for ref in (args.a, args.b))
    for ref, fp in ((args.a, a), (args.b, b)):
        fingerprint.check(fp, ref)
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


def cmd_adopt(args) -> int:
    from tracker.store import adoption, names
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri)
    run = tracker.run(args.run_id)
    kind = run.data.tags.get(names.KIND)
    if kind in ("eval", "reference"):
        raise DraftboardError(f"run {args.run_id} is a draftboard {kind} run; only training runs are adopted")
    view = adoption.RunView.of(run, tracker.client.get_experiment(run.info.experiment_id).name)
    found = adoption.detect(view) if args.tool is None else adoption.Detection(args.tool, ("--tool",))
    if found.tool is None:
        raise DraftboardError(f"cannot tell which tool wrote run {args.run_id}; name it: draftboard adopt "
                              f"{args.run_id} --tool NAME (known: {', '.join(adoption.TOOLS)}; any other name works)")
    known = adoption.TOOLS.get(found.tool)
    unit = known.steps.unit if known else "unknown"
    for tag, value in ((names.KIND, "train"), (adoption.TOOL_TAG, found.tool), (adoption.STEP_UNIT_TAG, unit)):
        tracker.client.set_tag(args.run_id, tag, value)
    print(f"adopted run {args.run_id} as a {found.label} training run ({'; '.join(found.evidence)})")
    print(f"step = {unit}" + (f": {known.steps.note}" if known else ""))
    curves = [a.label for a in adoption.aliases(found.tool, view.metrics) if a.canonical or a.note]
    if curves:
        print("curves: " + ", ".join(curves))
    return 0


def cmd_import_results(args) -> int:
    from tracker.store.importers import ddtree_benchmark, results, speculators_acceptance, tensorboard, zlab_benchmark
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri)
    name = args.name or Path(args.file).stem
    if args.format == "tensorboard":
        if args.train_run_id:
            raise DraftboardError("--train-run-id does not apply to --format tensorboard: event folders are "
                                  "imported as training runs of their own")
        run_ids = tensorboard.log_event_runs(tracker, tensorboard.read_event_folder(args.file), name, args.target)
    else:
        parse = {"zlab-benchmark": zlab_benchmark.parse_benchmark_log, "ddtree": ddtree_benchmark.parse_ddtree_results,
                 "speculators-acceptance": speculators_acceptance.parse_acceptance_csv}[args.format]
        run_ids = results.log_imported(tracker, parse(args.file), source=args.file, fmt=args.format, name=name,
                                       target=args.target, train_run_id=args.train_run_id)
    print(f"imported {args.file} ({args.format}) as run(s) {', '.join(run_ids)}")
    return 0


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
    from evaluators.harness import EvalSettings, evaluate
    from evaluators.logging import check_out_path, log_eval, write_results
    from tracker.events import emit

    if args.out:  # before the eval runs: a bad --out must not cost an eval or leave a logged run
        check_out_path(args.out)
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
    if args.out:
        write_results(args.out, results)
    run_id = None
    if not args.no_log:
        from tracker.store.tracker import Tracker

        run_id = log_eval(Tracker(args.tracking_uri), results, settings, train_run_id=args.train_run_id,
                          checkpoint_step=args.checkpoint_step, reference=args.reference, name=args.name)
    print(f"tau {results['tau']:.3f}  streak {results['streak']:.3f}  tau_all_anchors "
          f"{results['tau_all_anchors']:.3f}  " + "  ".join(f"ddtree_tau_b{b} {d['tau']:.3f}"
                                                      for b, d in results["ddtree"].items()))
    print(f"linear attention: {results['fingerprint']['numerics']['linear_attention_path']}  "
          f"timing: target {results['timing']['target_s']:.1f}s, drafter {results['timing']['drafter_s']:.1f}s"
          + (f"  run: {run_id}" if run_id else ""))
    emit("result", run_id=run_id, out=args.out)
    return 0


def _eval_results(tracker, run_id: str) -> dict:
    """A run's eval_results.json, checked to hold per-prompt acceptance lengths."""
    import tempfile

    from tracker.store import names

    tracker.run(run_id)
    with tempfile.TemporaryDirectory(prefix="draftboard-") as tmp:
        try:
            local = tracker.client.download_artifacts(run_id, names.EVAL_RESULTS_ARTIFACT, tmp)
            results = json.loads(Path(local).read_bytes())
        except Exception as exc:  # missing artifact, unreadable store, not JSON
            raise DraftboardError(f"run {run_id} has no readable {names.EVAL_RESULTS_ARTIFACT} "
                                  f"(not an eval run?): {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    records = results.get("prompts") if isinstance(results, dict) else None
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and "id" in r and isinstance(r.get("acceptance_lengths"), list) for r in records):
        raise DraftboardError(f"run {run_id}: {names.EVAL_RESULTS_ARTIFACT} has no per-prompt acceptance lengths "
                              "('prompts': [{id, acceptance_lengths}])")
    return results


def cmd_compare(args) -> int:
    from evaluators.uncertainty import NO_DIFFERENCE, WORSE, paired_comparison, tau_intervals
    from tracker import protocol
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri)
    results = [_eval_results(tracker, run_id) for run_id in (args.run_a, args.run_b)]
    by_id = [{str(r["id"]): r for r in res["prompts"]} for res in results]
    changed = [pid for pid in by_id[0] if pid in by_id[1] and "input_ids" in by_id[0][pid]
               and "input_ids" in by_id[1][pid] and by_id[0][pid]["input_ids"] != by_id[1][pid]["input_ids"]]
    if changed:
        raise DraftboardError(f"prompt {changed[0]!r} has different token ids in the two evals "
                              f"({len(changed)} prompt(s) differ): not the same prompt set")
    critical = [r for r in protocol.diff(*(protocol.Protocol.from_results(res) for res in results))
                if r.severity == "critical"]
    if critical:
        raise DraftboardError("the evals' protocols differ critically (" + "; ".join(
            f"{r.field}: {r.a_value} vs {r.b_value}" for r in critical) + "): their taus are not comparable")
    lengths = [{pid: r["acceptance_lengths"] for pid, r in ids.items()} for ids in by_id]
    paired = paired_comparison(*lengths)
    for label, run_id, per_prompt in (("A", args.run_a, lengths[0]), ("B", args.run_b, lengths[1])):
        own = tau_intervals(list(per_prompt.values())).tau
        print(f"{label} {run_id}: tau {own.value:.3f}  95% CI [{own.low:.3f}, {own.high:.3f}]")
    d = paired.delta
    print(f"delta tau (B - A) {d.value:+.3f}  95% CI [{d.low:+.3f}, {d.high:+.3f}]  "
          f"paired bootstrap over {paired.n_prompts} prompts")
    print(f"verdict: {paired.verdict}" if paired.verdict == NO_DIFFERENCE else f"verdict: B is {paired.verdict}")
    return EXIT_CRITICAL_DIFF if args.fail_if_worse and paired.verdict == WORSE else 0


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
        python = "python" if args.ray_python is None else (args.ray_python or None)  # "": the worker's own
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

    from tracker import lifecycle, serve

    app = Path(__file__).resolve().parent.parent / "app.py"
    if not app.is_file():
        raise DraftboardError(f"{app} not found: run `draftboard ui` from a source checkout")
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
    # The dashboard process reads its settings from the environment (tracker/dashboard/ui.py).
    for flag, var in (("readonly", config.READONLY_VAR), ("mlflow_ui", config.MLFLOW_UI_VAR),
                      ("jobs_uri", config.JOBS_VAR), ("allowed_roots", config.ROOTS_VAR)):
        value = getattr(args, flag)
        if value:
            env[var] = "1" if value is True else value
    print(f"store: {env[config.STORE_VAR]}")
    print(f"raw runs: mlflow ui --backend-store-uri {env[config.STORE_VAR]}")
    print(f"dashboard: http://{args.address}:{args.port}" + (" (basic auth)" if args.auth else ""))
    # The dashboard and the worker it starts refuse the same paths.
    env.setdefault(config.ROOTS_VAR, os.pathsep.join(str(root) for root in config.allowed_roots(env)))
    # Both children die with this process (lifecycle.py) and are stopped by it in order: the worker
    # first, so that it hands back or finishes its job while the dashboard is still there.
    env.update(lifecycle.parent_env())
    children = []
    if not (args.no_worker or args.readonly):  # read-only dashboards launch nothing
        worker_env = {k: v for k, v in env.items() if k not in (serve.PASSWORD_VAR, serve.AUTH_VAR)}
        children.append(lifecycle.Child("worker", subprocess.Popen(
            [sys.executable, "-m", "tracker.cli", "worker"], env=worker_env, **lifecycle.child_popen_kwargs())))
    cmd = [sys.executable, "-m", "tracker.serve", str(app), "--server.port", str(args.port),
           "--server.address", args.address, "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
           "--client.toolbarMode", "minimal"]
    server = lifecycle.Child("server", subprocess.Popen(cmd, env=env, **lifecycle.child_popen_kwargs()))
    return lifecycle.Supervisor([*children, server], main=server).run()


def _is_loopback(address: str) -> bool:
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


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

    p = sub.add_parser("compare", help="paired bootstrap of two evals on the same prompts: delta tau, interval, verdict")
    p.add_argument("run_a", metavar="RUN_A", help="the baseline eval's MLflow run id")
    p.add_argument("run_b", metavar="RUN_B", help="the eval compared with it")
    p.add_argument("--fail-if-worse", action="store_true", help="exit 1 when B is significantly worse than A")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("import-log", help="import a JSON-lines or key=value training log as a train run")
    p.add_argument("file")
    p.add_argument("--name", required=True)
    p.add_argument("--target", default=None, help="the target model the drafter was trained against")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_import_log)

    p = sub.add_parser("adopt", help="make a run another tool wrote (SpecForge, speculators, HF Trainer, ...) "
                                     "a draftboard training run")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--tool", default=None, help="the tool that wrote it (default: detected from its names)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_adopt)

    p = sub.add_parser("import-results", help="import eval results or TensorBoard curves another tool wrote")
    p.add_argument("file", help="the results file, or the TensorBoard log folder")
    p.add_argument("--format", required=True, choices=["zlab-benchmark", "speculators-acceptance", "ddtree",
                                                       "tensorboard"])
    p.add_argument("--train-run-id", default=None, help="the training run the evaluated drafter came from")
    p.add_argument("--name", default=None, help="run name (default: the file's name)")
    p.add_argument("--target", default=None, help="the target model (default: what the file or training run says)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_import_results)

    p = sub.add_parser("eval", help="evaluate a drafter checkpoint against a target (teacher-forced, T=0)")
    eval_job.add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("ui", help="serve the dashboard")
    p.add_argument("--port", type=int, default=8501)
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
                   help="also pass this environment variable to Ray jobs (MLFLOW_* and DRAFTBOARD_* always are); "
                        "never a secret: those are set on the Ray nodes (docs/RAY.md)")
    p.add_argument("--ray-runtime-env", default=None, metavar="JSON|FILE",
                   help="a Ray runtime_env for every job, e.g. '{\"pip\": [\"draftboard[gpu]\"]}'")
    p.set_defaults(func=cmd_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tracker.lifecycle import watch_parent_from_env

    watch_parent_from_env()  # a child of `draftboard ui` or of a worker stops when orphaned
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
