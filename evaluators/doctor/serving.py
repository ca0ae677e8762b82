"""A serving config against the drafter it serves.

Read as vLLM's `--speculative-config` JSON ({"method", "model", "num_speculative_tokens"}), a
file holding it under `speculative_config`, or SGLang's launch arguments
({"speculative_algorithm", "speculative_num_draft_tokens"}, dashes or underscores); the same file
may carry `mamba_ssm_dtype`, `chat_template_kwargs`, the engine's version (`version`,
`vllm_version` or `sglang_version`), its cache switches (`enable_prefix_caching`,
`disable_radix_cache`, `mamba_cache_mode`) and environment (`env`: `VLLM_USE_V2_MODEL_RUNNER`). An
engine eval's results JSON (`draftboard eval --engine --out`) is read as the serving box it measured:
its `engine` section and GDN record. A text file holding a `llama-server` command line (environment
assignments before it, `#` comments) is read as llama.cpp's: `--spec-type`, `--spec-draft-n-max`
(llama.cpp's default 3 when absent), `--cache-type-k-draft`, `LLAMA_ATTN_ROT_DISABLE`, the drafter
GGUF (`-md`, whose `dflash.target_layers` is checked) and the build (a `llama-server --version`
line `version: N (...)` in the file). What the engines do with them was read
from their sources: vLLM 0.32 serves DFlash and DFlash2 under method `dflash` (its DFlash2
speculator is chosen by the draft config's architectures); SGLang's algorithm is `DFLASH` for
both. A DFlash block of B positions drafts B - 1 tokens: vLLM's num_speculative_tokens is B - 1,
SGLang's speculative_num_draft_tokens counts the anchor too (B).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from evaluators.doctor.report import CRITICAL, INFO, OK, WARNING, Check
from evaluators.drafter import DFLASH2, DrafterConfig
from evaluators.engines import llamacpp
from evaluators.engines.base import EngineError
from evaluators.engines.server import SIMULATED_ACCEPTANCE
from evaluators.weights import one_line
from tracker.measurement import engine_metrics as em
from tracker.measurement import known_bad
from tracker.errors import DraftboardError
from tracker.untrusted import textlines
from tracker.untrusted.digits import whole_number

SPECULATION, METHOD, SSM_DTYPE = "speculation_length", "serving_method", "mamba_ssm_dtype"
ENGINE_VERSION, MODEL_RUNNER, PREFIX_CACHE = "engine_version", "model_runner", "prefix_cache"
VLLM_METHOD, SGLANG_ALGORITHM, LLAMACPP_SPEC_TYPE = "dflash", "DFLASH", "draft-dflash"
SIMULATED = "simulated_acceptance"
DRAFT_KV_CACHE, GGUF_TARGET_LAYERS, LLAMACPP_BUILD = "draft_kv_cache", "gguf_target_layers", "llamacpp_build"
# llama.cpp (common/common.h): --spec-draft-n-max defaults to 3, which caps acceptance at 4.
LLAMACPP_DEFAULT_N_MAX = 3
LLAMACPP_FLAGS = {"--spec-type": "spec_type", "--spec-draft-n-max": "n_max", "--draft-max": "n_max",
                  "--cache-type-k-draft": "cache_type_k_draft", "-ctkd": "cache_type_k_draft",
                  "-md": "drafter_gguf", "--model-draft": "drafter_gguf"}
MAX_COMMAND_LINE = 64 << 10  # a command line is a few hundred bytes
MAX_SERVING_FILE = 64 << 20  # an engine eval's results (its prompts' completions included), the largest shape read


@dataclass(frozen=True)
class ServingConfig:
    engine: str  # vllm | sglang
    method: str | None
    draft_tokens: int | None  # drafted tokens per step, anchor excluded
    mamba_ssm_dtype: str | None
    enable_thinking: bool | None  # chat_template_kwargs.enable_thinking
    version: str | None = None  # the engine's
    model_runner: str | None = None  # vLLM: V1 | V2
    prefix_cache: bool | None = None  # vLLM prefix caching / SGLang radix cache; None: not said
    where: str = "the serving config"
    draft_cache_type: str | None = None  # llama.cpp --cache-type-k-draft
    rotation_disabled: bool = False  # llama.cpp LLAMA_ATTN_ROT_DISABLE=1
    defaulted: bool = False  # draft_tokens is the engine's default, not set
    drafter_gguf: str | None = None  # llama.cpp's -md
    build: int | None = None  # llama.cpp's build number; None: not known
    draft_sample_method: str | None = None  # vLLM's speculative_config draft_sample_method
    tp_size: int | None = None  # SGLang's --tp-size
    radix_strategy: str | None = None  # SGLang's --mamba-radix-cache-strategy
    simulated: tuple[str, ...] = ()  # the config's `env` sets these variables that fake acceptance (server.SIMULATED_ACCEPTANCE)

    def record(self, hybrid: bool | None, family: str | None = None) -> known_bad.Serving:
        """What the known-bad table reads of this box (tracker/measurement/known_bad.py)."""
        return known_bad.Serving(self.engine, self.version, {
            "hybrid": hybrid, "family": family, "model_runner": self.model_runner, "prefix_cache": self.prefix_cache,
            # llama.cpp's draft KV cache is f16 unless --cache-type-k-draft says otherwise
            "draft_cache_type": self.draft_cache_type or ("f16" if self.engine == "llamacpp" else None),
            "rotation_disabled": self.rotation_disabled if self.engine == "llamacpp" else None,
            "draft_sample_method": self.draft_sample_method, "tp_size": self.tp_size,
            "mamba_radix_cache_strategy": self.radix_strategy})


def _get(raw: dict, name: str):
    return raw.get(name, raw.get(name.replace("_", "-")))


def read_serving_config(path: str | Path) -> ServingConfig:
    """DraftboardError in one line for a file that is not one of the shapes above."""
    try:
        with textlines.open_regular(path) as f:  # a FIFO must not hang doctor; a huge file is not read whole
            data = f.read(MAX_SERVING_FILE + 1)
    except (OSError, DraftboardError) as exc:
        raise DraftboardError(f"--serving-config {path}: not a readable file ({one_line(exc)})") from None
    if len(data) > MAX_SERVING_FILE:
        raise DraftboardError(f"--serving-config {path}: over {MAX_SERVING_FILE >> 20} MiB, larger than any serving "
                              "config or engine eval's results")
    text = data.decode("utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
        if "--spec-type" in text[:MAX_COMMAND_LINE] or "llama-server" in text[:MAX_COMMAND_LINE]:
            return _from_llamacpp_command_line(text[:MAX_COMMAND_LINE], path)
        why = "nested too deep" if isinstance(exc, RecursionError) else one_line(exc)
        raise DraftboardError(f"--serving-config {path}: not a readable JSON file ({why})") from None
    if not isinstance(raw, dict):
        raise DraftboardError(f"--serving-config {path}: expected a JSON object")
    if isinstance(raw.get("engine"), dict) and (raw.get("protocol") or {}).get("scoring") == "engine":
        return from_engine_eval(raw["engine"])
    kwargs = _get(raw, "chat_template_kwargs") or {}
    thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    ssm = _get(raw, "mamba_ssm_dtype")
    env = raw.get("env") if isinstance(raw.get("env"), dict) else {}
    simulated = tuple(name for name in SIMULATED_ACCEPTANCE if name in env)
    if _get(raw, "speculative_algorithm") is not None:
        n = _get(raw, "speculative_num_draft_tokens")
        radix_off = _get(raw, "disable_radix_cache")
        tp = _get(raw, "tp_size") or _get(raw, "tp")
        return ServingConfig("sglang", str(_get(raw, "speculative_algorithm")),
                             int(n) - 1 if isinstance(n, int) else None, ssm, thinking,
                             _text(_get(raw, "version") or _get(raw, "sglang_version")),
                             prefix_cache=None if radix_off is None else not _flag(radix_off),
                             tp_size=tp if isinstance(tp, int) and not isinstance(tp, bool) else None,
                             radix_strategy=_text(_get(raw, "mamba_radix_cache_strategy")), simulated=simulated)
    spec = _get(raw, "speculative_config") or raw
    if not isinstance(spec, dict) or "method" not in spec:
        raise DraftboardError(f"--serving-config {path}: no speculative config (vLLM: method, num_speculative_tokens;"
                              " SGLang: speculative_algorithm, speculative_num_draft_tokens)")
    n = spec.get("num_speculative_tokens")
    v2 = env.get("VLLM_USE_V2_MODEL_RUNNER")
    prefix = _get(raw, "enable_prefix_caching")
    return ServingConfig("vllm", str(spec["method"]), n if isinstance(n, int) else None, ssm, thinking,
                         _text(_get(raw, "version") or _get(raw, "vllm_version")),
                         None if v2 is None else ("V2" if _flag(v2) else "V1"),
                         None if prefix is None else _flag(prefix),
                         draft_sample_method=_text(spec.get("draft_sample_method")), simulated=simulated)


def _text(value) -> str | None:
    return None if value is None else str(value)[:64]


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _from_llamacpp_command_line(text: str, path) -> ServingConfig:
    """A `llama-server` command line (environment assignments before it) as llama.cpp's serving config."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as exc:
        raise DraftboardError(f"--serving-config {path}: not a command line ({exc})") from None
    env, values = {}, {}
    for i, word in enumerate(words):
        if "=" in word and not word.startswith("-") and not values and word.split("=", 1)[0].isupper():
            env.update([word.split("=", 1)])
        flag, _, inline = word.partition("=")
        if flag in LLAMACPP_FLAGS:
            values[LLAMACPP_FLAGS[flag]] = inline or (words[i + 1] if i + 1 < len(words) else "")
    n = values.get("n_max")
    if n is not None and whole_number(n) is None:
        raise DraftboardError(f"--serving-config {path}: --spec-draft-n-max {n[:20]!r} is not a number")
    gguf = values.get("drafter_gguf")
    if gguf and not Path(gguf).is_absolute():  # where the command line was written
        gguf = str(Path(path).parent / gguf)
    builds = [b for b in map(llamacpp.build_number, (line.lstrip("# ") for line in text.splitlines())) if b]
    return ServingConfig("llamacpp", values.get("spec_type"), int(n) if n is not None else LLAMACPP_DEFAULT_N_MAX,
                         None, None, draft_cache_type=values.get("cache_type_k_draft"),
                         rotation_disabled=_flag(env.get("LLAMA_ATTN_ROT_DISABLE", "0")), defaulted=n is None,
                         where="the llama-server command line", drafter_gguf=gguf, build=builds[0] if builds else None)


def from_engine_eval(engine: dict) -> ServingConfig:
    """The serving box an engine eval measured: its engine section and GDN record's settings."""
    record = engine.get("linear_attention") if isinstance(engine.get("linear_attention"), dict) else {}
    settings = {**engine, **(record.get("settings") if isinstance(record.get("settings"), dict) else {})}
    name = str(engine.get("name") or "vllm")
    if name not in _METHODS:
        raise DraftboardError(f"--serving-config: the engine eval names engine {name[:40]!r}; doctor reads "
                              f"{', '.join(_METHODS)} boxes")
    n = engine.get("num_speculative_tokens")
    return ServingConfig(name, str(engine.get("method") or _METHODS.get(name, VLLM_METHOD)),
                         n if isinstance(n, int) else None,
                         _text(settings.get("mamba_ssm_cache_dtype") or settings.get("mamba_ssm_dtype")), None,
                         _text(engine.get("version")), _text(settings.get("model_runner")),
                         em.prefix_cache(settings),
                         where=f"the engine eval's {name}",
                         draft_cache_type=_text(settings.get("cache_type_k_draft")),
                         drafter_gguf=engine["drafter_gguf"] if isinstance(engine.get("drafter_gguf"), str) else None,
                         build=llamacpp.build_number(_text(engine.get("version"))) if name == "llamacpp" else None,
                         tp_size=settings["tp_size"] if isinstance(settings.get("tp_size"), int) and not isinstance(
                             settings.get("tp_size"), bool) else None)


_METHODS = {"vllm": VLLM_METHOD, "sglang": SGLANG_ALGORITHM, "llamacpp": LLAMACPP_SPEC_TYPE}
_LENGTH_FLAGS = {"vllm": "num_speculative_tokens", "sglang": "speculative_num_draft_tokens",
                 "llamacpp": "--spec-draft-n-max"}


def speculation_length(serving: ServingConfig, drafter: DrafterConfig) -> Check:
    block = drafter.block_size
    flag = _LENGTH_FLAGS[serving.engine]
    counts_anchor = serving.engine == "sglang"  # SGLang's number counts the anchor too
    served = serving.draft_tokens + 1 if counts_anchor and serving.draft_tokens is not None else serving.draft_tokens
    right = block if counts_anchor else block - 1
    default = f" (not set: {serving.engine}'s default)" if serving.defaulted else ""
    evidence = f"{serving.engine} {flag}={served}{default}; the drafter's block_size {block} drafts {block - 1} tokens"
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
    expected = _METHODS[serving.engine]
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


def simulated_acceptance(serving: ServingConfig) -> Check:
    """A serving box whose environment makes the engine report an acceptance it did not measure."""
    if not serving.simulated:
        return Check(SIMULATED, OK, "the serving config's env sets no simulated-acceptance variable",
                     f"none of {', '.join(SIMULATED_ACCEPTANCE)} in env")
    return Check(SIMULATED, CRITICAL, "the engine reports a simulated acceptance, not what the drafter achieved: "
                 "SGLang overwrites DFlash's accepted length with SGLANG_SIMULATE_ACC_LEN after the real compute "
                 "(SGLang #32595), so its acceptance and speedup say nothing of this drafter",
                 f"env sets {', '.join(serving.simulated)}",
                 f"remove {', '.join(serving.simulated)} from the serving box's environment (a managed eval refuses them)")


def known_bad_check(name: str, serving: ServingConfig, hybrid: bool | None, family: str | None = None) -> Check:
    """The rows of the known-bad table (tracker/measurement/known_bad.json) under check `name` against this box:
    the worst that holds; else, where a row needs what the config does not say, that row at its `unknown`
    severity; else OK."""
    record = serving.record(hybrid, family)
    read = {key for row in known_bad.ROWS if row.check == name and row.engine == serving.engine for key in row.when}
    evidence = f"{serving.where}: {serving.engine} {serving.version or 'version not stated'}" + "".join(
        f"; {key} {'not known' if value is None else value}" for key, value in record.settings.items() if key in read)
    findings = [f for f in known_bad.evaluate(record) if f.row.check == name]
    held = [f.row for f in findings if f.state == known_bad.MATCH]
    if held:
        worst = min(held, key=lambda row: known_bad.SEVERITIES.index(row.severity))
        return Check(name, worst.severity, "; ".join(row.text for row in held), evidence, worst.fix)
    open_rows = [f for f in findings if f.state == known_bad.UNDECIDED and f.row.unknown]
    if open_rows:
        worst = min(open_rows, key=lambda f: known_bad.SEVERITIES.index(f.row.unknown))
        missing = sorted({m for f in open_rows for m in f.missing})
        return Check(name, worst.row.unknown, "not known whether it holds: " + "; ".join(f.row.text for f in open_rows),
                     evidence, f"state {', '.join(missing)} in the serving config")
    return Check(name, OK, f"no known-bad {name.replace('_', ' ')} of {serving.engine} holds here", evidence)


def engine_version(serving: ServingConfig, hybrid: bool) -> Check:
    return known_bad_check(ENGINE_VERSION, serving, hybrid)


def model_runner(serving: ServingConfig, family: str | None = None) -> Check:
    return known_bad_check(MODEL_RUNNER, serving, None, family)


def prefix_cache(serving: ServingConfig, hybrid: bool) -> Check:
    return known_bad_check(PREFIX_CACHE, serving, hybrid)


def draft_kv_cache(serving: ServingConfig) -> Check:
    """llama.cpp: a quantized draft KV cache without the rotation switch collapses DFlash acceptance."""
    return known_bad_check(DRAFT_KV_CACHE, serving, None)


def gguf_target_layers(serving: ServingConfig, target_layer_ids: list[int]) -> Check:
    """llama.cpp taps the layers the drafter GGUF names; its converter writes target_layer_ids + 1."""
    expected = [i + 1 for i in target_layer_ids]
    if not serving.drafter_gguf:
        return Check(GGUF_TARGET_LAYERS, INFO, "not checked: no drafter GGUF named (-md)", f"{serving.where}")
    try:
        found = llamacpp.drafter_target_layers(serving.drafter_gguf)
    except EngineError as exc:
        return Check(GGUF_TARGET_LAYERS, WARNING, f"the drafter GGUF is not readable: {exc}", serving.where)
    evidence = f"{serving.drafter_gguf}: dflash.target_layers {found}; the checkpoint's target_layer_ids " \
               f"{target_layer_ids} + 1 = {expected}"
    if found != expected:
        return Check(GGUF_TARGET_LAYERS, CRITICAL, "llama.cpp feeds the drafter other target layers than it was "
                     "trained on: acceptance collapses" if found else "the drafter GGUF names no target layers",
                     evidence, "convert the drafter again with llama.cpp's convert_hf_to_gguf.py "
                     "--target-model-dir TARGET")
    return Check(GGUF_TARGET_LAYERS, OK, "the drafter GGUF taps the layers it was trained on", evidence)


def llamacpp_build(serving: ServingConfig, drafter: DrafterConfig | None) -> Check:
    """A llama.cpp older than DFlash (or DFlash2, for a DFlash2 drafter) cannot serve the drafter."""
    dflash2 = drafter is not None and drafter.family == DFLASH2
    needed = llamacpp.DFLASH2_BUILD if dflash2 else llamacpp.DFLASH_BUILD
    kind = "DFlash2" if dflash2 else "DFlash"
    evidence = f"{serving.where}: llama.cpp build {f'b{serving.build}' if serving.build else 'not known'}; " \
               f"{kind} needs b{needed} or later"
    if serving.build is None:
        return Check(LLAMACPP_BUILD, INFO, "the llama.cpp build is not known (packages report b0)", evidence,
                     "add the line `llama-server --version` prints to the serving config")
    if serving.build < needed:
        return Check(LLAMACPP_BUILD, CRITICAL, f"this llama.cpp predates {kind}: it cannot serve this drafter",
                     evidence, f"upgrade llama.cpp to b{needed} or later")
    return Check(LLAMACPP_BUILD, OK, f"this llama.cpp serves {kind}", evidence)
