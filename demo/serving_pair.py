"""A target and drafter a serving engine can run: the demo's byte-level target, trained briefly on
local text, and a block-8 DFlash drafter trained on its greedy completions. Family `qwen3` on these
CPUs (vLLM serves Qwen3 here; its Qwen3.5 code needs torchvision), `qwen3_5` (the hybrid) on a GPU
box (benchmarks/gpu/engine_hybrid.py). Used by the demo's served evals (demo/served.py), the engine
tests and benchmarks/engine_eval.py; ~30 s on 2 cores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from demo.target import build_target, make_prompts
from demo.train_dflash import TrainConfig, prepare_data, train

MAX_NEW_TOKENS = 96
BLOCK_SIZE = 8
TARGET_STEPS, DRAFTER_STEPS = 150, 200


@dataclass(frozen=True)
class ServingPair:
    root: Path
    target: Path  # root / target_name
    drafter: Path  # the drafter's checkpoint (z-lab format): root/drafters/step_N
    prompts: Path  # held-out prompts, JSONL of input_ids
    train_run_id: str  # the drafter's training run in the tracker it was logged to
    step: int  # the checkpoint's step


def build_serving_pair(root: str | Path, n_prompts: int = 8, family: str = "qwen3", *, tracker=None,
                       target_name: str = "target", drafter_name: str = "dflash", link: bool = True,
                       progress: Callable[[float], None] | None = None) -> ServingPair:
    """`root/<target_name>`, the drafter's checkpoint (z-lab format) under `root/drafters`, linked as
    `root/drafter` unless `link` is False (the demo lists every file it makes: a link would be one more, and
    a copied home holds a folder there), and `root/prompts.jsonl` (held-out prompts). The drafter's training
    run goes to `tracker` (default: a store of its own, `root/train.db`); `progress(f)` is told the fraction
    done after every training step."""
    from tracker.store.tracker import Tracker

    root = Path(root)
    share = TARGET_STEPS / (TARGET_STEPS + DRAFTER_STEPS)  # the two loops take about the same time per step

    def told(start: float, width: float):
        return (lambda step, steps, loss: progress(start + width * step / steps)) if progress else None

    target = build_target(root / target_name, steps=TARGET_STEPS, family=family, progress=told(0.0, share))
    data = prepare_data(target, make_prompts(48, seed=1, length=24, split="drafter"), MAX_NEW_TOKENS)
    run_id = train(TrainConfig(name=drafter_name, heads=2, steps=DRAFTER_STEPS, block_size=BLOCK_SIZE,
                               ckpt_every=10**6),
                   target, data, tracker or Tracker(f"sqlite:///{root / 'train.db'}"), root / "drafters",
                   progress=told(share, 1.0 - share))
    checkpoint = root / "drafters" / f"step_{DRAFTER_STEPS}"
    if link:
        (root / "drafter").symlink_to(checkpoint)
    prompts = make_prompts(n_prompts, seed=2, length=24, split="eval")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return ServingPair(root, target, checkpoint, root / "prompts.jsonl", run_id, DRAFTER_STEPS)
