"""SGLang's native server (0.5): `/generate` of token ids, acceptance per request in `meta_info`.

Read from SGLang's own sources (v0.5.23 wheel):
- `srt/managers/tokenizer_manager.py` (`_calculate_spec_decoding_metrics`): `meta_info` gets
  `spec_verify_ct` (verify steps), `spec_num_correct_drafts` (accepted draft tokens, no bonus),
  `spec_num_proposed_drafts` (= steps x (speculative_num_draft_tokens - 1)), `spec_accept_rate`,
  `spec_accept_length` (= completion_tokens / spec_verify_ct: SGLang's own definition) and
  `spec_correct_drafts_histogram` (`srt/managers/schedule_batch.py`: index = accepted drafts of a
  step). Releases before the rename wrote `spec_accept_token_num`, `spec_draft_token_num` and
  `spec_accept_histogram`; both spellings are read.
- `srt/entrypoints/http_server.py`: `/generate` (body `input_ids`, `sampling_params`; reply `text`,
  `output_ids`, `meta_info`), `/model_info` (`model_path`), `/server_info` (deprecated alias
  `/get_server_info`: the resolved server args plus `version`); `srt/utils/common.py`
  `build_server_info`.
- server args (`srt/arg_groups/`): `speculative_algorithm` (`DFLASH`), `speculative_draft_model_path`,
  `speculative_num_draft_tokens`, `dtype`, `disable_radix_cache`, `mamba_ssm_dtype`,
  `attention_backend`, `disable_cuda_graph`.
"""

from __future__ import annotations

from pathlib import Path

from evaluators.engines.base import EngineClient, EngineError, EngineInfo, EngineReply, EngineRequest
from evaluators.engines.staging import Staged

NAME = "sglang"
SETTINGS = ("dtype", "disable_radix_cache", "mamba_ssm_dtype", "attention_backend", "disable_cuda_graph",
            "speculative_num_steps", "speculative_eagle_topk")
# (current name, the name before SGLang's rename)
ACCEPTED = ("spec_num_correct_drafts", "spec_accept_token_num")
PROPOSED = ("spec_num_proposed_drafts", "spec_draft_token_num")
HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


# How this engine ends a completion, as a protocol's `last_block` rule: SGLang counts its last step whole, as vLLM does.
LAST_BLOCK = "full"


def server_argv(python: str, target: str, drafter: str, port: int, num_speculative_tokens: int, dtype: str,
                max_model_len: int, device: str, slots: int = 1, tensor_parallel: int = 1) -> list[str]:
    """`sglang.launch_server` for a managed eval: DFLASH with the verify window of the drafter's block
    (`speculative_num_draft_tokens` = draft tokens + 1, `srt/arg_groups/fields/spec.py`), no radix
    cache (a cached prefix would carry another request's recurrent state: SGLang #31850), `slots`
    requests at a time, a fixed seed, the target split over `tensor_parallel` GPUs (`--tp-size`, the job's). Flags
    are the server-arg field names (`arg_utils._field_to_cli_name`)."""
    return [python, "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port),
            "--model-path", target, "--dtype", dtype, "--context-length", str(max_model_len),
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", drafter,
            "--speculative-num-draft-tokens", str(num_speculative_tokens + 1), "--disable-radix-cache",
            "--max-running-requests", str(slots), "--random-seed", "0", "--device", device,
            "--tp-size", str(tensor_parallel)]


def server_env(device: str) -> dict[str, str]:
    return {}


def prepare(python: str, folders: Staged, dtype: str, cache: Path, progress) -> tuple[str, str, dict]:
    """What the managed server loads: SGLang loads the staged transformers folders as they are."""
    return folders.target, folders.drafter, {}


def managed_settings(device: str, dtype: str, slots: int = 1, tensor_parallel: int = 1) -> dict:
    """What `server_argv` runs the server with (what /server_info reports is read over it)."""
    return {"dtype": dtype, "disable_radix_cache": True, "max_running_requests": slots, "tp_size": tensor_parallel}


def aux_layers_from_log(text: str) -> list[int] | None:
    return None  # SGLang does not log the layers it taps


PREFIX_CACHE_OFF = "--disable-radix-cache"


# SGLang's GDN kernels are chosen inside its attention backend at start and not logged in a form
# read here yet: the record says unknown rather than guessing from the device.
GDN_PROBE = None


def settings_from_log(text: str) -> dict:
    return {}


def gdn_functions_from_log(settings: dict) -> dict[str, str]:
    return {}


def _first(meta: dict, names: tuple[str, ...]):
    return next((meta[n] for n in names if meta.get(n) is not None), None)


class SGLangClient(EngineClient):
    name = NAME

    def info(self) -> EngineInfo:
        try:
            server = self.get_json("/server_info")
        except EngineError:
            server = self.get_json("/get_server_info")  # releases before /server_info
        if not isinstance(server, dict):
            raise EngineError(f"sglang at {self.url}: /server_info is not a JSON object")
        algorithm = server.get("speculative_algorithm")
        if not algorithm:
            raise EngineError(f"sglang at {self.url} runs no speculative decoding (speculative_algorithm is "
                              "unset); start it with --speculative-algorithm DFLASH")
        draft_tokens = server.get("speculative_num_draft_tokens")
        return EngineInfo(
            name=NAME, version=server.get("version"), url=self.url, model=server.get("model_path"),
            draft_model=server.get("speculative_draft_model_path"), method=str(algorithm).lower(),
            num_speculative_tokens=int(draft_tokens) - 1 if isinstance(draft_tokens, int) else None,
            settings={k: server[k] for k in SETTINGS if k in server})

    def generate(self, input_ids: list[int], request: EngineRequest) -> EngineReply:
        params = {"max_new_tokens": request.max_tokens, "temperature": request.temperature,
                  "top_p": request.top_p, "top_k": request.top_k, "stop_token_ids": list(request.stop_token_ids),
                  "skip_special_tokens": False}
        reply = self.post_json("/generate", {"input_ids": input_ids, "sampling_params": params, "stream": False})
        try:
            ids = [int(t) for t in reply["output_ids"]]
            meta = reply["meta_info"]
        except (KeyError, TypeError, ValueError):
            raise EngineError(f"sglang at {self.url}: a /generate reply without output_ids and meta_info") from None
        steps = meta.get("spec_verify_ct")
        if not isinstance(steps, int):
            # SGLang leaves the spec fields out when no step verified a draft (a one-token completion).
            return EngineReply(ids, 0, 0, 0, [], source="sglang meta_info")
        histogram = _first(meta, HISTOGRAM)
        accepted = _first(meta, ACCEPTED)
        if accepted is None:
            raise EngineError(f"sglang at {self.url}: meta_info has spec_verify_ct but no accepted-draft count "
                              f"({' or '.join(ACCEPTED)})")
        return EngineReply(completion_ids=ids, drafts=steps, draft_tokens=int(_first(meta, PROPOSED) or 0),
                           accepted=int(accepted), histogram=[int(c) for c in histogram] if histogram else None,
                           source="sglang meta_info", reported_mean=meta.get("spec_accept_length"))
