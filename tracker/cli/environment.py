"""`draftboard fingerprint` and `env-diff`: an environment, and how environments differ."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tracker.cli.common import ENV_DIFF_MAX, EXIT_CRITICAL_DIFF, format_table
from tracker.errors import DraftboardError
from tracker.jobs import eval_job  # the one declaration of the eval's flags (light: config and errors only)


def _add_env_flags(p: argparse.ArgumentParser) -> None:
    eval_job.add_eval_arguments(p, eval_job.ENV_FIELDS)  # declared once, with the eval's other flags


def cmd_fingerprint(args) -> int:
    from tracker.environment import fingerprint, linear_attn

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
    from tracker.measurement.protocol import Protocol

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

    tracker = Tracker(tracking_uri, create=False)
    ref = tracker.resolve_run_id(ref)
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
    print(f"{len(rows)} field{'s' if len(rows) != 1 else ''} differ{'s' if len(rows) == 1 else ''}: "
          + ", ".join(f"{n} {s}" for s, n in counts.items() if n))


def cmd_env_diff(args) -> int:
    """Environment and protocol of each ref against the one before it (training, offline eval,
    serving: the order a number travels), and for hybrid targets every side's Gated DeltaNet code per
    piece in one table; exit 1 on a critical row anywhere."""
    from tracker.environment import fingerprint, linear_attn
    from tracker.measurement import protocol

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
            which = [ref for ref, p in ((refs[i - 1], pa), (refs[i], pb)) if p is None]
            print(f"protocol{where}:\n  not compared: {' and '.join(which)} "
                  + ("is not an eval (no protocol)" if len(which) == 1 else "are not evals (no protocol)"))
        else:
            proto_rows = protocol.diff(pa, pb)
            _print_diff(f"protocol{where}", proto_rows, "no differences")
        critical = critical or fingerprint.has_critical(env_rows) or fingerprint.has_critical(proto_rows)
    for i, (fp, _) in enumerate(measured):
        _print_evidence(chr(65 + i), refs[i], fp)
    pieces = linear_attn.side_by_side([fp for fp, _ in measured])
    if pieces:
        print("Gated DeltaNet, per piece (what each side ran):")
        print(format_table(["piece", *(f"{chr(65 + i)}: {_side(fp, p)}" for i, (fp, p) in enumerate(measured)),
                            "severity"], [(r.piece, *r.values, r.severity) for r in pieces], width=96))
        critical = critical or any(r.severity == "critical" for r in pieces)
    return EXIT_CRITICAL_DIFF if critical else 0


def _print_evidence(side: str, ref: str, fp: dict) -> None:
    """Each field an imported run's own files stated, with its source quoted (file:line), and where
    those files disagree; nothing for a fingerprint captured live."""
    from tracker.environment import fingerprint
    from tracker.untrusted.escape import say

    rows, disagree = fingerprint.cited(fp), fingerprint.contradictions(fp)
    if not rows and not disagree:
        return
    say(f"evidence for {side} ({ref}): what its own files state")
    for field, value, cite in rows:
        line = f":{cite.get('line')}" if cite.get("line") is not None else ""
        say(f"  {field} = {value!r}: {cite.get('file')}{line} \"{str(cite.get('text'))[:200]}\" ({cite.get('rule')})")
    for text in disagree:
        say(f"  its files disagree: {text}")


def _side(fp: dict, measured_protocol) -> str:
    """What a fingerprint describes, in words: a serving engine, an eval, or a box (a training run's)."""
    source = fp.get("source") or {}
    if source.get("kind") == "engine":
        return f"{source.get('engine') or 'engine'} serving"
    if measured_protocol is not None:
        return f"{measured_protocol.scoring} eval"
    return "fingerprint" if source.get("kind") in (None, "captured") else str(source.get("kind"))


def add_commands(sub) -> None:
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
    p.add_argument("a", metavar="A", help="fingerprint JSON file, results JSON or MLflow run id")
    p.add_argument("b", metavar="B", help="fingerprint JSON file, results JSON or MLflow run id (compared with A)")
    p.add_argument("more", nargs="*", metavar="C", help="more of them, each compared with the one before (at most "
                                                        f"{ENV_DIFF_MAX} in all)")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_env_diff)
