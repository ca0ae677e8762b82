"""How much work one batched call may take on, from the device's free memory; and how many GPUs a target needs.

Two sizes matter: the drafter's anchor chunk (anchors scored per call: its logits are
[chunk, block-1, vocab] in fp32, the big term at a 248k vocabulary) and the target's batch
(prompts per continuation/feature batch: KV cache and activations grow with it). Both are sized
to a fraction of the memory free when the eval starts (`torch.cuda.mem_get_info` on a GPU,
MemAvailable on the CPU) and capped: on the CPU at the sizes the harness always used, since a
CPU gains little from bigger batches and the memory is shared. `--anchor-chunk` and
`--batch-size` pin them. Results do not depend on either beyond float rounding (batched
matmuls may block differently); pin them where bitwise repeatability across machines matters.

A target larger than one GPU is spread over the job's GPUs by accelerate's planner (`target_plan`:
`infer_auto_device_map` over the model built on the meta device from its config, each GPU's memory less
config.GPU_HEADROOM for activations, the KV cache and the drafter); `gpus_needed` is the fewest GPUs of one
size whose plan leaves nothing on the CPU or disk.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tracker.config import DTYPES, GPU_HEADROOM, MAX_GPUS

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


@dataclass(frozen=True)
class TargetPlan:
    """Where accelerate's planner puts a target's modules over some GPUs."""

    device_map: dict[str, int | str]  # module -> GPU index, or "cpu" / "disk" where no GPU had room
    weights: int  # bytes of the target's weights in the eval's dtype

    @property
    def fits(self) -> bool:
        return all(isinstance(d, int) for d in self.device_map.values())

    @property
    def gpus(self) -> int:
        """How many GPUs the plan uses."""
        return len({d for d in self.device_map.values() if isinstance(d, int)})


def target_plan(config, dtype: str, memories: Sequence[int]) -> TargetPlan:
    """accelerate's plan for a target (`config`: its whole transformers config, as checked) in `dtype` over GPUs of
    `memories` bytes each (their free memory, or as declared), each less config.GPU_HEADROOM."""
    return _plan(_meta_model(config, dtype), dtype, memories)


def gpus_needed(config, dtype: str, memory: int, most: int = MAX_GPUS) -> tuple[int | None, TargetPlan]:
    """(the fewest GPUs of `memory` bytes each that hold the target, None past `most`; the plan over that many, or
    over `most`). The search starts where the weights alone would fill the GPUs: one meta model, a few plans."""
    model = _meta_model(config, dtype)
    plan = _plan(model, dtype, [memory])
    first = max(1, -(-plan.weights // max(1, int(memory * (1 - GPU_HEADROOM)))))
    for n in range(first, most + 1):
        plan = plan if n == 1 else _plan(model, dtype, [memory] * n)
        if plan.fits:
            return n, plan
    return None, plan


def _meta_model(config, dtype: str):
    """The target's modules on the meta device: shapes, no weights read, nothing allocated."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, DTYPES[dtype]), trust_remote_code=False)


def _plan(model, dtype: str, memories: Sequence[int]) -> TargetPlan:
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes

    torch_dtype = getattr(torch, DTYPES[dtype])
    budget = {i: int(m * (1 - GPU_HEADROOM)) for i, m in enumerate(memories)}
    with warnings.catch_warnings(), _quiet("accelerate"):  # it warns of GPU indices this process cannot see
        warnings.simplefilter("ignore")
        device_map = infer_auto_device_map(model, max_memory={**budget, "cpu": 0},
                                           no_split_module_classes=model._no_split_modules or [], dtype=torch_dtype)
    return TargetPlan(dict(device_map), int(compute_module_sizes(model, dtype=torch_dtype)[""]))


@contextlib.contextmanager
def _quiet(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
