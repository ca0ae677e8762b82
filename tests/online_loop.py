"""z-lab's speculative loops at temperature 0, online: test-only references for the harness.

`speculative_generate` is the 44947fb loop (the `full` rule) with the target's KV cache: draft a
block from the features of every verified position, verify it with one target forward, accept
the matching prefix plus the target's bonus token, crop the cache, advance. `lossless_generate`
is the 07ebd93 loop (the `cut` rule) with recomputation instead of caches. The offline harness
must reproduce their acceptance lengths exactly.
"""

import json

import torch
from transformers import DynamicCache


@torch.no_grad()
def speculative_generate(target, drafter, input_ids, max_new_tokens, stop_token_ids=()):
    """-> (completion_ids, acceptance_lengths) as z-lab's dflash_generate (T=0) reports them."""
    layer_ids, block = drafter.target_layer_ids, drafter.block_size
    embed, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    P = len(input_ids)
    cache = DynamicCache(config=target.config)
    out = target(torch.tensor([input_ids]), cache=cache, use_cache=True, output_hidden_states=True)
    seq = list(input_ids) + [int(out.logits[0, -1].argmax())]
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], -1)  # [1, P, k*H]: positions < P
    start, lengths = P, []
    while start < P + max_new_tokens:
        # Draft: the block sees every verified position before the anchor.
        block_embeds = drafter.block_embeddings(torch.tensor([seq[start]]), embed)  # [1, B, H]
        hidden = drafter.forward_block(feats, torch.arange(start), block_embeds,
                                       start + torch.arange(block)[None])
        draft = drafter.logits(hidden, head)[0].argmax(-1).tolist()  # [B-1]
        # Verify: one target forward over [anchor, drafts] on top of the cache.
        verify = target(torch.tensor([[seq[start]] + draft]), cache=cache, use_cache=True,
                        output_hidden_states=True)
        posterior = verify.logits[0].argmax(-1).tolist()  # [B]
        accepted = 0
        while accepted < block - 1 and draft[accepted] == posterior[accepted]:
            accepted += 1
        seq = seq[: start + 1] + draft[:accepted] + [posterior[accepted]]
        new = torch.cat([verify.hidden_states[i + 1] for i in layer_ids], -1)[:, : accepted + 1]
        feats = torch.cat([feats, new], 1)
        cache.crop(-(cache.get_seq_length() - (start + accepted + 1)))  # keep verified positions
        lengths.append(accepted + 1)
        start += accepted + 1
        if any(t in stop_token_ids for t in seq[P: start + 1]):
            break
    completion = seq[P: P + max_new_tokens]
    for i, t in enumerate(completion):
        if t in stop_token_ids:
            completion = completion[: i + 1]
            break
    return completion, lengths


@torch.no_grad()
def lossless_generate(target, drafter, input_ids, max_new_tokens, stop_token_ids=()):
    """z-lab's dflash_generate @ 07ebd93 (T=0, the `cut` rule) with every cache replaced by recomputation.

    Each draft reads the features of a full forward over every verified token, and each verify
    pass is a full forward over the verified tokens plus the block, so no state from rejected
    drafts can leak into a later block: the loop is lossless by construction, on any target.
    -> (completion_ids, acceptance_lengths) as dflash_generate reports them.
    """
    layer_ids, block = drafter.target_layer_ids, drafter.block_size
    embed, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    P = len(input_ids)
    max_length = P + max_new_tokens
    seq = list(input_ids) + [int(target(torch.tensor([input_ids])).logits[0, -1].argmax())]
    start, lengths = P, []
    stopped = seq[P] in stop_token_ids
    while start + 1 < max_length and not stopped:
        size = min(block, max_length - start)  # the last blocks verify fewer positions
        hs = target(torch.tensor([seq[:start]]), output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in layer_ids], -1)  # [1, start, k*H]
        block_embeds = drafter.block_embeddings(torch.tensor([seq[start]]), embed, size)
        hidden = drafter.forward_block(feats, torch.arange(start), block_embeds, start + torch.arange(size)[None])
        draft = drafter.logits(hidden, head)[0].argmax(-1).tolist()  # [size-1]
        logits = target(torch.tensor([seq[: start + 1] + draft])).logits[0, start:]
        posterior = logits.argmax(-1).tolist()  # [size]
        accepted = 0
        while accepted < size - 1 and draft[accepted] == posterior[accepted]:
            accepted += 1
        seq = seq[: start + 1] + draft[:accepted] + [posterior[accepted]]
        produced = min(accepted + 1, max_length - start - 1)
        hit = [i for i, t in enumerate(seq[start + 1: start + produced + 1]) if t in stop_token_ids]
        if hit:
            produced, stopped = hit[0] + 1, True
        start += produced
        lengths.append(produced)
    return seq[P: min(start + 1, max_length)], lengths


def hybrid_pair(root, max_new_tokens, n_prompts=6):
    """Under root: a tiny Qwen3.5 (Gated DeltaNet + attention) `target/`, a `drafter/` fitted to
    its greedy text, and `prompts.jsonl`; the EOS is a token some completion reaches mid-way that
    the fewest completions reach at all, so some prompts stop early and others run to the limit.
    -> (target, drafter, prompts, eos)."""
    from transformers import Qwen3_5ForCausalLM

    from evaluators.drafter import save_zlab
    from tiny import fit_drafter, greedy_sequences, qwen35_config, save_target

    torch.manual_seed(0)
    target = Qwen3_5ForCausalLM(qwen35_config(eos_token_id=None)).eval()
    train = greedy_sequences(target, 8, 6, 48, seed=1)
    drafter, dcfg = fit_drafter(target, train, layer_ids=[1, 2], block_size=4, steps=150)
    prompts = torch.randint(2, 60, (n_prompts, 7), generator=torch.Generator().manual_seed(11)).tolist()
    free = greedy_sequences(target, n_prompts, 7, max_new_tokens, seed=11)[:, 7:].tolist()
    eos = min((t for row in free for t in row[5:]), key=lambda t: sum(t in row for row in free))
    target.config.eos_token_id = eos
    save_target(target, root / "target")
    save_zlab(drafter, dcfg, root / "drafter")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return target, drafter, prompts, eos
