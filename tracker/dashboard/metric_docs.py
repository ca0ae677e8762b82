"""What each metric means: the definitions the dashboard shows as tooltips and captions.

The eval metrics follow DESIGN.md ("Metric names"); training metrics keep the names the
trainer logs. `describe(name)` knows the fixed names, the per-position and per-budget
families (built and parsed by `tracker.store.names`), the per-benchmark names of published
tables, and falls back to a generic entry for anything else a trainer logs. Standard library and
draftboard's own name and escaping modules only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tracker.dashboard.escape import md, md_code
from tracker.store import names


@dataclass(frozen=True)
class MetricDoc:
    name: str
    title: str
    unit: str  # what a value counts, e.g. "tokens / block"
    definition: str
    higher_is_better: bool | None = None

    @property
    def label(self) -> str:
        """Axis label: `tau (tokens / block)`."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    @property
    def plain_definition(self) -> str:
        """The definition where Markdown is not rendered (a table cell): code spans without their backticks."""
        return self.definition.replace("`", "")

    def help(self) -> str:
        """Markdown for a tooltip (the name is a trainer's, so it is escaped)."""
        better = {True: " Higher is better.", False: " Lower is better.", None: ""}[self.higher_is_better]
        unit = f" Unit: {self.unit}." if self.unit else ""
        return f"**{md(self.title)}** ({md_code(self.name)}): {self.definition}{unit}{better}"


_WALK = ("along the walk at temperature 0 (a block starts at an anchor holding the last verified token; "
         "the next anchor is the anchor + the acceptance length), as z-lab's `dflash_generate` does")

_FIXED = {
    "tau": MetricDoc(
        "tau", "Mean acceptance length", "tokens / block",
        "mean acceptance length per drafted block " + _WALK + "; acceptance length = 1 + the number of "
        "leading draft tokens equal to the target's greedy tokens (max block_size). Averaged per prompt, "
        "then over prompts (z-lab's macro average). Equals the online speculative loop at T=0.",
        True),
    "tau_pooled": MetricDoc(
        "tau_pooled", "Mean acceptance length, pooled", "tokens / block",
        "the same walk as `tau`, averaged over all blocks of all prompts (long prompts weigh more).",
        True),
    "tau_all_anchors": MetricDoc(
        "tau_all_anchors", "Acceptance length over every anchor", "tokens / block",
        "mean acceptance length over every anchor position of the completion, not just the walk's anchors "
        "(the training-style statistic; differs from `tau`).", True),
    "streak": MetricDoc(
        "streak", "Accepted draft tokens per block", "tokens / block",
        "`tau` - 1: draft tokens accepted per block, the target's bonus token excluded. A trainer's `streak` "
        "is its own running estimate of the same quantity on training data.", True),
    "loss": MetricDoc("loss", "Training loss", "nats / token",
                      "the drafter's training loss as logged by the trainer (cross-entropy over the masked "
                      "block positions).", False),
    "acc": MetricDoc("acc", "Training token accuracy", "fraction",
                     "fraction of masked block positions whose argmax equals the label, as logged by the "
                     "trainer.", True),
    names.DECODING_SPEEDUP: MetricDoc(
        names.DECODING_SPEEDUP, "Decoding speedup (z-lab's)", "× vs target alone",
        "z-lab benchmark.py's \"Decoding speedup\": the mean over prompts of the target alone's time per output "
        "token over the mean with the drafter, one request at a time, each timed from its first token (`--scoring "
        "online` times both loops in one process; an imported z-lab log keeps the one it printed). Depends on the "
        "hardware: compare it only within one environment.", True),
    "lr": MetricDoc("lr", "Learning rate", "", "the optimizer's learning rate at this step."),
    "grad_norm": MetricDoc("grad_norm", "Gradient norm", "", "global gradient norm before clipping."),
    **{name: MetricDoc(name, *rest) for name, *rest in (
        # Training diagnostics other trainers log (SpecForge, Automodel; tracker/store/adoption.py): all on
        # recorded training blocks, none of them tau.
        ("accept_len", "Training-block acceptance length", "tokens / block",
         "1 + the leading draft tokens equal to the recorded labels, along the path the drafter proposes (the "
         "selector's for DFlash2), averaged over training blocks, as the trainer logs it. A training diagnostic "
         "on recorded text, not `tau`: no walk, no target decoding, no eval sampling.", True),
        ("base_accept_len", "Training-block acceptance length, unary path", "tokens / block",
         "`accept_len` along the per-position argmax (unary) path, without the DFlash2 selector.", True),
        ("selector_loss", "DFlash2 selector loss", "nats / token",
         "cross-entropy of the DFlash2 candidate selector over the target's top-K candidates, weighted as the "
         "trainer weights it.", False),
        ("base_loss", "DFlash2 base loss", "nats / token",
         "the unary draft head's block cross-entropy, beside `selector_loss`.", False),
        ("base_acc", "DFlash2 base accuracy", "fraction", "token accuracy of the unary draft head's argmax.", True),
        ("candidate_recall", "Candidate recall", "fraction",
         "fraction of supervised slots whose label is among the unary top-K candidates (the selector can only "
         "pick those).", True),
        ("gold_chain_length", "Gold-probability chain length", "tokens / block",
         "1 + Σ_j Π_{i≤j} q_i(label_i) on recorded training blocks (SpecForge's D-PACE surrogate): an acceptance "
         "length expected under the drafter's own probabilities, not a measured one.", True),
        ("overlap_chain_length", "Teacher-overlap chain length", "tokens / block",
         "1 + Σ_j Π_{i≤j} (1 - TV(q_i, p_i)) on recorded blocks, with the target's distributions p.", True),
        ("gold_probability", "Gold probability", "probability",
         "the drafter's full-softmax probability of the recorded label, averaged over supervised slots.", True),
        ("selector_covered_acc", "DFlash2 selector accuracy, covered slots", "fraction",
         "fraction of the slots whose label is among the unary top-K candidates where the selector, given the "
         "recorded predecessor (teacher-forced), picks the label (SpecForge's `teacher_forced_covered_accuracy`).",
         True),
        ("selector_marginal_acc", "DFlash2 selector accuracy, own path", "fraction",
         "fraction of all supervised slots where the selector's greedy path, conditioned on its own earlier "
         "picks, picks the label (SpecForge's `self_conditioned_marginal_accuracy`).", True),
        ("selector_gold_probability", "DFlash2 selector gold probability", "probability",
         "the selector's probability of the label over the top-K candidates, on covered slots, teacher-forced.",
         True),
        # speculators' `eal` was redefined in 0.9.0 (tracker/store/adoption.py): three names, never one series.
        ("eal", "Expected accepted length (speculators >= 0.9.0)", "tokens / block",
         "per training block, the leading draft slots equal to the labels plus the bonus token, averaged over "
         "blocks (vLLM's convention). A training diagnostic on recorded text, not `tau`.", True),
        ("eal_marginal", "Expected accepted length, no bonus (speculators 0.7-0.8)", "tokens / block",
         "Σ_k Π_{i≤k} acc_i over the drafted positions, from per-position accuracies averaged over the batch: no "
         "bonus token and no correlation between slots, so about 1 below the 0.9.0 `eal` of the same drafter.",
         True),
        ("eal_unversioned", "Expected accepted length, speculators release unknown", "tokens / block",
         "speculators' `eal` from a run that does not say its release: before 0.9.0 without the bonus token, "
         "from 0.9.0 with it. Set the release (`draftboard adopt RUN --tool-version V`) to draw it beside "
         "others.", True),
    )},
}


def _accept_rate(k: int) -> MetricDoc:
    return MetricDoc(
        names.accept_rate_metric(k), f"Acceptance rate at draft position {k}", "fraction of blocks",
        f"fraction of blocks along the walk whose draft token {k} was accepted (position 1 is the first "
        "masked position after the anchor). Decreases with the position: a draft is accepted only if all "
        "before it are.", True)


def _ddtree_tau(b: int) -> MetricDoc:
    return MetricDoc(
        names.ddtree_tau_metric(b), f"DDTree acceptance length, budget {b}", "tokens / block",
        f"DDTree (Ringel & Romano 2026) acceptance length with a node budget of {b}, along its own walk: a "
        f"best-first tree of the {b} most probable prefixes from the drafter's per-position log-softmax; "
        "acceptance = 1 + the longest prefix of the target's greedy continuation that is a root path.", True)


def _dds(b: int) -> MetricDoc:
    return MetricDoc(
        names.dds_metric(b), f"DDTree accepted drafts, budget {b}", "tokens / block",
        f"`{names.ddtree_tau_metric(b)}` - 1: draft tokens accepted per block by DDTree at node budget {b} (bonus "
        "token excluded). A trainer's `dds` is its own estimate on training data.", True)


# The eval families of tracker.store.names, by the family name `names.parse_metric` returns.
_FAMILIES = {"accept_rate_pos": _accept_rate, "ddtree_tau": _ddtree_tau, "dds": _dds}

# Per-benchmark columns of imported publication tables (tracker.store.importers.published), and the
# 95% bounds logged beside a number (`tau_ci_low`, a published `tau_gsm8k_ci_high`).
_BENCHMARKS = [
    (re.compile(r"^(.+_ci_(?:low|high))$"), lambda name: _bound(name)),
    (re.compile(r"^(ctx\d{1,8}_(?:engine_)?tau)$"), lambda name: _context(name)),
    (re.compile(r"^tau_(?!pooled$|all_anchors$)([a-z0-9_]+)$"), lambda bench: MetricDoc(
        f"tau_{bench}", f"Mean acceptance length on {bench}", "tokens / block",
        f"`tau` on the {bench} prompts alone (e.g. a published table's per-benchmark column).", True)),
    (re.compile(r"^speedup_([a-z0-9_]+)$"), lambda bench: MetricDoc(
        f"speedup_{bench}", f"Speedup on {bench}", "× vs target alone",
        f"end-to-end decoding speedup over the target alone on the {bench} prompts, as published (depends on "
        "hardware and backend, not comparable with local acceptance numbers).", True)),
]

# Ordering of metric names in pickers: the headline numbers first.
PREFERRED_ORDER = ["tau", "loss", "acc", "streak", "tau_pooled", "tau_all_anchors"]


def _context(name: str) -> MetricDoc:
    start, curve = names.parse_context_metric(name)
    what = "the offline walk's blocks" if curve == "tau" else "the engine's steps"
    return MetricDoc(name, f"Mean acceptance length from {start} tokens of context", "tokens / block",
                     f"the acceptance length of {what} whose context (prompt + completion tokens up to the block's "
                     f"anchor) lies in the bucket starting at {start} tokens, pooled over prompts (results "
                     f"`{'tau_by_context' if curve == 'tau' else 'engine_tau_by_context'}`; the bucket's end is the "
                     "eval's next edge). Buckets of evals with other edges are other buckets.", True)


def _bound(name: str) -> MetricDoc:
    of, side = name.rsplit("_ci_", 1)
    return MetricDoc(name, f"95% interval, {side} bound, of {of}", describe(of).unit,
                     f"the {side} bound of the 95% interval of `{of}` (draftboard's: a percentile bootstrap over "
                     "prompts; a published one: as its source printed it).")


def describe(name: str) -> MetricDoc:
    """The definition of a metric; unknown names get a generic entry."""
    if name in _FIXED:
        return _FIXED[name]
    family = names.parse_metric(name)
    if family is not None:
        return _FAMILIES[family[0]](family[1])
    for pattern, make in _BENCHMARKS:
        match = pattern.match(name)
        if match:
            return make(match.group(1))
    return MetricDoc(name, name, "", "logged by the trainer under this name; draftboard has no definition for it.")


def help_text(name: str) -> str:
    return describe(name).help()


def family(name: str) -> str | None:
    """`accept_rate_pos`, `ddtree_tau` or `dds` for a member of an eval family, else None."""
    parsed = names.parse_metric(name)
    return parsed[0] if parsed else None


def family_help(family_name: str) -> str:
    """The tooltip of a whole family, shown with a sample member (position 1, budget 8)."""
    return _FAMILIES[family_name](1 if family_name == "accept_rate_pos" else 8).help()


def sort_metrics(names) -> list[str]:
    """Headline metrics first, then families in numeric order, then the rest alphabetically."""

    def key(name: str):
        if name in PREFERRED_ORDER:
            return (0, PREFERRED_ORDER.index(name), "", 0)
        match = re.match(r"^(.*?)(\d+)$", name)
        if match:
            return (1, 0, match.group(1), int(match.group(2)))
        return (2, 0, name, 0)

    return sorted(set(names), key=key)


def glossary() -> list[MetricDoc]:
    """The documented metrics, for a glossary table (families shown with a sample index)."""
    return [*_FIXED.values(), *(make(1 if name == "accept_rate_pos" else 8) for name, make in _FAMILIES.items())]
