"""An eval's shares -> its results JSON: the walks of every share back in the prompts' order, then every pooled number
(tau, streak, DDTree, the context curves, the intervals over prompts) computed once over all of them.

A one-process eval has one share (evaluators.harness.score_share); `--shards N` has one per shard process
(evaluators.shards), which differ only in which prompts they scored. Pooling never averages per shard: a sharded
eval's numbers are exactly one process's on the same prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from evaluators.prompts import Prompt
from evaluators.sampling import expected_length
from evaluators.scoring import Walked, summarize, summarize_sampled
from evaluators.settings import EvalSettings
from tracker.errors import DraftboardError
from tracker.measurement import context
from tracker.measurement.protocol import UNKNOWN, prompt_digest
from tracker.measurement.protocol import lengths as protocol_lengths
from tracker.measurement.uncertainty import draws_interval, results_uncertainty

SCHEMA = "draftboard.eval/1"


@dataclass
class Share:
    """One process's share of an eval: its prompts scored, and everything pooling them needs. A one-process eval has
    one share; `--shards N` one per shard process (evaluators.shards carries each as JSON, `to_json`)."""

    shard: int  # 0 for a one-process eval
    of: int  # how many shards split the prompts (1: one process)
    walked: list[Walked]  # prompt-major: `samples` continuations per prompt when sampled
    protocol: dict  # eval_protocol of this share's prompts
    fingerprint: dict
    resolution: dict  # the target's linear_attn.Resolution.to_dict()
    timing: dict  # load_s, target_s, fingerprint_s, drafter_s, loaded, heads_held
    sized: dict  # batch_size and anchor_chunk as sized for this share's device
    budgets: list[int]
    ddtree_skipped: str | None
    block: int
    target: dict  # path, content_digest, num_layers
    drafter: dict  # path, source, target_layer_ids, mask_token_id, family
    node: str = ""  # where it ran: this host's name, or the Ray node's id for a shard run as a Ray task

    def to_json(self) -> dict:
        return {**asdict(self), "walked": [w.to_json() for w in self.walked]}

    @classmethod
    def from_json(cls, data: dict) -> "Share":
        return cls(**{**data, "walked": [Walked.from_json(w) for w in data["walked"]]})


def pool(s: EvalSettings, shares: list[Share], online: Callable[[dict], None] | None = None) -> dict:
    """The results JSON of an eval from its shares: their walks put back in the prompts' order, then every pooled
    number computed once over all of them, exactly as one process computes it (never averaged per shard).
    `online`: `--scoring online`'s loop, run on the results before the curves and intervals read them."""
    first = shares[0]
    per_prompt = 1 if s.sampling.greedy else s.samples  # continuations per prompt
    walked = _in_prompt_order(shares, per_prompt)
    if not any(w.n_anchors for w in walked):
        raise DraftboardError("no completion has a token to anchor a block (every one stopped at once)")
    block, budgets = first.block, tuple(first.budgets)
    if s.sampling.greedy:
        results = {"schema": SCHEMA, **summarize(walked, block, budgets, s.last_block)}
    else:
        results = {"schema": SCHEMA, **summarize_sampled(walked, s.samples, block, s.last_block)}
        results["monte_carlo"] = monte_carlo(results["prompts"], s.samples)
    if first.ddtree_skipped:
        results["ddtree_skipped"] = first.ddtree_skipped
    if online is not None:
        online(results)
    if s.sampling.greedy:  # the walks as scored (online: the loop's)
        results.update(_by_context(walked, results["prompts"], s.context_buckets))
    elif s.scoring == "offline":  # in expectation, like its tau (online, its tau is the runs' mean: no curve)
        results.update(_by_context_sampled(walked, s.samples, s.context_buckets))
    results.update(results_uncertainty(results["prompts"]))
    prompts = [w.prompt for w in walked[::per_prompt]]
    results["protocol"] = {**first.protocol, **prompt_fields(prompts)}
    results.update({
        "fingerprint": first.fingerprint,
        "timing": {k: (sum(sh.timing[k] for sh in shares) if k.endswith("_s") else first.timing[k])
                   for k in first.timing},
        "settings": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(s).items()},
                     **first.sized},  # as sized for this device
        "target": {**first.target, "linear_attention": first.resolution},
        "drafter": first.drafter,
    })
    return results


def _in_prompt_order(shares: list[Share], per_prompt: int) -> list[Walked]:
    """Every share's continuations in the order one process holds them: prompt i is the (i // of)-th prompt of
    shard i % of."""
    of = shares[0].of
    groups = {sh.shard: [sh.walked[j:j + per_prompt] for j in range(0, len(sh.walked), per_prompt)] for sh in shares}
    total = sum(map(len, groups.values()))
    return [w for i in range(total) for w in groups[i % of][i // of]]


def _by_context(walked: list[Walked], rows: list[dict], edges: tuple[int, ...]) -> dict:
    """`tau_by_context` of the walks and `tau_all_anchors_by_context` of every anchor (tracker.measurement.context),
    over `edges` or octaves of the walks' contexts."""
    edges, by_walk = context.by_walks([(len(r["input_ids"]), r["acceptance_lengths"]) for r in rows], edges)
    anchors = [(context.anchor_contexts(len(w.input_ids), w.n_anchors), [int(a) for a in w.chain[:w.n_anchors]])
               for w in walked]
    return {"context_buckets": list(edges), "tau_by_context": by_walk,
            "tau_all_anchors_by_context": context.by_context(anchors, edges)}


def _by_context_sampled(walked: list[Walked], draws: int, edges: tuple[int, ...]) -> dict:
    """A sampled eval's curves in expectation, like its tau: each continuation's anchors weighted by the probability
    that its walk puts a block there, at that block's expected length (sampling.expected_walk), a prompt's draws
    averaged; every anchor's expected length for the all-anchors curve."""
    walks, anchors = [], []
    for start in range(0, len(walked), draws):
        group, n = walked[start:start + draws], len(walked[start].input_ids)
        walk: tuple[list, list, list] = ([], [], [])
        every: tuple[list, list, list] = ([], [], [])
        for w in group:
            walk[0].extend(context.anchor_contexts(n, w.end))
            walk[1].extend(w.expected.lengths)
            walk[2].extend(v / len(group) for v in w.expected.visits)
            every[0].extend(context.anchor_contexts(n, w.n_anchors))
            every[1].extend(map(expected_length, w.ratios[:w.n_anchors]))
            every[2].extend([1 / len(group)] * w.n_anchors)
        walks.append(walk)
        anchors.append(every)
    edges = edges or context.default_edges(c for contexts, _, weights in walks
                                           for c, weight in zip(contexts, weights) if weight > 0)
    return {"context_buckets": list(edges), "tau_by_context": context.by_context(walks, edges),
            "tau_all_anchors_by_context": context.by_context(anchors, edges)}


def monte_carlo(rows: list[dict], draws: int) -> dict:
    """The interval of a sampled tau over its draws alone, the prompts held fixed."""
    per_prompt = [[d["tau"] for d in row["samples"] if d["tau"] is not None] for row in rows]
    return {"draws_per_prompt": draws, "tau_ci_given_prompts": draws_interval(per_prompt).bounds()}


def prompt_fields(prompts: list[Prompt]) -> dict:
    """The protocol's fields that describe the prompts themselves: each set's count, their digest and lengths."""
    datasets: dict[str, int] = {}
    for p in prompts:
        datasets[p.dataset or UNKNOWN] = datasets.get(p.dataset or UNKNOWN, 0) + 1
    return {"datasets": datasets, "prompt_digest": prompt_digest(p.input_ids for p in prompts),
            "prompt_lengths": protocol_lengths(p.input_ids for p in prompts)}
