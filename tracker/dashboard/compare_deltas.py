"""Compare's numbers with their uncertainty: each eval against the reference's number for the same
dataset, each checkpoint against the one before, per-dataset results, and online- against
offline-scored tau of one checkpoint.

A reference is matched per dataset: an eval on GSM8K meets the reference's GSM8K number (a
measured reference's `by_dataset`, a published one's `tau_gsm8k`), never a pooled average of
other sets; when the reference has no number for it, the row says so. Δτ is a paired bootstrap
(`tracker.measurement.uncertainty.paired_comparison`, as `draftboard compare`) when both evals hold per-prompt
acceptance lengths for the same prompts, token for token. Otherwise each side keeps its own
interval and the verdict is drawn from them: better or worse only when the intervals do not
overlap (or, against a published number without one, when it lies outside the eval's interval).
A critical environment or protocol difference makes the verdict "not comparable".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from tracker import config
from tracker.measurement import protocol, uncertainty
from tracker.dashboard import lineage, reconcile_view
from tracker.dashboard.lineage import MISSING
from tracker.dashboard.index import RunIndex, RunInfo
from tracker.errors import DraftboardError
from tracker.store import names

ResultsLoader = Callable[[RunInfo], "dict | None"]
ONLINE = "online"
NOT_COMPARABLE = "not comparable"
NO_INTERVAL = "no interval: cannot tell"
ALL_PROMPTS = "all prompts"  # the dataset cell of an eval whose prompts carry no dataset (before protocols)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float | None = None  # 95% bootstrap bounds; None: not known (published, or before intervals)
    high: float | None = None
    n_prompts: int | None = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def text(self, signed: bool = False) -> str:
        """`3.412 [3.105, 3.702]`; `+0.210 [+0.050, +0.380]` when signed; the value alone without bounds."""
        fmt = "{:+.3f}" if signed else "{:.3f}"
        shown = fmt.format(self.value)
        return f"{shown} [{fmt.format(self.low)}, {fmt.format(self.high)}]" if self.has_interval else shown


def _label(dataset: str | None) -> str:
    return ALL_PROMPTS if dataset is None else dataset


# --------------------------------------------------------------------------- what a run measured


def scoring(run: RunInfo) -> str:
    """`offline` | `online` | `published` | `imported` | `unknown` (from the run's protocol)."""
    proto = lineage.protocol_of(run)
    return proto.scoring if proto is not None else "unknown"


def scoring_note(run: RunInfo) -> str:
    """` (online)` after the label of an online-scored eval (its tau comes from z-lab's cached loop),
    ` (served by vllm)` after an engine eval's (its blocks are the engine's steps), and the sampling
    of a sampled one (` (T=1 top_p=0.95 top_k=20 x16)`): its tau is an expectation over draws."""
    how = scoring(run)
    proto = lineage.protocol_of(run)
    sampled = proto is not None and proto.temperature != protocol.UNKNOWN and not protocol.is_greedy(proto)
    notes = [ONLINE] if how == ONLINE else []
    if how == config.ENGINE_SCORING:
        notes.append(f"served by {run.params.get('engine') or 'an engine'}")
    if sampled:
        notes.append(protocol.sampling_text(proto))
    return f" ({', '.join(notes)})" if notes else ""


def overall(run: RunInfo) -> Estimate | None:
    """The run's tau with its logged interval (`tau_ci_low/_high`), None when it logged no tau."""
    tau = run.metrics.get("tau")
    if not _finite(tau):
        return None
    low_name, high_name = names.ci_metrics("tau")
    low, high = run.metrics.get(low_name), run.metrics.get(high_name)
    counts = list(lineage.datasets_of(run).values())
    n = sum(counts) if counts and all(isinstance(c, int) for c in counts) else None
    return Estimate(float(tau), low if _finite(low) else None, high if _finite(high) else None, n)


def dataset_estimates(run: RunInfo, results: Mapping | None = None) -> dict[str | None, Estimate]:
    """tau per dataset the run measured: its results' `by_dataset`, a published reference's
    `tau_<dataset>` metrics, or, for a single dataset, the run's own tau. Key None: a run whose
    datasets are unknown (its tau over all its prompts); never a pooled tau of named sets."""
    out: dict[str | None, Estimate] = {}
    by_dataset = (results or {}).get("by_dataset")
    if isinstance(by_dataset, Mapping):
        for name, entry in by_dataset.items():
            ci = entry.get("ci") if isinstance(entry, Mapping) else None
            if isinstance(entry, Mapping) and _finite(entry.get("tau")):
                low, high = ci if isinstance(ci, (list, tuple)) and len(ci) == 2 else (None, None)
                out[str(name)] = Estimate(float(entry["tau"]), low, high, entry.get("n_prompts"))
    datasets = lineage.datasets_of(run)
    whole = overall(run)
    if len(datasets) == 1 and whole is not None:
        out.setdefault(next(iter(datasets)), whole)
    for name, count in datasets.items():
        metric = names.dataset_metric("tau", name)
        value = run.metrics.get(metric)
        if name not in out and _finite(value):
            low, high = (run.metrics.get(bound) for bound in names.ci_metrics(metric))  # a published interval
            known = _finite(low) and _finite(high)
            out[name] = Estimate(float(value), low if known else None, high if known else None,
                                 count if isinstance(count, int) else None)
    if not datasets and whole is not None:
        out[None] = whole
    return out


def per_prompt(results: Mapping | None, dataset: str | None) -> dict[str, dict] | None:
    """{prompt id: record} of one dataset's prompts (None: every prompt) in a results JSON; None
    when the results hold no per-prompt scores (a walk, or sampled draws)."""
    records = (results or {}).get("prompts")
    if not isinstance(records, list):
        return None
    out = {str(r["id"]): r for r in records if isinstance(r, Mapping) and "id" in r
           and uncertainty.prompt_score(r) is not None and (dataset is None or r.get("dataset") == dataset)}
    return out or None


def same_prompts(a: Mapping[str, dict] | None, b: Mapping[str, dict] | None) -> bool:
    """Both hold the same prompt ids with the same token ids (where recorded): one prompt set."""
    if not a or not b or set(a) != set(b):
        return False
    return all(a[k].get("input_ids") == b[k].get("input_ids") for k in a)


# --------------------------------------------------------------------------- one comparison


@dataclass(frozen=True)
class Delta:
    delta: Estimate | None  # this - other
    verdict: str  # uncertainty.BETTER | WORSE | NO_DIFFERENCE | NOT_COMPARABLE ... | NO_INTERVAL
    how: str  # how the interval and verdict were drawn


def _unpaired(this: Estimate, other: Estimate) -> Delta:
    delta = Estimate(this.value - other.value)
    if this.has_interval and other.has_interval:
        how = "intervals of each side (not the same prompts: no paired test)"
        if this.low > other.high:
            return Delta(delta, uncertainty.BETTER, how)
        if this.high < other.low:
            return Delta(delta, uncertainty.WORSE, how)
        return Delta(delta, uncertainty.NO_DIFFERENCE, how)
    if this.has_interval:  # a published number: no interval of its own
        how = "the eval's interval against a number without one"
        return Delta(delta, uncertainty.verdict(uncertainty.Interval(delta.value, this.low - other.value,
                                                                     this.high - other.value)), how)
    return Delta(delta, NO_INTERVAL, "no interval logged (an eval from before intervals)")


def compare(this: Estimate, other: Estimate, this_prompts: Mapping[str, dict] | None = None,
            other_prompts: Mapping[str, dict] | None = None, critical: Sequence[str] = ()) -> Delta:
    """Δτ = this - other with its interval and a plain verdict (see the module docstring).

    `critical`: names of critical differences between the two runs; any makes them not comparable."""
    if critical:
        return Delta(Estimate(this.value - other.value), f"{NOT_COMPARABLE}: {', '.join(dict.fromkeys(critical))}",
                     "a critical environment or protocol difference")
    if same_prompts(this_prompts, other_prompts):
        try:
            paired = uncertainty.paired_comparison(
                {k: uncertainty.prompt_score(r) for k, r in other_prompts.items()},
                {k: uncertainty.prompt_score(r) for k, r in this_prompts.items()})
        except DraftboardError:  # no scored block on either side: nothing to pair
            return _unpaired(this, other)
        d = paired.delta
        return Delta(Estimate(d.value, d.low, d.high, paired.n_prompts), paired.verdict,
                     f"paired bootstrap over {paired.n_prompts} prompts")
    return _unpaired(this, other)


def _critical_names(rows: Sequence | None) -> list[str]:
    return [lineage.field_name(r.field) for r in lineage.of_severity(rows, "critical")]


# --------------------------------------------------------------------------- tables

REFERENCE_COLUMNS = ["eval", "dataset", "prompts", "tau", "reference tau", "delta tau", "verdict", "how",
                     "protocol", "run_id"]
PREVIOUS_COLUMNS = ["series", "step", "eval", "previous step", "dataset", "tau", "previous tau", "delta tau",
                    "verdict", "how", "run_id"]
DATASET_COLUMNS = ["run", "dataset", "prompts", "tau", "95% interval", "scoring", "run_id"]
ONLINE_COLUMNS = ["checkpoint", "offline tau", "online tau", "online - offline", "from"]
SERVED_COLUMNS = ["checkpoint", "offline eval", "engine mean acceptance length", "offline tau", "gap", "pooling",
                  "end of generation", "acceptance", "numerics", "unexplained", "hybrid", "verdict"]


def protocol_text(rows: Sequence, b_name: str = "reference") -> str:
    """`🔴 critical: temperature 0.0 vs reference: 1.0; 🟠 warning: max new tokens 64 vs reference: 2048`."""
    return "; ".join(f"{lineage.severity_label(r.severity)}: {lineage.field_name(r.field)} "
                     f"{lineage.value_text(r.a_value)} vs {b_name}: {lineage.value_text(r.b_value)}" for r in rows)


def reference_gap(index: RunIndex, ev: RunInfo, ref: RunInfo, results: ResultsLoader | None = None) -> list[dict]:
    """One row per dataset of `ev`: its tau, the reference's number for that dataset, Δτ and verdict."""
    ev_results = results(ev) if results else None
    ref_results = results(ref) if results else None
    mine, theirs = dataset_estimates(ev, ev_results), dataset_estimates(ref, ref_results)
    env_critical = _critical_names(lineage.env_diff(ev, ref))
    rows = []
    for dataset, est in mine.items():
        row = {"eval": index.eval_label(ev) + scoring_note(ev), "dataset": _label(dataset),
               "prompts": est.n_prompts, "tau": est.text(), "run_id": ev.run_id}
        other = theirs.get(dataset)
        if other is None:
            reported = ", ".join(_label(d) for d in theirs)
            rows.append({**row, "reference tau": MISSING, "delta tau": MISSING, "how": "", "protocol": "",
                         "verdict": f"no reference number for {_label(dataset)}: " + (
                             f"the reference reports {reported}; evaluate this checkpoint on "
                             f"{'it' if len(theirs) == 1 else 'one of them'} to compare" if reported
                             else "the reference reports no tau at all")})
            continue
        a, b = per_prompt(ev_results, dataset), per_prompt(ref_results, dataset)
        paired = same_prompts(a, b)
        proto = lineage.matched_protocol_rows(lineage.protocol_diff(ev, ref), ev, ref, same_prompts=paired)
        gap = compare(est, other, a, b, env_critical + _critical_names(proto))
        rows.append({**row, "reference tau": other.text(), "delta tau": gap.delta.text(signed=True),
                     "verdict": gap.verdict, "how": gap.how, "protocol": protocol_text(proto)})
    return rows


def vs_reference_frame(index: RunIndex, evals: Sequence[RunInfo], ref: RunInfo | None,
                       results: ResultsLoader | None = None) -> pd.DataFrame:
    """The "vs reference" table: each eval, per dataset, against the reference's number for it."""
    rows = [] if ref is None else [row for ev in evals for row in reference_gap(index, ev, ref, results)]
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS).astype({"prompts": "Int64"})


def told_apart(index: RunIndex, runs: Sequence[RunInfo]) -> dict[str, str]:
    """Each run's eval label, with its short id where another of `runs` has the same label (two evals of one step:
    a repeat, a re-evaluation, another protocol), so that their rows never read alike."""
    labels = {r.run_id: index.eval_label(r) for r in runs}
    seen = Counter(labels.values())
    return {run_id: f"{label} ({run_id[:6]})" if seen[label] > 1 else label for run_id, label in labels.items()}


def vs_previous_frame(index: RunIndex, series: Sequence[tuple[str, Sequence[RunInfo]]],
                      results: ResultsLoader | None = None) -> pd.DataFrame:
    """The "vs previous checkpoint" table: each eval of a series against an eval of the previous step
    (its latest, where a step was evaluated twice), per dataset both measured. `series`: (label, evals by step), as `compare.eval_series` gives."""
    rows = []
    for label, evals in series:
        ordered = sorted((e for e in evals if e.checkpoint_step is not None), key=lambda e: e.checkpoint_step)
        loaded = {e.run_id: results(e) if results else None for e in ordered}
        named = told_apart(index, ordered)
        # "Previous" is the previous step: a second eval of a step is never its own predecessor.
        latest_at: dict[int, RunInfo] = {e.checkpoint_step: e for e in ordered}
        steps = sorted(latest_at)
        pairs = [(latest_at[steps[steps.index(cur.checkpoint_step) - 1]], cur) for cur in ordered
                 if steps.index(cur.checkpoint_step) > 0]
        for prev, cur in pairs:
            before, after = dataset_estimates(prev, loaded[prev.run_id]), dataset_estimates(cur, loaded[cur.run_id])
            critical = (_critical_names(lineage.env_diff(cur, prev))
                        + _critical_names(lineage.protocol_diff(cur, prev)))
            for dataset in [d for d in after if d in before]:
                gap = compare(after[dataset], before[dataset], per_prompt(loaded[cur.run_id], dataset),
                              per_prompt(loaded[prev.run_id], dataset), critical)
                rows.append({"series": label, "step": cur.checkpoint_step, "eval": named[cur.run_id],
                             "previous step": prev.checkpoint_step,
                             "dataset": _label(dataset), "tau": after[dataset].text(),
                             "previous tau": before[dataset].text(), "delta tau": gap.delta.text(signed=True),
                             "verdict": gap.verdict, "how": gap.how, "run_id": cur.run_id})
    return pd.DataFrame(rows, columns=PREVIOUS_COLUMNS).astype({"step": "Int64", "previous step": "Int64"})


def by_dataset_frame(index: RunIndex, runs: Sequence[RunInfo], results: ResultsLoader | None = None) -> pd.DataFrame:
    """Per-dataset tau of each run with its interval, grouped by dataset (then run). Cells are text, so what
    a publication does not state reads as such (never an empty `None` cell)."""
    rows, named = [], told_apart(index, runs)
    for run in runs:
        published = scoring(run) == "published"
        for dataset, est in dataset_estimates(run, results(run) if results else None).items():
            interval = (f"[{est.low:.3f}, {est.high:.3f}]" if est.has_interval
                        else "none published" if published else "not computed")
            rows.append({"run": named[run.run_id], "dataset": _label(dataset),
                         "prompts": str(est.n_prompts) if est.n_prompts is not None else "not stated",
                         "tau": f"{est.value:.3f}", "95% interval": interval, "scoring": scoring(run),
                         "run_id": run.run_id})
    frame = pd.DataFrame(rows, columns=DATASET_COLUMNS)
    return frame.sort_values(["dataset", "run"], kind="stable", ignore_index=True)


def _checkpoint_key(run: RunInfo) -> tuple | None:
    if run.train_run_id and run.checkpoint_step is not None:
        return run.train_run_id, run.checkpoint_step
    return (run.checkpoint_sha256 or run.checkpoint,) if (run.checkpoint_sha256 or run.checkpoint) else None


def online_gaps(index: RunIndex, evals: Sequence[RunInfo], results: ResultsLoader | None = None) -> pd.DataFrame:
    """Offline vs online tau of one checkpoint, wherever both exist: an online eval's own offline
    numbers (its results' `offline` section), and an online eval beside an offline one of the same
    checkpoint, the same prompts and no critical environment difference."""
    rows = []
    offline_by_key: dict[tuple, list[RunInfo]] = {}
    for ev in evals:
        if scoring(ev) == "offline" and _checkpoint_key(ev) is not None:
            offline_by_key.setdefault(_checkpoint_key(ev), []).append(ev)
    for ev in evals:
        if scoring(ev) != ONLINE or not _finite(ev.metrics.get("tau")):
            continue
        online = ev.metrics["tau"]
        own = ((results(ev) if results else None) or {}).get("offline")
        if isinstance(own, Mapping) and _finite(own.get("tau")):
            rows.append({"checkpoint": index.eval_label(ev), "offline tau": own["tau"], "online tau": online,
                         "online - offline": online - own["tau"], "from": "the online eval's own offline score"})
        for other in offline_by_key.get(_checkpoint_key(ev), []) if _checkpoint_key(ev) else []:
            # the scoring is what this table sets side by side; every other series field must match
            rows_between = [*(lineage.env_diff(ev, other) or ()),
                            *(r for r in lineage.protocol_diff(ev, other) if r.field != names.protocol_tag("scoring"))]
            if _finite(other.metrics.get("tau")) and not lineage.of_severity(rows_between, "critical"):
                rows.append({"checkpoint": index.eval_label(ev), "offline tau": other.metrics["tau"],
                             "online tau": online, "online - offline": online - other.metrics["tau"],
                             "from": f"offline eval {index.label(other.run_id)}"})
    return pd.DataFrame(rows, columns=ONLINE_COLUMNS)


# --------------------------------------------------------------------------- the chart's reference line


@dataclass(frozen=True)
class ReferenceLine:
    """One reference number drawn across the eval-by-checkpoint tau chart."""

    estimate: Estimate
    label: str  # what the number is, after the reference's own label: ` · gsm8k`, or its protocol when apart
    apart: bool = False  # not the evals' prompts: drawn in its own style as shape only, never a verdict


@dataclass(frozen=True)
class ReferenceTau:
    estimate: Estimate | None  # the reference's number to draw against the chosen evals' tau (one dataset, or the same)
    note: str  # what that number is, or plainly why there is none
    same_sets: bool = False  # the reference ran on the evals' very datasets: its other numbers compare too
    lines: tuple[ReferenceLine, ...] = ()  # every line to draw: the estimate's, or one per dataset, or one apart


def reference_tau(evals: Sequence[RunInfo], ref: RunInfo | None, ref_results: Mapping | None = None) -> ReferenceTau:
    """The reference number the eval-by-checkpoint chart draws as tau: the reference's number for
    the one dataset every drawn eval ran on, or its tau when both ran on the same sets; never a
    pooled average of other sets drawn as the evals' number. Evals on several datasets get the reference's
    number for each dataset it reports, each line named by its dataset; where none matches, the reference's
    own tau is drawn apart, labelled with its prompts and protocol (issue 65 M6), so the shapes can be compared."""
    if ref is None or not evals:
        return ReferenceTau(None, "")
    theirs = dataset_estimates(ref, ref_results)
    sets = {frozenset(lineage.datasets_of(ev)) for ev in evals}
    reported = ", ".join(_label(d) for d in theirs) or "none"
    if len(sets) > 1:
        shown = "; ".join(sorted(", ".join(sorted(s)) or ALL_PROMPTS for s in sets))
        matched = sorted({next(iter(s)) for s in sets if len(s) == 1 and next(iter(s)) in theirs})
        if matched:
            lines = tuple(ReferenceLine(theirs[d], f" · {_label(d)}") for d in matched)
            return ReferenceTau(None, f"Reference tau: one line per dataset ({', '.join(map(_label, matched))}): the "
                                      f"chosen evals ran on different datasets ({shown}); each meets the reference's "
                                      "number for its own dataset.", lines=lines)
        return _apart(ref, f"the chosen evals ran on different datasets ({shown}), none of which the reference "
                           f"reports (it reports {reported})")
    (mine,) = sets
    ref_sets = frozenset(lineage.datasets_of(ref))
    # A publication's average is over its columns, not its prompts: never drawn against an eval's tau.
    if mine == ref_sets and overall(ref) is not None and (mine or None in theirs) and (
            len(mine) <= 1 or not ref.published):
        what = "the same datasets" if mine else "prompts without dataset labels, as the chosen evals"
        return ReferenceTau(overall(ref), f"Reference tau: measured on {what}.", same_sets=True,
                            lines=(ReferenceLine(overall(ref), ""),))
    if len(mine) == 1 and next(iter(mine)) in theirs:
        (dataset,) = mine
        return ReferenceTau(theirs[dataset], f"Reference tau: its {dataset} number (the chosen evals ran on {dataset}).",
                            lines=(ReferenceLine(theirs[dataset], ""),))
    ran = ", ".join(sorted(mine)) or "prompts without a dataset label"
    return _apart(ref, f"the chosen evals ran on {ran}; the reference reports tau for {reported}")


def _apart(ref: RunInfo, why: str) -> ReferenceTau:
    """No reference number matches the evals' prompts (`why`): its own tau, where it logged one, drawn apart as shape
    only, labelled with the prompts and protocol it was measured under."""
    own = overall(ref)
    if own is None:
        return ReferenceTau(None, f"No reference number matches: {why}. It logged no tau of its own to draw apart.")
    proto = lineage.protocol_of(ref)
    sets = ", ".join(_label(d) for d in lineage.datasets_of(ref))
    words = [(f"avg over {sets}" if ref.published else f"on {sets}") if sets else "on its own prompts"]
    if proto is not None and proto.max_new_tokens != protocol.UNKNOWN:
        words.append(f"{proto.max_new_tokens} tok")
    if proto is not None and proto.temperature != protocol.UNKNOWN:
        words.append(protocol.sampling_text(proto, draws=False))
    line = ReferenceLine(own, f" · {' · '.join(words)} · other prompts: shape only", apart=True)
    return ReferenceTau(None, f"No reference number matches: {why}. Its own tau ({' · '.join(words)}) is drawn "
                              "apart, grey and dashed, to compare the curves' shapes, not their values.",
                        lines=(line,))


def served_gaps(index: RunIndex, evals: Sequence[RunInfo], results: ResultsLoader | None = None) -> pd.DataFrame:
    """Each engine eval against every offline eval of the same checkpoint and prompts: the gap between
    the engine's number and the offline tau, in the parts `tracker.measurement.reconcile` takes it apart into."""
    rows = []
    engine_evals = [ev for ev in evals if results is not None and reconcile_view.is_engine_eval(ev)]
    named = told_apart(index, engine_evals)  # two engine evals of one step: never two rows alike
    for ev in engine_evals:
        partners = reconcile_view.offline_partners(index, ev)
        partner_named = told_apart(index, partners)
        for other in partners:
            try:
                r = reconcile_view.report(ev, other, results)
            except DraftboardError:
                continue  # results another tool wrote, or damaged: Run detail says why
            if r is not None:
                rows.append({"checkpoint": named[ev.run_id] + scoring_note(ev),
                             "offline eval": partner_named[other.run_id],
                             "engine mean acceptance length": r["engine_mean_acceptance_length"],
                             "offline tau": r["offline_tau"], "gap": r["gap"],
                             **{k.replace("_", " "): v for k, v in r["parts"].items()},
                             "unexplained": r["unexplained"], "hybrid": reconcile_view.hybrid_words(r),
                             "verdict": r["verdict"]})
    return pd.DataFrame(rows, columns=SERVED_COLUMNS)
