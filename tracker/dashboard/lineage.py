"""The one environment comparison the dashboard makes: a run's fingerprint against another's.

Two relations use it:
- lineage: an eval (or reference) of a checkpoint against its own training run. `Lineage` is that
  pair with its `fingerprint.diff` rows; the Runs table, Run detail, the checkpoint table, Compare's
  "evaluated in a different environment" banner and the Environments pairs all read it from here,
  and count mismatches from the rows' severities;
- against a reference (Compare): `env_diff` of any two runs, and beside it `protocol_diff` (how
  each number was measured: prompts, thinking, temperature, block size, scoring; tracker.measurement.protocol).
  `vs_reference` is both, the protocol matched per dataset (`matched_protocol_rows`), and is what
  Compare dashes, banners and picks the closest reference by.
How a difference is worded (`linear-attn fallback vs training: fast`) lives here too, and how a
severity reads (`🔴 critical`, a table cell's colour) wherever one is shown.

Resolved (`resolved_by`): an eval that differs critically from its training run is answered once the
same measurement (training run, checkpoint, settings, protocol) was repeated without a critical
difference. `mismatches` leaves it out, so every count, badge, banner and default that reads
mismatches from here reads it as resolved, and `resolutions` names the re-evaluation that answered it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracker.environment import fingerprint
from tracker.measurement import protocol
from tracker.dashboard.index import RunIndex, RunInfo, computed_once
from tracker.store import names

# How a severity reads: its icon in text (`🔴 critical`), its background in a coloured table.
SEVERITY_ICONS = {"critical": "🔴", "warning": "🟠", "info": "🔵"}
SEVERITY_COLORS = {"critical": "#f8c7c3", "warning": "#fde2b0", "info": "#dbe9f7"}
MISSING = "—"  # how an unknown value reads in a table cell (never "None" or "nan")

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
    names.DRAFTER_REVISION: "drafter revision",
    names.protocol_tag("datasets"): "dataset",
    names.protocol_tag("prompt_digest"): "prompt set",
    names.protocol_tag("completions"): "completions",
    names.protocol_tag("max_new_tokens"): "max new tokens",
    names.protocol_tag("enable_thinking"): "thinking",
    names.protocol_tag("chat_template_digest"): "chat template",
    names.protocol_tag("block_size"): "block size",
    names.protocol_tag("temperature"): "temperature",
    names.protocol_tag("stop_token_ids"): "stop tokens",
    names.protocol_tag("last_block"): "last-block rule",
    names.protocol_tag("scoring"): "scoring",
    names.protocol_tag("target_digest"): "target weights",
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


def severity_label(severity: str) -> str:
    """`🔴 critical`."""
    return f"{SEVERITY_ICONS[severity]} {severity}"


def severity_background(severity: str) -> str:
    """The CSS that colours a table cell of this severity; "" for none (same, or no difference)."""
    return f"background-color: {SEVERITY_COLORS[severity]}" if severity in SEVERITY_COLORS else ""


def value_text(value) -> str:
    """A fingerprint value as shown: None -> unknown, booleans -> on/off."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, dict):  # a protocol's datasets: `gsm8k (80), mbpp (40)`
        return ", ".join(f"{k} ({value_text(v)})" for k, v in value.items())
    return str(value)


def env_diff(a: RunInfo, b: RunInfo) -> tuple | None:
    """`fingerprint.diff` rows of run a against run b, most severe first; None when either has no fingerprint."""
    if a.fingerprint is None or b.fingerprint is None:
        return None
    return tuple(fingerprint.diff(a.fingerprint, b.fingerprint))


def protocol_of(run: RunInfo) -> protocol.Protocol | None:
    """How an eval or reference was measured (`RunInfo.protocol`); None for other runs."""
    return run.protocol


def series_key(run: RunInfo) -> tuple[str, ...]:
    """What splits a training run's evals into separate lines besides the environment, each part
    worded as a label shows it: the protocol's series fields (`protocol.SERIES_FIELDS`, worded by
    `protocol.series_words`: `gsm8k`, `prompts 3fa2c1`, `256 tok`, `last block full`, `thinking on`,
    `T=1 top_p=0.95 top_k=20`, `block 8`, `online`), the engine and its draft length (`vllm`), the drafter family
    (`JetSpec`). Greedy and sampled evals, two generation lengths (acceptance moves with context: 32 and 512 tokens
    are two numbers), two engines, two drafter families are never one line, so their numbers are never compared
    either (issue 65 H1: a series is one protocol)."""
    proto = protocol_of(run)
    if proto is None:
        return ()
    engine = run.params.get("engine")
    drafts = run.params.get("num_speculative_tokens")
    return (*protocol.series_words(proto), f"{engine} {drafts} draft tokens" if engine and drafts else
            str(engine or "no engine"), run.drafter_family or "family unknown")


def lines_of(index: RunIndex, train_run_id: str) -> dict[tuple, list[RunInfo]]:
    """A training run's evals by `series_key`, each line by step: built once per index."""
    def build() -> dict[tuple, list[RunInfo]]:
        lines: dict[tuple, list[RunInfo]] = {}
        for ev in index.evals_of(train_run_id):
            lines.setdefault(series_key(ev), []).append(ev)
        return lines

    return index.memo(("lines", train_run_id), build)


def main_series(index: RunIndex, train_run_id: str) -> tuple[str, ...] | None:
    """A training run's default protocol: the `series_key` most of its checkpoints were measured under (the most
    distinct steps; a tie goes to the line reaching the later step). What Compare draws and quotes by default, so a
    one-off 512-token eval of the last step never stands in for a run measured at 64 tokens (issue 65 H1)."""
    lines = lines_of(index, train_run_id)
    if not lines:
        return None

    def weight(key: tuple) -> tuple:
        steps = {e.checkpoint_step for e in lines[key] if e.checkpoint_step is not None}
        return len(steps), max(steps, default=-1), len(lines[key])

    return max(lines, key=weight)


def drawn_with(index: RunIndex, run: RunInfo) -> list[RunInfo]:
    """The other evals of run's training run on its line (the same `series_key`), by step: the evals its
    number is drawn and quoted against."""
    if index.train_of(run) is None:
        return []
    return [e for e in lines_of(index, run.train_run_id).get(series_key(run), []) if e.run_id != run.run_id]


def protocol_diff(a: RunInfo, b: RunInfo) -> tuple:
    """`protocol.diff` rows of run a against run b; () when either measures nothing (a training run)."""
    pa, pb = protocol_of(a), protocol_of(b)
    return () if pa is None or pb is None else tuple(protocol.diff(pa, pb))


def datasets_of(run: RunInfo) -> dict:
    """{dataset: prompts} an eval's protocol names; {} when unknown."""
    proto = protocol_of(run)
    return proto.datasets if proto is not None and isinstance(proto.datasets, dict) else {}


_SAMPLE_FIELDS = (names.protocol_tag("datasets"), names.protocol_tag("prompt_digest"))


def matched_protocol_rows(rows: Sequence, a: RunInfo, b: RunInfo, same_prompts: bool = False) -> list:
    """The protocol rows of `a` against a reference `b` that reports each of a's datasets.

    Compared per dataset (a GSM8K eval against the reference's GSM8K number), a reference that
    also covers other sets is no different dataset: the dataset and prompt-set rows become one
    warning that the two may be different samples of it, or none when `same_prompts` (checked
    token by token). Where b lacks one of a's datasets the rows stay as they are (critical)."""
    mine, theirs = datasets_of(a), datasets_of(b)
    if not mine or not set(mine) <= set(theirs):
        return list(rows)
    kept = [r for r in rows if r.field not in _SAMPLE_FIELDS]
    sampled = {k: theirs[k] for k in mine}
    if not same_prompts and any(r.field in _SAMPLE_FIELDS for r in rows) and (
            sampled != mine or protocol_of(a).prompt_digest != protocol_of(b).prompt_digest):
        kept.append(fingerprint.DiffRow(names.protocol_tag("datasets"), mine, sampled, "warning"))
    kept.sort(key=lambda r: (fingerprint.SEVERITY_ORDER[r.severity], r.field))
    return kept


def drafter_rows(a: RunInfo, ref: RunInfo) -> list:
    """A hub drafter against a reference of the same hub repository: another commit is another drafter
    (z-lab retrains in place under the same name, z-lab #152), critical; a side that does not say its
    commit cannot prove it is the same one, a warning. Nothing for drafters of different repositories."""
    if a.drafter_repo is None or a.drafter_repo != ref.drafter_repo or a.drafter_revision == ref.drafter_revision:
        return []
    known = a.drafter_revision is not None and ref.drafter_revision is not None
    return [fingerprint.DiffRow(names.DRAFTER_REVISION, a.drafter_revision, ref.drafter_revision,
                                "critical" if known else "warning")]


def vs_reference(a: RunInfo, ref: RunInfo) -> tuple:
    """Drafter, environment and protocol rows of a run against a reference, most severe first (a missing
    fingerprint adds no environment rows: `env_diff` says so with None)."""
    rows = [*drafter_rows(a, ref), *(env_diff(a, ref) or ()), *matched_protocol_rows(protocol_diff(a, ref), a, ref)]
    rows.sort(key=lambda r: fingerprint.SEVERITY_ORDER[r.severity])
    return tuple(rows)


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


def probe_digests(a: dict | None, b: dict | None, a_name: str, b_name: str) -> str | None:
    """The digests behind `probe_words`, for a tooltip beside them: `hidden-state probe digest:
    v4 @ step 200 3fa2c1d0e5b6a7f8, training 9bc1e2f3a4b5c6d7`. None when `probe_words` is."""
    if probe_words(a, b) is None:
        return None
    return (f"hidden-state probe digest: {a_name} {value_text(a['probe'].get('digest'))}, "
            f"{b_name} {value_text(b['probe'].get('digest'))}")


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


# --------------------------------------------------------------------------- the same measurement

def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _budgets(value) -> list[int] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        parsed = [v for v in str(value).strip("()[] ").split(",") if v.strip()]
    try:
        return [int(v) for v in parsed]
    except (TypeError, ValueError):
        return None


def eval_settings_of(run: RunInfo, results: dict | None = None) -> dict:
    """The settings an eval ran with, from its params (paths from eval_results.json when relative)."""
    p = run.params
    settings = {
        "target": p.get("target") or run.target,
        "drafter": p.get("drafter") or run.checkpoint,
        "prompts": p.get("prompts"),
        "completions": p.get("completions"),
        "max_new_tokens": _int(p.get("max_new_tokens")),
        "budgets": _budgets(p.get("budgets")),
        "device": p.get("device"),
        "dtype": p.get("dtype"),
        "drafter_precision": p.get("drafter_precision"),
        "linear_attn": p.get("linear_attn"),
    }
    if results:
        for key in ("target", "drafter"):
            section = results.get(key)
            if isinstance(section, dict) and section.get("path") and not Path(str(settings[key] or "")).is_absolute():
                settings[key] = section["path"]
    return settings


# Settings that make two evals of one checkpoint the same measurement (besides the environment).
SAME_SETTINGS = ("drafter", "prompts", "completions", "max_new_tokens", "budgets")


def same_settings(run: RunInfo, settings: dict) -> bool:
    """Whether `run` measured with `settings` (an `eval_settings_of`), the environment aside."""
    mine = eval_settings_of(run)
    return all(mine[k] == settings.get(k) for k in SAME_SETTINGS)


def protocol_tags(run: RunInfo) -> dict[str, str]:
    """The run's `protocol.*` tags as logged: equal tags, the same protocol (`RunInfo.protocol_tags`)."""
    return run.protocol_tags


# --------------------------------------------------------------------------- lineage


@dataclass(frozen=True)
class Lineage:
    """An eval (or reference) of a checkpoint against the training run that produced the checkpoint."""

    eval: RunInfo
    train: RunInfo
    diff: Callable[[], tuple | None]  # -> `rows`, computed (and the two fingerprints read) when first asked
    # Their `env.critical_key` (`env.warning_key`) tags are equal and their probe digests agree: no critical
    # (nor warning) row, known without reading either fingerprint. `nothing_warned` implies `nothing_critical`.
    nothing_critical: bool = False
    nothing_warned: bool = False

    @property
    def rows(self) -> tuple | None:
        """DiffRow, eval vs train, most severe first; None: a fingerprint is missing. Computed once
        (`computed_once`: no lock shared by every pair while it reads their files)."""
        return computed_once(self, "_rows", self.diff)

    @property
    def compared(self) -> bool:
        """Both fingerprints are there to compare (`rows` is not None), known from the keys when they agree."""
        return self.nothing_critical or self.rows is not None

    @property
    def critical(self) -> list:
        return [] if self.nothing_critical else of_severity(self.rows, "critical")

    @property
    def warnings(self) -> list:
        return [] if self.nothing_warned else of_severity(self.rows, "warning")

    def summary(self, train_name: str = "training") -> str:
        """The critical differences, worded: `linear-attn fallback vs training: fast`."""
        return summarize_rows(self.critical, "", train_name, probe=self.probe)

    @property
    def probe(self) -> str | None:
        return probe_words(self.eval.fingerprint, self.train.fingerprint)

    def probe_help(self, index: RunIndex) -> str | None:
        """The probe digests of the pair (`probe_digests`), for the tooltip where `probe` is shown."""
        return probe_digests(self.eval.fingerprint, self.train.fingerprint, index.eval_label(self.eval),
                             index.label(self.train.run_id))


def vs_training(index: RunIndex, run: RunInfo) -> Lineage | None:
    """An eval or reference against its training run; None for other runs and unknown training runs.
    Diffed once per index (`RunIndex.memo`), and only when asked for more than whether anything critical
    differs where their critical keys answer that: a listing of matching runs reads no fingerprint."""
    train = index.train_of(run) if run.kind in ("eval", "reference") else None
    if train is None:
        return None

    lasting = index.lasting  # kept by the pair, which the index keeps: never the index itself (a cycle)

    def diff() -> tuple | None:
        if run.fingerprint is None or train.fingerprint is None:  # may be read later: not kept
            return None
        # Their diff outlives this index (the next read diffs new runs only) while neither file is replaced.
        return lasting(("env_diff", run.run_id, run.fingerprint_version, train.run_id, train.fingerprint_version),
                       lambda: env_diff(run, train))

    probes = (run.tags.get(names.ENV_PROBE_DIGEST), train.tags.get(names.ENV_PROBE_DIGEST))

    def same(tag: str) -> bool:  # no row of that severity, from the tags alone (`fingerprint.critical_key`)
        return (run.env_key(tag) is not None and run.env_key(tag) == train.env_key(tag)
                and None not in probes and fingerprint.probes_agree(*probes))

    def pair() -> Lineage:
        warned = same(names.ENV_WARNING_KEY)  # covers every critical field too (`fingerprint.warning_key`)
        return Lineage(run, train, diff, nothing_critical=warned or same(names.ENV_CRITICAL_KEY), nothing_warned=warned)

    return index.memo(("vs_training", run.run_id), pair)


def lineage(index: RunIndex, run: RunInfo) -> list[Lineage]:
    """A training run: each of its evals and references against it; an eval: itself against its training run."""
    if run.kind == "train":
        return [vs_training(index, ev) for ev in index.evals_of(run.run_id, ("eval", "reference"))]
    own = vs_training(index, run)
    return [own] if own is not None else []


def mismatches(index: RunIndex, run: RunInfo) -> list[Lineage]:
    """The lineage pairs of a run whose environments differ critically (their numbers are not comparable)
    and that no matching re-evaluation answered (`resolved_by`)."""
    return [p for p in lineage(index, run) if p.critical and resolved_by(index, p.eval) is None]


def read_for_listing(index: RunIndex) -> None:
    """Read at once (`RunIndex.read_fingerprints`) the fingerprints a listing of every run will ask for: the
    evals and references whose critical keys differ from their training runs' (or that have none) and those
    training runs, and the runs without the `env.*` tags that say their badges (logged before the tags
    existed). Against a server their round trips overlap instead of queueing one by one. Once per index."""
    def read() -> bool:
        wanted = {r.run_id: r for r in index.runs.values() if names.ENV_SOURCE not in r.tags}
        for ev in index.of_kind("eval", "reference"):
            pair = vs_training(index, ev)
            if pair is not None and not pair.nothing_critical:
                wanted.update({ev.run_id: ev, pair.train.run_id: pair.train})
        index.read_fingerprints(wanted.values())
        return True

    index.memo(("read_for_listing",), read)


def open_evals(index: RunIndex) -> list[RunInfo]:
    """The evals with a critical environment mismatch no re-evaluation answered (`mismatches`), found once
    per index: the count every Runs visit shows."""
    def find() -> list[RunInfo]:
        read_for_listing(index)
        return [ev for ev in index.of_kind("eval") if mismatches(index, ev)]

    return index.memo(("open_evals",), find)


def resolutions(index: RunIndex, run: RunInfo) -> list[tuple[Lineage, RunInfo]]:
    """The run's critically differing lineage pairs that a re-evaluation answered, with that re-evaluation."""
    return [(p, by) for p in lineage(index, run) if p.critical and (by := resolved_by(index, p.eval)) is not None]


def _same_measurement(run: RunInfo) -> tuple:
    """What two evals share when one repeats the other's measurement: training run, checkpoint step,
    the settings of SAME_SETTINGS and the protocol tags (the environment aside)."""
    settings = eval_settings_of(run)
    return (run.train_run_id, run.checkpoint_step,
            tuple(tuple(v) if isinstance(v, list) else v for v in (settings[k] for k in SAME_SETTINGS)),
            tuple(sorted(protocol_tags(run).items())))


def _repeats(index: RunIndex) -> dict[tuple, list[RunInfo]]:
    """The evals grouped by `_same_measurement`, each group in `evals_of` order: built once per index,
    so finding an eval's re-evaluation reads its group, never every eval of its training run."""
    def build() -> dict[tuple, list[RunInfo]]:
        groups: dict[tuple, list[RunInfo]] = {}
        for train_id in {r.train_run_id for r in index.of_kind("eval") if r.train_run_id}:
            for ev in index.evals_of(train_id):
                groups.setdefault(_same_measurement(ev), []).append(ev)
        return groups

    return index.memo(("repeats",), build)


def resolved_by(index: RunIndex, run: RunInfo) -> RunInfo | None:
    """The re-evaluation that answers `run`'s critical difference from its training run: an eval of the
    same checkpoint of the same training run, with the same settings and protocol, started no earlier,
    that differs from the training run in nothing critical (the newest such); None when there is none, or
    nothing to answer. An eval in another environment made after a matching one is an exploration of that
    environment, not a mismatch a re-evaluation answered: it stays shown."""
    own = vs_training(index, run)
    if own is None or not own.critical:
        return None
    for other in reversed(_repeats(index).get(_same_measurement(run), [])):
        if other.run_id == run.run_id or (other.start_time or 0) < (run.start_time or 0):
            continue
        pair = vs_training(index, other)
        if pair.compared and not pair.critical:
            return other
    return None


def mismatch_text(index: RunIndex, pair: Lineage) -> str:
    """`v4 @ step 200: linear-attn fallback vs training: fast`."""
    return f"{index.eval_label(pair.eval)}: {pair.summary()}"


def train_eval_pairs(index: RunIndex, run_ids: Sequence[str] | None = None) -> list[Lineage]:
    """Every (eval, training run) pair, or those touching `run_ids`; critical differences first. Every pair is
    derived once per index (Environments reads them on every visit)."""
    if run_ids is None:
        return index.memo(("train_eval_pairs",), lambda: _train_eval_pairs(index, None))
    return _train_eval_pairs(index, run_ids)


def _train_eval_pairs(index: RunIndex, run_ids: Sequence[str] | None) -> list[Lineage]:
    wanted = None if run_ids is None else set(run_ids)
    pairs = [p for p in (vs_training(index, ev) for ev in index.of_kind("eval", "reference")) if p is not None
             and (wanted is None or p.eval.run_id in wanted or p.train.run_id in wanted)]
    # Sorted by their warnings: the pairs whose warning keys differ are diffed, their files read at once.
    index.read_fingerprints({r.run_id: r for p in pairs if not p.nothing_warned for r in (p.eval, p.train)}.values())
    pairs.sort(key=lambda p: (-len(p.critical), -len(p.warnings), p.train.name, p.eval.checkpoint_step or 0))
    return pairs
