"""`draftboard eval`, `check-lossless`, `compare`, `reconcile`, `report` and `cache`: measuring drafters and relating the numbers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tracker import config, redact
from tracker.cli.common import EXIT_CRITICAL_DIFF, StageProgress, format_table, write_whole
from tracker.errors import DraftboardError
from tracker.jobs import eval_job  # the one declaration of the eval's flags (light: config and errors only)
from tracker.untrusted.escape import say


def _check_gpus(gpus: int, device: str | None) -> None:
    """`--gpus N`: the eval holds N GPUs (a worker's job is given exactly those): refused where it cannot see them."""
    if device == "cpu":
        raise DraftboardError(f"--gpus {gpus} with --device cpu: a CPU eval holds no GPU")
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < gpus:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise DraftboardError(f"--gpus {gpus}: this process sees {seen} GPU(s) (CUDA_VISIBLE_DEVICES "
                              f"{'unset' if shown is None else repr(shown[:100])})")


def cmd_eval(args) -> int:
    from evaluators.harness import evaluate
    from evaluators.settings import EvalSettings
    from evaluators.logging import check_out_path, log_eval
    from tracker.events import emit

    if args.out:  # before the eval runs: a bad --out must not cost an eval or leave a logged run
        check_out_path(args.out)
    if args.gpus:
        _check_gpus(args.gpus, args.device)
    settings = EvalSettings(
        target=args.target, drafter=args.drafter, prompts=args.prompts, completions=args.completions,
        max_new_tokens=args.max_new_tokens, budgets=args.budgets, device=args.device, dtype=args.dtype,
        drafter_precision=args.drafter_precision, linear_attn=args.linear_attn,
        enable_thinking=args.enable_thinking, cache_dir=args.cache_dir, last_block=args.last_block,
        scoring=args.scoring, limit_per_dataset=args.limit_per_dataset, prompt_tokens=args.prompt_tokens,
        batch_size=args.batch_size, anchor_chunk=args.anchor_chunk, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, samples=args.samples, seeds=args.seeds, seed=args.seed,
        context_buckets=tuple(args.context_buckets or ()), gpus=args.gpus if not args.shards else None,
    )
    if args.checkpoint_step is not None and not args.train_run_id:
        raise DraftboardError("--checkpoint-step needs --train-run-id (the run the checkpoint belongs to)")
    if args.shards is not None and (problem := config.shards_problem(args.shards, args.scoring, args.engine)):
        raise DraftboardError(problem)
    if args.engine:
        from evaluators.engines.run import EngineSettings, evaluate_engine

        engine = EngineSettings(args.engine, python=args.engine_python, url=args.engine_url, port=args.engine_port,
                                num_speculative_tokens=args.num_speculative_tokens,
                                concurrency=tuple(args.concurrency or ()), repeats=args.repeats,
                                prefix_caching=args.prefix_caching,
                                tensor_parallel=args.gpus or 1)  # a CPU eval holding GPUs was refused above
        results = _run_staged(lambda s, progress: evaluate_engine(s, engine, progress), settings, args.out)
    elif args.prefix_caching or any(getattr(args, k) is not None for k in (
            "engine_python", "engine_url", "engine_port", "num_speculative_tokens", "concurrency", "repeats")):
        raise DraftboardError("--engine-python, --engine-url, --engine-port, --num-speculative-tokens, --concurrency, "
                              "--repeats and --prefix-caching need --engine vllm|sglang|llamacpp")
    elif args.shards and args.shards > 1:
        from evaluators.shards import evaluate_sharded

        results = _run_staged(lambda s, progress: evaluate_sharded(s, args.shards, progress), settings, args.out)
    else:
        results = _run_staged(evaluate, settings, args.out)
    run_id = None
    if not args.no_log:
        from tracker.store.tracker import Tracker

        tracker = Tracker(args.tracking_uri)
        train_run_id, step = args.train_run_id, args.checkpoint_step
        if train_run_id is None and args.reference is None:
            train_run_id, step = _registered_checkpoint(tracker, args.drafter)
        run_id = log_eval(tracker, results, settings, train_run_id=train_run_id,
                          checkpoint_step=step, reference=args.reference, name=args.name)
        _regression_alerts(tracker, run_id)
    from tracker.measurement import protocol

    low, high = results["ci"]["tau"]
    drawn = protocol.sampling_text(protocol.Protocol.from_results(results))
    print(f"tau {results['tau']:.3f} (95% CI {low:.3f}-{high:.3f}, {results['protocol']['scoring']}, {drawn}, "
          f"last block {results['protocol']['last_block']})  streak {results['streak']:.3f}  "
          + (f"tau_all_anchors {results['tau_all_anchors']:.3f}  " if results["tau_all_anchors"] is not None else "")
          + "  ".join(f"ddtree_tau_b{b} {d['tau']:.3f}" for b, d in results["ddtree"].items()))
    from tracker.measurement.context import bucket_text

    if results.get("engine_tau_by_context_unavailable"):
        print(f"engine_tau_by_context: not measured: {results['engine_tau_by_context_unavailable']}")
    for key in ("tau_by_context", "engine_tau_by_context"):
        if results.get(key):
            print(f"{key}: " + "  ".join(f"{bucket_text(r)} {r['tau']:.3f} ({r['blocks']} blocks)"
                                         for r in results[key] if r["blocks"]))
    if "monte_carlo" in results:
        mc, offline = results["monte_carlo"], results.get("offline") or {}
        mc_low, mc_high = mc["tau_ci_given_prompts"]
        print(f"sampled: {mc['draws_per_prompt']} draws per prompt; over the draws alone (prompts held fixed) "
              f"{mc_low:.3f}-{mc_high:.3f}" + (f"; the offline expectation {offline['tau']:.3f}" if "monte_carlo"
                                                in offline else ""))
    if (results.get("decoding") or {}).get("speedup"):
        d = results["decoding"]
        print(f"decoding speedup {d['speedup']:.2f}x (z-lab's: mean time per output token of the target alone "
              f"{d['time_per_output_token_s_target_alone'] * 1e3:.2f} ms / with the drafter "
              f"{d['time_per_output_token_s'] * 1e3:.2f} ms, one request at a time, this machine)")
    timing = results["timing"]
    if "engine" in results:
        print(f"{results['engine']['name']} {results['engine']['version']}: mean acceptance length "
              f"{results['engine_mean_acceptance_length']:.3f} (1 + accepted / drafts)  timing: engine start "
              f"{timing['engine_start_s']:.1f}s, requests {timing['requests_s']:.1f}s"
              + (f"  run: {run_id}" if run_id else ""))
        for level in results.get("load") or ():
            ci = level.get("speedup_ci")
            alone = (f"{level['tokens_per_s_target_alone']:.1f} target alone: speedup {level['speedup']:.2f}x"
                     + (f" (95% {ci[0]:.2f}-{ci[1]:.2f} over rounds)" if ci else "")
                     + f", step cost {level['step_cost']:.2f}" if level["speedup"]
                     else "target alone not measured (attached)")
            rounds, busy = len(level.get("rounds") or ()), level.get("busy_rounds") or 0
            print(f"  concurrency {level['concurrency']}: mean acceptance length "
                  f"{level['engine_mean_acceptance_length']:.3f}, {level['tokens_per_s']:.1f} tok/s with the drafter, "
                  f"{alone}; medians of {rounds} rounds" + (f", {busy} on a busy box" if busy else "")
                  + (f"; the server died {len(level['aborts'])} time(s) here and was restarted" if level.get("aborts")
                     else "")
                  + (f"; flags: {len(level['flags'])}" if level["flags"] else ""))
        if results.get("load_break_even_concurrency") is not None:
            print(f"  the drafter stops paying at about {results['load_break_even_concurrency']:.1f} requests in flight")
    else:
        print(f"linear attention: {results['fingerprint']['numerics']['linear_attention_path']}  "
              f"timing: target {timing['target_s']:.1f}s, drafter {timing['drafter_s']:.1f}s"
              + (f"  run: {run_id}" if run_id else ""))
    emit("result", run_id=run_id, out=args.out)
    return 0


def _registered_checkpoint(tracker, drafter: str) -> tuple[str | None, int | None]:
    """An eval that names no training run is linked to the one that registered these very bytes (the checkpoint's
    content digest), at its step, and says so; (None, None) when no run, or more than one, registered them."""
    from tracker.store import checkpoints

    if not Path(drafter).exists():  # a hub id: no bytes here to compare
        return None, None
    try:
        _, sha256 = checkpoints.digest(Path(drafter))
        found = sorted(set(tracker.runs_with_checkpoint(sha256)))
    except (OSError, DraftboardError) as exc:  # the eval ran: linking it is never worth losing it
        say(f"warning: the checkpoint's training run could not be looked up ({exc}); the eval is linked to none",
            file=sys.stderr)
        return None, None
    if len(found) == 1:
        (run_id, step), = found
        say(f"the checkpoint's content digest is training run {run_id}'s at step {step}: the eval is logged as that "
            "checkpoint's (--train-run-id and --checkpoint-step say otherwise)", file=sys.stderr)
        return run_id, step
    if found:
        say(f"warning: {len(found)} registered checkpoints have these bytes ("
            + ", ".join(f"{r} step {s}" for r, s in found[:4]) + "): the eval is linked to none; name one with "
            "--train-run-id and --checkpoint-step", file=sys.stderr)
    return None, None


def _run_staged(run, settings, out: str | None) -> dict:
    """run(settings, progress) under tqdm bars and event lines; its results written to `out` if given."""
    from evaluators.logging import write_results

    progress = StageProgress()
    try:
        results = run(settings, progress)
    finally:
        progress.close()
    if out:
        write_results(out, results)
    return results


def cmd_check_lossless(args) -> int:
    from evaluators.harness import check_lossless
    from evaluators.settings import EvalSettings
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
    from tracker.measurement import regression

    try:
        alerts = regression.check(tracker, run_id, lambda line: say(f"regression check: {line}", file=sys.stderr))
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
    from tracker.measurement.uncertainty import prompt_score
    from tracker.store import names

    run_id = tracker.resolve_run_id(run_id)
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

    return _eval_results(Tracker(tracking_uri, create=False), ref)


def _add_margins(report: dict, offline: dict) -> None:
    """Each acceptance difference gets the offline drafter's logit margin there (evaluators.margins)."""
    from evaluators.margins import MarginAsk, block_margins, settings_of

    completions = {str(p["id"]): p["completion_ids"] for p in offline["prompts"]}
    wanted = [d for d in report["first_differences"] if d["cause"] == "acceptance" and d["anchor"] is not None]
    asks = [MarginAsk(d["id"], completions[d["id"]], d["anchor"], min(d["engine"], d["offline"])) for d in wanted]
    progress = StageProgress()
    try:
        margins = block_margins(settings_of(offline), asks, progress) if asks else []
    finally:
        progress.close()
    for d, margin in zip(wanted, margins):
        d["margin"] = None if margin is None else margin.value
    for p in report["prompts"]:
        p["margin"] = next((d.get("margin") for d in wanted if d["id"] == p["id"]), None)


def cmd_reconcile(args) -> int:
    from tracker.measurement.levels import level_results
    from tracker.measurement.reconcile import reconcile, reconcile_engines

    engine, offline = _results_of(args.engine_eval, args.tracking_uri), _results_of(args.offline_eval, args.tracking_uri)
    if args.concurrency is not None:  # one level of the engine eval's load sweep, read as an eval of its own
        engine = level_results(engine, args.concurrency)
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
    _say_buckets(report.get("by_context") or [], "offline", "engine")
    say(report["verdict"])
    return 0


def cmd_compare(args) -> int:
    from tracker.measurement import protocol, regression
    from tracker.measurement.uncertainty import (
        NO_DIFFERENCE,
        WORSE,
        prompt_score,
        tau_intervals,
    )
    from tracker.store.tracker import Tracker

    tracker = Tracker(args.tracking_uri, create=False)
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
    buckets = regression.by_context(*results) or []
    _say_buckets(buckets, "A", "B")
    worse = paired.verdict == WORSE or any(r["verdict"] == WORSE for r in buckets)
    return EXIT_CRITICAL_DIFF if args.fail_if_worse and worse else 0


def _say_buckets(rows: list[dict], a: str, b: str) -> None:
    """A paired comparison by context (tracker.measurement.context.paired_by_walks) as a table, B against A."""
    from tracker.measurement.context import MIN_PROMPTS, bucket_text

    if not rows:
        return
    say(format_table(["context (tokens)", f"blocks {a}/{b}", f"tau {a}", f"tau {b}", f"delta tau ({b} - {a})",
                      "verdict"], [
        (bucket_text(r), f"{r['blocks_a']}/{r['blocks_b']}", _maybe(r["tau_a"]), _maybe(r["tau_b"]),
         "-" if r["delta"] is None else f"{r['delta']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]",
         r["verdict"] or f"not compared (under {MIN_PROMPTS} prompts with blocks on both sides)") for r in rows]))
    say(f"by context: pooled over each bucket's blocks, paired bootstrap over prompts, intervals Bonferroni over "
        f"the {sum(r['verdict'] is not None for r in rows)} buckets compared")


def _maybe(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def cmd_export_results(args) -> int:
    from tracker.store import names
    from tracker.store.importers.served import aiperf_records
    from tracker.store.tracker import Tracker

    out = Path(args.out)
    if out.exists() or not out.parent.is_dir():
        raise DraftboardError(f"--out {out}: give a new file in an existing folder")
    tracker = Tracker(args.tracking_uri, create=False)
    args.run_id = tracker.resolve_run_id(args.run_id)
    try:
        results = tracker.read_json(args.run_id, names.EVAL_RESULTS_ARTIFACT)
    except DraftboardError as exc:
        raise DraftboardError(f"run {args.run_id}: no eval results to export ({exc})") from None
    records = aiperf_records(results, args.concurrency)
    write_whole(out, "".join(json.dumps(record) + "\n" for record in records))
    level = f" at {args.concurrency} requests in flight" if args.concurrency else ""
    say(f"wrote {out}: {len(records)} request record(s) of run {args.run_id}{level} (AIPerf profile_export.jsonl; "
        "draftboard import-results --format aiperf reads it back)")
    return 0


def cmd_report(args) -> int:
    from tracker.dashboard import report
    from tracker.dashboard.compare import closest_reference, train_runs_for_histories
    from tracker.dashboard.index import load_run_index, read_json_artifact
    from tracker.store import history, names
    from tracker.store.tracker import Tracker

    out = Path(args.out)
    if not out.parent.is_dir() or out.is_dir():
        raise DraftboardError(f"--out {out}: give a file in an existing folder")
    tracker = Tracker(args.tracking_uri, create=False)
    index = load_run_index(tracker)
    args.runs = [tracker.resolve_run_id(r) if r not in index else r for r in args.runs]
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
    write_whole(out, page)
    say(f"wrote {out} ({len(page.encode()) / 1e3:.0f} kB): {len(args.runs)} run(s), reference "
          f"{index.label(reference) if reference else 'none'}")
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


def add_commands(sub) -> None:
    p = sub.add_parser("compare", help="paired bootstrap of two evals on the same prompts: delta tau, interval, verdict")
    p.add_argument("run_a", metavar="RUN_A", help="the baseline eval's MLflow run id")
    p.add_argument("run_b", metavar="RUN_B", help="the eval compared with it")
    p.add_argument("--fail-if-worse", action="store_true",
                   help="exit 1 when B is significantly worse than A, in the mean or in a context bucket")
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
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="the engine eval's load-sweep level with C requests in flight instead of its own pass")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_reconcile)

    p = sub.add_parser("report", help="one self-contained HTML file of what Compare shows for RUN...: curves, "
                                      "environment and protocol differences, vs-reference and vs-previous tables")
    p.add_argument("runs", nargs="+", metavar="RUN_ID")
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.add_argument("--reference", default=None,
                   help="the reference run id (default: the closest, as Compare picks it; `none`: no reference)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export-results", help="write a served eval's requests in another tool's format: "
                                              "aiperf (AIPerf's profile_export.jsonl records)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--format", required=True, choices=["aiperf"])
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="a load sweep's level: its requests at C in flight (default: the eval's own pass)")
    p.add_argument("--out", required=True, help="the file to write (refused if it exists)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_export_results)

    p = sub.add_parser("eval", help="evaluate a drafter checkpoint against a target: offline (teacher-forced walk), "
                                    "online (z-lab's cached loop) or in a serving engine (--engine); greedy or sampled")
    eval_job.add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("check-lossless", help="z-lab's cached online loop vs plain greedy, per prompt; "
                                              "exit 1 if any completion leaves greedy")
    eval_job.add_eval_arguments(p, ("target", "drafter", "prompts", "max_new_tokens", "device", "dtype",
                                    "linear_attn", "enable_thinking", "last_block", "limit_per_dataset", "out"))
    p.set_defaults(func=cmd_check_lossless)

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
