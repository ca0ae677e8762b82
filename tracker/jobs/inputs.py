"""A queued eval's inputs at a glance: a target folder with its config.json, a drafter checkpoint (a folder with
a config.json or weight files, or a weight file), a prompts file whose first line is a prompt. The look Launch
takes at submit and a worker takes before it starts the eval (`worker.job_args`), so a job the eval would refuse
in its first second never takes a worker. The eval reads the files whole and checks them fully; this reads at
most one bounded line of each, and never follows what it reads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracker import config
from tracker.errors import DraftboardError
from tracker.untrusted import textlines

FIRST_LINE_BYTES = 1 << 20  # a prompt line longer than this is read by the eval, not glanced at here


def target_problem(target: str) -> str | None:
    if not (Path(target) / "config.json").is_file():
        return f"target {target}: no config.json there (a transformers model folder holds one)"
    return None


def checkpoint_problem(drafter: str) -> str | None:
    path = Path(drafter)
    if path.is_dir():
        if (path / "config.json").is_file() or any(
                p.suffix in config.CHECKPOINT_SUFFIXES for p in path.iterdir() if p.is_file()):
            return None
        return f"checkpoint {drafter}: a folder without a config.json or weight files ({', '.join(config.CHECKPOINT_SUFFIXES)})"
    if path.is_file() and path.suffix in config.CHECKPOINT_SUFFIXES:
        return None
    return f"checkpoint {drafter}: not a drafter checkpoint (a folder, or a {', '.join(config.CHECKPOINT_SUFFIXES)} file)"


def prompts_problem(prompts: str) -> str | None:
    if prompts.startswith(config.HF_DATASET_PREFIX):
        return None  # the worker's `datasets` library reads it
    path = Path(prompts)
    if path.is_dir():
        return None if any(p.is_file() for p in path.glob("*.jsonl")) else \
            f"prompts {prompts}: a folder without .jsonl files (one file per dataset)"
    try:
        with textlines.open_regular(path) as f:  # a FIFO named here must not hang the worker or Launch
            line = b""
            while not line.strip():
                line = f.readline(FIRST_LINE_BYTES)
                if not line:
                    return f"prompts {prompts}: empty"
        row = json.loads(line)
    except DraftboardError as exc:
        return f"prompts {exc}"
    except OSError as exc:
        return f"prompts {prompts}: cannot be read ({exc.strerror})"
    except ValueError:
        return None if len(line) >= FIRST_LINE_BYTES else \
            f"prompts {prompts}: its first line is not JSON (a prompts file is JSON lines)"
    if not isinstance(row, dict) or not any(k in row for k in config.PROMPT_KEYS):
        return (f"prompts {prompts}: its first line is not a prompt (a line holds one of "
                f"{', '.join(config.PROMPT_KEYS)})")
    return None


CONFIG_BYTES = 1 << 20  # a config.json larger than this is not read here
_ELEMENT_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def weights_bytes(target: str, dtype: str) -> int | None:
    """The target's weights in the eval's `dtype` (config.DTYPES' names), from its safetensors files' sizes and the
    dtype its config.json says they were saved in: a bound from the files, not a plan (evaluators.sizing plans);
    None where either is unknown."""
    folder = Path(target)
    try:
        files = [p for p in folder.glob("*.safetensors") if p.is_file()]
        with textlines.open_regular(folder / "config.json") as f:
            cfg = json.loads(f.read(CONFIG_BYTES + 1))
    except (DraftboardError, OSError, ValueError):
        return None
    if not files or not isinstance(cfg, dict):
        return None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    saved = next((c.get(k) for c in (cfg, text) for k in ("torch_dtype", "dtype") if isinstance(c.get(k), str)), None)
    wanted = config.DTYPES.get(dtype)
    if saved not in _ELEMENT_BYTES or wanted not in _ELEMENT_BYTES:
        return None
    return sum(p.stat().st_size for p in files) * _ELEMENT_BYTES[wanted] // _ELEMENT_BYTES[saved]


def inputs_problem(params: Mapping[str, Any]) -> str | None:
    """The first problem of a job's target, drafter and prompts; None when each looks like one."""
    for field, check in (("target", target_problem), ("drafter", checkpoint_problem), ("prompts", prompts_problem)):
        value = params.get(field)
        if isinstance(value, str) and (problem := check(value)):
            return problem
    return None
