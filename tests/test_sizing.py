"""Batch sizes from free device memory (evaluators/sizing.py), on hand-worked examples."""

import pytest

from evaluators import sizing
from tiny import qwen35_config


def test_anchor_bytes_by_hand():
    # 4 bytes x (3 x 3 x 64 logits + 4 heads x 4 x (10 + 4) scores + 12 x 4 x 32 hidden) = 4 x 2336
    assert sizing.anchor_bytes(block=4, vocab=64, hidden=32, heads=4, context=10) == 9344


@pytest.mark.parametrize("per_item, free, cap, expected", [
    (9344, 10**6, 256, 53),     # half of 1 MB over 9344 bytes
    (9344, 10**9, 256, 256),    # capped
    (10**9, 100, 8, 1),         # never below one
    (9344, None, 256, 256),     # unknown free memory: the cap
])
def test_fit(per_item, free, cap, expected):
    assert sizing.fit(per_item, free, cap) == expected


def test_a_27b_target_on_an_h200_scores_hundreds_of_anchors_per_call():
    # Qwen3.6-27B heads: block 16, vocab 248320, a 5120-wide drafter with 32 heads, 4k context:
    # 4 x (3 x 15 x 248320 + 32 x 16 x 4112 + 12 x 16 x 5120) = 57,051,136 bytes per anchor
    assert sizing.anchor_bytes(16, 248320, 5120, 32, 4096) == 57_051_136
    assert sizing.anchor_chunk("cuda", 16, 248320, 5120, 32, 4096, free=100 * 10**9) == 876
    assert sizing.anchor_chunk("cpu", 16, 248320, 5120, 32, 4096, free=100 * 10**9) == sizing.CPU_ANCHOR_CHUNK


def test_target_batch_by_hand():
    cfg = qwen35_config()  # hidden 32, intermediate 64, 4 layers, 2 KV heads of 8
    # per token: 4 layers x 2 x 2 x 8 x 4 bytes of KV + 4 x (4 x 32 + 2 x 64) activations = 512 + 1024
    assert sizing.sequence_bytes(100, 32, 64, 4, 2 * 2 * 8 * 4, 4) == 100 * 1536
    assert sizing.target_batch("cuda", cfg, 100, 4, free=2 * 100 * 1536 * 10) == 10
    assert sizing.target_batch("cpu", cfg, 100, 4, free=10**12) == sizing.CPU_BATCH


# --------------------------------------------------------------------------- targets larger than one GPU (issue 63)


def _qwen3_config():
    from transformers import Qwen3Config

    # 1,104,704 bytes in fp32: embedding and lm_head 256,000 each, four decoder layers of 148,096, the final norm
    return Qwen3Config(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       intermediate_size=128, vocab_size=1000, tie_word_embeddings=False)


def test_accelerates_plan_over_declared_gpu_memories():
    cfg = _qwen3_config()
    one = sizing.target_plan(cfg, "fp32", [4 * 2**20])
    assert one.fits and one.gpus == 1 and one.weights == 1_104_704 and one.device_map == {"": 0}
    # 700 kB GPUs (595 kB each after the headroom): accelerate spreads the modules over three, never splitting a
    # decoder layer, and nothing lands on the CPU or disk
    n, plan = sizing.gpus_needed(cfg, "fp32", 700_000)
    assert n == 3 and plan.fits and set(plan.device_map.values()) == {0, 1, 2}
    assert not sizing.target_plan(cfg, "fp32", [700_000] * 2).fits  # two are too few
    # in bf16 the same target is half the bytes: one GPU holds it
    assert sizing.gpus_needed(cfg, "bf16", 700_000)[0] == 1
    assert sizing.gpus_needed(cfg, "fp32", 100_000, most=4)[0] is None  # a layer alone is larger than a GPU


def test_a_hybrid_targets_plan_keeps_each_gated_deltanet_layer_whole():
    cfg = qwen35_config()  # 3 Gated DeltaNet layers and 1 full attention
    n, plan = sizing.gpus_needed(cfg, "fp32", sizing.target_plan(cfg, "fp32", [2**30]).weights // 2)
    assert n is not None and n >= 2 and plan.fits
    assert not any(name.startswith("model.layers.0.") for name in plan.device_map)  # a layer is never split


def test_an_eval_spread_over_more_gpus_than_it_sees_is_refused_in_one_line(tmp_path):
    import torch

    from evaluators.target import load_target
    from tiny import save_target
    from tracker.errors import DraftboardError

    if torch.cuda.is_available():
        pytest.skip("this box has GPUs")
    from transformers import Qwen3ForCausalLM

    save_target(Qwen3ForCausalLM(_qwen3_config()).eval(), tmp_path / "target")
    with pytest.raises(DraftboardError, match=r"^--gpus 2: this process sees 0 GPU\(s\)$"):
        load_target(tmp_path / "target", "cuda", "fp32", gpus=2)
    assert load_target(tmp_path / "target", "cpu", "fp32", gpus=2).device == "cpu"  # on the CPU nothing is spread
