"""`draftboard doctor`: the checks that catch the bugs DFlash teams lose days to."""

from __future__ import annotations

import json
from pathlib import Path

from tracker.cli.common import EXIT_CRITICAL_DIFF, StageProgress
from tracker.errors import DraftboardError
from tracker.jobs import eval_job  # the one declaration of the eval's flags (light: config and errors only)


def cmd_doctor(args) -> int:
    from evaluators.doctor import DoctorSettings, run_doctor
    from tracker.store import names

    tracker = trained = None
    if args.run:
        from tracker.store.tracker import Tracker

        tracker = Tracker(args.tracking_uri, create=False)
        trained = tracker.fingerprint(args.run)  # before anything loads: a wrong id is one error line
    prompts, prompts_from = args.prompts, None
    if prompts is None:
        found = domain_prompts(args.tracking_uri, args.drafter, args.run)
        if found is not None:
            prompts, prompts_from = found
    settings = DoctorSettings(target=args.target, drafter=args.drafter, prompts=prompts, prompts_from=prompts_from,
                              n_prompts=args.n_prompts,
                              max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
                              drafter_precision=args.drafter_precision,
                              linear_attn=args.linear_attn, enable_thinking=args.enable_thinking,
                              serving_config=args.serving_config, trained_fingerprint=trained,
                              trained_name=f"run {args.run}" if args.run else "the training run")
    progress = StageProgress()
    try:
        report = run_doctor(settings, progress)
    finally:
        progress.close()
    if tracker is not None:
        worst = report.ordered()[0].severity
        tracker.write_json(args.run, names.DOCTOR_ARTIFACT, {**report.to_dict(), "target": args.target,
                                                             "drafter": args.drafter})
        tracker.client.set_tag(args.run, names.DOCTOR, worst)
    if args.json:
        print(json.dumps(report.to_dict()))
    else:  # whole sentences: the evidence and the fix are the point, a table would cut them
        for c in report.ordered():
            print(f"{c.severity.upper():8} {c.name}: {c.verdict}")
            for label, text in (("evidence", c.evidence), ("fix", c.fix)):
                if text:
                    print(f"{'':9}{label}: {text}")
        print("critical: a check failed" if report.critical else "no critical finding")
    return EXIT_CRITICAL_DIFF if report.critical else 0


def domain_prompts(tracking_uri: str | None, drafter: str, run_id: str | None) -> tuple[str, str] | None:
    """Prompts from the drafter's own domain for the layer-mapping check, when none were given: those of
    the newest eval of this checkpoint in the store, else of the newest eval of the training run
    `--run`; a local prompts file only (never fetched), read like any `--prompts`. None when the store
    has neither, does not exist (a doctor creates no store) or can't be read, and for a store server
    unless this command names it (`--tracking-uri`, `--run`). -> (prompts path, where it came from)."""
    from tracker import config
    from tracker.store import names
    from tracker.store.tracker import Tracker

    uri = config.store_uri(tracking_uri)
    if config.missing_local_store(uri) is not None:
        return None
    if config.sqlite_path(uri) is None and not (tracking_uri or run_id):
        return None  # a server nobody named for this command: not waited on (a down one retries for minutes)
    try:
        tracker = Tracker(uri)
        evals = tracker.find_runs(kind="eval") if tracker.find_experiment() is not None else []
    except DraftboardError:  # a store that can't be read: the doctor still runs, on its default prompts
        return None
    checkpoint = str(Path(drafter).resolve())

    def of_checkpoint(run) -> bool:
        tagged = run.data.tags.get(names.CHECKPOINT) or run.data.params.get("drafter")
        return bool(tagged) and str(Path(tagged).resolve()) == checkpoint

    for why, chosen in (("of this checkpoint", [r for r in evals if of_checkpoint(r)]),
                        (f"of training run {run_id}", [r for r in evals if run_id and
                                                       r.data.tags.get(names.TRAIN_RUN_ID) == run_id])):
        for run in chosen:  # newest first
            path = run.data.params.get("prompts")
            if path and ":" not in path.split("/")[0] and Path(path).is_file():
                return path, f"the prompts of eval {run.info.run_name} ({run.info.run_id}), {why}: {path}"
    return None


def add_commands(sub) -> None:
    p = sub.add_parser("doctor", help="the checks that catch the bugs DFlash teams lose days to: layer mapping, "
                                      "architecture, tokens, serving config, environment; exit 1 on a critical one")
    eval_job.add_eval_arguments(p, ["target", "drafter", "device", "dtype", "drafter_precision", "linear_attn",
                                    "enable_thinking"])
    p.add_argument("--prompts", default=None, help="prompts for the layer-mapping check, as `eval --prompts` (default: "
                                                   "the drafter's own domain: the prompts of the store's newest eval of "
                                                   "this checkpoint, or of --run's; else a few plain-text prompts)")
    p.add_argument("--n-prompts", type=int, default=8, help="how many of them the layer-mapping check scores")
    p.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens per prompt for that check")
    p.add_argument("--run", metavar="RUN_ID", default=None,
                   help="the training run: this machine against its fingerprint; the report is attached to it")
    p.add_argument("--serving-config", metavar="JSON", default=None,
                   help="vLLM's --speculative-config JSON (or a file with it under speculative_config) or SGLang's "
                        "launch arguments, optionally with mamba_ssm_dtype and chat_template_kwargs")
    p.add_argument("--json", action="store_true", help='print {"checks": [{name, severity, verdict, evidence, fix}]}')
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_doctor)
