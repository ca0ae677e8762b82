"""One eval as one process against the same eval sharded over every GPU of the box, for a GPU node.

`benchmarks/shards.py` with `--device cuda --shards <every GPU this process sees>` (CUDA_VISIBLE_DEVICES, else
torch's count): shard k runs on the k-th GPU alone. It prints that benchmark's lines: each arm's seconds cold and warm
with their spread, whether every results key equals the one process's, and the ratio one process / all GPUs.
On one GPU it compares one process with one shard process (the ratio is the cost of the shard's own start-up).

Usage: python benchmarks/gpu/shards.py [--prompts 64] [--repeats 3]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shards import main  # noqa: E402 (after the path it is found on)


def _gpus() -> int:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([g for g in listed.split(",") if g.strip()])
    import torch

    return torch.cuda.device_count()


if __name__ == "__main__":
    main(["--device", "cuda", "--shards", str(max(1, _gpus())), "--prompts", "64", *sys.argv[1:]])
