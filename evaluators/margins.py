"""How close the offline drafter came where its walk and an engine's part: its logit margin at the
first draft position where the two accepted counts differ (`draftboard reconcile --margins`).

At that position one of the two accepted the target's token and the other did not. The margin is
read off the offline drafter's logits there, in logits (nats of the unnormalised score):
- offline rejected it: top logit - the target token's logit (how far the target's token was from
  winning);
- offline accepted it: top logit - the runner-up's (how far the drafter was from rejecting).
A margin near 0 is a near-tie, which another kernel's rounding can flip: numerics. A wide one means
the drafter saw another context there (layer mapping, cache state).

A DFlash2 drafter chooses among its selector's top-k candidates by their scores given the previous
token, so its margin is read off those scores (the previous token being the completion's, as its
walk saw it); a target token outside the candidates could not be drafted at all, and its margin
is how far its logit was from entering them (the k-th logit minus its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields

import torch

from evaluators.harness import Progress, load_pair, quiet
from evaluators.settings import EvalSettings
from evaluators.target import layer_hidden_states_batch, load_target
from tracker.environment import fingerprint
from tracker.errors import DraftboardError


@dataclass(frozen=True)
class Margin:
    value: float  # in logits, >= 0
    accepts: bool  # the drafter's top token there is the target's (it accepts that position)


@dataclass(frozen=True)
class MarginAsk:
    prompt_id: str
    completion_ids: list[int]  # as both evals produced it (equal completions)
    anchor: int  # completion-relative anchor of the block
    position: int  # 0-based draft position in the block where the accepted counts part


def settings_of(results: dict) -> EvalSettings:
    """The offline eval's own settings (its results' `settings`): the same target, drafter, prompts,
    dtype, precision and kernel path, so the margins are of the drafter that eval measured."""
    settings = results.get("settings")
    if not isinstance(settings, dict) or not all(isinstance(settings.get(k), str) for k in ("target", "drafter",
                                                                                            "prompts")):
        raise DraftboardError("the offline eval's results have no settings (target, drafter, prompts) to "
                              "recompute its drafter's logits from")
    known = {f.name for f in fields(EvalSettings)} - {"completions", "cache_dir", "batch_size", "anchor_chunk"}
    values = {k: v for k, v in settings.items() if k in known}
    values["budgets"] = tuple(values.get("budgets") or (8,))
    return EvalSettings(**values)


def _margin(drafter, hidden: torch.Tensor, logits: torch.Tensor, ask: MarginAsk, wanted: int) -> Margin:
    """The margin at ask.position of one block: hidden [1, B, H], logits [1, B-1, V]."""
    row = logits[0, ask.position].float()  # [V]
    if drafter.candidate_selector is not None:
        before = ask.completion_ids[ask.anchor: ask.anchor + ask.position + 1]  # each position's predecessor
        predecessors = torch.tensor([before], device=logits.device)
        candidates, scores = drafter.candidate_selector.teacher_forced(
            hidden[:, 1: ask.position + 2], logits[:, : ask.position + 1], predecessors)
        candidates, scores = candidates[0, ask.position], scores[0, ask.position].float()  # [K]
        if not (candidates == wanted).any():
            return Margin(float(row[candidates].min() - row[wanted]), False)
        row = torch.full_like(row, float("-inf")).scatter_(0, candidates, scores)
    top2 = torch.topk(row, 2)
    top = int(top2.indices[0])
    return Margin(float(top2.values[0] - (row[wanted] if top != wanted else top2.values[1])), top == wanted)


@torch.no_grad()
def block_margins(s: EvalSettings, asks: Sequence[MarginAsk], progress: Progress = quiet) -> list[Margin | None]:
    """The offline drafter's margin at each ask (None where the position lies past the completion)."""
    device = s.device or fingerprint.default_device()
    pair = load_pair(s, device, progress)
    by_id = {p.id: p for p in pair.prompts}
    loaded, precision = pair.loaded, pair.precision
    drafter = loaded.model
    layers = list(drafter.target_layer_ids)
    target = load_target(s.target, device, s.dtype, s.linear_attn)  # its features, as the offline eval saw them
    lm_head = (loaded.own_lm_head if loaded.own_lm_head is not None else target.lm_head_weight).to(drafter.device)
    embed = target.embed_weight.to(drafter.device)
    out: list[Margin | None] = []
    for i, ask in enumerate(asks, 1):
        prompt = by_id.get(ask.prompt_id)
        if prompt is None:
            raise DraftboardError(f"prompt {ask.prompt_id!r} is not in {s.prompts}: not the offline eval's prompts")
        token = ask.anchor + 1 + ask.position
        if token >= len(ask.completion_ids):
            out.append(None)
            continue
        seq = prompt.input_ids + ask.completion_ids[: ask.anchor + 1]
        feats = layer_hidden_states_batch(target, [seq], layers)[0]
        ctx = torch.cat([feats[k] for k in layers], dim=-1)[None].to(drafter.device, torch.float32)
        anchor = torch.tensor([len(prompt.input_ids) + ask.anchor], device=drafter.device)
        first = torch.tensor([ask.completion_ids[ask.anchor]], device=drafter.device)
        with precision.context(drafter.device) if precision else nullcontext():
            hidden = drafter.forward_anchors(ctx, anchor, drafter.block_embeddings(first, embed))
            logits = drafter.logits(hidden, lm_head)  # [1, B-1, V]
        out.append(_margin(drafter, hidden, logits, ask, ask.completion_ids[token]))
        progress("drafter: margins", i, len(asks))
    return out
