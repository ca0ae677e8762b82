"""A target and drafter a serving engine can run: the demo's byte-level target, trained briefly on
local text, and a block-8 DFlash drafter trained on its greedy completions. Family `qwen3` on these
CPUs (vLLM serves Qwen3 here; its Qwen3.5 code needs torchvision), `qwen3_5` (the hybrid) on a GPU
box (benchmarks/gpu/engine_hybrid.py). Used by the engine tests and benchmarks/engine_eval.py;
~30 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

from demo.target import build_target, make_prompts
from demo.train_dflash import TrainConfig, prepare_data, train

MAX_NEW_TOKENS = 96
BLOCK_SIZE = 8


def build_serving_pair(root: str | Path, n_prompts: int = 8, family: str = "qwen3") -> Path:
    """`root/target`, `root/drafter` (z-lab format) and `root/prompts.jsonl` (held-out prompts)."""
    from tracker.store.tracker import Tracker

    root = Path(root)
    build_target(root / "target", steps=150, family=family)
    data = prepare_data(root / "target", make_prompts(48, seed=1, length=24, split="drafter"), MAX_NEW_TOKENS)
    train(TrainConfig(heads=2, steps=200, block_size=BLOCK_SIZE, ckpt_every=10**6), root / "target", data,
          Tracker(f"sqlite:///{root / 'train.db'}"), root / "drafters")
    (root / "drafter").symlink_to(root / "drafters" / "step_200")
    prompts = make_prompts(n_prompts, seed=2, length=24, split="eval")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root
