"""vLLM speculators' `acceptance.csv` (scripts/evaluate), one eval per subset.

Columns, as its evaluate script writes them: `subset, num_drafts, num_draft_tokens,
num_accepted_tokens, acceptance_length, acceptance_at_pos_0 .. acceptance_at_pos_{K-1}`, the
counts from vLLM's spec-decode metrics, written as floats ("20.0").

- `acceptance_length` = 1 + accepted / drafts, pooled over every draft of the subset: that is
  draftboard's `tau_pooled`, not the per-prompt macro `tau`, so it is logged as `tau_pooled` only.
- `acceptance_at_pos_{i}` = the fraction of drafts whose token i (from 0) was accepted: draft
  position k = i + 1 of a block, i.e. `accept_rate_pos{i+1}`.
- K (the number of position columns) is vLLM's num_speculative_tokens, stated as protocol.
"""

from __future__ import annotations

import csv
import math
import re
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
    return records


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
