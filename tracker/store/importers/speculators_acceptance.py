"""vLLM speculators' `acceptance.csv` (scripts/evaluate), one eval per subset.

Columns, as its evaluate script writes them: `subset, num_drafts, num_draft_tokens,
num_accepted_tokens, acceptance_length, acceptance_at_pos_0 .. acceptance_at_pos_{K-1}`, the
counts from vLLM's spec-decode metrics, written as floats ("20.0").

- `acceptance_length` = 1 + accepted / drafts, pooled over every draft of the subset: that is
  draftboard's `tau_pooled`, not the per-prompt macro `tau`, so it is logged as `tau_pooled` only.
- `acceptance_at_pos_{i}` = the fraction of drafts whose token i (from 0) was accepted: draft
  position k = i + 1 of a block, i.e. `accept_rate_pos{i+1}`.
- K (the number of position columns) is vLLM's num_speculative_tokens, stated as protocol.

`evaluate.py` also writes `eval_command.txt` beside it (`save_eval_provenance`): `# Timestamp:`, `# Git
SHA:` and `# <package>: <version>` lines for speculators, vllm, transformers, torch and
compressed-tensors, then `shlex.join(sys.argv)`. Where it is there, its versions and git SHA become the
imported fingerprint (they are the Python that ran evaluate.py, the client: a server elsewhere may
differ, and the fingerprint's source says so), and the command's `--gen-kwargs` (temperature, top_p,
top_k) and `--dataset` become protocol; without `--gen-kwargs` the server's defaults applied, unknown here.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
from dataclasses import replace
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.importers.results import ImportedEval, finite

FORMAT = "speculators-acceptance"
COLUMNS = ("subset", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_length")
_POSITION = re.compile(r"^acceptance_at_pos_(\d+)$")
_COUNTS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def parse_acceptance_csv(path: str | Path) -> list[ImportedEval]:
    """One record per subset row; DraftboardError naming `file:line` for anything malformed."""
    file = Path(path)
    if not file.is_file():
        raise DraftboardError(f"{file}: no such file")
    with file.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise DraftboardError(f"{file}: not a speculators acceptance.csv: missing column(s) {', '.join(missing)}")
        positions = sorted(int(m.group(1)) for c in header if (m := _POSITION.match(c)))
        if positions != list(range(len(positions))):
            raise DraftboardError(f"{file}: acceptance_at_pos_ columns must run 0..K-1, got {positions}")
        records = [_record(row, positions, f"{file}:{reader.line_num}") for row in reader]
    if not records:
        raise DraftboardError(f"{file}: no subset rows")
    subsets = [r.dataset for r in records]
    if len(set(subsets)) != len(subsets):
        raise DraftboardError(f"{file}: a subset appears twice ({', '.join(subsets)})")
    stated = read_provenance(file.parent)
    if stated is None:
        return records
    protocol, environment = stated
    return [replace(r, protocol={**r.protocol, **protocol}, environment=environment) for r in records]


PROVENANCE = "eval_command.txt"
_HEADER = re.compile(r"^# ([\w.-]+(?: SHA)?): (.*)$")
_ENVIRONMENT = {"torch": "software.torch", "transformers": "software.transformers", "vllm": "engine.version",
                "speculators": "source.speculators", "compressed-tensors": "source.compressed-tensors",
                "Git SHA": "code.git_commit", "Timestamp": "source.timestamp"}
_SAMPLING = ("temperature", "top_p", "top_k")
MAX_PROVENANCE_BYTES = 1 << 20


def read_provenance(folder: Path) -> tuple[dict[str, str], dict[str, str]] | None:
    """(protocol, fingerprint fields) from `folder/eval_command.txt`; None when there is none."""
    file = folder / PROVENANCE
    if not file.is_file():
        return None
    if file.stat().st_size > MAX_PROVENANCE_BYTES:
        raise DraftboardError(f"{file}: larger than an eval_command.txt ({MAX_PROVENANCE_BYTES} bytes)")
    environment = {"source.eval_command": str(file.resolve()),
                   "source.versions_of": "the Python that ran speculators' evaluate.py (the client)"}
    command: list[str] = []
    for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if header := _HEADER.match(line):
            name, value = header.groups()
            if name in _ENVIRONMENT and value not in ("unknown", "not installed"):
                environment[_ENVIRONMENT[name]] = value
        elif line.strip():
            try:
                command = shlex.split(line)
            except ValueError as exc:
                raise DraftboardError(f"{file}:{number}: not a command line ({exc})") from None
    if "engine.version" in environment:
        environment["engine.name"] = "vllm"
    return _command_protocol(command, file), environment


def _command_protocol(argv: list[str], file: Path) -> dict[str, str]:
    """What evaluate.py's own arguments state about the protocol."""
    options = {}
    for i, word in enumerate(argv):
        key, eq, value = word.partition("=")
        if key in ("--gen-kwargs", "--dataset"):
            options[key] = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    protocol = {"dataset_source": options["--dataset"]} if options.get("--dataset") else {}
    if options.get("--gen-kwargs"):
        try:
            kwargs = json.loads(options["--gen-kwargs"])
        except json.JSONDecodeError:
            raise DraftboardError(f"{file}: --gen-kwargs is not JSON: {options['--gen-kwargs']!r:.80}") from None
        if not isinstance(kwargs, dict):
            raise DraftboardError(f"{file}: --gen-kwargs must be a JSON object")
        protocol.update({k: str(kwargs[k]) for k in _SAMPLING if k in kwargs})
    return protocol


def _record(row: dict, positions: list[int], where: str) -> ImportedEval:
    subset = (row.get("subset") or "").strip()
    if not subset:
        raise DraftboardError(f"{where}: empty subset")
    counts = {}
    for column in _COUNTS:
        value = finite(row[column], f"{where} {column}")
        if value < 0 or not value.is_integer():
            raise DraftboardError(f"{where} {column}: a count must be a whole number >= 0, got {row[column]}")
        counts[column] = int(value)
    if counts["num_drafts"] == 0:
        raise DraftboardError(f"{where}: subset {subset!r} has no drafts; nothing was measured")
    length = finite(row["acceptance_length"], f"{where} acceptance_length")
    expected = 1 + counts["num_accepted_tokens"] / counts["num_drafts"]
    if not math.isclose(length, expected, rel_tol=1e-4):
        raise DraftboardError(f"{where}: acceptance_length {length} is not 1 + num_accepted_tokens / num_drafts "
                              f"= {expected:.6g}; the row is inconsistent")
    metrics = {"tau_pooled": length}
    for i in positions:
        rate = finite(row[f"acceptance_at_pos_{i}"], f"{where} acceptance_at_pos_{i}")
        if not 0 <= rate <= 1:
            raise DraftboardError(f"{where} acceptance_at_pos_{i}: a rate must lie in [0, 1], got {rate}")
        metrics[names.accept_rate_metric(i + 1)] = rate
    protocol = {"num_speculative_tokens": str(len(positions)), "aggregation": "pooled over drafts"}
    return ImportedEval(subset, metrics, protocol, {"counts": counts})
