"""The load sweep on a Gated DeltaNet hybrid target, for a GPU box (issue 49's prepared check).

`benchmarks/load_sweep.py` with the demo's Qwen3-Next-layout hybrid pair (bf16) on cuda: draftboard's
`eval --engine vllm --concurrency 1,4,8` (each request's own counts at every level, the counters checked
per level, the target alone on the same settings) against vLLM's own `LLM.generate` of both arms, whole
processes. It needs a venv with a CUDA build of vLLM (`pip install vllm==0.32.0`), named by
--engine-python or DRAFTBOARD_VLLM_PYTHON; it prints each level's tokens/s, speedup, served acceptance
length and step cost, and ends with the benchmark's JSON line (docs/GPU.md).

Usage: python benchmarks/gpu/load_sweep_hybrid.py [--engine-python PATH] [--prompts 16] [--levels 1,4,8,16]
       [--family qwen3_next|qwen3_5]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from load_sweep import main  # noqa: E402 (after the path it is found on)

if __name__ == "__main__":
    main(["--family", "qwen3_next", "--device", "cuda", "--levels", "1,4,8,16", *sys.argv[1:]])
