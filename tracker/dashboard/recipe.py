"""Foreign runs on the dashboard: their recipes side by side, their curves under our names, their step unit.

- `config_view`: Compare's Config view. Each chosen run's recipe (its training run's, for an
  eval) next to a reference recipe (`adoption.recipe_diff`): one row per key, grouped, aliased
  across tools (the column `logged as` names each tool's own key where it differs from ours),
  with severities and reasons; the DFlash recipe keys are marked. The lint rules come with
  their reasons.
- `alias_curves`: training curves of runs another tool wrote, under our metric names
  (`adoption.canonical_metric`), the tool's own name kept in the series label (legend and
  tooltip), and config that a tool logged as step-0 metrics left out (it is a recipe, not a curve), as is
  a tool's step metric (the x axis, `history.on_step_metric`).
- `step_unit` / `step_axis_title`: what one logged step counts (`adoption.StepSemantics`), for
  axis titles and the Runs table.

Everything here is data shaping; the pages render it (values are user-written: st.dataframe shows
them as text, anything put in Markdown goes through `escape.md`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from tracker.dashboard.index import RunIndex, RunInfo
from tracker.dashboard.lineage import MISSING, severity_background, severity_label
from tracker.store import adoption, names

DFLASH_MARK = "★"  # before a DFlash recipe key: block size, target layers, mask token, loss, anchors, ...
_PLURAL = {"micro-batch": "micro-batches", "optimizer step": "optimizer steps"}


def run_view(run: RunInfo) -> adoption.RunView:
    """What adoption reads of an indexed run. The index already carries the tool tag (written by
    `draftboard adopt`, or added in memory when the run was listed), so the experiment name is
    not needed again."""
    return adoption.RunView(run.run_id, "", run.params, run.metrics, run.tags, run.name)


def tool_of(run: RunInfo) -> str | None:
    """The training stack that wrote the run; None for draftboard's own runs and unknown ones."""
    tool = run.tags.get(names.TOOL)
    return None if tool == adoption.DRAFTBOARD else tool


# --------------------------------------------------------------------------- step unit


def step_unit(run: RunInfo) -> str:
    """What one logged step of the run counts: `micro-batch` or `optimizer step`."""
    tool = run.tags.get(names.TOOL) or adoption.DRAFTBOARD
    spec = adoption.TOOLS.get(tool)
    return run.tags.get(names.STEP_UNIT) or (spec.steps.unit if spec else adoption.TOOLS[adoption.DRAFTBOARD].steps.unit)


def step_unit_note(run: RunInfo) -> str:
    """` · step = micro-batch` for a run another tool wrote (its step may not be ours), else ""."""
    return f" · step = {step_unit(run)}" if run.tags.get(names.STEP_UNIT) else ""


def step_axis_title(index: RunIndex, run_ids: Sequence[str]) -> str:
    """`training step (optimizer steps)`; with mixed units, which runs count what."""
    by_unit: dict[str, list[str]] = {}
    for run_id in run_ids:
        run = index.get(run_id)
        if run is not None and run.kind == "train":
            by_unit.setdefault(step_unit(run), []).append(index.label(run_id))
    if len(by_unit) <= 1:
        unit = next(iter(by_unit), adoption.TOOLS[adoption.DRAFTBOARD].steps.unit)
        return f"training step ({_PLURAL.get(unit, unit)})"
    return "training step (" + "; ".join(f"{_PLURAL.get(u, u)}: {', '.join(labels)}"
                                          for u, labels in sorted(by_unit.items())) + ")"


# --------------------------------------------------------------------------- aliased curves


def alias_curves(curves: pd.DataFrame, index: RunIndex) -> pd.DataFrame:
    """Curves (columns run_id, key, series, ...) with foreign runs' metrics under our names.

    `train/accuracy` of a SpecForge run becomes `acc`, its series `train_dflash · train/accuracy`,
    so it shares the `acc` chart with our runs and both names show. Config logged as metrics
    (speculators' `dflash/block_size`) and step metrics are dropped; names without an alias stay as logged.
    """
    tools = {run_id: tool_of(index.runs[run_id]) for run_id in curves["run_id"].unique()
             if run_id in index.runs} if not curves.empty else {}
    tools = {run_id: tool for run_id, tool in tools.items() if tool}
    versions = {run_id: index.runs[run_id].tags.get(names.TOOL_VERSION) for run_id in tools}
    if not tools:
        return curves
    pairs = curves.loc[curves["run_id"].isin(tools), ["run_id", "key"]].drop_duplicates()
    renamed, dropped = {}, set()
    for run_id, key in pairs.itertuples(index=False):
        if not adoption.is_curve(tools[run_id], key):
            dropped.add((run_id, key))
            continue
        alias = adoption.canonical_metric(tools[run_id], key, versions[run_id])
        if alias.canonical is not None and alias.canonical != key:
            renamed[(run_id, key)] = alias.canonical
    if not renamed and not dropped:
        return curves
    pair = pd.Series(list(zip(curves["run_id"], curves["key"])), index=curves.index)
    out = curves[~pair.isin(dropped)].copy()
    pair = pair[out.index]
    hit = pair.isin(renamed)
    out.loc[hit, "series"] = out.loc[hit, "series"] + " · " + out.loc[hit, "key"]
    out.loc[hit, "key"] = pair[hit].map(renamed)
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------- config view


def recipe_run(index: RunIndex, run: RunInfo) -> RunInfo:
    """The run whose recipe stands for `run`: an eval's training run where it is known."""
    if run.kind != "train":
        train = index.train_of(run)
        if train is not None:
            return train
    return run


def recipe_runs(index: RunIndex, run_ids: Sequence[str]) -> list[RunInfo]:
    """The training runs behind the chosen runs, each once, in the order chosen."""
    out: dict[str, RunInfo] = {}
    for run_id in run_ids:
        run = index.get(run_id)
        if run is not None:
            owner = recipe_run(index, run)
            out.setdefault(owner.run_id, owner)
    return list(out.values())


@dataclass
class ConfigView:
    reference_id: str
    table: pd.DataFrame  # one row per recipe key; see `config_view`
    lints: pd.DataFrame  # run, severity, key, reason
    severities: pd.Series  # the table's severity per row (critical | warning | info | same), for colouring
    counts: dict[str, int]  # severity -> number of differing keys (all of them, whatever is shown)

    def styled(self):
        """The table with differing rows coloured by severity (for st.dataframe)."""
        colors = [severity_background(s) for s in self.severities]
        return self.table.style.apply(lambda row: [colors[row.name]] * len(row), axis=1)

    @property
    def critical_keys(self) -> list[str]:
        """The keys whose difference makes the runs' acceptance numbers incomparable."""
        return [key.removeprefix(f"{DFLASH_MARK} ") for key, severity in zip(self.table["key"], self.severities)
                if severity == "critical"]

    @property
    def summary(self) -> str:
        """`2 keys differ: 1 critical, 1 info` (every differing key, shown or not)."""
        total = sum(self.counts.values())
        if not total:
            return "same recipe as the reference"
        parts = ", ".join(f"{n} {severity}" for severity, n in self.counts.items() if n)
        return f"{total} key{'s' if total > 1 else ''} differ{'' if total > 1 else 's'}: {parts}"


_FIXED_COLUMNS = ("group", "key", "severity", "reference", "reason", "logged as")


def default_reference(index: RunIndex, run_ids: Sequence[str], compare_reference: str | None) -> str | None:
    """The recipe the Config view starts from: the training run behind Compare's reference where
    it is known (a reference eval of a training run of ours), else the first chosen run's."""
    ref = index.get(compare_reference)
    if ref is not None and index.train_of(ref) is not None:
        return index.train_of(ref).run_id
    runs = recipe_runs(index, run_ids)
    return runs[0].run_id if runs else None


def reference_choices(index: RunIndex, run_ids: Sequence[str], compare_reference: str | None
                      ) -> tuple[list[str], str | None]:
    """(the recipes the Config view may diff against, the default): the chosen runs' training runs,
    and the training run behind Compare's reference where there is one."""
    default = default_reference(index, run_ids, compare_reference)
    ids = [r.run_id for r in recipe_runs(index, run_ids)]
    return (ids if default is None or default in ids else [default, *ids]), default


def _severity_cell(severity: str) -> str:
    """`🔴 critical`; empty for a key that is the same."""
    return "" if severity == "same" else severity_label(severity)


def _cell(value: str | None) -> str:
    return MISSING if value is None else value


def config_view(index: RunIndex, run_ids: Sequence[str], reference_id: str, diff_only: bool = True) -> ConfigView:
    """The recipes of `run_ids` (their training runs) next to the recipe of `reference_id`.

    Table columns: `group`, `key` (★ marks a DFlash recipe key), `severity`, `reference`, one column
    per run (its label), `reason`, `logged as` (the tools' own keys, where any differs from ours).
    Rows: differences only unless `diff_only` is False; grouped DFlash keys first, then by severity.
    """
    ref = index.runs[reference_id]
    runs = [r for r in recipe_runs(index, run_ids) if r.run_id != reference_id]
    diff = adoption.recipe_diff([run_view(r) for r in runs], run_view(ref))
    labels = {r.run_id: index.label(r.run_id) for r in (ref, *runs)}
    for run_id, label in labels.items():  # a run named `reason` gets a column of its own
        if label in _FIXED_COLUMNS:
            labels[run_id] = f"{label} ({run_id[:6]})"
    rows, severities = [], []
    for row in diff.shown(diff_only):
        own = {s for s in (row.reference_source, *row.sources.values()) if s and s != row.key}
        record = {"group": row.group, "key": f"{DFLASH_MARK} {row.key}" if row.highlighted else row.key,
                  "severity": _severity_cell(row.severity), "reference": _cell(row.reference)}
        record.update({labels[run_id]: _cell(value) for run_id, value in row.values.items()})
        record.update({"reason": row.reason, "logged as": ", ".join(sorted(own))})
        rows.append(record)
        severities.append(row.severity)
    columns = ["group", "key", "severity", "reference", *(labels[r.run_id] for r in runs), "reason", "logged as"]
    lints = pd.DataFrame([{"run": labels.get(lint.run_id, lint.run_id), "severity": _severity_cell(lint.severity),
                           "key": lint.key, "reason": lint.message} for lint in diff.lints],
                         columns=["run", "severity", "key", "reason"])
    counts = {s: sum(r.severity == s for r in diff.rows) for s in ("critical", "warning", "info")}
    return ConfigView(reference_id, pd.DataFrame(rows, columns=columns), lints, pd.Series(severities, dtype=object),
                      counts)
