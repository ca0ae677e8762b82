"""How much work one batched call may take on, from the device's free memory.

Two sizes matter: the drafter's anchor chunk (anchors scored per call: its logits are
[chunk, block-1, vocab] in fp32, the big term at a 248k vocabulary) and the target's batch
(prompts per continuation/feature batch: KV cache and activations grow with it). Both are sized
to a fraction of the memory free when the eval starts (`torch.cuda.mem_get_info` on a GPU,
MemAvailable on the CPU) and capped: on the CPU at the sizes the harness always used, since a
CPU gains little from bigger batches and the memory is shared. `--anchor-chunk` and
`--batch-size` pin them. Results do not depend on either beyond float rounding (batched
matmuls may block differently); pin them where bitwise repeatability across machines matters.
"""

from __future__ import annotations

from pathlib import Path

import torch

FREE_FRACTION = 0.5  # of the free memory, the rest left to the models' own activations and other users
CPU_ANCHOR_CHUNK, GPU_ANCHOR_CHUNK = 256, 4096  # caps
CPU_BATCH, GPU_BATCH = 8, 64
FP32 = 4


def free_bytes(device: str) -> int | None:
    """Free memory of `device` in bytes; None where it cannot be told."""
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def anchor_bytes(block: int, vocab: int, hidden: int, heads: int, context: int) -> int:
    """Peak bytes one anchor costs a scoring call: its logits and their DDTree reductions (about
    three [block-1, vocab] fp32 copies), attention scores over the context for every head, and
    the block's hidden states through a layer (a dozen [block, hidden] fp32 tensors)."""
    return FP32 * (3 * (block - 1) * vocab + heads * block * (context + block) + 12 * block * hidden)


def sequence_bytes(length: int, hidden: int, intermediate: int, layers: int, kv_bytes_per_token: int,
                   elem: int) -> int:
    """Peak bytes one sequence of `length` tokens costs a batched target pass: every layer's KV
    (or tapped features) kept for the whole sequence, one layer's activations (MLP included)."""
    return length * (layers * kv_bytes_per_token + elem * (4 * hidden + 2 * intermediate))


def fit(per_item: int, free: int | None, cap: int) -> int:
    """How many items of `per_item` bytes fit FREE_FRACTION of `free`, between 1 and `cap`."""
    if free is None:
        return cap
    return max(1, min(cap, int(free * FREE_FRACTION) // max(1, per_item)))


def anchor_chunk(device: str, block: int, vocab: int, hidden: int, heads: int, context: int,
                 free: int | None = None) -> int:
    cap = GPU_ANCHOR_CHUNK if device.startswith("cuda") else CPU_ANCHOR_CHUNK
    return fit(anchor_bytes(block, vocab, hidden, heads, context), free_bytes(device) if free is None else free, cap)


def target_batch(device: str, cfg, length: int, elem: int, free: int | None = None) -> int:
    """Prompts per target batch for sequences up to `length` tokens under text config `cfg`."""
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_seq = sequence_bytes(length, cfg.hidden_size, getattr(cfg, "intermediate_size", 4 * cfg.hidden_size),
                             cfg.num_hidden_layers, 2 * heads * head_dim * elem, elem)
    cap = GPU_BATCH if device.startswith("cuda") else CPU_BATCH
    return fit(per_seq, free_bytes(device) if free is None else free, cap)
