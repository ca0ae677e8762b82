"""Eval outputs written exactly as the eval tools write them, from numbers a test chose or measured.

- speculators `scripts/evaluate/evaluate.py` @ 01dd14e `save_eval_provenance`: `eval_command.txt`.
- speculators `scripts/evaluate/spec_acceptance.py` @ d296739: `raw_requests.jsonl` (`append_result`),
  and `write_report`'s two tables through perf_utils' `CsvWriter` (a `csv.DictWriter` with its header):
  `bin_by_start_length` over the default context edges, `bin_by_position` in 256-token bins, each
  bucket finished by `_finish_bucket`.
- SpecForge `evaluate_cached_features` + `run_checkpoint_evaluation` (schema_version 1): the JSON report.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

CONTEXT_EDGES = (0, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)
POSITION_BIN = 256
START_COLUMNS = ["bucket", "num_requests", "num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens",
                 "draft_acceptance_rate", "mean_acceptance_length"]


def eval_command(output_dir: Path, argv: list[str], versions: dict[str, str], sha: str = "unknown") -> Path:
    """`eval_command.txt` as `save_eval_provenance` writes it (packages absent: "not installed")."""
    packages = ("speculators", "vllm", "transformers", "torch", "compressed-tensors")
    header = "\n".join(["# Timestamp: 2026-12-01T10:00:00.000000+00:00", f"# Git SHA: {sha}",
                        *(f"# {pkg}: {versions.get(pkg, 'not installed')}" for pkg in packages)])
    path = output_dir / "eval_command.txt"
    path.write_text(f"{header}\n{shlex.join(argv)}\n")
    return path


def spec_acceptance(output_dir: Path, results: list[tuple[int, dict]]) -> None:
    """raw_requests.jsonl and both CSVs for (prompt_tokens, metrics.speculative_decoding) pairs."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with (output_dir / "raw_requests.jsonl").open("w") as f:
        for prompt_tokens, metrics in results:
            f.write(json.dumps({"prompt_tokens": prompt_tokens, "metrics": metrics}))
            f.write("\n")
    by_start: dict[str, dict] = {}
    for prompt_tokens, m in results:
        label = next((f"{lo}-{hi}" for lo, hi in zip(CONTEXT_EDGES, CONTEXT_EDGES[1:]) if prompt_tokens <= hi),
                     f"{CONTEXT_EDGES[-1]}+")
        bucket = by_start.setdefault(label, {"bucket": label, "num_requests": 0, "num_spec_steps": 0,
                                             "num_draft_tokens": 0, "num_accepted_draft_tokens": 0})
        bucket["num_requests"] += 1
        for key in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens"):
            bucket[key] += m[key]
    by_position: dict[str, dict] = {}
    for prompt_tokens, m in results:
        pos = prompt_tokens
        for a, d in zip(m.get("per_step_accepted") or [], m.get("per_step_drafted") or [], strict=True):
            lo = (pos // POSITION_BIN) * POSITION_BIN
            label = f"{lo}-{lo + POSITION_BIN}"
            bucket = by_position.setdefault(label, {"bucket": label, "num_spec_steps": 0, "num_draft_tokens": 0,
                                                    "num_accepted_draft_tokens": 0})
            bucket["num_spec_steps"] += 1
            bucket["num_draft_tokens"] += d
            bucket["num_accepted_draft_tokens"] += a
            pos += a + 1
    _write_csv(output_dir / "acceptance_by_start_length.csv", START_COLUMNS, by_start)
    if by_position:
        _write_csv(output_dir / "acceptance_by_position.csv", [c for c in START_COLUMNS if c != "num_requests"],
                   by_position)


def _write_csv(path: Path, columns: list[str], buckets: dict[str, dict]) -> None:
    rows = []
    for _, bucket in sorted(buckets.items(), key=lambda item: int(item[0].split("-")[0].rstrip("+"))):
        bucket["draft_acceptance_rate"] = (bucket["num_accepted_draft_tokens"] / bucket["num_draft_tokens"]
                                           if bucket["num_draft_tokens"] else 0.0)
        bucket["mean_acceptance_length"] = (1 + bucket["num_accepted_draft_tokens"] / bucket["num_spec_steps"]
                                            if bucket["num_spec_steps"] else 0.0)
        rows.append(bucket)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def vllm_request_metrics(steps: list[int], num_spec_tokens: int, drafted: int | None = None) -> dict:
    """`RequestSpecDecodeMetrics.to_dict` (detailed) for verify steps that accepted `steps` drafts each."""
    histogram = [0] * (num_spec_tokens + 1)
    for a in steps:
        histogram[a] += 1
    per_drafted = [num_spec_tokens if drafted is None else drafted] * len(steps)
    accepted, draft_tokens = sum(steps), sum(per_drafted)
    return {"mean_acceptance_length": 1.0 + accepted / len(steps) if steps else 1.0,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
            "acceptance_histogram": histogram, "num_spec_steps": len(steps), "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": draft_tokens, "num_spec_tokens": num_spec_tokens,
            "per_step_accepted": list(steps), "per_step_drafted": per_drafted}


def specforge_report(path: Path, examples: list[dict], *, checkpoint: str, index: Path, recipe: dict,
                     draft_config: dict) -> dict:
    """The report `run_checkpoint_evaluation` writes, for per-example {id, seed, sha256, metrics,
    ratio_metrics, sum_metrics} records as `evaluate_cached_features` builds them."""
    ratio_totals: dict[str, list[float]] = {}
    sum_totals: dict[str, float] = {}
    for record in examples:
        for key, (numerator, denominator) in record["ratio_metrics"].items():
            total = ratio_totals.setdefault(key, [0.0, 0.0])
            total[0] += numerator
            total[1] += denominator
        for key, value in record["sum_metrics"].items():
            sum_totals[key] = sum_totals.get(key, 0.0) + value
    means = {key: sum(r["metrics"][key] for r in examples) / len(examples) for key in examples[0]["metrics"]}
    means.update({key: numerator / denominator if denominator else 0.0
                  for key, (numerator, denominator) in ratio_totals.items()})
    report = {"schema_version": 1, "success": True, "examples": len(examples), "seconds": 1.25,
              "optimizer_updates": 0,
              "metric_scope": "teacher-forced diagnostics; not serving acceptance, speed, or answer accuracy",
              "mean": means, "ratio_totals": ratio_totals, "sum_totals": sum_totals, "rows": examples,
              "checkpoint": checkpoint, "checkpoint_format": "specforge", "feature_index": str(index.resolve()),
              "feature_index_sha256": "0" * 64, "recipe": recipe, "draft_config": draft_config}
    with path.open("x") as stream:
        json.dump(report, stream, indent=2, allow_nan=False)
        stream.write("\n")
    return report
