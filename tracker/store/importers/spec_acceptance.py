"""vLLM speculators' `scripts/evaluate/spec_acceptance.py` output folder: served acceptance by context length.

The harness sends each prompt to a vLLM server run with `--per-request-spec-decode-metrics detailed`
and streams one line per request to `raw_requests.jsonl`, `{"prompt_tokens": N, "metrics": M}`, M
being the response's `metrics.speculative_decoding` (vLLM `RequestSpecDecodeMetrics.to_dict`:
`acceptance_histogram` = verify steps by accepted draft count, `num_spec_steps`,
`num_accepted_draft_tokens`, `num_draft_tokens`, `num_spec_tokens`, and per-step `per_step_accepted`
/ `per_step_drafted`). It then writes two slicings of those lines with perf_utils' `CsvWriter`:
`acceptance_by_start_length.csv` (bucket, num_requests, num_spec_steps, num_draft_tokens,
num_accepted_draft_tokens, draft_acceptance_rate, mean_acceptance_length; buckets of prompt length)
and `acceptance_by_position.csv` (the same without num_requests; buckets of each verify step's token
position). mean_acceptance_length = 1 + accepted / steps; draft_acceptance_rate = accepted / drafted.

One eval per folder. `raw_requests.jsonl` is the source of truth: from it `engine_mean_acceptance_length`
(1 + accepted / steps over every request: vLLM's pooled definition, as the served importers log it)
and `accept_rate_pos{k}` (the fraction of verify steps that accepted at least k drafts); where every request
lists its `per_step_accepted`, `engine_tau_by_context` in the details: each step at its context (the request's
prompt_tokens + 1 + the tokens its earlier steps produced), draftboard's definition (tracker/measurement/context.py),
octave buckets. Without it the
CSVs give the pooled length alone. Where both are there the CSVs must add up to the raw lines (a CSV
from another run is refused). Both slicings are kept, bucket by bucket, in the run's details. The
requests' sampling is the server's default (the harness sends none): unknown here.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tracker import config
from tracker.measurement import context
from tracker.measurement import engine_metrics as em
from tracker.untrusted.jsonlines import records
from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.importers.results import ImportedEval, finite

FORMAT = "speculators-spec-acceptance"
RAW = "raw_requests.jsonl"
BY_START, BY_POSITION = "acceptance_by_start_length.csv", "acceptance_by_position.csv"
_COUNTS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
MAX_LINE_BYTES = 64 << 20  # one request's per-step arrays: far below this


def parse_folder(path: str | Path) -> list[ImportedEval]:
    """The folder (or any file in it) as one eval; DraftboardError naming `file:line` for anything malformed."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    if not folder.is_dir():
        raise DraftboardError(f"{path}: no such folder")
    raw, by_start, by_position = folder / RAW, folder / BY_START, folder / BY_POSITION
    if not raw.is_file() and not by_start.is_file():
        raise DraftboardError(f"{folder}: not a spec_acceptance.py output folder (no {RAW} or {BY_START})")
    tables = {name: _table(file) for name, file in (("by_start_length", by_start), ("by_position", by_position))
              if file.is_file()}
    metrics: dict[str, float]
    protocol = {"aggregation": "pooled over verify steps", "source": "vLLM per-request spec-decode metrics"}
    if raw.is_file():
        requests, k = _raw(raw)
        steps = sum(r["num_spec_steps"] for r in requests)
        accepted = sum(r["num_accepted_draft_tokens"] for r in requests)
        if steps == 0:
            raise DraftboardError(f"{raw}: no verify steps in any request; nothing was measured")
        metrics = {"engine_mean_acceptance_length": 1 + accepted / steps}
        # a step accepted draft j when it accepted at least j drafts (the pooled histogram's suffix sums)
        pooled = [sum(counts) for counts in zip(*(r["acceptance_histogram"] for r in requests))]
        metrics.update({names.accept_rate_metric(j + 1): c / steps
                        for j, c in enumerate(em.positions_from_histogram(pooled))})
        totals = {c: sum(r[c] for r in requests) for c in _COUNTS}
        _agree(tables.get("by_start_length"), totals, by_start)
        stepped = [r for r in requests if r.get("per_step_accepted")]
        _agree(tables.get("by_position"), {c: sum(r[c] for r in stepped) for c in _COUNTS}, by_position)
        protocol.update({"num_speculative_tokens": str(k), "n_prompts": str(len(requests))})
        if requests and all(r["per_step_accepted"] for r in requests):  # each step where it stood: by context
            edges, tables["engine_tau_by_context"] = context.by_walks(
                [(r["prompt_tokens"], [a + 1 for a in r["per_step_accepted"]]) for r in requests], ())
            tables["context_buckets"] = list(edges)
    else:
        totals = {c: sum(row[c] for row in tables["by_start_length"]) for c in _COUNTS}
        if totals["num_spec_steps"] == 0:
            raise DraftboardError(f"{by_start}: no verify steps; nothing was measured")
        metrics = {"engine_mean_acceptance_length": 1 + totals["num_accepted_draft_tokens"] / totals["num_spec_steps"]}
        protocol["n_prompts"] = str(sum(row["num_requests"] for row in tables["by_start_length"]))
    return [ImportedEval(folder.name or "spec_acceptance", metrics, protocol, {"counts": totals, **tables})]


def _raw(file: Path) -> tuple[list[dict], int]:
    """The requests' metrics, checked line by line, and the one num_spec_tokens they share."""
    requests, k = [], None
    for where, obj in records(file, MAX_LINE_BYTES, "spec_acceptance.py's raw_requests.jsonl"):
        metrics = obj.get("metrics") if isinstance(obj, dict) else None
        prompt = obj.get("prompt_tokens") if isinstance(obj, dict) else None
        if not isinstance(metrics, dict) or isinstance(prompt, bool) or not isinstance(prompt, int) or prompt < 0:
            raise DraftboardError(f"{where}: expected {{\"prompt_tokens\": N, \"metrics\": {{...}}}}")
        request = {**_request(metrics, where), "prompt_tokens": prompt}
        if k is not None and request["num_spec_tokens"] != k:
            raise DraftboardError(f"{where}: num_spec_tokens {request['num_spec_tokens']} differs from the "
                                  f"earlier requests' {k}: one server config per import")
        k = request["num_spec_tokens"]
        requests.append(request)
    if not requests:
        raise DraftboardError(f"{file}: no requests")
    return requests, k


def _request(metrics: dict, where: str) -> dict:
    """One request's counts, consistent with its own histogram (vLLM writes them from it)."""
    out = {}
    for key in (*_COUNTS, "num_spec_tokens"):
        value = metrics.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DraftboardError(f"{where}: {key} must be a whole number >= 0, got {value!r:.40}")
        out[key] = value
    if out["num_spec_tokens"] > config.MAX_BUDGET:  # checked before the histogram is read
        raise DraftboardError(f"{where}: num_spec_tokens {out['num_spec_tokens']} is more than any drafter drafts "
                              f"({config.MAX_BUDGET} at most)")
    histogram = metrics.get("acceptance_histogram")
    if (not isinstance(histogram, list) or len(histogram) != out["num_spec_tokens"] + 1
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in histogram)):
        raise DraftboardError(f"{where}: acceptance_histogram must be num_spec_tokens + 1 counts")
    if sum(histogram) != out["num_spec_steps"] or sum(j * n for j, n in enumerate(histogram)) != \
            out["num_accepted_draft_tokens"]:
        raise DraftboardError(f"{where}: acceptance_histogram disagrees with num_spec_steps / "
                              "num_accepted_draft_tokens")
    out["acceptance_histogram"] = histogram
    steps = metrics.get("per_step_accepted") or []
    out["per_step_accepted"] = em.per_step_counts(steps, out["num_spec_steps"], out["num_accepted_draft_tokens"],
                                                  out["num_spec_tokens"], f"{where}: per_step_accepted") if steps else []
    return out


def _table(file: Path) -> list[dict]:
    """A CsvWriter table: counts as whole numbers, rates as floats, the bucket as written."""
    with file.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("bucket", *_COUNTS) if c not in (reader.fieldnames or [])]
        if missing:
            raise DraftboardError(f"{file}: missing column(s) {', '.join(missing)}")
        rows = []
        for row in reader:
            where = f"{file}:{reader.line_num}"
            parsed: dict = {"bucket": row["bucket"]}
            for column, value in row.items():
                if column == "bucket" or column is None:
                    continue
                number = finite(value, f"{where} {column}")
                if column.startswith("num_"):
                    if number < 0 or not number.is_integer():
                        raise DraftboardError(f"{where} {column}: a count must be a whole number >= 0, got {value}")
                    number = int(number)
                parsed[column] = number
            rows.append(parsed)
    if not rows:
        raise DraftboardError(f"{file}: no bucket rows")
    return rows


def _agree(rows: list[dict] | None, totals: dict[str, int], file: Path) -> None:
    if rows is None:
        return
    found = {c: sum(row[c] for row in rows) for c in _COUNTS}
    if found != totals:
        raise DraftboardError(f"{file}: its buckets add up to {found}, the {RAW} beside it to {totals}: "
                              "they come from different runs")
