"""A serving config against the drafter it serves.

Read as vLLM's `--speculative-config` JSON ({"method", "model", "num_speculative_tokens"}), a
file holding it under `speculative_config`, or SGLang's launch arguments
({"speculative_algorithm", "speculative_num_draft_tokens"}, dashes or underscores); the same file
may carry `mamba_ssm_dtype` and `chat_template_kwargs`. What the engines do with them was read
from their sources: vLLM 0.32 serves DFlash and DFlash2 under method `dflash` (its DFlash2
speculator is chosen by the draft config's architectures); SGLang's algorithm is `DFLASH` for
both. A DFlash block of B positions drafts B - 1 tokens: vLLM's num_speculative_tokens is B - 1,
SGLang's speculative_num_draft_tokens counts the anchor too (B).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evaluators.doctor.report import CRITICAL, INFO, OK, WARNING, Check
from evaluators.drafter import DFLASH2, DrafterConfig
from evaluators.weights import one_line
from tracker.errors import DraftboardError

SPECULATION, METHOD, SSM_DTYPE = "speculation_length", "serving_method", "mamba_ssm_dtype"
VLLM_METHOD, SGLANG_ALGORITHM = "dflash", "DFLASH"


@dataclass(frozen=True)
class ServingConfig:
    engine: str  # vllm | sglang
    method: str | None
    draft_tokens: int | None  # drafted tokens per step, anchor excluded
    mamba_ssm_dtype: str | None
    enable_thinking: bool | None  # chat_template_kwargs.enable_thinking


def _get(raw: dict, name: str):
    return raw.get(name, raw.get(name.replace("_", "-")))


def read_serving_config(path: str | Path) -> ServingConfig:
    """DraftboardError in one line for a file that is not one of the shapes above."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DraftboardError(f"--serving-config {path}: not a readable JSON file ({one_line(exc)})") from None
    if not isinstance(raw, dict):
        raise DraftboardError(f"--serving-config {path}: expected a JSON object")
    kwargs = _get(raw, "chat_template_kwargs") or {}
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    ssm = _get(raw, "mamba_ssm_dtype")
    if _get(raw, "speculative_algorithm") is not None:
        n = _get(raw, "speculative_num_draft_tokens")
        return ServingConfig("sglang", str(_get(raw, "speculative_algorithm")),
                             int(n) - 1 if isinstance(n, int) else None, ssm, thinking)
    spec = _get(raw, "speculative_config") or raw
    if not isinstance(spec, dict) or "method" not in spec:
        raise DraftboardError(f"--serving-config {path}: no speculative config (vLLM: method, num_speculative_tokens;"
                              " SGLang: speculative_algorithm, speculative_num_draft_tokens)")
    n = spec.get("num_speculative_tokens")
    return ServingConfig("vllm", str(spec["method"]), n if isinstance(n, int) else None, ssm, thinking)


def speculation_length(serving: ServingConfig, drafter: DrafterConfig) -> Check:
    block = drafter.block_size
    flag = "num_speculative_tokens" if serving.engine == "vllm" else "speculative_num_draft_tokens"
    served = serving.draft_tokens if serving.engine == "vllm" or serving.draft_tokens is None \
        else serving.draft_tokens + 1
    right = block - 1 if serving.engine == "vllm" else block
    evidence = f"{serving.engine} {flag}={served}; the drafter's block_size {block} drafts {block - 1} tokens"
    if serving.draft_tokens is None:
        return Check(SPECULATION, WARNING, f"the serving config does not set {flag}", evidence,
                     f"set {flag}={right}")
    if serving.draft_tokens > block - 1:
        return Check(SPECULATION, CRITICAL, "the server drafts more tokens than the drafter's block holds: the "
                     "positions past it were never trained", evidence, f"set {flag}={right}")
    if serving.draft_tokens < block - 1:
        return Check(SPECULATION, WARNING, "the server drafts fewer tokens than the drafter's block: acceptance is "
                     f"capped at {serving.draft_tokens + 1}, below what offline evals of this drafter measure",
                     evidence, f"set {flag}={right} to serve what was evaluated")
    return Check(SPECULATION, OK, "the server drafts one block", evidence)


def method(serving: ServingConfig, drafter: DrafterConfig) -> Check:
    expected = VLLM_METHOD if serving.engine == "vllm" else SGLANG_ALGORITHM
    evidence = f"{serving.engine} method {serving.method!r}; the drafter is {drafter.family}"
    if serving.method != expected:
        return Check(METHOD, CRITICAL, f"{serving.engine} serves DFlash and DFlash2 drafters as {expected!r}, not "
                     f"{serving.method!r}", evidence, f"set the method to {expected!r}")
    note = " (its DFlash2 path follows the draft config's architectures)" if drafter.family == DFLASH2 else ""
    return Check(METHOD, OK, f"the method serves this drafter{note}", evidence)


# transformers' torch reference computes the gated delta rule, its recurrent state included, in fp32
# whatever the model's dtype (torch_chunk_gated_delta_rule casts its inputs to float32).
OFFLINE_STATE = "float32"


def ssm_dtype(serving: ServingConfig) -> Check:
    if serving.mamba_ssm_dtype is None:
        return Check(SSM_DTYPE, INFO, "the serving config does not pin mamba_ssm_dtype: the engine's default applies "
                     "to the Gated DeltaNet recurrent state", f"offline the state is {OFFLINE_STATE}")
    evidence = f"served mamba_ssm_dtype {serving.mamba_ssm_dtype}; offline the state is {OFFLINE_STATE}"
    if serving.mamba_ssm_dtype not in ("float32", "fp32"):
        return Check(SSM_DTYPE, WARNING, "the served recurrent state is narrower than offline: a hybrid target's "
                     "features drift with it over a long completion, and acceptance with them", evidence,
                     "serve with --mamba-ssm-dtype float32 (the published serving profiles pin it)")
    return Check(SSM_DTYPE, OK, "the served recurrent state is as wide as offline", evidence)
