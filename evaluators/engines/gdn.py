"""What a serving engine runs for a hybrid target's Gated DeltaNet layers: results `engine.linear_attention`.

Offline, transformers picks fla / causal-conv1d or its torch reference per function
(`tracker.environment.linear_attn`); on the serving box the engine runs a third implementation, its own. This
record names it per piece (the same function names `tracker.environment.linear_attn.PIECES` compares), from
two sources, never from the device name alone:
- the engine module's `GDN_PROBE`, run in the engine's own Python: what its code calls on this
  platform (on CPU, the same capability tests vLLM's GDN op makes);
- what the engine logged at start (`settings_from_log`: the prefill and spec-decode kernels it
  chose, the SSM state dtype it reset, the model runner, prefix caching): it names the pieces the
  probe cannot (a GPU box's prefill backend is chosen at start), and is kept beside it in `settings`.
Beside the pieces, the settings that change GDN results: prefix caching and the mamba cache mode,
the SSM / mamba state dtype, the model dtype, eager or graphs, the model runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracker.environment import linear_attn

# Settings that change what a GDN layer computes or which state it resumes from, as the record
# names them, each with the engine's own names it is read from (server report, then start log).
SETTINGS = {
    "dtype": ("dtype", "config_dtype"),
    "enable_prefix_caching": ("enable_prefix_caching", "config_enable_prefix_caching"),
    "disable_radix_cache": ("disable_radix_cache",),
    "mamba_cache_mode": ("mamba_cache_mode",),
    "mamba_ssm_cache_dtype": ("mamba_ssm_cache_dtype", "mamba_ssm_dtype"),
    "mamba_cache_dtype": ("mamba_cache_dtype",),
    "enforce_eager": ("config_enforce_eager",),
    "cuda_graphs": ("cuda_graphs",),
    "model_runner": ("model_runner",),
    "gdn_prefill_kernel": ("gdn_prefill_kernel",),
    "gdn_spec_decode_kernel": ("gdn_spec_decode_kernel",),
}


@dataclass
class EngineGDN:
    engine: str
    platform: str | None  # the engine's own platform name (cpu, cuda, rocm, xpu); None: not probed
    functions: dict[str, str]  # tracker.environment.linear_attn.PIECES' function names -> what the engine runs
    settings: dict = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # what the record was read from
    capabilities: dict = field(default_factory=dict)  # what the probe's choice rested on (CPU: AMX, AVX-512 bf16)

    @property
    def summary(self) -> str:
        if not self.functions:
            return f"{self.engine}: unknown (nothing read from the engine says what runs its GDN layers)"
        words = [f"{label}: {_kind(self.functions[name])}" for label, name in linear_attn.PIECES
                 if name in self.functions]
        return f"{self.engine} on {self.platform or 'an unknown platform'}: {'; '.join(words)}"

    def to_dict(self) -> dict:
        return {"engine": self.engine, "platform": self.platform, "functions": dict(self.functions),
                "summary": self.summary, "settings": dict(self.settings), "sources": list(self.sources),
                "capabilities": dict(self.capabilities)}


def _kind(implementation: str) -> str:
    """`vllm C++ kernel vllm._custom_ops.x` -> `vllm C++ kernel`: the words before the qualified name."""
    head = []
    for word in implementation.split(" "):
        if "." in word or word.startswith("("):
            break
        head.append(word)
    return " ".join(head) or implementation


def record(engine: str, probe: dict | None, logged: dict, logged_functions: dict[str, str],
           reported: dict) -> EngineGDN:
    """The engine's GDN record from its probe, its start log and what the server reports of itself
    (`reported`: EngineInfo.settings; the server's own report wins over the managed defaults)."""
    probed = {k: v for k, v in ((probe or {}).get("functions") or {}).items()
              if isinstance(k, str) and isinstance(v, str)}
    functions = {**logged_functions, **probed}
    merged = {**logged, **reported}
    settings = {}
    for name, keys in SETTINGS.items():
        value = next((merged[k] for k in keys if merged.get(k) is not None), None)
        if value is not None:
            settings[name] = value
    sources = [s for s, present in (("probe in the engine's Python", bool(probe)), ("the engine's start log", bool(logged)),
                                    ("the server's report", bool(reported))) if present]
    platform = (probe or {}).get("platform")
    capabilities = (probe or {}).get("capabilities")
    return EngineGDN(engine, platform if isinstance(platform, str) else None, functions, settings, sources,
                     {str(k): v for k, v in capabilities.items() if isinstance(v, bool)}
                     if isinstance(capabilities, dict) else {})
