"""Target loading and tapped features (evaluators/target.py)."""

import torch
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

from evaluators.target import content_digest, layer_hidden_states, layer_hidden_states_batch, load_target
from tiny import qwen35_config, save_target


def test_multimodal_checkpoint_loads_its_text_model_with_identical_features(tmp_path):
    # Qwen3.5 releases are multimodal: the text model sits under model.language_model.
    cfg = Qwen3_5Config(text_config=qwen35_config().to_dict(), vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=4,
        temporal_patch_size=1, spatial_merge_size=1))
    torch.manual_seed(0)
    full = Qwen3_5ForConditionalGeneration(cfg).eval()
    full.save_pretrained(tmp_path)
    target = load_target(tmp_path, "cpu", "fp32", "auto")
    assert target.num_layers == 4 and target.resolution.path == "fallback"
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = full.model.language_model(input_ids=ids, output_hidden_states=True).hidden_states
    feats = layer_hidden_states(target, ids[0].tolist(), [1, 3])
    assert torch.equal(feats[1], ref[2][0]) and torch.equal(feats[3], ref[4][0])  # z-lab indexing, last = normed


def test_hooks_keep_only_the_tapped_layers_and_are_removed(tmp_path):
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), tmp_path)
    target = load_target(tmp_path, "cpu", "fp32", "fallback")
    feats = layer_hidden_states(target, [1, 2, 3, 4], [2])
    assert set(feats) == {2} and feats[2].shape == (4, 32)
    assert all(not layer._forward_hooks for layer in target.text_model.layers)


def test_content_digest_changes_with_the_weights(tmp_path):
    torch.manual_seed(0)
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), tmp_path / "a")
    torch.manual_seed(1)
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), tmp_path / "b")
    assert content_digest(tmp_path / "a") != content_digest(tmp_path / "b")
    assert content_digest(tmp_path / "a") == content_digest(tmp_path / "a")


def test_batched_features_equal_the_per_prompt_pass(tmp_path):
    torch.manual_seed(0)
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), tmp_path)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(2, 60, (n,), generator=gen).tolist() for n in (5, 40, 17, 70, 1)]
    # Equal up to the dtype's rounding: batched matmuls block their sums differently. Measured: 5e-7 in
    # fp32; in bf16 (8 bits of mantissa) up to 3.9e-3 after three layers, one rounding step at |x| ~ 1.
    tolerance = {"fp32": {"rtol": 1e-5, "atol": 1e-5}, "bf16": {"rtol": 2e-2, "atol": 8e-3}}
    for dtype in ("fp32", "bf16"):
        target = load_target(tmp_path, "cpu", dtype, "auto")
        batched = layer_hidden_states_batch(target, seqs, [0, 2, 3])  # right-padded to 70 tokens
        for seq, feats in zip(seqs, batched):
            ref = layer_hidden_states(target, seq, [0, 2, 3])
            for i in (0, 2, 3):
                assert feats[i].shape == (len(seq), 32) and feats[i].dtype == ref[i].dtype
                torch.testing.assert_close(feats[i], ref[i], **tolerance[dtype])
