"""A tiny Qwen3.5 hybrid target, trained in seconds on the Python standard library's source.

The demo needs a target whose numbers are honest: a real `Qwen3_5ForCausalLM` (Gated DeltaNet
linear-attention layers plus a full-attention layer, so the kernel-path story of the
fingerprints is real), a real tokenizer on disk, and greedy completions that carry structure a
drafter can learn. A byte-level model trained briefly on Python source gives exactly that.

The stdlib's top-level `.py` files, sorted by name, are split three ways by position:
index % 8 == 6 gives the drafters' training prompts, index % 8 == 7 the eval prompts, the rest
trains the target. So neither the drafters nor the evals ever see the target's training text.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import sysconfig
import time
from pathlib import Path

import torch

from demo import bytetok

SEQ_LEN = 128
BATCH = 16
LR = 4e-3
WARMUP = 10
FULL_STEPS = 400  # ~40 s on 2 idle CPU cores; held-out loss ~1.5 nats/byte
QUICK_STEPS = 80  # ~8 s
SPLITS = {"drafter": 6, "eval": 7}  # file index % 8 -> prompt split; every other file trains the target
LOG_FILE = "demo_train_log.json"


FAMILIES = ("qwen3_5", "qwen3", "qwen3_next")


def target_config(family: str = "qwen3_5"):
    """4 layers, byte vocabulary. `qwen3_5` (the demo's): hidden 64, 3 Gated DeltaNet layers, then one
    full-attention layer. `qwen3`: all full attention, head_dim 32 (vLLM's CPU attention has no kernel
    for 16), the target an engine can serve on these CPUs. `qwen3_next`: the hybrid vLLM serves on
    these CPUs (shared/research/engines-2026-12-04.md): the same 3 GDN + 1 full-attention layout, with
    the sizes vLLM's CPU kernels take (GDN head dim 64, the chunk kernel's smallest; attention head
    dim 64) and layer 3 a small MoE, since vLLM's Qwen3-Next finds no decoder layer in an all-dense
    model (`qwen3_next.py`: "No Qwen3Next layer found")."""
    from transformers import Qwen3_5TextConfig, Qwen3Config, Qwen3NextConfig

    shared = dict(vocab_size=bytetok.VOCAB_SIZE, num_hidden_layers=4, max_position_embeddings=8192,
                  bos_token_id=bytetok.BOS, eos_token_id=bytetok.EOS, pad_token_id=bytetok.PAD,
                  tie_word_embeddings=False)
    hybrid = ["linear_attention"] * 3 + ["full_attention"]
    if family == "qwen3":
        return Qwen3Config(hidden_size=64, intermediate_size=192, num_key_value_heads=2, num_attention_heads=2,
                           head_dim=32, **shared)
    if family == "qwen3_5":
        return Qwen3_5TextConfig(
            hidden_size=64, intermediate_size=192, num_key_value_heads=2, layer_types=hybrid, num_attention_heads=4,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
            linear_value_head_dim=16, **shared)
    if family == "qwen3_next":
        return Qwen3NextConfig(
            hidden_size=128, intermediate_size=256, layer_types=hybrid, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64,
            linear_value_head_dim=64, linear_conv_kernel_dim=4, mlp_only_layers=[0, 1, 2], decoder_sparse_step=1,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
            **shared)
    raise ValueError(f"unknown target family {family!r}: one of {', '.join(FAMILIES)}")


def stdlib_files() -> list[Path]:
    """The stdlib's top-level .py files, sorted by name (the same list on every run)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if len(files) < 16:
        raise RuntimeError(f"found only {len(files)} .py files in the stdlib at {root}; the demo trains on them")
    return files


def split_files(split: str) -> list[Path]:
    """Files of one split: "target" (training text), "drafter" or "eval" (prompt sources)."""
    files = stdlib_files()
    if split == "target":
        return [f for i, f in enumerate(files) if i % 8 not in SPLITS.values()]
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use target, drafter or eval")
    return [f for i, f in enumerate(files) if i % 8 == SPLITS[split]]


def training_stream() -> torch.Tensor:
    """The target's training text as one token stream, files separated by EOS: LongTensor [L]."""
    parts = []
    for f in split_files("target"):
        parts.append(torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8).long())
        parts.append(torch.tensor([bytetok.EOS]))
    return torch.cat(parts)


MAX_THREADS = 2  # the demo's models are small: more intra-op threads only add contention


def cpu_threads(cores: int, load: float) -> int:
    """Intra-op threads for the cores this process may use and the box's 1-minute load: one per core left free
    by the other work (at least 1, at most MAX_THREADS). A thread per core on a busy box makes torch's threads
    wait on each other and on the other work: the walk's demo took 53 min beside load 5-10, 137 s quiet."""
    return max(1, min(MAX_THREADS, round(cores - load)))


@functools.cache
def _free_threads() -> int:
    """Decided once per process, before its own work adds to the load it reads."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpu_threads(cores, os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)


def use_cpu_threads() -> None:
    """`cpu_threads` of this process's cores and the box's load when it first asked."""
    torch.set_num_threads(_free_threads())


def build_target(out_dir: str | Path, *, steps: int = FULL_STEPS, seed: int = 0, progress=None,
                 family: str = "qwen3_5") -> Path:
    """Train the tiny target for `steps` AdamW steps and save it as a transformers model directory.

    `out_dir` gets config.json, model.safetensors, generation_config.json, the tokenizer files and
    `demo_train_log.json` (the loss per step: a test asserts it fell). `progress(step, steps,
    loss)` is called after every step.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    from tracker.environment import linear_attn

    use_cpu_threads()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config(family))
    linear_attn.apply("auto", "cpu", linear_attn.module_of(model))  # on CPU: the torch path
    stream = training_stream()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps))
    losses = []
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        batch = _sample_windows(stream, BATCH, SEQ_LEN, gen)  # [B, S]
        loss = model(input_ids=batch, labels=batch).loss  # the model shifts the labels
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        losses.append(round(loss.item(), 4))
        if progress:
            progress(step, steps, losses[-1])
    seconds = time.perf_counter() - start
    model.eval()

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=bytetok.BOS, eos_token_id=bytetok.EOS, pad_token_id=bytetok.PAD, do_sample=False
    )
    model.save_pretrained(out)
    bytetok.save(out)
    log = {"steps": steps, "seed": seed, "batch": BATCH, "seq_len": SEQ_LEN, "lr": LR,
           "train_files": len(split_files("target")), "train_tokens": int(stream.numel()),
           "seconds": round(seconds, 1), "loss": losses}
    (out / LOG_FILE).write_text(json.dumps(log) + "\n")
    return out


def lr_factor(step: int, steps: int, warmup: int = WARMUP) -> float:
    """Learning-rate multiplier: linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac)))


def _sample_windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """n random windows of `length` tokens: LongTensor [n, length]."""
    starts = torch.randint(0, stream.numel() - length, (n,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def training_log(target_dir: str | Path) -> dict:
    """What `build_target` wrote about its training (steps, loss per step, seconds)."""
    return json.loads((Path(target_dir) / LOG_FILE).read_text())


def make_prompts(n: int, *, seed: int, length: int, split: str = "eval") -> list[list[int]]:
    """n deterministic prompts of `length` tokens from held-out stdlib files.

    Each prompt starts at the beginning of a non-blank line of a random file of `split`
    ("drafter": prompts the drafters train on, "eval": prompts the evals score; disjoint files,
    neither seen by the target) and is cut at `length` bytes.
    """
    rng = random.Random(seed)
    texts = [f.read_bytes() for f in split_files(split)]
    starts = [[i for i in _line_starts(t) if i + length <= len(t) and t[i] != ord("\n")] for t in texts]
    usable = [(t, s) for t, s in zip(texts, starts) if s]
    prompts = []
    for _ in range(n):
        text, candidates = usable[rng.randrange(len(usable))]
        i = candidates[rng.randrange(len(candidates))]
        prompts.append(list(text[i : i + length]))
    return prompts


def _line_starts(text: bytes) -> list[int]:
    starts, i = [0], text.find(b"\n")
    while i != -1:
        starts.append(i + 1)
        i = text.find(b"\n", i + 1)
    return starts
