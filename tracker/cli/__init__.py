"""`draftboard` command line. Each subcommand parses, calls a library function, prints.

The parser is assembled here from one module per command family, each command's handler beside its
arguments: `environment` (fingerprint, env-diff), `evals` (eval, check-lossless, compare, reconcile,
report, cache), `doctor`, `imports` (import-log, import-results, adopt, watch) and `service` (ui,
worker, demo). Every user-facing failure is a DraftboardError; `main` turns it into one
`error: ...` line on stderr and exit status 2. Heavy imports (torch, transformers, mlflow) happen
inside commands so that `draftboard --help` stays instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tracker import config
from tracker.cli import doctor, environment, evals, imports, service
from tracker.cli.common import EXIT_BAD_INPUT
from tracker.errors import DraftboardError
from tracker.untrusted.escape import say

FAMILIES = (environment, evals, doctor, imports, service)


DESCRIPTION = ("draftboard: evaluate DFlash drafter checkpoints offline or in a serving engine, compare them with "
               "their environment and protocol, and serve the dashboard")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose error is one line and where to read more: argparse printed the whole usage first (21
    lines before `draftboard eval`'s error). Subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="draftboard", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser
    # `draftboard CMD --help` opens with what the command does: its one-line help, unless it has a description
    sub.add_parser = lambda name, **kw: add_parser(name, **{"description": kw.get("help"), **kw})
    for family in FAMILIES:
        family.add_commands(sub)
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
