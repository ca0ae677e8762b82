"""The one environment comparison the dashboard makes: a run's fingerprint against another's.

Two relations use it:
- lineage: an eval (or reference) of a checkpoint against its own training run. `Lineage` is that
  pair with its `fingerprint.diff` rows; the Runs table, Run detail, the checkpoint table, Compare's
  "evaluated in a different environment" banner and the Environments pairs all read it from here,
  and count mismatches from the rows' severities;
- against a reference (Compare): `env_diff` of any two runs.
How a difference is worded (`linear-attn fallback vs training: fast`) lives here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracker import fingerprint
from tracker.dashboard.index import RunIndex, RunInfo

# Readable names of fingerprint fields, for banners and tables.
FIELD_NAMES = {
    "numerics.linear_attention_path": "linear-attn",
    "numerics.dtype": "dtype",
    "numerics.drafter_precision": "drafter precision",
    "hardware.device": "device",
    "numerics.attn_implementation": "attention impl.",
    "numerics.tf32_matmul": "TF32 matmul",
    "numerics.tf32_cudnn": "TF32 cuDNN",
    "numerics.float32_matmul_precision": "fp32 matmul precision",
    "hardware.gpu_name": "GPU",
    "probe.max_rel_diff": "hidden-state probe",
    "probe.digest": "hidden-state probe digest",
}
# The differences named first in banners.
HEADLINE_FIELDS = ["numerics.linear_attention_path", "numerics.dtype", "numerics.drafter_precision",
                   "hardware.device", "numerics.attn_implementation"]
_KERNEL_FIELDS = "numerics.linear_attention.functions."


def field_name(field: str) -> str:
    """`numerics.linear_attention_path` -> `linear-attn`; software versions -> the package name."""
    if field in FIELD_NAMES:
        return FIELD_NAMES[field]
    if field.startswith(_KERNEL_FIELDS):
        return field.rsplit(".", 1)[1] + " impl."
    if field.startswith("software."):
        return field.split(".", 1)[1]
    return field


def value_text(value) -> str:
    """A fingerprint value as shown: None -> unknown, booleans -> on/off."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def env_diff(a: RunInfo, b: RunInfo) -> tuple | None:
    """`fingerprint.diff` rows of run a against run b, most severe first; None when either has no fingerprint."""
    if a.fingerprint is None or b.fingerprint is None:
        return None
    return tuple(fingerprint.diff(a.fingerprint, b.fingerprint))


def of_severity(rows: Sequence | None, severity: str) -> list:
    return [r for r in rows or () if r.severity == severity]


def probe_words(a: dict | None, b: dict | None) -> str | None:
    """The hidden-state probe difference of two fingerprints in plain words: `hidden states differ by
    up to 5.7e-3 (relative) at layer 2` (the statistic and layer furthest apart, relative to the
    larger). None when either has no probe or they share no layer; the digests stay in the diff table."""
    pa, pb = (a or {}).get("probe"), (b or {}).get("probe")
    if not isinstance(pa, dict) or not isinstance(pb, dict):
        return None
    gap = fingerprint.probe_gap(pa, pb)
    if gap is None:
        return None
    worst, layer = gap
    number = f"{worst:.1e}".replace("e-0", "e-").replace("e+0", "e+")  # 5.7e-3, as people write it
    return f"hidden states differ by up to {number} (relative) at layer {layer}"


def summarize_rows(rows: Sequence, a_name: str, b_name: str, limit: int = 4, probe: str | None = None) -> str:
    """`linear-attn fallback vs training: fast; dtype fp32 vs training: bf16`.

    The per-function kernel rows are left out when the linear-attention path itself differs
    (they say the same thing). `probe` (`probe_words`) words the probe row instead of its digests.
    """
    fields = {r.field for r in rows}
    shown = [r for r in rows if not (r.field.startswith(_KERNEL_FIELDS) and HEADLINE_FIELDS[0] in fields)]
    shown.sort(key=lambda r: (fingerprint.SEVERITY_ORDER.get(r.severity, 3),
                              HEADLINE_FIELDS.index(r.field) if r.field in HEADLINE_FIELDS else len(HEADLINE_FIELDS)))
    parts = [probe if probe and r.field == "probe.max_rel_diff" else
             f"{field_name(r.field)} {value_text(r.a_value)} vs {b_name}: {value_text(r.b_value)}"
             for r in shown[:limit]]
    if len(shown) > limit:
        parts.append(f"{len(shown) - limit} more")
    return f"{a_name}: " + "; ".join(parts) if a_name else "; ".join(parts)


# --------------------------------------------------------------------------- lineage


@dataclass(frozen=True)
class Lineage:
    """An eval (or reference) of a checkpoint against the training run that produced the checkpoint."""

    eval: RunInfo
    train: RunInfo
    rows: tuple | None  # DiffRow, eval vs train, most severe first; None: a fingerprint is missing

    @property
    def critical(self) -> list:
        return of_severity(self.rows, "critical")

    @property
    def warnings(self) -> list:
        return of_severity(self.rows, "warning")

    def summary(self, train_name: str = "training") -> str:
        """The critical differences, worded: `linear-attn fallback vs training: fast`."""
        return summarize_rows(self.critical, "", train_name, probe=self.probe)

    @property
    def probe(self) -> str | None:
        return probe_words(self.eval.fingerprint, self.train.fingerprint)


def vs_training(index: RunIndex, run: RunInfo) -> Lineage | None:
    """An eval or reference against its training run; None for other runs and unknown training runs."""
    train = index.train_of(run) if run.kind in ("eval", "reference") else None
    return None if train is None else Lineage(run, train, env_diff(run, train))


def lineage(index: RunIndex, run: RunInfo) -> list[Lineage]:
    """A training run: each of its evals and references against it; an eval: itself against its training run."""
    if run.kind == "train":
        return [Lineage(ev, run, env_diff(ev, run)) for ev in index.evals_of(run.run_id, ("eval", "reference"))]
    own = vs_training(index, run)
    return [own] if own is not None else []


def mismatches(index: RunIndex, run: RunInfo) -> list[Lineage]:
    """The lineage pairs of a run whose environments differ critically (their numbers are not comparable)."""
    return [p for p in lineage(index, run) if p.critical]


def mismatch_text(index: RunIndex, pair: Lineage) -> str:
    """`v4 @ step 200: linear-attn fallback vs training: fast`."""
    return f"{index.eval_label(pair.eval)}: {pair.summary()}"


def train_eval_pairs(index: RunIndex, run_ids: Sequence[str] | None = None) -> list[Lineage]:
    """Every (eval, training run) pair, or those touching `run_ids`; critical differences first."""
    wanted = None if run_ids is None else set(run_ids)
    pairs = [p for p in (vs_training(index, ev) for ev in index.of_kind("eval", "reference")) if p is not None
             and (wanted is None or p.eval.run_id in wanted or p.train.run_id in wanted)]
    pairs.sort(key=lambda p: (-len(p.critical), -len(p.warnings), p.train.name, p.eval.checkpoint_step or 0))
    return pairs
