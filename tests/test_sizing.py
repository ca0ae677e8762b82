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
