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

from tracker import config, redact
from tracker.escape import say
from tracker.errors import DraftboardError
from tracker.jobs import eval_job  # the one declaration of the eval's flags (light: config and errors only)

EXIT_BAD_INPUT = 2
EXIT_CRITICAL_DIFF = 1
ENV_DIFF_MAX = 4  # fingerprints one env-diff compares (training, offline eval, serving and one more)


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
    fp = fingerprint.capture(target, device, args.dtype, drafter_precision=args.drafter_precision)
    if args.attach:
        from tracker.store.tracker import Tracker

        Tracker(args.tracking_uri).attach_fingerprint(args.attach, fp)
        print(f"attached the fingerprint (env.hash {fingerprint.env_hash(fp)}, linear attention "
              f"{fp['numerics']['linear_attention_path']}) to run {args.attach}")
    text = json.dumps(fp, indent=2, default=str)
    if args.attach and not args.out:
        return 0
    if args.out:
        Path(args.out).write_text(text + "\n")
        num = fp["numerics"]
        print(f"wrote {args.out}: linear_attention_path={num['linear_attention_path']} "
              f"({num['linear_attention']['reason']}), env.hash={fingerprint.env_hash(fp)}")
    else:
        print(text)
    return 0


def _load_measured(ref: str, tracking_uri: str | None):
    """(fingerprint, protocol) of a fingerprint JSON file, a results JSON or an MLflow run id.

    The protocol is None where there is no eval to have one (a fingerprint file, a training
    run); an eval run from before protocols existed reads `unknown` in every field."""
    from tracker.protocol import Protocol

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
        # A results JSON of `draftboard eval` carries its fingerprint and protocol inside.
        if isinstance(data, dict) and "fingerprint" in data:
            return data["fingerprint"], Protocol.from_results(data)
        return data, None
    if os.sep in ref or ref.endswith(".json"):
        raise DraftboardError(f"{ref}: no such file")
    from tracker.store import names
    from tracker.store.tracker import Tracker

    tracker = Tracker(tracking_uri)
    tags = tracker.run(ref).data.tags
    is_eval = tags.get(names.KIND) in ("eval", "reference")
    return tracker.fingerprint(ref), Protocol.from_tags(tags) if is_eval else None


def _print_diff(title: str, rows, same: str) -> None:
    print(f"{title}:")
    if not rows:
        print(f"  {same}")
        return
    print(format_table(["field", "A", "B", "severity"], [(r.field, r.a_value, r.b_value, r.severity) for r in rows]))
    counts = {s: sum(r.severity == s for r in rows) for s in ("critical", "warning", "info")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()))


def cmd_env_diff(args) -> int:
    """Environment and protocol of each ref against the one before it (training, offline eval,
    serving: the order a number travels), and for hybrid targets every side's Gated DeltaNet code per
    piece in one table; exit 1 on a critical row anywhere."""
    from tracker import fingerprint, linear_attn, protocol

    refs = [args.a, args.b, *args.more]
    if len(refs) > ENV_DIFF_MAX:
        raise DraftboardError(f"env-diff compares at most {ENV_DIFF_MAX} fingerprints, got {len(refs)}")
    measured = [_load_measured(ref, args.tracking_uri) for ref in refs]
    for ref, (fp, _) in zip(refs, measured):
        fingerprint.check(fp, ref)
    critical = False
    for i in range(1, len(refs)):
        (fa, pa), (fb, pb) = measured[i - 1], measured[i]
        where = "" if len(refs) == 2 else f" ({refs[i - 1]} -> {refs[i]})"
        env_rows = fingerprint.diff(fa, fb)
        _print_diff(f"environment{where}", env_rows, f"no differences (env.hash {fingerprint.env_hash(fa)})")
        proto_rows = []
        if pa is None or pb is None:
            which = " and ".join(ref for ref, p in ((refs[i - 1], pa), (refs[i], pb)) if p is None)
            print(f"protocol{where}:\n  not compared: {which} is not an eval (no protocol)")
        else:
            proto_rows = protocol.diff(pa, pb)
            _print_diff(f"protocol{where}", proto_rows, "no differences")
        critical = critical or fingerprint.has_critical(env_rows) or fingerprint.has_critical(proto_rows)
    pieces = linear_attn.side_by_side([fp for fp, _ in measured])
    if pieces:
        print("Gated DeltaNet, per piece (what each side ran):")
        print(format_table(["piece", *(f"{chr(65 + i)}: {_side(fp, p)}" for i, (fp, p) in enumerate(measured)),
                            "severity"], [(r.piece, *r.values, r.severity) for r in pieces], width=96))
        critical = critical or any(r.severity == "critical" for r in pieces)
    return EXIT_CRITICAL_DIFF if critical else 0


def _side(fp: dict, measured_protocol) -> str:
    """What a fingerprint describes, in words: a serving engine, an eval, or a box (a training run's)."""
    source = fp.get("source") or {}
    if source.get("kind") == "engine":
        return f"{source.get('engine') or 'engine'} serving"
    if measured_protocol is not None:
        return f"{measured_protocol.scoring} eval"
    return "fingerprint" if source.get("kind") in (None, "captured") else str(source.get("kind"))


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

    run_id = import_log(Tracker(args.tracking_uri), args.file, args.name, target=args.target, fmt=args.format)
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
    from tracker.store.importers import (ddtree_benchmark, results, served, spec_acceptance, specforge_eval,
                                         speculators_acceptance, tensorboard, zlab_benchmark)
    from tracker.store.tracker import Tracker

    name = args.name or Path(args.file).stem
    # The file is read whole before the store is opened: a bad file creates nothing.
    if args.format == "tensorboard":
        if args.train_run_id:
            raise DraftboardError("--train-run-id does not apply to --format tensorboard: event folders are "
                                  "imported as training runs of their own")
        runs = tensorboard.read_event_folder(args.file)
        run_ids = tensorboard.log_event_runs(Tracker(args.tracking_uri), runs, name, args.target)
    else:
        parse = {"zlab-benchmark": zlab_benchmark.parse_benchmark_log, "ddtree": ddtree_benchmark.parse_ddtree_results,
                 "speculators-acceptance": speculators_acceptance.parse_acceptance_csv,
                 specforge_eval.FORMAT: specforge_eval.parse_report, spec_acceptance.FORMAT: spec_acceptance.parse_folder,
                 **served.PARSERS}[args.format]
        evals = parse(args.file)
        run_ids = results.log_imported(Tracker(args.tracking_uri), evals, source=args.file, fmt=args.format,
                                       name=name, target=args.target, train_run_id=args.train_run_id)
    print(f"imported {args.file} ({args.format}) as run(s) {', '.join(run_ids)}")
    return 0


def cmd_watch(args) -> int:
    import time

    from tracker.jobs import watch
    from tracker.jobs.queue import JobQueue
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri)
    preset = _json_argument("--auto-eval", args.auto_eval) if args.auto_eval else None
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
    from evaluators.logging import check_out_path, log_eval
    from tracker.events import emit

    if args.out:  # before the eval runs: a bad --out must not cost an eval or leave a logged run
        check_out_path(args.out)
    settings = EvalSettings(
        target=args.target, drafter=args.drafter, prompts=args.prompts, completions=args.completions,
        max_new_tokens=args.max_new_tokens, budgets=args.budgets, device=args.device, dtype=args.dtype,
        drafter_precision=args.drafter_precision, linear_attn=args.linear_attn,
        enable_thinking=args.enable_thinking, cache_dir=args.cache_dir, last_block=args.last_block,
        scoring=args.scoring, limit_per_dataset=args.limit_per_dataset,
        batch_size=args.batch_size, anchor_chunk=args.anchor_chunk, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, samples=args.samples, seeds=args.seeds, seed=args.seed,
    )
    if args.checkpoint_step is not None and not args.train_run_id:
        raise DraftboardError("--checkpoint-step needs --train-run-id (the run the checkpoint belongs to)")
    if args.engine:
        from evaluators.engines.run import EngineSettings, evaluate_engine

        engine = EngineSettings(args.engine, python=args.engine_python, url=args.engine_url, port=args.engine_port,
                                num_speculative_tokens=args.num_speculative_tokens)
        results = _run_staged(lambda s, progress: evaluate_engine(s, engine, progress), settings, args.out)
    elif any(getattr(args, k) is not None for k in ("engine_python", "engine_url", "engine_port",
                                                     "num_speculative_tokens")):
        raise DraftboardError("--engine-python, --engine-url, --engine-port and --num-speculative-tokens need "
                              "--engine vllm|sglang|llamacpp")
    else:
        results = _run_staged(evaluate, settings, args.out)
    run_id = None
    if not args.no_log:
        from tracker.store.tracker import Tracker

        tracker = Tracker(args.tracking_uri)
        run_id = log_eval(tracker, results, settings, train_run_id=args.train_run_id,
                          checkpoint_step=args.checkpoint_step, reference=args.reference, name=args.name)
        _regression_alerts(tracker, run_id)
    from tracker import protocol

    low, high = results["ci"]["tau"]
    drawn = protocol.sampling_text(protocol.Protocol.from_results(results))
    print(f"tau {results['tau']:.3f} (95% CI {low:.3f}-{high:.3f}, {results['protocol']['scoring']}, {drawn}, "
          f"last block {results['protocol']['last_block']})  streak {results['streak']:.3f}  "
          + (f"tau_all_anchors {results['tau_all_anchors']:.3f}  " if results["tau_all_anchors"] is not None else "")
          + "  ".join(f"ddtree_tau_b{b} {d['tau']:.3f}" for b, d in results["ddtree"].items()))
    if "monte_carlo" in results:
        mc, offline = results["monte_carlo"], results.get("offline") or {}
        mc_low, mc_high = mc["tau_ci_given_prompts"]
        print(f"sampled: {mc['draws_per_prompt']} draws per prompt; over the draws alone (prompts held fixed) "
              f"{mc_low:.3f}-{mc_high:.3f}" + (f"; the offline expectation {offline['tau']:.3f}" if "monte_carlo"
                                                in offline else ""))
    timing = results["timing"]
    if "engine" in results:
        print(f"{results['engine']['name']} {results['engine']['version']}: mean acceptance length "
              f"{results['engine_mean_acceptance_length']:.3f} (1 + accepted / drafts)  timing: engine start "
              f"{timing['engine_start_s']:.1f}s, requests {timing['requests_s']:.1f}s"
              + (f"  run: {run_id}" if run_id else ""))
    else:
        print(f"linear attention: {results['fingerprint']['numerics']['linear_attention_path']}  "
              f"timing: target {timing['target_s']:.1f}s, drafter {timing['drafter_s']:.1f}s"
              + (f"  run: {run_id}" if run_id else ""))
    emit("result", run_id=run_id, out=args.out)
    return 0


def _run_staged(run, settings, out: str | None) -> dict:
    """run(settings, progress) under tqdm bars and event lines; its results written to `out` if given."""
    from evaluators.logging import write_results

    progress = _StageProgress()
    try:
        results = run(settings, progress)
    finally:
        progress.close()
    if out:
        write_results(out, results)
    return results


def cmd_check_lossless(args) -> int:
    from evaluators.harness import EvalSettings, check_lossless
    from evaluators.logging import check_out_path

    if args.out:
        check_out_path(args.out)
    settings = EvalSettings(target=args.target, drafter=args.drafter, prompts=args.prompts,
                            max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
                            linear_attn=args.linear_attn, enable_thinking=args.enable_thinking,
                            last_block=args.last_block, limit_per_dataset=args.limit_per_dataset)
    report = _run_staged(check_lossless, settings, args.out)

    def gap(value):
        return "-" if value is None else f"{value:.2e}"

    rows = [(r["id"], "yes" if r["equals_greedy"] else "NO", "-" if r["first_divergence"] is None
             else r["first_divergence"], f"{r['blocks_agreeing']}/{r['n_blocks']}",
             gap(r["max_gap_after_accept"]), gap(r["max_gap_after_reject"])) for r in report["prompts"]]
    print(format_table(["prompt", "equals greedy", "first divergence", "blocks agreeing",
                        "max feature gap after accepted block", "... after rejected drafts"], rows))
    print(f"{report['n_diverged']}/{len(rows)} completions leave greedy decoding "
          f"(last block: {report['last_block']}; feature gap = max |hidden state the loop used - full forward|, "
          f"tapped layers); {report['timing']['total_s']:.1f}s")
    return EXIT_CRITICAL_DIFF if report["n_diverged"] else 0


def _regression_alerts(tracker, run_id: str) -> None:
    """Alert when the eval just logged is worse than its previous checkpoint or a reference: on the run,
    on stderr, and to the deployment's webhook. An alert never fails the eval that raised it."""
    from tracker import regression

    try:
        alerts = regression.check(tracker, run_id)
        regression.record(tracker, run_id, alerts)
        url = config.alert_webhook()
    except DraftboardError as exc:
        print(f"warning: regression check skipped: {exc}", file=sys.stderr)
        return
    for alert in alerts:
        say(f"regression: {alert.text}", file=sys.stderr)
    if url and alerts:
        regression.post(url, alerts)


def _eval_results(tracker, run_id: str) -> dict:
    """A run's eval_results.json, checked to hold a score for every prompt (a walk, or sampled draws)."""
    from tracker.store import names
    from tracker.uncertainty import prompt_score

    tracker.run(run_id)
    results = tracker.read_json(run_id, names.EVAL_RESULTS_ARTIFACT, missing="not an eval run?")
    records = results.get("prompts") if isinstance(results, dict) else None
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and "id" in r and prompt_score(r) is not None for r in records):
        raise DraftboardError(f"run {run_id}: {names.EVAL_RESULTS_ARTIFACT} has no per-prompt scores "
                              "('prompts': [{id, acceptance_lengths}] or, sampled, [{id, samples}])")
    return results


def _same_draws(a: dict, b: dict) -> bool:
    """Both sampled evals scored the very same continuations of every prompt (paired draws)."""
    def draws(record):
        return [d.get("completion_ids") for d in record.get("samples") or []]
    return all(draws(a[pid]) and draws(a[pid]) == draws(b[pid]) for pid in a)


def _results_of(ref: str, tracking_uri: str | None) -> dict:
    """An eval's results: a results JSON file (`draftboard eval --out`), else a run id in the store."""
    path = Path(ref)
    if path.is_file():
        from evaluators.prompts import read_text

        try:
            return json.loads(read_text(path))
        except ValueError as exc:
            raise DraftboardError(f"{ref}: not a results JSON ({exc})") from None
    from tracker.store.tracker import Tracker

    return _eval_results(Tracker(tracking_uri), ref)


def _add_margins(report: dict, offline: dict) -> None:
    """Each acceptance difference gets the offline drafter's logit margin there (evaluators.margins)."""
    from evaluators.margins import MarginAsk, block_margins, settings_of

    completions = {str(p["id"]): p["completion_ids"] for p in offline["prompts"]}
    wanted = [d for d in report["first_differences"] if d["cause"] == "acceptance" and d["anchor"] is not None]
    asks = [MarginAsk(d["id"], completions[d["id"]], d["anchor"], min(d["engine"], d["offline"])) for d in wanted]
    progress = _StageProgress()
    try:
        margins = block_margins(settings_of(offline), asks, progress) if asks else []
    finally:
        progress.close()
    for d, margin in zip(wanted, margins):
        d["margin"] = None if margin is None else margin.value
    for p in report["prompts"]:
        p["margin"] = next((d.get("margin") for d in wanted if d["id"] == p["id"]), None)


def cmd_reconcile(args) -> int:
    from tracker.reconcile import reconcile, reconcile_engines

    engine, offline = _results_of(args.engine_eval, args.tracking_uri), _results_of(args.offline_eval, args.tracking_uri)
    if isinstance(offline, dict) and (offline.get("protocol") or {}).get("scoring") == "engine":
        if args.margins:
            raise DraftboardError("--margins reads an offline eval's drafter: reconcile an engine eval with one")
        report = reconcile_engines(engine, offline, _results_of(args.offline, args.tracking_uri) if args.offline
                                   else None)
        if args.json:
            say(json.dumps(report))
            return 0
        say(format_table(["setting", report["a"]["engine"], report["b"]["engine"]],
                           [(d["field"], d["a_value"], d["b_value"]) for d in report["settings_diff"]], width=72))
        say(report["verdict"])
        return 0
    if args.offline:
        raise DraftboardError("--offline is the common reference of two engine evals; here the second eval is "
                              "already an offline eval")
    report = reconcile(engine, offline)
    if args.margins:
        _add_margins(report, offline)
    if args.json:
        say(json.dumps(report))
        return 0
    rows = [(p["id"], "yes" if p["completions_equal"] else f"no (token {p['first_token_difference']})",
             f"{p['engine_blocks']}/{p['offline_blocks']}",
             "-" if p["first_block_difference"] is None else
             f"{p['first_block_difference']} ({p['engine_accepted']} vs {p['offline_accepted']})",
             p["cause"] or "agree", "-" if p.get("margin") is None else f"{p['margin']:.3f}")
            for p in report["prompts"]]
    say(format_table(["prompt", "completions equal", "blocks engine/offline",
                        "first differing block (accepted: engine vs offline)", "cause",
                        "offline margin there (logits)"], rows))
    say("parts of the gap (pooled mean acceptance length): " + ", ".join(
        f"{k.replace('_', ' ')} {v:+.3f}" for k, v in report["parts"].items()) + f", unexplained {report['unexplained']:+.3f}")
    for title, key in (("protocol", "protocol_diff"), ("environment", "environment_diff")):
        shown = [r for r in report[key] if r["severity"] != "info"]
        if shown:
            say(f"{title} differs: " + "; ".join(f"{r['field']} {r['a_value']!r} vs {r['b_value']!r} ({r['severity']})"
                                                 for r in shown[:8]))
    for note in (report.get("hybrid") or {}).get("notes", []):
        say(f"hybrid: {note}")
    say(report["verdict"])
    return 0


def cmd_compare(args) -> int:
    from tracker import protocol, regression
    from tracker.store.tracker import Tracker
    from tracker.uncertainty import NO_DIFFERENCE, WORSE, prompt_score, tau_intervals

    tracker = Tracker(args.tracking_uri)
    results = [_eval_results(tracker, run_id) for run_id in (args.run_a, args.run_b)]
    paired = regression.paired(*results)
    by_id = [{str(r["id"]): r for r in res["prompts"]} for res in results]
    scores = [{pid: prompt_score(r) for pid, r in ids.items()} for ids in by_id]
    for label, run_id, res, per_prompt in zip("AB", (args.run_a, args.run_b), results, scores):
        own = tau_intervals(list(per_prompt.values())).tau
        say(f"{label} {run_id}: tau {own.value:.3f}  95% CI [{own.low:.3f}, {own.high:.3f}]  "
              f"{protocol.sampling_text(protocol.Protocol.from_results(res))}")
    d = paired.delta
    shared = [pid for pid in by_id[0] if pid in by_id[1]]
    draws = ""
    if any(by_id[0][pid].get("samples") for pid in shared):
        same = _same_draws({p: by_id[0][p] for p in shared}, {p: by_id[1][p] for p in shared})
        draws = (", both scored on the same sampled continuations" if same else
                 ", on different sampled continuations (the same --seed and --samples on one target pair them)")
    say(f"delta tau (B - A) {d.value:+.3f}  95% CI [{d.low:+.3f}, {d.high:+.3f}]  "
          f"paired bootstrap over {paired.n_prompts} prompts{draws}")
    say(f"verdict: {paired.verdict}" if paired.verdict == NO_DIFFERENCE else f"verdict: B is {paired.verdict}")
    return EXIT_CRITICAL_DIFF if args.fail_if_worse and paired.verdict == WORSE else 0


def cmd_report(args) -> int:
    from tracker.dashboard import report
    from tracker.dashboard.compare import closest_reference, train_runs_for_histories
    from tracker.dashboard.index import load_run_index, read_json_artifact
    from tracker.store import history, names
    from tracker.store.tracker import Tracker

    out = Path(args.out)
    if not out.parent.is_dir() or out.is_dir():
        raise DraftboardError(f"--out {out}: give a file in an existing folder")
    tracker = Tracker(args.tracking_uri)
    index = load_run_index(tracker)
    missing = [r for r in args.runs if r not in index]
    if missing:
        raise DraftboardError(f"no run {missing[0]!r} in {redact.shown_uri(tracker.uri)}")
    reference = None if args.reference == "none" else args.reference or closest_reference(index, args.runs).run_id
    if reference is not None and reference not in index:
        raise DraftboardError(f"no reference run {reference!r} in {redact.shown_uri(tracker.uri)}")
    trained = train_runs_for_histories(index, args.runs)
    axes = {r: index.runs[r].step_metric for r in trained if index.runs[r].step_metric}
    curves = history.decimated(history.on_step_metric(history.load_histories(tracker.uri, trained), axes),
                               history.CHART_BUCKETS)

    def results(run):
        return read_json_artifact(tracker.client, run.run_id, run.artifact_uri, names.EVAL_RESULTS_ARTIFACT)

    page = report.compare_report(index, args.runs, reference, curves, results, tracker.uri)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # the report appears whole or not at all
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    say(f"wrote {out} ({len(page.encode()) / 1e3:.0f} kB): {len(args.runs)} run(s), reference "
          f"{index.label(reference) if reference else 'none'}")
    return 0


def cmd_doctor(args) -> int:
    from evaluators.doctor import DoctorSettings, run_doctor
    from tracker.store import names

    tracker = trained = None
    if args.run:
        from tracker.store.tracker import Tracker

        tracker = Tracker(args.tracking_uri)
        trained = tracker.fingerprint(args.run)  # before anything loads: a wrong id is one error line
    settings = DoctorSettings(target=args.target, drafter=args.drafter, prompts=args.prompts, n_prompts=args.n_prompts,
                              max_new_tokens=args.max_new_tokens, device=args.device, dtype=args.dtype,
                              linear_attn=args.linear_attn, enable_thinking=args.enable_thinking,
                              serving_config=args.serving_config, trained_fingerprint=trained,
                              trained_name=f"run {args.run}" if args.run else "the training run")
    progress = _StageProgress()
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


def cmd_demo(args) -> int:
    from demo.build import build_demo

    store = config.store_uri(args.tracking_uri)
    build_demo(config.home_dir(), store=store, quick=args.quick, force=args.force, resume=args.resume)
    print(f"raw runs: mlflow ui --backend-store-uri {redact.shown_uri(store)}")
    return 0


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.3f} GB"  # decimal GB, the unit of DRAFTBOARD_CACHE_MAX_GB


def cmd_cache(args) -> int:
    import time

    from evaluators.cache import EvalCache

    cache = EvalCache(args.cache_dir)
    if args.action == "ls" and (args.all or args.max_gb is not None):
        raise DraftboardError("cache ls: --max-gb and --all are options of `cache prune`")
    if args.action == "ls":
        entries = cache.entries()
        rows = [(e.kind, e.key, e.target, "" if not e.layers else ",".join(map(str, e.layers)), _gb(e.size),
                 time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(e.last_used))) for e in entries]
        if rows:
            print(format_table(["kind", "key", "target digest", "layers", "size", "last use"], rows))
        print(f"{len(entries)} entries, {_gb(sum(e.size for e in entries))} in {cache.root} "
              f"(cap {_gb(cache.max_bytes)}, {config.CACHE_MAX_VAR}; least recently used go first)")
        return 0
    if args.all and args.max_gb is not None:
        raise DraftboardError("cache prune: give --max-gb or --all, not both")
    limit = 0 if args.all else None if args.max_gb is None else config.gb_to_bytes(args.max_gb, "--max-gb")
    removed = cache.prune(limit)
    print(f"removed {len(removed)} entries ({_gb(sum(e.size for e in removed))}); "
          f"{_gb(cache.size())} left in {cache.root}")
    return 0


def _json_argument(flag: str, text: str):
    """A flag's JSON value: the JSON itself (starting with `{`), or a file holding it."""
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).read_text()
        except OSError as exc:
            raise DraftboardError(f"{flag}: cannot read {text}: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftboardError(f"{flag} is not JSON: {exc}") from exc


def cmd_worker(args) -> int:
    import logging

    from tracker.jobs.launchers import make_launcher
    from tracker.jobs.worker import run_worker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    ray_options = {}
    if args.launcher == "ray":
        runtime_env = _json_argument("--ray-runtime-env", args.ray_runtime_env) if args.ray_runtime_env else None
        python = "python" if args.ray_python is None else (args.ray_python or None)  # "": the worker's own
        ray_options = dict(python=python, gpus_per_job=args.ray_gpus, env=args.ray_env,
                           runtime_env=runtime_env, poll_s=args.poll)
    elif args.address or args.ray_python is not None or args.ray_env or args.ray_runtime_env:
        raise DraftboardError("--address and --ray-* options need --launcher ray")
    launcher = make_launcher(args.launcher, args.address, **ray_options)
    launcher.prepare()  # a worker is there to run jobs: the first one need not wait for its imports
    claimed = run_worker(args.jobs_uri, slots=args.slots, poll_s=args.poll, stale_s=args.stale, once=args.once,
                         launcher=launcher, watch_s=args.watch_interval if args.watch else None)
    print(f"worker stopped after {claimed} job(s)")
    return 0


def cmd_ui(args) -> int:
    import subprocess

    from tracker import lifecycle, serve

    app = Path(__file__).resolve().parent.parent / "app.py"
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
            [sys.executable, "-m", "tracker.cli", "worker"], env=worker_env, **lifecycle.child_popen_kwargs())))
    cmd = [sys.executable, "-m", "tracker.serve", str(app), "--server.port", str(args.port),
           "--server.address", args.address, "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
           "--client.toolbarMode", "minimal"]
    server = lifecycle.Child("server", subprocess.Popen(cmd, env=env, **lifecycle.child_popen_kwargs()))
    return lifecycle.Supervisor([*children, server], main=server).run()


def _start_demo_build(env: dict):
    """`draftboard demo --resume` in the background, its output in <home>/logs/demo.log; the page shows
    its progress (tracker/demo_progress.py) and it stops with the dashboard (tracker/lifecycle.py)."""
    import subprocess

    from tracker import demo_progress, lifecycle

    home, log = config.home_dir(env), config.logs_dir(env) / "demo.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "demo", "--resume"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **lifecycle.child_popen_kwargs())
    if hasattr(os, "setpriority"):  # on busy cores the page answers first; the build takes what is left
        os.setpriority(os.PRIO_PROCESS, proc.pid, 10)
    shown = demo_progress.read_progress(home)
    if shown is None or shown.state != demo_progress.DONE:  # a built demo reads as built while it is checked
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


def build_parser() -> argparse.ArgumentParser:
    from tracker.store.importers import served, training_log

    parser = argparse.ArgumentParser(prog="draftboard", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("fingerprint", help="print this environment's fingerprint")
    p.add_argument("--target", help="a target model directory: adds its kernel path and a numerical probe")
    _add_env_flags(p)
    p.add_argument("--out", help="write the JSON here instead of printing it")
    p.add_argument("--attach", metavar="RUN_ID", help="attach it (fingerprint.json + env.* tags) to this existing "
                                                      "run: run it on the training machine, in its environment")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_fingerprint)

    p = sub.add_parser("env-diff", help="compare fingerprints (e.g. training, offline eval, serving); exit 1 on a "
                                        "critical difference")
    p.add_argument("a", help="fingerprint JSON file, results JSON or MLflow run id")
    p.add_argument("b", help="fingerprint JSON file, results JSON or MLflow run id")
    p.add_argument("more", nargs="*", metavar="C", help="more of them, each compared with the one before (at most "
                                                        f"{ENV_DIFF_MAX} in all)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_env_diff)

    p = sub.add_parser("compare", help="paired bootstrap of two evals on the same prompts: delta tau, interval, verdict")
    p.add_argument("run_a", metavar="RUN_A", help="the baseline eval's MLflow run id")
    p.add_argument("run_b", metavar="RUN_B", help="the eval compared with it")
    p.add_argument("--fail-if-worse", action="store_true", help="exit 1 when B is significantly worse than A")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("reconcile", help="the gap between an engine eval and an offline eval of the same prompts, "
                                         "in parts: definitions, acceptance on equal completions, numerics; or "
                                         "between two engine evals (--offline: their common reference)")
    p.add_argument("engine_eval", metavar="ENGINE_EVAL", help="results JSON file or MLflow run id of the engine eval")
    p.add_argument("offline_eval", metavar="OFFLINE_EVAL", help="results JSON file or run id of the offline eval, or "
                                                               "of another engine eval of the same prompts")
    p.add_argument("--offline", metavar="OFFLINE_EVAL", help="with two engine evals: the offline eval of the same "
                                                            "prompts, through which the gap comes apart in parts")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--margins", action="store_true",
                   help="at each acceptance difference, the offline drafter's logit margin (reloads the offline "
                        "eval's target and drafter: a near-tie points to numerics, a wide margin to another context)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("doctor", help="the checks that catch the bugs DFlash teams lose days to: layer mapping, "
                                      "architecture, tokens, serving config, environment; exit 1 on a critical one")
    eval_job.add_eval_arguments(p, ["target", "drafter", "device", "dtype", "linear_attn", "enable_thinking"])
    p.add_argument("--prompts", default=None, help="prompts for the layer-mapping check, as `eval --prompts` (default: "
                                                   "a few plain-text prompts through the target's tokenizer)")
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

    p = sub.add_parser("report", help="one self-contained HTML file of what Compare shows for RUN...: curves, "
                                      "environment and protocol differences, vs-reference and vs-previous tables")
    p.add_argument("runs", nargs="+", metavar="RUN_ID")
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.add_argument("--reference", default=None,
                   help="the reference run id (default: the closest, as Compare picks it; `none`: no reference)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("import-log", help="import a JSON-lines or key=value training log, or Automodel's console, "
                                          "as a train run")
    p.add_argument("file")
    p.add_argument("--format", choices=training_log.FORMATS, default=None,
                   help="automodel: NVIDIA Automodel's DFlash/DFlash2 console log (default: JSON lines or key=value, "
                        "recognised by the first line)")
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

    p = sub.add_parser("watch", help="record the checkpoints a training tool writes into DIR as they appear "
                                     "(z-lab, SpecForge, speculators layouts), optionally queueing their evals")
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
                            "specforge-eval", "tensorboard", *served.FORMATS],
                   help="vllm-log / sglang-log / llamacpp-log / prometheus: served numbers from production (a "
                        "server log, a /metrics scrape), imported with the window they cover; aiperf: AIPerf's "
                        "per-request records (profile_export.jsonl); specforge-eval: a `specforge "
                        "evaluate-checkpoint` report (teacher-forced diagnostics, not tau)")
    p.add_argument("--train-run-id", default=None, help="the training run the evaluated drafter came from")
    p.add_argument("--name", default=None, help="run name (default: the file's name)")
    p.add_argument("--target", default=None, help="the target model (default: what the file or training run says)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_import_results)

    p = sub.add_parser("eval", help="evaluate a drafter checkpoint against a target (teacher-forced, T=0)")
    eval_job.add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("check-lossless", help="z-lab's cached online loop vs plain greedy, per prompt; "
                                              "exit 1 if any completion leaves greedy")
    eval_job.add_eval_arguments(p, ("target", "drafter", "prompts", "max_new_tokens", "device", "dtype",
                                    "linear_attn", "enable_thinking", "last_block", "limit_per_dataset", "out"))
    p.set_defaults(func=cmd_check_lossless)

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

    p = sub.add_parser("cache", help="list or trim the target cache (continuations and features of past evals)")
    p.add_argument("action", choices=["ls", "prune"],
                   help="ls: every entry, least recently used first; prune: remove entries until the cache fits")
    p.add_argument("--max-gb", default=None, metavar="GB",
                   help=f"prune down to this size (default: the cap, {config.CACHE_MAX_VAR}, "
                        f"{config.DEFAULT_CACHE_MAX_GB:g} GB unless set)")
    p.add_argument("--all", action="store_true", help="prune every entry draftboard wrote")
    p.add_argument("--cache-dir", default=None, help="the cache folder (default: $DRAFTBOARD_HOME/cache)")
    p.add_argument("--home", default=None, help="home directory (DRAFTBOARD_HOME)")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("worker", help="run queued evals")
    p.add_argument("--slots", type=int, default=1, help="evals run at once")
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
        say(f"error: {exc}", file=sys.stderr)  # store text in it reaches a terminal inert
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
