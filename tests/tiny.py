"""Tiny model configs shared by the tests: real transformers architectures, random weights."""

from transformers import Qwen3_5TextConfig, Qwen3Config

VOCAB = 64


def qwen35_config(**overrides) -> Qwen3_5TextConfig:
    """A 4-layer hybrid target: three Gated DeltaNet layers, then one full-attention layer."""
    kw = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=512,
        eos_token_id=VOCAB - 1, pad_token_id=0, tie_word_embeddings=False,
    )
    kw.update(overrides)
    return Qwen3_5TextConfig(**kw)


def qwen3_config(**overrides) -> Qwen3Config:
    kw = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        eos_token_id=VOCAB - 1, pad_token_id=0, tie_word_embeddings=False,
    )
    kw.update(overrides)
    return Qwen3Config(**kw)


# --------------------------------------------------------------------------- a trained pair


def save_target(model, out_dir):
    """save_pretrained with a generation config whose EOS is the model's."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(eos_token_id=model.config.eos_token_id,
                                               pad_token_id=model.config.pad_token_id)
    model.save_pretrained(out_dir)
    return out_dir


def greedy_sequences(model, n, prompt_len, new_tokens, seed=0):
    """Random prompts and the target's greedy continuations (no stop): training data."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, VOCAB - 1, (n, prompt_len), generator=gen)
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out  # [n, prompt_len + new_tokens]


def fit_drafter(model, sequences, layer_ids, block_size=4, steps=150, seed=0, mask_token_id=1, head_dim=8, offset=1):
    """A 1-layer DFlash drafter fitted to `model`'s greedy text, so acceptance is not trivial.

    Trains over every anchor with the same masked attention the harness evaluates with, on
    `hidden_states[layer_id + offset]`: z-lab's offset is 1; 0 is the off-by-one (vLLM #42505).
    """
    import torch
    import torch.nn.functional as F

    from evaluators.drafter import DFlashDrafter, DrafterConfig

    torch.manual_seed(seed)
    cfg = model.config
    dcfg = DrafterConfig(hidden_size=cfg.hidden_size, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=head_dim, intermediate_size=64, target_layer_ids=list(layer_ids),
                         block_size=block_size, mask_token_id=mask_token_id, num_target_layers=cfg.num_hidden_layers,
                         vocab_size=cfg.vocab_size, max_position_embeddings=cfg.max_position_embeddings)
    drafter = DFlashDrafter(dcfg)
    with torch.no_grad():
        hs = model(sequences, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i + offset] for i in layer_ids], -1)  # [n, T, k*H]
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    T = sequences.shape[1]
    anchors = torch.arange(1, T - block_size)
    labels = sequences[:, anchors[:, None] + torch.arange(1, block_size)]  # [n, A, B-1]
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for step in range(steps):
        i = step % sequences.shape[0]
        hidden = drafter.forward_anchors(feats[i:i + 1], anchors, drafter.block_embeddings(sequences[i, anchors], embed))
        loss = F.cross_entropy(drafter.logits(hidden, head).flatten(0, 1), labels[i].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval(), dcfg


def hybrid_eval_files(root, prompt_id=str):
    """A tiny Qwen3.5 target, an untrained z-lab-format drafter and 3 token-id prompts under `root`.

    What an end-to-end eval needs on disk (`target/`, `drafter/`, `prompts.jsonl`); returns `root`.
    """
    import json

    import torch
    from transformers import Qwen3_5ForCausalLM

    from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab

    torch.manual_seed(0)
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), root / "target")
    torch.manual_seed(1)
    cfg = DrafterConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, intermediate_size=64, target_layer_ids=[1, 2], block_size=4,
                        mask_token_id=1, num_target_layers=4, vocab_size=VOCAB)
    save_zlab(DFlashDrafter(cfg), cfg, root / "drafter")
    prompts = torch.randint(2, 60, (3, 9), generator=torch.Generator().manual_seed(3)).tolist()
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": prompt_id(i), "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root


def dflash2_from(drafter, dcfg, seed=0, conv_group_size=16, selector_rank=8, selector_top_k=8):
    """A DFlash2 drafter on a fitted DFlash one: its weights copied, the convs and the candidate
    selector drawn at random with enough weight that they change what is drafted (the selector
    reorders each position's top-k, the convs mix each block slot with the one before)."""
    import dataclasses

    import torch

    from evaluators.drafter import DFLASH2, DFlashDrafter

    cfg = dataclasses.replace(dcfg, family=DFLASH2, conv_kernel_size=2, conv_group_size=conv_group_size,
                              selector_rank=selector_rank, selector_top_k=selector_top_k)
    torch.manual_seed(seed)
    model = DFlashDrafter(cfg)
    missing, unexpected = model.load_state_dict(drafter.state_dict(), strict=False)
    assert not unexpected and all("conv" in k or "candidate_selector" in k for k in missing)
    with torch.no_grad():
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.add_(0.05 * torch.randn_like(conv.base_kernel))
                conv.kernel_projection.weight.normal_(std=0.02)
        selector = model.candidate_selector
        selector.predecessor_codebook.weight.normal_(std=0.3)
        selector.successor_codebook.weight.normal_(std=0.3)
        selector.hidden_projection.weight.normal_(std=0.1)
    return model.eval(), cfg
