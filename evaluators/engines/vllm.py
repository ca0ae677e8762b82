"""vLLM's OpenAI server (0.32): completions of token ids, acceptance per request.

Read from vLLM's own sources (v0.32.0):
- `entrypoints/openai/completion/protocol.py`: `prompt` may be token ids; `return_token_ids` returns
  the completion's ids; `stop_token_ids`, `ignore_eos`, `top_k` (-1: off).
- `v1/metrics/stats.py` `RequestSpecDecodeMetrics.to_dict`: with `--per-request-spec-decode-metrics
  detailed` the response's `metrics.speculative_decoding` holds `acceptance_histogram` (steps by
  accepted draft count), `num_spec_steps`, `num_accepted_draft_tokens`, `num_draft_tokens`,
  `num_spec_tokens`, `per_step_accepted`, `per_step_drafted`.
- `v1/spec_decode/metrics.py`: counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
  `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos{position}` (exported with `_total`);
  mean acceptance length = 1 + accepted / drafts. Without per-request metrics, the deltas of these
  counters around one request at concurrency 1 are that request's.
- `entrypoints/serve/instrumentator/basic.py` `/version`; `entrypoints/openai/models/api_router.py`
  `/v1/models` (`id`, `root`, `max_model_len`).
- Gated DeltaNet (hybrid targets), `model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`: the
  layer picks `forward_cpu` on CPU (`ops/cpu/gdn_attention.py`, bf16 only: "CPU GDN attention
  requires BF16"), else a prefill backend it logs ("Using {CPU|Triton/FLA|FlashInfer|CuteDSL} GDN
  prefill kernel") and a spec-decode kernel ("GDN spec decode kernel: {CPU|triton|cuda}").
  `platforms/cpu.py` resets the SSM state to float32 ("Reset SSM cache type to float32 ...");
  `config/vllm.py` falls back to the V1 model runner without Triton.
"""

from __future__ import annotations

from pathlib import Path

import json
import re

from evaluators.engines.base import (EngineClient, EngineError, EngineInfo, EngineReply, EngineRequest, engine_timings,
                                     reply_from_deltas)
from evaluators.engines.staging import Staged
from tracker.measurement import engine_metrics as em

NAME = "vllm"


# The per-request timings of vLLM's reply (`metrics`, --enable-per-request-metrics; vLLM's
# `build_per_request_timing_metrics`): first token - scheduled, (last - first token) / (tokens - 1),
# scheduled - queued, last - first token; milliseconds, measured by the engine.
TIMINGS = ("time_to_first_token_ms", "mean_itl_ms", "queue_time_ms", "generation_time_ms")


# How this engine ends a completion, as a protocol's `last_block` rule: vLLM counts its last step whole (it drafts a whole block at every step and stops once the tokens are out).
LAST_BLOCK = "full"


def server_argv(python: str, target: str, drafter: str | None, port: int, num_speculative_tokens: int, dtype: str,
                max_model_len: int, device: str, slots: int = 1, prefix_caching: bool = False,
                memory_share: float = 1.0, tensor_parallel: int = 1) -> list[str]:
    """`vllm serve` for a managed eval: exact numbers first (the eval's dtype, eager on CPU, no
    prefix caching, so one prompt's acceptance never depends on the one before), per-request
    statistics on, `slots` sequences at a time (a load sweep's largest level). vLLM 0.32 picks DFlash2's
    model class from the drafter's architectures, so the method is `dflash` for both families. Without
    a drafter: the same server serving the target alone (a load sweep's other arm). `prefix_caching`: a load
    sweep's cache dimension (`--prefix-caching`), asked for by the user on a target whose cache is exact.
    `memory_share`: the part of a GPU's memory this server may take (`shared_device_options`). `tensor_parallel`:
    the target split over that many GPUs (the job's: `--tensor-parallel-size`)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", target, "--dtype", dtype, "--max-model-len", str(max_model_len), "--seed", "0",
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching", "--max-num-seqs", str(slots),
            "--disable-uvicorn-access-log",
            "--enable-per-request-metrics"]
    if drafter is not None:
        spec = {"method": "dflash", "model": drafter, "num_speculative_tokens": num_speculative_tokens}
        argv += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
    if tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel)]
    if device == "cpu":
        # The CPU backend reserves --gpu-memory-utilization of the node's memory (0.92 by default).
        argv += ["--enforce-eager", "--gpu-memory-utilization", "0.2"]
    elif memory_share < 1:
        argv += ["--gpu-memory-utilization", f"{GPU_MEMORY_UTILIZATION * memory_share:.3f}"]
    return argv


GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of a GPU's memory for one server


def shared_device_options(device: str, servers: int) -> dict:
    """How each of `servers` servers up at once on one device is started (a load sweep's two arms): on a GPU
    each takes its share of vLLM's default memory, where one alone would take it all and the next fail to start;
    on CPU the KV cache is a fixed VLLM_CPU_KVCACHE_SPACE each."""
    return {} if device == "cpu" or servers < 2 else {"memory_share": 1 / servers}


def server_env(device: str) -> dict[str, str]:
    return {"VLLM_CPU_KVCACHE_SPACE": "1"} if device == "cpu" else {}  # GiB of KV cache


def prepare(python: str, folders: Staged, dtype: str, cache: Path, progress) -> tuple[str, str, dict]:
    """What the managed server loads: vLLM loads the staged transformers folders as they are."""
    return folders.target, folders.drafter, {}


def managed_settings(device: str, dtype: str, slots: int = 1, prefix_caching: bool = False,
                     memory_share: float = 1.0, tensor_parallel: int = 1) -> dict:
    """What `server_argv` runs the server with (the server reports less of it)."""
    return {"dtype": dtype, "enable_prefix_caching": prefix_caching, "cuda_graphs": device != "cpu",
            "max_num_seqs": slots, "tp_size": tensor_parallel,
            **({"gpu_memory_share": memory_share} if memory_share < 1 else {})}


def aux_layers_from_log(text: str) -> list[int] | None:
    """The layers vLLM logs as the drafter's auxiliary hidden states (`gpu_model_runner.py`)."""
    for line in text.splitlines():
        if em.VLLM_AUX_LAYERS_LOG in line:
            inside = line.split(em.VLLM_AUX_LAYERS_LOG, 1)[1].strip().strip("()[] ")
            try:
                return [int(x) for x in inside.replace(",", " ").split()]
            except ValueError:
                return None
    return None


PREFIX_CACHE_OFF = "--no-enable-prefix-caching"


# What vLLM's own code runs for each Gated DeltaNet piece, read in the engine's Python (`python -c`):
# the platform's forward, and on CPU the same capability tests `ops/cpu/gdn_attention.py` makes
# (with speculative decoding the layer takes its spec-aware path: C++ conv only with AMX or Arm bf16,
# else vLLM's torch conv; C++ chunk, recurrent and spec-decode rules; RMSNormGated's torch forward).
# On GPUs the prefill and spec-decode kernels are chosen at start and logged (`settings_from_log`).
# Prints one JSON object; keys as `tracker.environment.linear_attn` names the pieces.
GDN_PROBE = r"""
import json, torch
from vllm.platforms import current_platform as platform
def name(fn):
    return f"{fn.__module__}.{fn.__qualname__}"
out = {"platform": platform.device_type, "functions": {}}
if platform.is_cpu():
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as g
    from vllm.model_executor.layers.layernorm import RMSNormGated
    def kernel(op):
        registered = hasattr(torch.ops._C, op)
        return f"vllm C++ kernel {name(getattr(ops, op))}" + ("" if registered else " (op not registered)")
    native_conv = bool(torch.cpu._is_amx_tile_supported() or g.is_arm_bf16())
    out["capabilities"] = {"amx": bool(torch.cpu._is_amx_tile_supported()), "avx512_bf16":
                           bool(torch.cpu._is_avx512_bf16_supported()), "arm_bf16": bool(g.is_arm_bf16())}
    out["functions"] = {
        "causal_conv1d_fn": kernel("causal_conv1d_fwd_cpu") if native_conv else
            f"vllm torch {name(g._spec_aware_nonspec)}",
        "causal_conv1d_update": kernel("causal_conv1d_update_cpu") if native_conv else
            f"vllm torch {name(g._spec_forward)}",
        "torch_chunk_gated_delta_rule": kernel("chunk_gated_delta_rule_cpu"),
        "torch_recurrent_gated_delta_rule": kernel("fused_sigmoid_gating_delta_rule_update_cpu"),
        "spec_decode": kernel("fused_sigmoid_gating_delta_rule_update_spec_cpu"),
        "gated_norm": f"vllm torch {name(RMSNormGated.forward_native)}",
    }
elif platform.is_cuda_alike():
    from vllm.model_executor.layers.mamba.ops import causal_conv1d as conv
    out["functions"] = {"causal_conv1d_fn": f"vllm triton {name(conv.causal_conv1d_fn)}",
                        "causal_conv1d_update": f"vllm triton {name(conv.causal_conv1d_update)}"}
print(json.dumps(out))
"""

# The lines vLLM logs at start that say what its GDN layers and caches run (see the module's docstring).
_GDN_LOG = (
    ("gdn_prefill_kernel", re.compile(r"Using (\S+(?: \S+)?) GDN prefill kernel")),
    ("gdn_spec_decode_kernel", re.compile(r"GDN spec decode kernel: (\S+)")),
    ("mamba_ssm_cache_dtype", re.compile(r"Reset SSM cache type to (\w+)")),
    ("mamba_ssm_cache_dtype", re.compile(r"Using (\w+) SSM state storage")),
    ("model_runner", em.VLLM_RUNNER_LINE),
    ("engine_version", em.VLLM_ENGINE_LINE),
)
_ENGINE_CONFIG = re.compile(r"\b(enable_prefix_caching|enforce_eager|dtype)=([\w.]+)")
_PREFILL_KERNELS = {"CPU": "vllm C++ kernel", "Triton/FLA": "vllm triton (fla copy)", "FlashInfer": "flashinfer",
                    "CuteDSL": "vllm CuTe DSL", "AITER FlyDSL": "aiter FlyDSL"}
MAX_LOG_LINE = 4096  # the start lines are short; a longer line is not one of them


def settings_from_log(text: str) -> dict:
    """What the engine logged of its GDN kernels and the settings that change GDN results (first
    mention wins: vLLM logs each once, from every process)."""
    found: dict = {}
    for line in text.splitlines():
        line = line[:MAX_LOG_LINE]
        for key, pattern in _GDN_LOG:
            match = key not in found and pattern.search(line)
            if match:
                found[key] = match.group(1)
        if "LLM engine" in line and "with config:" in line:
            for key, value in _ENGINE_CONFIG.findall(line):
                found.setdefault(f"config_{key}", value)
    return found


def gdn_functions_from_log(settings: dict) -> dict[str, str]:
    """The GDN pieces a GPU box's log names (the chunk rule's backend and the spec-decode kernel)."""
    out = {}
    prefill = settings.get("gdn_prefill_kernel")
    if prefill:
        out["torch_chunk_gated_delta_rule"] = f"{_PREFILL_KERNELS.get(prefill, prefill)} (logged: {prefill})"
    spec = settings.get("gdn_spec_decode_kernel")
    if spec:
        out["spec_decode"] = f"vllm {spec} spec-decode kernel (logged)"
    return out


class VLLMClient(EngineClient):
    name = NAME

    def __init__(self, url: str):
        super().__init__(url)
        self._model: str | None = None
        self._per_request: bool | None = None  # None: not known until the first reply

    def info(self) -> EngineInfo:
        models = (self.get_json("/v1/models") or {}).get("data") or []
        if not models:
            raise EngineError(f"vllm at {self.url} serves no model (/v1/models is empty)")
        served = models[0]
        self._model = served.get("id")
        version = (self.get_json("/version") or {}).get("version")
        samples = em.prometheus_samples(self.get_text("/metrics"))
        if em.counter(samples, em.VLLM_DRAFTS) is None:
            raise EngineError(f"vllm at {self.url} runs no speculative decoding (/metrics has no "
                              f"{em.VLLM_DRAFTS}); "
                              "start it with --speculative-config")
        n_spec = len(em.vllm_totals(samples).by_position) or None
        cache = {lab_k: lab_v for n, lab, _ in samples if n == "vllm:cache_config_info"
                 for lab_k, lab_v in lab.items() if lab_k in ("enable_prefix_caching", "cache_dtype", "mamba_cache_mode",
                                                                "mamba_ssm_cache_dtype", "mamba_cache_dtype")}
        return EngineInfo(name=NAME, version=version, url=self.url, model=served.get("root") or self._model,
                          draft_model=None, method=None, num_speculative_tokens=n_spec,
                          settings={"max_model_len": served.get("max_model_len"), **cache})

    def _complete(self, input_ids: list[int], request: EngineRequest) -> tuple[list[int], dict]:
        body = {"model": self._model, "prompt": input_ids, "max_tokens": request.max_tokens,
                "temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k,
                "stop_token_ids": list(request.stop_token_ids), "return_token_ids": True,
                "skip_special_tokens": False, "seed": 0}
        reply = self.post_json("/v1/completions", body)
        try:
            choice = reply["choices"][0]
            return [int(t) for t in choice["token_ids"]], reply
        except (KeyError, IndexError, TypeError, ValueError):
            raise EngineError(f"vllm at {self.url}: a completion without token_ids (vLLM older than 0.10?)") from None

    def complete(self, input_ids: list[int], request: EngineRequest) -> list[int]:
        if self._model is None:
            models = (self.get_json("/v1/models") or {}).get("data") or []
            self._model = models[0].get("id") if models and isinstance(models[0], dict) else None
        return self._complete(input_ids, request)[0]

    def generate(self, input_ids: list[int], request: EngineRequest) -> EngineReply:
        """With `cross_check` (managed: no other client), the request's own statistics must equal the
        deltas of vLLM's Prometheus counters around it, or the reply is refused."""
        before = None if self._per_request and not self.cross_check else self.counters()
        ids, reply = self._complete(input_ids, request)
        metrics = reply.get("metrics") if isinstance(reply, dict) else None
        metrics = metrics if isinstance(metrics, dict) else {}
        timings = engine_timings(metrics, TIMINGS)
        stats = metrics.get("speculative_decoding")
        if stats:
            self._per_request = True
            reply = _from_request_stats(ids, stats, timings)
            if not self.cross_check:
                return reply
            return _checked(reply, reply_from_deltas(ids, before, self.counters(), "vllm /metrics deltas"))
        self._per_request = False
        reply = reply_from_deltas(ids, before, self.counters(), "vllm /metrics deltas")
        reply.timings = timings
        return reply

    @property
    def counts_per_request(self) -> bool:
        """Whether each reply carries its own counts (--per-request-spec-decode-metrics detailed)."""
        return bool(self._per_request)

    def counters(self) -> em.SpecTotals:
        return em.vllm_totals(em.prometheus_samples(self.get_text("/metrics")))

    def prefix_cache_counters(self) -> tuple[float, float] | None:
        """vLLM's prefix cache counters now: (tokens queried, tokens found cached); None where it has none."""
        samples = em.prometheus_samples(self.get_text("/metrics"))
        queries, hits = em.counter(samples, em.VLLM_PREFIX_QUERIES), em.counter(samples, em.VLLM_PREFIX_HITS)
        return None if queries is None or hits is None else (queries, hits)


def _from_request_stats(ids: list[int], stats: dict, timings: dict[str, float]) -> EngineReply:
    steps = stats.get("per_step_accepted")
    drafts, accepted = int(stats["num_spec_steps"]), int(stats["num_accepted_draft_tokens"])
    return EngineReply(completion_ids=ids, drafts=drafts,
                       draft_tokens=int(stats["num_draft_tokens"]), accepted=accepted,
                       histogram=[int(c) for c in stats["acceptance_histogram"]],
                       accepted_per_step=em.per_step_counts(steps, drafts, accepted, None, "vLLM's per_step_accepted")
                       if steps is not None else None,
                       source="vllm metrics.speculative_decoding",
                       reported_mean=stats.get("mean_acceptance_length"), timings=timings)


def _checked(reply: EngineReply, counted: EngineReply) -> EngineReply:
    """The request's own statistics, if vLLM's counters moved by exactly as much around it."""
    own = (reply.drafts, reply.draft_tokens, reply.accepted, reply.accepted_by_position)
    moved = (counted.drafts, counted.draft_tokens, counted.accepted, counted.accepted_by_position)
    if own != moved:
        raise EngineError(f"vllm's per-request statistics (drafts, draft tokens, accepted, by position) {own} disagree "
                          f"with its /metrics counters' deltas around the request {moved}: refused, not averaged")
    reply.source = "vllm metrics.speculative_decoding = /metrics deltas"
    return reply
