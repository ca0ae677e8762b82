"""Which hidden states the drafter was trained on: z-lab's `hidden_states[layer_id + 1]` or the
off-by-one `hidden_states[layer_id]` (vLLM #42505, fixed by PR #42704).

`output_hidden_states` holds the embeddings at 0 and decoder layer i's output at i + 1 (the last
one after the final norm); z-lab's `extract_context_feature` reads `layer_id + 1`. A drafter
trained, or served, one layer off sees features of the wrong depth and accepts far less than it
can. The check scores the same drafter on the same greedy continuations twice, once with each
convention, and compares the two taus prompt by prompt (a paired bootstrap): the convention the
drafter was trained on is clearly better.
"""

from __future__ import annotations

import math

import torch

from evaluators import metrics
from evaluators.doctor.report import CRITICAL, OK, WARNING, Check
from evaluators.drafter import LoadedDrafter, Precision
from evaluators.prompts import Prompt
from evaluators.scoring import Walked, completion_bounds, score_anchors
from evaluators.target import Target, greedy_continuations
from tracker.measurement.uncertainty import BETTER, WORSE, paired_comparison

NAME = "layer_offset"
ZLAB, OFF_BY_ONE = 1, 0  # the index offset into output_hidden_states of tapped layer i


@torch.no_grad()
def _walks(target: Target, loaded: LoadedDrafter, prompts: list[list[int]], max_new_tokens: int,
           batch_size: int, precision: Precision | None) -> dict[int, dict[str, list[int]]]:
    """{offset: {prompt index: the greedy walk's acceptance lengths}} for both conventions."""
    block, layers = loaded.model.block_size, list(loaded.model.target_layer_ids)
    stops = set(target.stop_token_ids())
    conts = greedy_continuations(target, prompts, max_new_tokens + block - 1, block - 1, batch_size)
    walks: dict[int, dict[str, list[int]]] = {ZLAB: {}, OFF_BY_ONE: {}}
    for i, (prompt, cont) in enumerate(zip(prompts, conts)):
        completion, n = completion_bounds(cont, max_new_tokens, stops)
        end = metrics.walk_end(len(completion), n, n < len(completion), "full")
        states = target.model(torch.tensor([prompt + completion[:n]], device=target.device),
                              output_hidden_states=True).hidden_states
        for offset in walks:
            context = torch.cat([states[layer + offset][0] for layer in layers], dim=-1).float().cpu()
            w = Walked(Prompt(str(i), prompt), completion, n, max_new_tokens, end)
            score_anchors(loaded, target, w, context, cont, (), precision=precision)
            walks[offset][str(i)] = metrics.walk(w.walk_lengths(), end)
    return walks


def prompts_needed(n_prompts: int, delta) -> int | None:
    """About how many prompts would make the paired interval of `delta` (a Δτ over `n_prompts`
    prompts, with its 95% interval) exclude zero, as its half-width shrinks with 1/sqrt(n); None
    when the two conventions drafted alike (a zero difference no sample size resolves)."""
    half = (delta.high - delta.low) / 2
    if abs(delta.value) < 1e-9:
        return None
    return max(n_prompts + 1, math.ceil(n_prompts * (half / abs(delta.value)) ** 2))


def check(target: Target, loaded: LoadedDrafter, prompts: list[list[int]], max_new_tokens: int = 64,
          batch_size: int = 8, prompts_from: str = "the doctor's default prompts",
          precision: Precision | None = None) -> Check:
    walks = _walks(target, loaded, prompts, max_new_tokens, batch_size, precision)
    taus = {o: metrics.summarize_walks(list(w.values()), loaded.model.block_size).tau for o, w in walks.items()}
    shifted = paired_comparison(walks[ZLAB], walks[OFF_BY_ONE])  # tau(off by one) - tau(z-lab)
    d = shifted.delta
    layers = list(loaded.model.target_layer_ids)
    evidence = (f"tau with hidden_states[layer_id + 1] (z-lab) {taus[ZLAB]:.3f}, with hidden_states[layer_id] "
                f"{taus[OFF_BY_ONE]:.3f}: off-by-one minus z-lab {d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}] "
                f"(paired bootstrap over {shifted.n_prompts} prompts: {prompts_from}, {max_new_tokens} new tokens; "
                f"tapped layers {layers})")
    if shifted.verdict == BETTER:
        return Check(NAME, CRITICAL, "the drafter was trained on hidden_states[layer_id], one layer off z-lab's "
                     "hidden_states[layer_id + 1]: served or evaluated the z-lab way it sees the wrong depth",
                     evidence, "retrain with z-lab's extract_context_feature (layer_id + 1); to serve this checkpoint "
                     f"as trained, the engine must read hidden_states[layer_id] (vLLM's auxiliary layers {layers}, "
                     f"not {[i + 1 for i in layers]}; vLLM #42505 / PR #42704 was this off-by-one in the engine)")
    if shifted.verdict == WORSE:
        return Check(NAME, OK, "the drafter reads z-lab's hidden_states[layer_id + 1], as vLLM, SGLang and z-lab "
                     "feed it", evidence)
    needed = prompts_needed(shifted.n_prompts, d)
    more = (f"about {needed} prompts would tell them apart at this difference: rerun with --n-prompts {needed} and "
            "--prompts from the drafter's training data" if needed is not None else
            "both conventions drafted the same walks: no number of prompts tells them apart; longer --max-new-tokens "
            "or prompts from the drafter's training data might")
    return Check(NAME, WARNING, "the two layer conventions cannot be told apart on these prompts", evidence,
                 f"{more}; an untrained drafter accepts too little under either convention to tell")
