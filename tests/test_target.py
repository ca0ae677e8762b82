"""Target loading and tapped features (evaluators/target.py)."""

import pytest
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


def test_sampled_continuations_follow_the_sampling_distribution_whatever_the_batch(tmp_path):
    """Each draw is a sample of z-lab's `_sampling_probs` (a chi-square test of 4,000 first tokens against
    it; a cut-off token is never drawn), recorded with the probability it had, and one seed gives one
    continuation whether it is drawn alone or in a batch of others."""
    from transformers import Qwen3ForCausalLM

    from evaluators.sampling import Sampling, draw_seed, sampling_probs
    from evaluators.target import sampled_continuations
    from tiny import qwen3_config

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config()).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(5)  # a distribution with a head and a tail for top_p / top_k to cut
    target = load_target(save_target(model, tmp_path / "target"))
    prompt, s, n = [5, 6, 7, 8], Sampling(1.0, 0.9, 10), 4000
    draws = sampled_continuations(target, [prompt] * n, [draw_seed(0, prompt, k) for k in range(n)], 1, 0, s, 500)
    with torch.no_grad():
        p = sampling_probs(model(torch.tensor([prompt])).logits[0, -1], s).double()
    counts = torch.bincount(torch.tensor([d.tokens[0] for d in draws]), minlength=p.shape[0]).double()
    kept = p > 0
    assert counts[~kept].sum() == 0 and 2 <= kept.sum() <= 10
    chi2 = float(((counts - n * p) ** 2 / (n * p))[kept].sum())
    assert chi2 < 27.9  # the 99.9% point of chi-square with 9 degrees of freedom (at most 10 tokens kept)
    assert all(abs(d.probs[0] - float(p[d.tokens[0]])) < 1e-6 for d in draws[:50])

    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    seeds = [draw_seed(0, q, 0) for q in prompts]
    alone = [sampled_continuations(target, [q], [seed], 20, 3, s, 1)[0] for q, seed in zip(prompts, seeds)]
    batched = sampled_continuations(target, prompts, seeds, 20, 3, s, 3)
    assert [d.tokens for d in batched] == [d.tokens for d in alone]
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip([d.probs for d in batched], [d.probs for d in alone]))


def test_a_qwen3_next_release_layout_evaluates_offline(tmp_path, capsys):
    """Qwen3-Next as its releases ship (Qwen/Qwen3-Next-80B-A3B-Instruct's config.json, shrunk): no
    `layer_types` but `full_attention_interval`, every layer a MoE (`mlp_only_layers` []), weights in
    shards behind model.safetensors.index.json. The harness loads it, taps a GDN layer's features on
    the torch path and names that path per function; Launch sees it as a hybrid."""
    import json

    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab
    from tracker.cli import main
    from tracker.dashboard.launch_form import target_is_hybrid

    release = {"architectures": ["Qwen3NextForCausalLM"], "decoder_sparse_step": 1, "full_attention_interval": 4,
               "head_dim": 32, "hidden_size": 64, "intermediate_size": 128, "linear_conv_kernel_dim": 4,
               "linear_key_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_value_head_dim": 16, "mlp_only_layers": [], "model_type": "qwen3_next",
               "moe_intermediate_size": 32, "norm_topk_prob": True, "num_attention_heads": 2, "num_experts": 4,
               "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 1,
               "shared_expert_intermediate_size": 32, "vocab_size": 64, "eos_token_id": 63, "pad_token_id": 0,
               "max_position_embeddings": 512, "tie_word_embeddings": False}
    torch.manual_seed(0)
    target = tmp_path / "target"
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**release)).eval()
    save_target(model, target)
    model.save_pretrained(target, max_shard_size="100KB")  # shards, as releases are
    (target / "model.safetensors").unlink(missing_ok=True)
    (target / "config.json").write_text(json.dumps(release))  # as shipped: layer_types derived, not written
    assert len(list(target.glob("model-*-of-*.safetensors"))) > 1 and (target / "model.safetensors.index.json").exists()
    assert target_is_hybrid(str(target))

    cfg = DrafterConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=32, intermediate_size=64, target_layer_ids=[1, 2], block_size=4, mask_token_id=1,
                        num_target_layers=4, vocab_size=64)
    save_zlab(DFlashDrafter(cfg), cfg, tmp_path / "drafter")
    prompts = torch.randint(2, 60, (2, 9), generator=torch.Generator().manual_seed(3)).tolist()
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                    for i, p in enumerate(prompts)))
    out = tmp_path / "results.json"
    assert main(["eval", "--target", str(target), "--drafter", str(tmp_path / "drafter"), "--prompts",
                 str(tmp_path / "prompts.jsonl"), "--max-new-tokens", "12", "--no-log", "--cache-dir",
                 str(tmp_path / "cache"), "--out", str(out)]) == 0, capsys.readouterr().err
    results = json.loads(out.read_text())
    la = results["fingerprint"]["numerics"]["linear_attention"]
    assert la["module"] == "transformers.models.qwen3_next.modeling_qwen3_next"
    assert la["linear_attention_path"] == "fallback" and la["functions"]["torch_chunk_gated_delta_rule"] == "torch"
    assert results["tau"] >= 1.0 and len(results["prompts"]) == 2 and results["ddtree"]["4"]["tau"] >= 1.0
