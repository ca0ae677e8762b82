"""The z-lab speculative loop at temperature 0, online, with the target's KV cache.

Test-only reference: draft a block from the features of every verified position, verify it
with one target forward, accept the matching prefix plus the target's bonus token, crop the
cache, advance. The offline harness must reproduce its acceptance lengths exactly.
"""

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
