"""`draftboard import-log`, `import-results`, `adopt` and `watch`: runs other tools wrote, brought into the store."""

from __future__ import annotations

import sys
from pathlib import Path

from tracker.cli.common import json_argument
from tracker.errors import DraftboardError
from tracker.untrusted.escape import say


def cmd_import_log(args) -> int:
    from tracker.store.importers.training_log import import_log
    from tracker.store.tracker import Tracker

    run_id = import_log(Tracker(args.tracking_uri), args.file, args.name, target=args.target, fmt=args.format,
                        console=args.console)
    print(f"imported {args.file} as run {run_id}")
    return 0


def cmd_adopt(args) -> int:
    from tracker.environment import fingerprint
    from tracker.store import adoption, names
    from tracker.store.importers import foreign_run
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri)
    args.run_id = tracker.resolve_run_id(args.run_id)
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
    version = args.tool_version or view.tags.get(adoption.TOOL_VERSION_TAG)
    if args.tool_version is not None and adoption.parse_version(args.tool_version) is None:
        raise DraftboardError(f"--tool-version {args.tool_version!r} is not a release number (e.g. 0.9.0)")
    tags = [(names.KIND, "train"), (adoption.TOOL_TAG, found.tool), (adoption.STEP_UNIT_TAG, unit)]
    if args.tool_version is not None:
        tags.append((adoption.TOOL_VERSION_TAG, args.tool_version))
    with foreign_run.adopted(tracker, args.run_id, args.console) as evidence:  # read before anything is written
        for tag, value in tags:
            tracker.client.set_tag(args.run_id, tag, value)
        fp = foreign_run.attach(tracker, args.run_id, found.tool, evidence) if evidence is not None else None
    if evidence is not None and fp is None:
        print(f"run {args.run_id} keeps the fingerprint captured in its own environment; its files were not read into it")
    elif fp is not None:
        env = fingerprint.env_tags(fp)
        print(f"environment from its files: linear attention {env['env.linear_attn']}, torch {env['env.torch']}, "
              f"transformers {env['env.transformers']} (draftboard env-diff {args.run_id} ... cites each source)")
    print(f"adopted run {args.run_id} as a {found.label} training run ({'; '.join(found.evidence)})")
    print(f"step = {unit}" + (f": {known.steps.note}" if known else ""))
    curves = [a.label for a in adoption.aliases(found.tool, view.metrics, version) if a.canonical or a.note]
    if curves:
        print("curves: " + ", ".join(curves))
    if version is None and known is not None and any(key in known.redefined for key in view.metrics):
        print(f"note: {found.label} redefined {', '.join(k for k in known.redefined if k in view.metrics)} between "
              "releases and the run does not say its release, so those curves are drawn apart from every "
              f"versioned run: draftboard adopt {args.run_id} --tool-version V (speculators writes it into "
              "train_command.txt as `# speculators: V`)")
    return 0


def cmd_import_results(args) -> int:
    from tracker.store.importers import (
        ddtree_benchmark,
        foreign_run,
        results,
        served,
        spec_acceptance,
        specforge_eval,
        speculators_acceptance,
        zlab_benchmark,
    )
    from tracker.store.tracker import Tracker

    name = args.name or Path(args.file).stem
    # The file is read whole before the store is opened: a bad file creates nothing.
    if args.format in TRAINING_FORMATS:
        if args.train_run_id:
            raise DraftboardError(f"--train-run-id does not apply to --format {args.format}: its runs are "
                                  "imported as training runs of their own")
        runs = TRAINING_FORMATS[args.format](args.file)
        for run in runs:
            foreign_run.with_console(run, args.console)
        run_ids = foreign_run.log_runs(Tracker(args.tracking_uri), runs, name, args.target)
        for run in runs:
            for note in run.notes:  # a partial read is said, not hidden (also the run's import.partial param)
                say(f"note: {run.label}: {note}", file=sys.stderr)
    elif args.console is not None:
        raise DraftboardError(f"--console goes with a training run's import (--format "
                              f"{', '.join(TRAINING_FORMATS)}), not --format {args.format}")
    else:
        parse = {"zlab-benchmark": zlab_benchmark.parse_benchmark_log, "ddtree": ddtree_benchmark.parse_ddtree_results,
                 "speculators-acceptance": speculators_acceptance.parse_acceptance_csv,
                 specforge_eval.FORMAT: specforge_eval.parse_report, spec_acceptance.FORMAT: spec_acceptance.parse_folder,
                 **served.PARSERS}[args.format]
        evals = keyed_by_step(parse(args.file), args.checkpoint_step, args.train_run_id)
        run_ids = results.log_imported(Tracker(args.tracking_uri), evals, source=args.file, fmt=args.format,
                                       name=name, target=args.target, train_run_id=args.train_run_id)
    print(f"imported {args.file} ({args.format}) as run(s) {', '.join(run_ids)}")
    return 0


def _read_tensorboard(path):
    from tracker.store.importers import tensorboard

    return tensorboard.read_event_folder(path)


def _read_wandb(path):
    from tracker.store.importers import wandb_run

    return wandb_run.read_folder(path)


def _read_swanlab(path):
    from tracker.store.importers import swanlab_run

    return swanlab_run.read_folder(path)


# --format -> the reader of its run folders (training runs, each with the evidence of its own files).
TRAINING_FORMATS = {"tensorboard": _read_tensorboard, "wandb": _read_wandb, "swanlab": _read_swanlab}


def keyed_by_step(evals: list, step: int | None, train_run_id: str | None) -> list:
    """The imported records with the evaluated checkpoint's step: `--checkpoint-step` where the file names
    none (a file naming another step is refused), and required once the evals belong to a training run,
    whose evals are drawn at their steps, never in the order they were logged (W&B drops out-of-order
    steps; an eval imported after training must still land at its checkpoint)."""
    from dataclasses import replace

    if step is not None:
        if step < 0:
            raise DraftboardError(f"--checkpoint-step must be >= 0, got {step}")
        named = {r.checkpoint_step for r in evals if r.checkpoint_step is not None}
        if named - {step}:
            raise DraftboardError(f"the file names checkpoint step {min(named - {step})}, --checkpoint-step says {step}")
        evals = [replace(r, checkpoint_step=step) for r in evals]
    if train_run_id and any(r.checkpoint_step is None for r in evals):
        raise DraftboardError("the file does not name the evaluated checkpoint's step: give it with --checkpoint-step N "
                              "(an eval of a training run is drawn at its checkpoint's step)")
    return evals


def cmd_watch(args) -> int:
    import time

    from tracker.jobs import watch
    from tracker.jobs.queue import JobQueue
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri)
    preset = json_argument("--auto-eval", args.auto_eval) if args.auto_eval else None
    state = watch.start(tracker, args.run_id, args.dir, preset, settle_s=args.settle)
    queue = JobQueue(args.jobs_uri) if state.preset is not None else None
    print(f"watching {state.dir} for run {args.run_id}" + (" (auto-eval)" if queue else ""))
    while True:
        result = watch.scan(tracker, queue, args.run_id)
        for found in result.recorded:
            print(f"checkpoint step {found.step}: {found.path} ({found.layout})")
        if result.queued:
            print(f"queued eval job(s) {', '.join(map(str, result.queued))}")
        if not args.follow:
            print("scanned once; `draftboard worker --watch` (or --follow here) keeps watching")
            return 0
        time.sleep(args.interval)


CONSOLE_HELP = ("the training process's console log, read for the environment it ran in (transformers' fallback "
                "lines, version banners, nvidia-smi, pip freeze) and kept on the run")


def add_commands(sub) -> None:
    from tracker.store.importers import served, training_log

    p = sub.add_parser("import-log", help="import a JSON-lines or key=value training log, or Automodel's console, "
                                          "as a train run")
    p.add_argument("file")
    p.add_argument("--format", choices=training_log.FORMATS, default=None,
                   help="automodel: NVIDIA Automodel's DFlash/DFlash2 console log (default: JSON lines or key=value, "
                        "recognised by the first line)")
    p.add_argument("--name", required=True)
    p.add_argument("--console", default=None, metavar="FILE", help=CONSOLE_HELP)
    p.add_argument("--target", default=None, help="the target model the drafter was trained against")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_import_log)

    p = sub.add_parser("adopt", help="make a run another tool wrote (SpecForge, speculators, HF Trainer, ...) "
                                     "a draftboard training run")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--tool", default=None, help="the tool that wrote it (default: detected from its names)")
    p.add_argument("--console", default=None, metavar="FILE", help=CONSOLE_HELP)
    p.add_argument("--tool-version", default=None, metavar="V",
                   help="the tool's release that wrote it, for metrics it redefined (speculators 0.9.0 counts the "
                        "bonus token in `eal`); also read from the run's draftboard.tool_version tag")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_adopt)

    p = sub.add_parser("watch", help="record the checkpoints a training tool writes into DIR as they appear "
                                     "(z-lab, SpecForge, speculators, TorchSpec layouts), optionally queueing their evals")
    p.add_argument("run_id", metavar="RUN_ID", help="the training run the checkpoints belong to")
    p.add_argument("dir", metavar="DIR", help="the folder the tool saves its checkpoints in")
    p.add_argument("--auto-eval", metavar="PRESET", default=None,
                   help="queue an eval of each new checkpoint with these eval params: a JSON file or object "
                        "(target, prompts, budgets, device, ...; stored on the run)")
    p.add_argument("--settle", type=float, default=30.0,
                   help="seconds a checkpoint's files must be unchanged before it is recorded")
    p.add_argument("--follow", action="store_true", help="keep scanning (every --interval seconds) until Ctrl-C")
    p.add_argument("--interval", type=float, default=60.0)
    p.add_argument("--jobs-uri", default=None, help="job queue database (DRAFTBOARD_JOBS_URI)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("import-results", help="import eval results or TensorBoard curves another tool wrote")
    p.add_argument("file", help="the results file, or the folder (TensorBoard logs, spec_acceptance.py output)")
    p.add_argument("--format", required=True,
                   choices=["zlab-benchmark", "speculators-acceptance", "speculators-spec-acceptance", "ddtree",
                            "specforge-eval", *TRAINING_FORMATS, *served.FORMATS],
                   help="vllm-log / sglang-log / llamacpp-log / prometheus: served numbers from production (a "
                        "server log, a /metrics scrape), imported with the window they cover; aiperf: AIPerf's "
                        "per-request records (profile_export.jsonl); specforge-eval: a `specforge "
                        "evaluate-checkpoint` report (teacher-forced diagnostics, not tau); tensorboard / wandb / "
                        "swanlab: training runs (an event folder, a W&B run or wandb/ folder, a SwanLab "
                        "swanlog/run-* folder), their environment read from their own files")
    p.add_argument("--console", default=None, metavar="FILE", help=CONSOLE_HELP)
    p.add_argument("--train-run-id", default=None, help="the training run the evaluated drafter came from")
    p.add_argument("--checkpoint-step", type=int, default=None, metavar="N",
                   help="the evaluated checkpoint's training step, where the file does not name it (needed with "
                        "--train-run-id: its evals are drawn at their steps, not in the order they were logged)")
    p.add_argument("--name", default=None, help="run name (default: the file's name)")
    p.add_argument("--target", default=None, help="the target model (default: what the file or training run says)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_import_results)
