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

from tracker.errors import DraftboardError

EXIT_BAD_INPUT = 2
EXIT_CRITICAL_DIFF = 1


def _add_env_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--linear-attn", choices=["auto", "fast", "fallback"], default="auto",
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
    from tracker.store import Tracker

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
    from tracker.importlog import import_log
    from tracker.store import Tracker

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
        from tracker.store import Tracker

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


def cmd_ui(args) -> int:
    import subprocess

    from tracker.store import Tracker

    app = Path(__file__).resolve().parent.parent / "app.py"
    if not app.is_file():
        raise DraftboardError(f"{app} not found: run `draftboard ui` from a source checkout")
    tracker = Tracker(args.tracking_uri)
    print(f"store: {tracker.uri}")
    print(f"raw runs: mlflow ui --backend-store-uri {tracker.uri}")
    print(f"dashboard: http://{args.address}:{args.port}")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(args.port),
           "--server.address", args.address, "--server.headless", "true",
           "--browser.gatherUsageStats", "false"]
    return subprocess.call(cmd)


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
    p.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "home", None):
        os.environ["DRAFTBOARD_HOME"] = str(Path(args.home).resolve())
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
