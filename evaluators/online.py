"""Online scoring as z-lab's `dflash_generate` runs it, and the check that shows whether it is lossless.

`online_generate` is the loop at batch 1: prefill with the target's cache, then per block draft
from the features of every verified position, verify [anchor, drafts] in one target forward on
top of the cache, accept a prefix plus the bonus token, `crop` the cache back to the verified
tokens, advance; the end-of-generation rule is `last_block` (metrics.walk_end: `cut` as z-lab
07ebd93, `full` as 44947fb). At T = 0 the accepted prefix is the drafts equal to the target's
argmax; at T > 0 drafts are drawn from the drafter's distribution and accepted by z-lab's
`_rejection_sample` (draft d with probability min(1, p(d) / q(d)), else a draw from the residual
max(p - q, 0)), every draw from the run's own generator. On a Gated DeltaNet target `crop`
rolls back the attention layers and the short-conv states only (transformers 5.24), so after a
block with rejected drafts the recurrent state still holds them and the next verify pass sees
slightly different hidden states.

Each run also times its decoding as z-lab's `benchmark.py` does (`time_per_output_token`: the time
from the first token to the end over the output tokens, the first one included), and
`target_alone_generate` is the same loop at block size 1 (one target forward per token, no drafter, no
hidden states), so `--scoring online` reports z-lab's "Decoding speedup" = mean TPOT of the target alone /
mean TPOT with the drafter over the prompts (`decoding_speedup`).

`check_lossless` runs that loop and plain greedy decoding side by side and measures exactly
that: per prompt, whether the completions agree, the first divergence, how many blocks agree,
and the largest difference between the features the loop used and a full forward over the same
tokens, split by whether the previous block rejected drafts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from evaluators.drafter import LoadedDrafter
from evaluators.sampling import Sampling, sampling_probs
from evaluators.target import Target


@dataclass
class OnlineRun:
    """One prompt through the cached online loop."""

    completion_ids: list[int]
    acceptance_lengths: list[int]  # tokens each block produced, as dflash_generate reports them
    # per block after the first: (the previous block rejected drafts, max |used - full forward|);
    # filled only when the loop is asked to measure it
    feature_gaps: list[tuple[bool, float]] = field(default_factory=list)
    time_per_output_token: float = 0.0  # s: decoding time (after the first token) / output tokens (z-lab's TPOT)


def _clock(device: torch.device | str) -> float:
    """z-lab's `_cuda_time`: the device's queued work done, then the wall clock."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _tapped(hidden_states, layer_ids: list[int]) -> torch.Tensor:
    # output_hidden_states: 0 = embeddings, i + 1 = decoder layer i (z-lab extract_context_feature)
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def _rejection_sample(draft: list[int], p: torch.Tensor, q: torch.Tensor,
                      generator: torch.Generator | None) -> tuple[int, int]:
    """z-lab's `_rejection_sample`: draft [S], p [S+1, V] the target's distributions at the block's
    positions, q [S, V] the ones the drafts were drawn from -> (accepted drafts, the bonus token)."""
    d = torch.tensor(draft, device=p.device)[:, None]
    p_d, q_d = p[:-1].gather(-1, d)[:, 0], q.gather(-1, d)[:, 0]
    u = torch.rand(len(draft), generator=generator, device=p.device)
    accepted = int((u * q_d < p_d).int().cumprod(0).sum())
    if accepted == len(draft):
        return accepted, _draw(p[-1], generator)
    residual = (p[accepted] - q[accepted]).clamp_min(0)
    total = residual.sum()
    residual = residual / total.clamp_min(torch.finfo(residual.dtype).tiny) if total > 0 else p[accepted]
    return accepted, _draw(residual, generator)


def _propose(drafter, hidden: torch.Tensor, logits: torch.Tensor, anchor: int, sampling: Sampling,
             generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
    """The block's drafts [S] and, at T > 0, the distributions they were drawn from [S, V]."""
    if drafter.candidate_selector is not None:  # DFlash2: z-lab's path, each choice the next one's predecessor
        path, candidates, q = drafter.candidate_selector.select(
            hidden[:, 1:], logits, torch.tensor([anchor], device=drafter.device), sampling.temperature, generator)
        full = None if q is None else torch.zeros_like(logits[0], dtype=q.dtype).scatter_add_(-1, candidates[0], q[0])
        return path[0].tolist(), full
    if sampling.greedy:
        return logits[0].argmax(-1).tolist(), None  # [size-1]
    q = sampling_probs(logits[0], sampling)
    return torch.multinomial(q, 1, generator=generator)[:, 0].tolist(), q


@torch.no_grad()
def online_generate(target: Target, loaded: LoadedDrafter, input_ids: list[int], max_new_tokens: int,
                    stops: set[int], last_block: str, measure: bool = False, sampling: Sampling = Sampling(),
                    generator: torch.Generator | None = None) -> OnlineRun:
    """z-lab's cached loop for one prompt; with `measure`, also each block's feature gap (one
    extra full forward per block). At T > 0 every draw comes from `generator` (on the target's
    device), so a seed gives one run."""
    from transformers import DynamicCache

    model, drafter = target.model, loaded.model
    layer_ids, block = list(drafter.target_layer_ids), drafter.block_size
    embed = target.embed_weight
    lm_head = loaded.own_lm_head if loaded.own_lm_head is not None else target.lm_head_weight
    dev = target.device
    P, cut = len(input_ids), last_block == "cut"
    max_length = P + max_new_tokens
    cache = DynamicCache(config=model.config)
    # As z-lab's _make_cache: lets `crop` roll back the short-conv states of linear-attention
    # layers; their recurrent state has no rollback, which is what `check_lossless` measures.
    cache.activate_past_recording()
    out = model(torch.tensor([input_ids], device=dev), past_key_values=cache, use_cache=True,
                output_hidden_states=True)
    first = out.logits[0, -1]
    seq = list(input_ids) + [int(first.argmax()) if sampling.greedy else _draw(sampling_probs(first, sampling),
                                                                                 generator)]
    feats = _tapped(out.hidden_states, layer_ids).float()  # [1, P, k*H]: features of positions < P
    decode_start = _clock(dev)
    start, lengths, gaps = P, [], []
    rejected_before = False
    stopped = seq[P] in stops
    while not stopped and (start + 1 < max_length if cut else start < max_length):
        size = min(block, max_length - start) if cut else block
        embeds = drafter.block_embeddings(torch.tensor([seq[start]], device=drafter.device),
                                          embed.to(drafter.device), size)
        hidden = drafter.forward_block(feats.to(drafter.device, drafter.dtype), torch.arange(start), embeds,
                                       start + torch.arange(size)[None])
        logits = drafter.logits(hidden, lm_head.to(drafter.device))  # [1, size-1, V]
        draft, q = _propose(drafter, hidden, logits, seq[start], sampling, generator)
        verify = model(torch.tensor([[seq[start]] + draft], device=dev), past_key_values=cache, use_cache=True,
                       position_ids=torch.arange(start, start + size, device=dev)[None], output_hidden_states=True)
        if sampling.greedy:
            posterior = verify.logits[0].argmax(-1).tolist()  # [size]
            accepted = 0
            while accepted < size - 1 and draft[accepted] == posterior[accepted]:
                accepted += 1
            bonus = posterior[accepted]
        else:
            accepted, bonus = _rejection_sample(draft, sampling_probs(verify.logits[0], sampling), q.to(dev),
                                                generator)
        seq = seq[: start + 1] + draft[:accepted] + [bonus]
        produced = min(accepted + 1, max_length - start - 1) if cut else accepted + 1
        hit = [i for i, t in enumerate(seq[start + 1: start + produced + 1]) if t in stops]
        if hit:
            stopped = True
            if cut:  # 07ebd93 ends the block at the stop; 44947fb reports the whole block
                produced = hit[0] + 1
        used = _tapped(verify.hidden_states, layer_ids)[:, :produced].float()
        if measure and lengths:
            full = model(torch.tensor([seq[: start + produced]], device=dev), output_hidden_states=True)
            exact = _tapped(full.hidden_states, layer_ids)[:, start:start + produced].float()
            gaps.append((rejected_before, float((used - exact).abs().max())))
        feats = torch.cat([feats, used], dim=1)
        rejected_before = accepted < size - 1
        lengths.append(produced)
        start += produced
        cache.crop(-(cache.get_seq_length() - start))  # keep the verified positions only
    decode_s = _clock(dev) - decode_start
    completion = _until_stop(seq[P:max_length], stops)
    return OnlineRun(completion, lengths, feature_gaps=gaps, time_per_output_token=decode_s / max(len(completion), 1))


def _until_stop(completion: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(completion):
        if t in stops:
            return completion[: i + 1]
    return completion


@torch.no_grad()
def target_alone_generate(target: Target, input_ids: list[int], max_new_tokens: int,
                          stops: set[int]) -> tuple[list[int], float]:
    """z-lab's `dflash_generate` at block size 1, greedy: prefill, then one cached target forward per token
    until a stop token or the limit; (the completion, its time per output token as `online_generate`'s)."""
    from transformers import DynamicCache

    model, dev = target.model, target.device
    P, max_length = len(input_ids), len(input_ids) + max_new_tokens
    cache = DynamicCache(config=model.config)
    out = model(torch.tensor([input_ids], device=dev), past_key_values=cache, use_cache=True, logits_to_keep=1)
    seq = list(input_ids) + [int(out.logits[0, -1].argmax())]
    decode_start = _clock(dev)
    start = P
    while start + 1 < max_length and seq[start] not in stops:
        out = model(torch.tensor([[seq[start]]], device=dev), past_key_values=cache, use_cache=True,
                    position_ids=torch.tensor([[start]], device=dev))
        seq.append(int(out.logits[0, -1].argmax()))
        start += 1
    decode_s = _clock(dev) - decode_start
    completion = _until_stop(seq[P:max_length], stops)
    return completion, decode_s / max(len(completion), 1)


@dataclass
class LosslessRow:
    """One prompt of `check_lossless`."""

    id: str
    equals_greedy: bool
    first_divergence: int | None  # completion index where online and greedy first differ
    blocks_agreeing: int  # leading blocks whose tokens all equal greedy's
    n_blocks: int
    max_gap_after_accept: float | None  # largest feature gap after a fully accepted block
    max_gap_after_reject: float | None  # ... after a block with rejected drafts


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def lossless_row(prompt_id: str, run: OnlineRun, greedy: list[int]) -> LosslessRow:
    """Compare one online completion with plain greedy decoding (both cut the same way)."""
    n = min(len(run.completion_ids), len(greedy))
    first = next((i for i in range(n) if run.completion_ids[i] != greedy[i]), None)
    if first is None and len(run.completion_ids) != len(greedy):
        first = n
    # Block k covers completion positions (sum of earlier lengths, + its own]; position 0 is the prefill's.
    agree, end = 0, 0
    for length in run.acceptance_lengths:
        end += length
        if first is not None and end >= first:
            break
        agree += 1
    return LosslessRow(prompt_id, first is None, first, agree, len(run.acceptance_lengths),
                       _max([g for rejected, g in run.feature_gaps if not rejected]),
                       _max([g for rejected, g in run.feature_gaps if rejected]))
