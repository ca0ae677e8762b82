"""The engine eval on a Qwen3.5 hybrid target (Gated DeltaNet + full attention), for a GPU box.

vLLM serves Qwen3.5 only where torchvision loads beside its torch (its qwen3_5 code imports
transformers' qwen2_vl image processor), so on the CPU boxes of this project the hybrid is tested
offline and this script is its served check: `benchmarks/engine_eval.py` with the demo's hybrid
target, on cuda. It needs a venv with a CUDA build of vLLM (`pip install vllm==0.32.0`), named by
--engine-python or DRAFTBOARD_VLLM_PYTHON, and prints engine_eval's JSON line: the served mean
acceptance length, the offline tau, and the gap in parts (docs/GPU.md).

Usage: python benchmarks/gpu/engine_hybrid.py [--engine-python PATH] [--prompts 16]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_eval import main  # noqa: E402 (after the path it is found on)

if __name__ == "__main__":
    main(["--family", "qwen3_5", "--device", "cuda", *sys.argv[1:]])
