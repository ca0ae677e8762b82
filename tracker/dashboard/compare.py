"""The Compare page's data: curves of chosen runs against a reference, and where they are not comparable.

- Training curves: every logged step of the chosen training runs (`metrics_sql`, optionally
  downsampled for plotting).
- Eval curves: the eval runs of each chosen training run (tag `draftboard.train_run_id`),
  one point per checkpoint step (tag `draftboard.checkpoint_step`); evals of one training run
  made in different environments form separate series, so a re-evaluation shows next to the
  original instead of zig-zagging one line.
- The reference: its eval metrics as horizontal lines; its acceptance by position and DDTree
  points as their own series.
- Environment: every eval series, every training run and the reference are diffed against the
  reference's fingerprint; a critical difference makes the series dashed and puts a line in
  the banner naming the fields (`v4 @ step 200: linear-attn fallback vs reference: fast`).

`closest_reference` picks the default reference: one evaluated for the same target, with the
fewest critical, then warning, differences from the chosen runs' eval environments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from tracker.dashboard import lineage, metric_docs
from tracker.dashboard.index import RunIndex, RunInfo, same_target
from tracker.dashboard.lineage import summarize_rows
from tracker.store import names

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
            evals = index.evals_of(run.run_id)
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
        return ReferenceChoice(None, message="no reference runs in the store yet (evaluate one with "
                                             "`draftboard eval ... --reference NAME`)")
    same = [ref for ref in refs if any(same_target(ref.target, t) for t in targets)]
    if not same:
        names = ", ".join(sorted({r.target_name for r in runs if r.target})) or "the chosen runs' target"
        return ReferenceChoice(None, message=f"no reference was evaluated for {names}; the references in the "
                                             "store belong to other targets")
    anchors = anchor_runs(index, runs)
    scored = []
    for ref in same:
        crit = warn = 0
        for anchor in anchors:
            rows = lineage.env_diff(anchor, ref)
            if rows is None:
                warn += 1
                continue
            crit += len(lineage.of_severity(rows, "critical"))
            warn += len(lineage.of_severity(rows, "warning"))
        # Measured references before published ones at equal scores; then the newest.
        scored.append(((crit, warn, ref.published, -(ref.start_time or 0)), ref))
    scored.sort(key=lambda s: s[0])
    (crit, warn, _, _), best = scored[0]
    label = index.label(best.run_id)
    if crit:
        message = (f"no reference matches the chosen runs' environment: the closest, {label}, has {crit} critical "
                   f"difference(s)")
    elif best.published:
        message = f"{label} (published numbers: its environment is mostly unknown; {warn} warning(s))"
    else:
        message = f"{label}: same target, closest environment ({warn} warning difference(s), none critical)"
    return ReferenceChoice(best.run_id, crit, warn, message, matches=crit == 0,
                           candidates=tuple(s[1].run_id for s in scored))


def reference_label(index: RunIndex, ref: RunInfo) -> str:
    """`z-lab v1 · published · Qwen3.5-4B` for pickers."""
    parts = [ref.reference_name or index.label(ref.run_id)]
    if ref.published:
        parts.append("published")
    else:
        parts.append(f"{ref.linear_attn}/{ref.device}/{ref.dtype}")
    parts.append(ref.target_name)
    return " · ".join(parts)


# --------------------------------------------------------------------------- compare data


@dataclass
class CompareData:
    runs: list[RunInfo]
    reference: RunInfo | None
    train_curves: pd.DataFrame  # series, run_id, key, step, value, dashed
    eval_points: pd.DataFrame  # series, run_id, train_run_id, key, step, value, dashed, env
    reference_values: dict[str, float]
    accept_by_position: pd.DataFrame  # series, run_id, position, rate, dashed
    ddtree: pd.DataFrame  # series, run_id, budget, tau, dashed
    banner: list[str] = field(default_factory=list)  # critical differences vs the reference
    lineage_banner: list[str] = field(default_factory=list)  # evals vs their own training run
    train_metrics: list[str] = field(default_factory=list)
    eval_metrics: list[str] = field(default_factory=list)

    def export_frame(self) -> pd.DataFrame:
        """Everything shown, long format, for the CSV download."""
        parts = []
        if not self.train_curves.empty:
            parts.append(self.train_curves.assign(chart="training curve", x_name="step"))
        if not self.eval_points.empty:
            parts.append(self.eval_points.assign(chart="eval over checkpoints", x_name="checkpoint step"))
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
        if not parts:
            return pd.DataFrame(columns=["chart", "series", "run_id", "key", "x_name", "step", "value", "dashed"])
        frame = pd.concat(parts, ignore_index=True)
        cols = ["chart", "series", "run_id", "key", "x_name", "step", "value", "dashed"]
        extra = [c for c in frame.columns if c not in cols]
        return frame[[c for c in cols if c in frame.columns] + extra]


def _critical_vs(run: RunInfo, ref: RunInfo | None) -> list:
    return [] if ref is None else lineage.of_severity(lineage.env_diff(run, ref), "critical")


def _env_key(run: RunInfo) -> str:
    return f"{run.linear_attn}/{run.device}/{run.dtype}"


def eval_series(index: RunIndex, run: RunInfo) -> list[tuple[str, list[RunInfo]]]:
    """Eval series of a chosen run: (label, evals by step). A training run's evals split by environment."""
    if run.kind != "train":
        return [(index.eval_label(run), [run])]
    evals = index.evals_of(run.run_id)
    if not evals:
        return []
    groups: dict[str, list[RunInfo]] = {}
    for ev in evals:
        groups.setdefault(ev.env_hash or _env_key(ev), []).append(ev)
    label = index.label(run.run_id)
    if len(groups) == 1:
        return [(label, evals)]
    return [(f"{label} [{_env_key(g[0])}]", g) for g in groups.values()]


def compare_data(
    index: RunIndex,
    run_ids: Sequence[str],
    reference_id: str | None,
    histories: pd.DataFrame,
    results: ResultsLoader | None = None,
) -> CompareData:
    """Assemble the Compare page from the run index and the training runs' metric histories.

    `histories` is `metrics_sql.load_histories` of the chosen training runs (columns run_id,
    key, step, value). `results` loads eval_results.json where metrics lack the by-position data.
    """
    runs = [index.runs[r] for r in run_ids if r in index.runs]
    ref = index.get(reference_id)
    banner: list[str] = []
    vs_training_lines: list[str] = []
    ref_name = "reference"

    # Training curves.
    train_runs = [r for r in runs if r.kind == "train"]
    dashed_train = {}
    for run in train_runs:
        crit = _critical_vs(run, ref)
        dashed_train[run.run_id] = bool(crit)
        if crit:
            banner.append(summarize_rows(crit, f"{index.label(run.run_id)} (training)", ref_name))
    curves = histories[histories["run_id"].isin(dashed_train)] if not histories.empty else histories
    if curves.empty:
        train_curves = pd.DataFrame(columns=["series", "run_id", "key", "step", "value", "dashed"])
    else:
        train_curves = curves.assign(series=curves["run_id"].map(index.label),
                                     dashed=curves["run_id"].map(dashed_train).astype(bool))
        train_curves = train_curves[["series", "run_id", "key", "step", "value", "dashed"]]

    # Eval points, by-position and DDTree series.
    points, positions, trees = [], [], []
    for run in runs:
        for label, evals in eval_series(index, run):
            crit_any = False
            vs_ref: dict[str, list[RunInfo]] = {}  # same differences -> one banner line
            vs_train: dict[str, list[RunInfo]] = {}
            for ev in evals:
                crit = _critical_vs(ev, ref)
                if crit:
                    crit_any = True
                    vs_ref.setdefault(summarize_rows(crit, "", ref_name), []).append(ev)
                own = lineage.vs_training(index, ev)
                if own is not None and own.critical:
                    vs_train.setdefault(own.summary("its training run"), []).append(ev)
            for text, group in vs_ref.items():
                banner.append(f"{_group_label(index, run, label, group)} (eval): {text}")
            for text, group in vs_train.items():
                vs_training_lines.append(f"{_group_label(index, run, label, group)} (eval): {text}")
            for ev in evals:
                for key, value in ev.metrics.items():
                    points.append({"series": label, "run_id": ev.run_id, "train_run_id": ev.train_run_id,
                                   "key": key, "step": ev.checkpoint_step if ev.checkpoint_step is not None else 0,
                                   "value": value, "dashed": crit_any, "env": ev.env_badges})
            last = evals[-1]
            _add_curves(positions, trees, f"{label} @ step {last.checkpoint_step}" if run.kind == "train"
                        and last.checkpoint_step is not None else label, last, crit_any, results)
    reference_values = {}
    if ref is not None:
        reference_values = {k: v for k, v in ref.metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        _add_curves(positions, trees, f"reference: {reference_label(index, ref)}", ref, False, results)

    eval_points = pd.DataFrame(points, columns=["series", "run_id", "train_run_id", "key", "step", "value",
                                                "dashed", "env"])
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
        accept_by_position=pd.DataFrame(positions, columns=["series", "run_id", "position", "rate", "dashed"]),
        ddtree=pd.DataFrame(trees, columns=["series", "run_id", "budget", "tau", "dashed"]),
        banner=list(dict.fromkeys(banner)),
        lineage_banner=list(dict.fromkeys(vs_training_lines)),
        train_metrics=train_keys,
        eval_metrics=eval_keys,
    )


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
            if str(budget).isdigit() and isinstance(d, dict) and "tau" in d:
                found[int(budget)] = float(d["tau"])
    return sorted(found.items())


def _add_curves(positions: list, trees: list, label: str, run: RunInfo, dashed: bool,
                results: ResultsLoader | None) -> None:
    needs_results = not (names.family_values(run.metrics, "accept_rate_pos")
                         and names.family_values(run.metrics, "ddtree_tau"))
    loaded = results(run) if (needs_results and results is not None) else None
    for k, rate in enumerate(eval_positions(run, loaded), 1):
        positions.append({"series": label, "run_id": run.run_id, "position": k, "rate": rate, "dashed": dashed})
    for budget, tau in ddtree_points(run, loaded):
        trees.append({"series": label, "run_id": run.run_id, "budget": budget, "tau": tau, "dashed": dashed})


def run_acceptance(run: RunInfo, results: ResultsLoader | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(acceptance by position, DDTree vs budget) frames of one eval run."""
    positions, trees = [], []
    _add_curves(positions, trees, run.name, run, False, results)
    return (pd.DataFrame(positions, columns=["series", "run_id", "position", "rate", "dashed"]),
            pd.DataFrame(trees, columns=["series", "run_id", "budget", "tau", "dashed"]))


def train_runs_for_histories(index: RunIndex, run_ids: Sequence[str]) -> list[str]:
    """The chosen runs whose step histories the page loads (training runs only)."""
    return [r for r in run_ids if r in index.runs and index.runs[r].kind == "train"]


def default_selection(index: RunIndex, limit: int = 3) -> list[str]:
    """The newest training runs (at most `limit`), else the newest evals."""
    trains = [r.run_id for r in index.of_kind("train")][:limit]
    return trains or [r.run_id for r in index.of_kind("eval")][:limit]
