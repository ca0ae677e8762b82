"""The Compare page's data: curves of chosen runs against a reference, and where they are not comparable.

- Training curves: every logged step of the chosen training runs (`metrics_sql`, optionally
  downsampled for plotting).
- Eval curves: the eval runs of each chosen training run (tag `draftboard.train_run_id`),
  one point per checkpoint step (tag `draftboard.checkpoint_step`), with their 95% intervals
  (`low`, `high`); evals of one training run made in different environments, or under protocols
  that differ critically (another prompt set, thinking, temperature, block size) or scored
  online, form separate series, so a re-evaluation shows next to the original instead of
  zig-zagging one line.
- The reference: its eval metrics as horizontal lines; its acceptance by position and DDTree
  points as their own series.
- Environment and protocol: every eval series, every training run and the reference are diffed
  against the reference's fingerprint and protocol (`lineage.vs_reference`, the protocol matched
  per dataset), and every eval against its training run. The one dashing rule, for every chart
  (`series_reason`): an eval of a fingerprinted training run is dashed when its environment differs
  critically from its training run's or its protocol from the reference's; any other series when
  its environment or protocol differs critically from the reference's. Its `reason` column says
  which fields (legend and tooltip); the banners say it in full (`v4 @ step 200: linear-attn fallback vs
  reference: fast`); the protocol's warnings and infos are named in `protocol_notes`. A
  reference for another target is said first (`target_note`).
- The reference's tau line is its number for the chosen evals' dataset (`compare_deltas.reference_tau`),
  never an average over other sets; `reference_note` says which, or why there is none.
- Acceptance by position and DDTree: one checkpoint per chosen training run, the same `step` for every run
  (one control on the page) or by default each run's latest (`best_evals`: of a step's evals its default
  protocol's, a solid one, then the closest to the reference's environment, then to its training run's); a
  run with no eval at `step` is left out of them and said in `not_picked`.

Every frame carries `owner`, the run whose colour a series takes (`charts.run_colors`).
`closest_reference` picks the default reference: one evaluated for the same target, with the
fewest critical, then warning, differences from the chosen runs' eval environments and protocols.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from tracker.dashboard import compare_deltas, lineage, metric_docs, recipe, reconcile_view
from tracker.dashboard.index import DRAFTER_FAMILY_LABELS, RunIndex, RunInfo, same_target
from tracker.dashboard.lineage import summarize_rows
from tracker.measurement import protocol
from tracker.store import names
from tracker.untrusted.digits import whole_number

ResultsLoader = Callable[[RunInfo], "dict | None"]  # eval_results.json of a run, or None


# --------------------------------------------------------------------------- reference choice


@dataclass(frozen=True)
class ReferenceChoice:
    run_id: str | None
    critical: int = 0
    warning: int = 0
    message: str = ""
    matches: bool = False  # same target and no critical difference
    candidates: tuple[str, ...] = ()  # same-target references, best first


def anchor_runs(index: RunIndex, runs: Sequence[RunInfo]) -> list[RunInfo]:
    """The runs whose environment a reference is matched against: each chosen eval, and the
    latest eval of each chosen training run (the training run itself when it has none)."""
    out = []
    for run in runs:
        if run.kind == "train":
            evals = current_evals(index, run)
            out.append(evals[-1] if evals else run)
        else:
            out.append(run)
    return [r for r in out if r.fingerprint is not None]


def closest_reference(index: RunIndex, run_ids: Sequence[str]) -> ReferenceChoice:
    """The default reference for comparing `run_ids`, and a sentence saying how well it matches."""
    runs = [index.runs[r] for r in run_ids if r in index.runs]
    refs = [r for r in index.of_kind("reference") if r.run_id not in run_ids]
    if not runs:
        return ReferenceChoice(None, message="choose runs to compare")
    targets = sorted({r.target for r in runs if r.target})
    if not refs:
        # Plain words: the page shows the message escaped (it names targets read from the store), so a code
        # span would read as raw backticks.
        return ReferenceChoice(None, message="no reference runs in the store yet: evaluate one with draftboard "
                                             "eval ... --reference NAME, or Launch's 'Log as a reference'")
    same = [ref for ref in refs if any(same_target(ref.target, t) for t in targets)]
    if not same:
        names = ", ".join(sorted({r.target_name for r in runs if r.target})) or "the chosen runs' target"
        return ReferenceChoice(None, message=f"no reference was evaluated for {names}; the references in the "
                                             "store belong to other targets")
    anchors = anchor_runs(index, runs)
    scored = []
    for ref in same:
        crit = warn = 0
        fields: dict[str, list[str]] = {"critical": [], "warning": []}
        for anchor in anchors:
            if lineage.env_diff(anchor, ref) is None:
                warn += 1
                fields["warning"].append("no fingerprint")
            rows = lineage.vs_reference(anchor, ref)
            for severity in fields:
                found = lineage.of_severity(rows, severity)
                fields[severity] += [lineage.field_name(r.field) for r in found]
            crit += len(lineage.of_severity(rows, "critical"))
            warn += len(lineage.of_severity(rows, "warning"))
        # Measured references before published ones at equal scores; then the newest.
        scored.append(((crit, warn, ref.published, -(ref.start_time or 0)), ref, fields))
    scored.sort(key=lambda s: s[0])
    (crit, warn, _, _), best, fields = scored[0]
    label = index.label(best.run_id)
    warned = _named(fields["warning"])
    if crit:
        message = (f"no reference matches the chosen runs' environment: the closest, {label}, has {crit} critical "
                   f"difference(s): {_named(fields['critical'])}")
    elif best.published:
        message = f"{label} (published numbers: its environment is mostly unknown; {warn} warning(s): {warned})"
    elif warn:
        message = f"{label}: same target, closest environment ({warn} warning difference(s), none critical: {warned})"
    else:
        message = f"{label}: same target, same environment"
    return ReferenceChoice(best.run_id, crit, warn, message, matches=crit == 0,
                           candidates=tuple(s[1].run_id for s in scored))


def _named(fields: Sequence[str], limit: int = 5) -> str:
    """`torch, GPU` (each field once, in order); `… and N more` past `limit`."""
    unique = list(dict.fromkeys(fields))
    more = f" and {len(unique) - limit} more" if len(unique) > limit else ""
    return ", ".join(unique[:limit]) + more


def reference_label(index: RunIndex, ref: RunInfo) -> str:
    """`z-lab v1 · published · Qwen3.5-4B` for pickers; a hub drafter's repository and commit after the name
    (`z-lab v1 · z-lab/Qwen3.5-27B-DFlash @ 2274357 · ...`), or that the commit is not stated."""
    parts = [ref.reference_name or index.label(ref.run_id)]
    if ref.drafter_repo:
        parts.append(f"{ref.drafter_repo} @ {ref.drafter_revision[:7] if ref.drafter_revision else 'revision not stated'}")
    if ref.published:
        parts.append("published")
    else:
        parts.append(f"{ref.linear_attn}/{ref.device}/{ref.dtype}")
    parts.append(ref.target_name)
    return " · ".join(parts)


# --------------------------------------------------------------------------- compare data


TRAIN_COLUMNS = ["series", "owner", "run_id", "key", "step", "value", "dashed", "reason"]
POINT_COLUMNS = ["series", "owner", "run_id", "train_run_id", "key", "step", "value", "low", "high", "scoring",
                 "dashed", "reason", "env"]
POSITION_COLUMNS = ["series", "owner", "run_id", "position", "rate", "dashed", "reason"]
DDTREE_COLUMNS = ["series", "owner", "run_id", "budget", "tau", "dashed", "reason"]


# How Compare titles each of its warning lists, in the legend's words (`≠ reference`, `≠ training`): the
# page and the report (report.py) say the same.
TITLES = {
    "banner": "Environment or protocol differs critically from the reference — not comparable with it (series "
              "dashed where the legend says ≠ reference):",
    "resolution_notes": "Re-evaluated as trained, not as the reference was measured:",
    "lineage_banner": "Evaluated in a different environment than trained — not the drafter as trained, drawn dashed "
                      "(≠ training):",
    "protocol_notes": "Protocol differences from the reference that do not dash a series:",
}


@dataclass
class CompareData:
    runs: list[RunInfo]
    reference: RunInfo | None
    train_curves: pd.DataFrame  # TRAIN_COLUMNS
    eval_points: pd.DataFrame  # POINT_COLUMNS
    reference_values: dict[str, float]
    accept_by_position: pd.DataFrame  # POSITION_COLUMNS
    ddtree: pd.DataFrame  # DDTREE_COLUMNS
    banner: list[str] = field(default_factory=list)  # critical differences vs the reference
    lineage_banner: list[str] = field(default_factory=list)  # evals vs their own training run
    train_metrics: list[str] = field(default_factory=list)
    eval_metrics: list[str] = field(default_factory=list)
    target_note: str | None = None  # the reference was evaluated for another target
    picked: dict[str, str] = field(default_factory=dict)  # chosen training run -> eval drawn by position/DDTree
    protocol_notes: list[str] = field(default_factory=list)  # protocol warnings/infos vs the reference
    probe_help: list[str] = field(default_factory=list)  # probe digests behind the banner's probe words
    reference_note: str = ""  # which reference number the tau line is, or why there is none
    reference_lines: tuple = ()  # compare_deltas.ReferenceLine: what the tau chart draws of the reference
    resolution_notes: list[str] = field(default_factory=list)  # re-evaluations as trained that the reference is not
    not_drawn: list[str] = field(default_factory=list)  # chosen runs and evals with no point on the step axis, and why
    not_picked: list[str] = field(default_factory=list)  # chosen training runs with no eval at the checkpoint drawn
    off_axis: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=POINT_COLUMNS))  # evals with no step

    def references(self, key: str, label: str) -> list[dict]:
        """The reference lines of one eval chart (`curve_chart.eval_spec`'s `references`), each labelled after
        `label`: on tau its matched number with its interval, one per dataset, or its own tau drawn apart; on
        another metric its value for the evals' prompts, if it has one."""
        if key == "tau":
            return [{"value": line.estimate.value, "label": label + line.label, "low": line.estimate.low,
                     "high": line.estimate.high, "apart": line.apart} for line in self.reference_lines]
        if key in self.reference_values:
            return [{"value": self.reference_values[key], "label": label, "low": None, "high": None, "apart": False}]
        return []

    def export_frame(self) -> pd.DataFrame:
        """Everything shown, long format, for the CSV download."""
        parts = []
        if not self.train_curves.empty:
            parts.append(self.train_curves.assign(chart="training curve", x_name="step"))
        if not self.eval_points.empty:
            parts.append(self.eval_points.assign(chart="eval over checkpoints", x_name="checkpoint step"))
        if not self.off_axis.empty:
            parts.append(self.off_axis.assign(chart="eval without a checkpoint step", x_name=""))
        if self.reference is not None:
            parts.append(pd.DataFrame([{"chart": "reference", "series": f"reference: {self.reference.name}",
                                        "run_id": self.reference.run_id, "key": k, "value": v}
                                       for k, v in self.reference_values.items()]))
        if not self.accept_by_position.empty:
            parts.append(self.accept_by_position.rename(columns={"position": "step", "rate": "value"})
                         .assign(chart="acceptance by position", key="accept_rate", x_name="position"))
        if not self.ddtree.empty:
            parts.append(self.ddtree.rename(columns={"budget": "step", "tau": "value"})
                         .assign(chart="ddtree vs budget", key="ddtree_tau", x_name="node budget"))
        cols = ["chart", "series", "run_id", "key", "x_name", "step", "value", "dashed", "reason"]
        if not parts:
            return pd.DataFrame(columns=cols)
        frame = pd.concat(parts, ignore_index=True)
        extra = [c for c in frame.columns if c not in cols and c != "owner"]
        return frame[[c for c in cols if c in frame.columns] + extra]


def _critical_vs(run: RunInfo, ref: RunInfo | None) -> list:
    return [] if ref is None else lineage.of_severity(lineage.vs_reference(run, ref), "critical")


def dash_reason(rows: Sequence, against: str = "reference") -> str:
    """Why a series is dashed, short enough for a legend: `≠ reference: linear-attn, dtype`; "" when not."""
    if not rows:
        return ""
    return f"≠ {against}: " + _named([lineage.field_name(r.field) for r in rows], limit=3)


def series_reason(index: RunIndex, run: RunInfo, ref: RunInfo | None) -> str:
    """The one dashing rule, for every chart: why `run`'s series is dashed, "" when it is not.

    An eval of a fingerprinted training run answers "how good is the drafter as trained?": its
    environment must match its training run's (a bf16-autocast run re-evaluated under bf16 autocast
    is solid, its fp32 eval dashed), and its protocol the reference's. Any other run (a training run,
    a reference, an eval of unknown lineage) must match the reference in both. Where a training run
    itself differs from the reference, the banner says so once for all of its series."""
    own = lineage.vs_training(index, run)
    if own is None or not own.compared:
        return dash_reason(_critical_vs(run, ref))
    if own.critical:
        return dash_reason(own.critical, "training")
    return dash_reason([r for r in _critical_vs(run, ref) if names.parse_protocol_tag(r.field)])


def env_key(run: RunInfo) -> str:
    """`fallback/cpu/fp32`, and `/drafter bf16-autocast` where the drafter was not cast to the dtype."""
    drafter = f"/drafter {run.drafter_precision}" if run.drafter_precision else ""
    return f"{run.linear_attn}/{run.device}/{run.dtype}{drafter}"


def eval_series(index: RunIndex, run: RunInfo) -> list[tuple[str, list[RunInfo]]]:
    """Eval series of a chosen run: (label, evals by step). A training run's evals split by
    environment and by the protocol fields that make taus incomparable (`lineage.series_key`); the
    label names only the parts that differ between its series."""
    if run.kind != "train":
        return [(index.eval_label(run) + compare_deltas.scoring_note(run), [run])]
    evals = current_evals(index, run)
    if not evals:
        return []
    groups: dict[tuple, list[RunInfo]] = {}
    for ev in evals:
        groups.setdefault((ev.env_hash or env_key(ev), *lineage.series_key(ev)), []).append(ev)
    label = index.label(run.run_id)
    if len(groups) == 1:
        return [(label + compare_deltas.scoring_note(evals[0]), evals)]
    keys = [(env_key(g[0]), *lineage.series_key(g[0])) for g in groups.values()]
    width = max(map(len, keys))
    keys = [k + ("",) * (width - len(k)) for k in keys]
    # Environments with one summary but different hashes (a kernel, a library version) still say so.
    varying = [i for i in range(width) if len({k[i] for k in keys}) > 1] or [0]
    return [(f"{label} [{' · '.join(k[i] for i in varying if k[i])}]", g) for k, g in zip(keys, groups.values())]


def best_evals(index: RunIndex, run: RunInfo, ref: RunInfo | None) -> list[RunInfo]:
    """A chosen run's evals, the default first: the run's default protocol (`lineage.main_series`: the one most
    of its checkpoints were measured under) before any other, then the latest evaluated checkpoint (a
    re-evaluation of an earlier one never moves the default off the drafter the run ended with); at one step,
    the run's own protocol before a side test (greedy before sampled, offline before served, more prompts before
    fewer: a 4-prompt sampled check never replaces the full greedy eval), drawn solid (`series_reason`), then the
    fewest critical differences from the reference, then from its own training run, then the newest eval."""
    if run.kind != "train":
        return [run]
    main = lineage.main_series(index, run.run_id)

    def rank(ev: RunInfo) -> tuple:
        own = lineage.vs_training(index, ev)
        return (lineage.series_key(ev) != main, -(ev.checkpoint_step or 0), _side_test(ev),
                bool(series_reason(index, ev, ref)),
                len(_critical_vs(ev, ref)), len(own.critical) if own is not None else 0, -(ev.start_time or 0))

    return sorted(current_evals(index, run), key=rank)


def checkpoint_steps(index: RunIndex, run_ids: Sequence[str]) -> dict[int, int]:
    """Each checkpoint step evaluated in any of the chosen training runs (newest first), with how many of them
    evaluated it: the choices of Compare's one "Checkpoint drawn" control."""
    counts: dict[int, int] = {}
    for run_id in run_ids:
        run = index.runs.get(run_id)
        if run is not None and run.kind == "train":
            for step in {ev.checkpoint_step for ev in current_evals(index, run) if ev.checkpoint_step is not None}:
                counts[step] = counts.get(step, 0) + 1
    return dict(sorted(counts.items(), reverse=True))


def _side_test(ev: RunInfo) -> tuple[bool, bool, int]:
    """How far an eval is from a run's main protocol: sampled before greedy, then served by an engine (its
    own series, beside the offline walk), then fewer prompts."""
    proto = lineage.protocol_of(ev)
    if proto is None:
        return (False, False, 0)
    sampled = proto.temperature != protocol.UNKNOWN and not protocol.is_greedy(proto)
    counts = proto.datasets.values() if isinstance(proto.datasets, dict) else ()
    prompts = sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool))
    return (sampled, reconcile_view.is_engine_eval(ev), -prompts)


def resolution_notes(index: RunIndex, runs: Sequence[RunInfo], ref: RunInfo | None) -> list[str]:
    """One sentence per re-evaluation that answers a chosen training run's mismatch (`lineage.resolutions`)
    yet differs critically from the reference: what differs, and the reference that matches it (the
    fewest warnings), or that none does."""
    if ref is None:
        return []
    notes = []
    for run in runs:
        if run.kind != "train":
            continue
        for _, by in lineage.resolutions(index, run):
            crit = _critical_vs(by, ref)
            if not crit:
                continue
            matching = sorted((len(lineage.of_severity(lineage.vs_reference(by, r), "warning")), r.run_id)
                              for r in index.of_kind("reference") if r.run_id != ref.run_id
                              and same_target(r.target, by.target) and not _critical_vs(by, r))
            offer = (f"{reference_label(index, index.runs[matching[0][1]])} matches it: choose it as the reference"
                     if matching else "no reference in the store matches it: evaluate one in this environment")
            fields = _named([lineage.field_name(r.field) for r in crit])
            notes.append(f"{index.eval_label(by)} is the drafter as trained, but differs from the reference "
                         f"({fields}): {offer}.")
    return list(dict.fromkeys(notes))


def current_evals(index: RunIndex, run: RunInfo) -> list[RunInfo]:
    """A training run's evals, each eval that a matching re-evaluation answered (`lineage.resolved_by`)
    collapsed into that re-evaluation: one step, one number, the one measured as trained."""
    return [ev for ev in index.evals_of(run.run_id) if lineage.resolved_by(index, ev) is None]


def target_note(index: RunIndex, runs: Sequence[RunInfo], ref: RunInfo | None) -> str | None:
    """When the reference was evaluated for another target than the chosen runs, say so: its
    numbers measure another model, whatever the environments."""
    targets = sorted({r.target_name for r in runs if r.target})
    if ref is None or not ref.target or not targets or any(same_target(ref.target, r.target) for r in runs):
        return None
    return (f"Different target: the reference {index.label(ref.run_id)} was evaluated for {ref.target_name}, "
            f"the chosen runs for {', '.join(targets)}. Its numbers describe another model: compare the shapes of "
            "the curves, not their values.")


def training_curves(index: RunIndex, run_ids: Sequence[str], reference_id: str | None,
                    histories: pd.DataFrame) -> pd.DataFrame:
    """The chosen training runs' `histories` as Compare draws them (TRAIN_COLUMNS): labelled, dashed
    by `series_reason`, other tools' metric names aliased to ours. A zoom redraws only these."""
    ref = index.get(reference_id)
    reasons = {r: series_reason(index, index.runs[r], ref) for r in train_runs_for_histories(index, run_ids)}
    curves = histories[histories["run_id"].isin(reasons)] if not histories.empty else histories
    if curves.empty:
        return pd.DataFrame(columns=TRAIN_COLUMNS)
    reason = curves["run_id"].map(reasons)
    curves = curves.assign(series=curves["run_id"].map(index.label), owner=curves["run_id"],
                           reason=reason, dashed=reason.ne(""))[TRAIN_COLUMNS]
    return recipe.alias_curves(curves, index)  # other tools' names -> ours, both shown


def compare_data(
    index: RunIndex,
    run_ids: Sequence[str],
    reference_id: str | None,
    histories: pd.DataFrame,
    results: ResultsLoader | None = None,
    step: int | None = None,
) -> CompareData:
    """Assemble the Compare page from the run index and the training runs' metric histories.

    `histories` is `metrics_sql.load_histories` of the chosen training runs (columns run_id,
    key, step, value). `results` loads eval_results.json where metrics lack the by-position data.
    `step` is the checkpoint whose acceptance by position and DDTree curves are drawn for every chosen
    training run (`best_evals`' first at that step; default: each run's `best_evals`' first).
    """
    runs = [index.runs[r] for r in run_ids if r in index.runs]
    ref = index.get(reference_id)
    banner: list[str] = []
    vs_training_lines: list[str] = []
    probe_help: list[str] = []
    ref_name = "reference"

    def note_probe(run: RunInfo, label: str, rows: Sequence) -> None:
        """The probe digests behind a banner line's probe words (a tooltip on the page)."""
        digests = lineage.probe_digests(run.fingerprint, ref.fingerprint, label, ref_name)
        if digests and any(r.field == "probe.max_rel_diff" for r in rows):
            probe_help.append(digests)

    # Training curves.
    for run in runs:
        crit = _critical_vs(run, ref) if run.kind == "train" else []
        if crit:
            banner.append(summarize_rows(crit, f"{index.label(run.run_id)} (training)", ref_name,
                                         probe=lineage.probe_words(run.fingerprint, ref.fingerprint)))
            note_probe(run, index.label(run.run_id), crit)
    train_curves = training_curves(index, run_ids, reference_id, histories)

    # Eval points by checkpoint, one series per chosen run and environment. A re-evaluation that answers
    # a mismatch but differs from the reference is said once, by its resolution note (which offers the
    # reference that matches it), not again in the banner.
    answered = {by.run_id for run in runs if run.kind == "train" for _, by in lineage.resolutions(index, run)}
    points, drawn, protocol_notes, not_drawn = [], [], [], []
    for run in runs:
        for label, evals in eval_series(index, run):
            reason = ""
            vs_ref: dict[str, list[RunInfo]] = {}  # same differences -> one banner line
            vs_train: dict[str, list[RunInfo]] = {}
            noted: dict[str, list[RunInfo]] = {}
            for ev in evals:
                crit = _critical_vs(ev, ref)
                if ref is not None:
                    minor = [r for r in lineage.matched_protocol_rows(lineage.protocol_diff(ev, ref), ev, ref)
                             if r.severity != "critical"]
                    if minor:
                        noted.setdefault(compare_deltas.protocol_text(minor), []).append(ev)
                reason = reason or series_reason(index, ev, ref)
                if crit and ev.run_id not in answered:
                    note_probe(ev, index.eval_label(ev), crit)
                    vs_ref.setdefault(summarize_rows(crit, "", ref_name,
                                                     probe=lineage.probe_words(ev.fingerprint, ref.fingerprint)),
                                      []).append(ev)
                own = lineage.vs_training(index, ev)
                if own is not None and own.critical:
                    vs_train.setdefault(own.summary("its training run"), []).append(ev)
            for text, group in vs_ref.items():
                banner.append(f"{_group_label(index, run, label, group)} (eval): {text}")
            for text, group in vs_train.items():
                vs_training_lines.append(f"{_group_label(index, run, label, group)} (eval): {text}")
            for text, group in noted.items():
                protocol_notes.append(f"{_group_label(index, run, label, group)} (eval): {text}")
            for ev in evals:
                drawn.append(ev)
                if ev.checkpoint_step is None:  # never drawn at a step it does not have; exported all the same
                    not_drawn.append(f"{index.eval_label(ev)}: no checkpoint step (it names no training run and "
                                     "step), so it is off the step axis; its numbers are in the tables below")
                bounds = _ci_bounds(ev.metrics)
                for key, value in ev.metrics.items():
                    if key in bounds["of"]:
                        continue  # drawn as the interval of its metric
                    low, high = bounds.get(key, (None, None))
                    points.append({"series": label, "owner": run.run_id, "run_id": ev.run_id,
                                   "train_run_id": ev.train_run_id, "key": key,
                                   "step": ev.checkpoint_step,
                                   "value": value, "low": low, "high": high, "scoring": compare_deltas.scoring(ev),
                                   "dashed": bool(reason), "reason": reason, "env": ev.env_badges})

    not_drawn += [f"{index.label(run.run_id)}: nothing to draw, no eval of its checkpoints yet" for run in runs
                  if run.kind == "train" and not eval_series(index, run)]

    # Acceptance by position and DDTree: one checkpoint per chosen run.
    positions, trees, picked, not_picked = [], [], {}, []
    for run in runs:
        ranked = best_evals(index, run, ref)
        if run.kind == "train" and step is not None:
            ranked = [e for e in ranked if e.checkpoint_step == step]
            if not ranked and eval_series(index, run):
                not_picked.append(f"{index.label(run.run_id)}: no eval at step {step}")
        if not ranked:
            continue
        chosen = ranked[0]
        picked[run.run_id] = chosen.run_id
        label = index.eval_label(chosen) + compare_deltas.scoring_note(chosen)
        series = eval_series(index, run) if run.kind == "train" else []
        if len(series) > 1:  # the part of its series' label that tells it from the others: ` [gsm8k]`
            label = index.eval_label(chosen) + next(s[len(index.label(run.run_id)):] for s, evs in series
                                                    if chosen in evs)
        _add_curves(positions, trees, label, run.run_id, chosen, series_reason(index, chosen, ref), results)
    reference_values, ref_tau = {}, compare_deltas.ReferenceTau(None, "")
    if ref is not None:
        ref_tau = compare_deltas.reference_tau(drawn, ref, results(ref) if results is not None else None)
        reference_values = {k: v for k, v in ref.metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)
                            and k not in _ci_bounds(ref.metrics)["of"]}
        if not ref_tau.same_sets:  # its other numbers are over other prompts: only per-dataset ones stay
            per_dataset = {names.dataset_metric(m, d) for d in lineage.datasets_of(ref) for m in ("tau", "speedup")}
            reference_values = {k: v for k, v in reference_values.items() if k in per_dataset}
        if ref_tau.estimate is not None:
            reference_values["tau"] = ref_tau.estimate.value
        _add_curves(positions, trees, f"reference: {reference_label(index, ref)}", ref.run_id, ref, "", results)

    off_axis = pd.DataFrame([p for p in points if p["step"] is None], columns=POINT_COLUMNS)
    eval_points = pd.DataFrame([p for p in points if p["step"] is not None], columns=POINT_COLUMNS)
    if not eval_points.empty:
        eval_points = eval_points.sort_values(["series", "key", "step"], ignore_index=True)
    train_keys = metric_docs.sort_metrics(train_curves["key"].unique()) if not train_curves.empty else []
    eval_keys = metric_docs.sort_metrics(set(eval_points["key"]) | set(reference_values)) if (
        not eval_points.empty or reference_values) else []
    return CompareData(
        runs=runs,
        reference=ref,
        train_curves=train_curves.reset_index(drop=True),
        eval_points=eval_points,
        reference_values=reference_values,
        accept_by_position=pd.DataFrame(positions, columns=POSITION_COLUMNS),
        ddtree=pd.DataFrame(trees, columns=DDTREE_COLUMNS),
        banner=list(dict.fromkeys(banner)),
        lineage_banner=list(dict.fromkeys(vs_training_lines)),
        train_metrics=train_keys,
        eval_metrics=eval_keys,
        target_note=target_note(index, runs, ref),
        picked=picked,
        protocol_notes=list(dict.fromkeys(protocol_notes)),
        probe_help=list(dict.fromkeys(probe_help)),
        reference_note=ref_tau.note,
        reference_lines=ref_tau.lines,
        resolution_notes=resolution_notes(index, runs, ref),
        not_drawn=not_drawn,
        not_picked=not_picked,
        off_axis=off_axis,
    )


def _ci_bounds(metrics: Mapping[str, float]) -> dict:
    """{metric: (low, high)} for each metric logged with its interval, and under "of" the
    interval metrics' own names (`tau_ci_low`, ...), which are not series of their own."""
    out: dict = {"of": set()}
    for key in metrics:
        low, high = names.ci_metrics(key)
        if low in metrics and high in metrics:
            out[key] = (metrics[low], metrics[high])
            out["of"].update((low, high))
    return out


@dataclass
class EvalTables:
    """Compare's tables beside the eval chart (`compare_deltas`): built only where they are shown,
    since they read every drawn eval's results JSON."""

    vs_reference: pd.DataFrame  # compare_deltas.REFERENCE_COLUMNS
    vs_previous: pd.DataFrame  # compare_deltas.PREVIOUS_COLUMNS
    by_dataset: pd.DataFrame  # compare_deltas.DATASET_COLUMNS
    online: pd.DataFrame  # compare_deltas.ONLINE_COLUMNS
    served: pd.DataFrame  # compare_deltas.SERVED_COLUMNS


def eval_tables(index: RunIndex, data: CompareData, results: ResultsLoader | None = None) -> EvalTables:
    """The chosen evals (a training run's: the checkpoint drawn, `data.picked`) against the
    reference per dataset; every eval series against its previous checkpoint; per-dataset results
    of the chosen evals and the reference; offline vs online tau wherever both exist."""
    chosen = [index.runs[data.picked[r.run_id]] if r.kind == "train" else r
              for r in data.runs if r.kind != "train" or r.run_id in data.picked]
    series = [s for run in data.runs for s in eval_series(index, run)]
    every = [ev for _, evals in series for ev in evals]
    shown = chosen + ([data.reference] if data.reference is not None else [])
    return EvalTables(
        vs_reference=compare_deltas.vs_reference_frame(index, chosen, data.reference, results),
        vs_previous=compare_deltas.vs_previous_frame(index, series, results),
        by_dataset=compare_deltas.by_dataset_frame(index, shown, results),
        online=compare_deltas.online_gaps(index, every, results),
        served=compare_deltas.served_gaps(index, every, results),
    )


def engines_views(index: RunIndex, data: CompareData, results: ResultsLoader) -> list[reconcile_view.EnginesView]:
    """Compare's Engines view: the engine evals among the chosen runs' series, by checkpoint and prompts."""
    every = [ev for run in data.runs for _, evals in eval_series(index, run) for ev in evals]
    return reconcile_view.engines_views(index, every, results)


def _group_label(index: RunIndex, run: RunInfo, label: str, evals: list[RunInfo]) -> str:
    """`v4 @ steps 100, 200` for evals of a chosen training run, else the eval's label."""
    if run.kind != "train":
        return index.eval_label(evals[0])
    steps = [str(e.checkpoint_step) for e in evals if e.checkpoint_step is not None]
    if not steps:
        return label
    return f"{label} @ step{'s' if len(steps) > 1 else ''} {', '.join(steps)}"


def eval_positions(run: RunInfo, results: dict | None = None) -> list[float]:
    """Acceptance rate by draft position: the accept_rate_pos family of metrics, else eval_results.json."""
    found = names.family_values(run.metrics, "accept_rate_pos")
    if found:
        return [found.get(k, math.nan) for k in range(1, max(found) + 1)]
    if results and isinstance(results.get("accept_rate_by_position"), list):
        return [float(v) for v in results["accept_rate_by_position"]]
    return []


def ddtree_points(run: RunInfo, results: dict | None = None) -> list[tuple[int, float]]:
    """(budget, DDTree tau) pairs: the ddtree_tau family of metrics, else eval_results.json."""
    found = names.family_values(run.metrics, "ddtree_tau")
    if not found and results and isinstance(results.get("ddtree"), dict):
        for budget, d in results["ddtree"].items():
            if whole_number(budget) is not None and isinstance(d, dict) and "tau" in d:
                found[whole_number(budget)] = float(d["tau"])
    return sorted(found.items())


def _add_curves(positions: list, trees: list, label: str, owner: str, run: RunInfo, reason: str,
                results: ResultsLoader | None) -> None:
    needs_results = not (names.family_values(run.metrics, "accept_rate_pos")
                         and names.family_values(run.metrics, "ddtree_tau"))
    loaded = results(run) if (needs_results and results is not None) else None
    common = {"series": label, "owner": owner, "run_id": run.run_id, "dashed": bool(reason), "reason": reason}
    for k, rate in enumerate(eval_positions(run, loaded), 1):
        positions.append({**common, "position": k, "rate": rate})
    for budget, tau in ddtree_points(run, loaded):
        trees.append({**common, "budget": budget, "tau": tau})


def without_ddtree(index: RunIndex, data: "CompareData") -> list[str]:
    """The drawn evals the DDTree chart has no curve for, each with why where it is known: a DFlash2
    drafter's selector walks one path, so DDTree (a tree over per-position candidates) is not measured
    for it; an eval may also predate DDTree or skip it (no budgets)."""
    drawn = set(data.ddtree["run_id"])
    out = []
    for eval_id in data.picked.values():
        ev = index.get(eval_id)
        if ev is None or eval_id in drawn:
            continue
        why = (" (DFlash2: its candidate selector picks one path; DDTree is measured for DFlash drafters)"
               if ev.drafter_family == DRAFTER_FAMILY_LABELS["dflash2"] else " (no DDTree budgets in this eval)")
        out.append(index.eval_label(ev) + why)
    return out


def common_budgets(trees: pd.DataFrame) -> tuple[int, int] | None:
    """The node budgets every series was measured at, as (lowest, highest); None with fewer than two
    series or nothing in common. A DDTree chart's axis spans this range, so one eval at an odd budget
    (100000) does not squeeze every curve into a corner."""
    if trees.empty or trees["series"].nunique() < 2:
        return None
    spans = trees.groupby("series")["budget"].agg(["min", "max"])
    low, high = int(spans["min"].max()), int(spans["max"].min())
    return (low, high) if low <= high else None


def outside_budgets(trees: pd.DataFrame, span: tuple[int, int] | None) -> list[str]:
    """`v2 @ step 60: 100000` for each series' budgets outside `span` (off the chart)."""
    if span is None or trees.empty:
        return []
    out = trees[(trees["budget"] < span[0]) | (trees["budget"] > span[1])]
    return [f"{series}: {', '.join(str(b) for b in part['budget'])}" for series, part in out.groupby("series", sort=False)]


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average, `s[t] = weight * s[t-1] + (1 - weight) * v[t]`, from s[0] = v[0].

    Non-finite values (NaN, inf: a diverged step) are carried past, not averaged in: the smoothed
    curve keeps its last finite value there. weight 0 returns the values unchanged."""
    out, last = [], None
    for v in values:
        if not math.isfinite(v):
            out.append(last if last is not None else v)
            continue
        last = v if last is None else weight * last + (1 - weight) * v
        out.append(last)
    return out


def run_acceptance(run: RunInfo, results: ResultsLoader | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(acceptance by position, DDTree vs budget) frames of one eval run."""
    positions, trees = [], []
    _add_curves(positions, trees, run.name, run.train_run_id or run.run_id, run, "", results)
    return pd.DataFrame(positions, columns=POSITION_COLUMNS), pd.DataFrame(trees, columns=DDTREE_COLUMNS)


def train_runs_for_histories(index: RunIndex, run_ids: Sequence[str]) -> list[str]:
    """The chosen runs whose step histories the page loads (training runs only)."""
    return [r for r in run_ids if r in index.runs and index.runs[r].kind == "train"]
