"""The engine's GDN record (evaluators/engines/gdn.py), what vLLM's start log says of its GDN layers
(evaluators/engines/vllm.py) and the per-piece comparison of sides (tracker/environment/linear_attn.py), on
hand-worked inputs. The log lines are vLLM 0.32.0's own, as it printed them serving the demo's
Qwen3-Next pair on this CPU (tests/test_engines_vllm_hybrid.py drives that engine)."""

from __future__ import annotations

import sys
import time

import pytest

from evaluators.engines import gdn, server, sglang, vllm
from tracker import config
from tracker.environment import linear_attn
from tracker.measurement import engine_metrics as em

VLLM_START = """\
(APIServer pid=6721) WARNING 12-04 08:22:45 [cpu.py:317] Reset SSM cache type to float32 for accelerated GDN mamba backend 'qwen3_next'.
(APIServer pid=6721) WARNING 12-04 08:22:45 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(EngineCore pid=6739) INFO 12-04 08:22:52 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/hp/pair/target', dtype=torch.bfloat16, max_seq_len=256, kv_cache_dtype=auto, enforce_eager=True, enable_prefix_caching=False, kv_cache_metrics=False
(Worker pid=6751) INFO 12-04 08:23:00 [qwen_gdn_linear_attn.py:206] Using CPU GDN prefill kernel (head_k_dim=64).
(Worker pid=6751) INFO 12-04 08:23:00 [qwen_gdn_linear_attn.py:620] GDN spec decode kernel: CPU
"""
# What a GPU box prints instead (the same format strings, qwen_gdn_linear_attn.py:221 and :620).
VLLM_GPU_START = """\
(Worker pid=1) INFO [qwen_gdn_linear_attn.py:221] Using Triton/FLA GDN prefill kernel (requested=triton, head_k_dim=128).
(Worker pid=1) INFO [qwen_gdn_linear_attn.py:620] GDN spec decode kernel: triton
"""


def test_vllms_start_log_names_its_gdn_kernels_and_settings():
    assert vllm.settings_from_log(VLLM_START) == {
        "mamba_ssm_cache_dtype": "float32", "model_runner": "V1", "engine_version": "0.32.0",
        "config_dtype": "torch.bfloat16", "config_enforce_eager": "True", "config_enable_prefix_caching": "False",
        "gdn_prefill_kernel": "CPU", "gdn_spec_decode_kernel": "CPU"}
    gpu = vllm.settings_from_log(VLLM_GPU_START)
    assert gpu == {"gdn_prefill_kernel": "Triton/FLA", "gdn_spec_decode_kernel": "triton"}
    assert vllm.gdn_functions_from_log(gpu) == {
        "torch_chunk_gated_delta_rule": "vllm triton (fla copy) (logged: Triton/FLA)",
        "spec_decode": "vllm triton spec-decode kernel (logged)"}
    assert vllm.settings_from_log("") == {} and sglang.settings_from_log(VLLM_START) == {}


def test_a_long_log_line_is_read_in_linear_time():
    line = "Using " + "x" * 1_000_000 + "\n"
    start = time.perf_counter()
    assert vllm.settings_from_log(line * 4) == {}
    assert time.perf_counter() - start < 1.0  # bounded per line (MAX_LOG_LINE), never quadratic in it


def test_the_record_takes_the_probes_names_then_the_logs_and_the_servers_settings():
    probe = {"platform": "cpu", "capabilities": {"amx": False, "arm_bf16": False, "note": "x"}, "functions": {
        "torch_chunk_gated_delta_rule": "vllm C++ kernel vllm._custom_ops.chunk_gated_delta_rule_cpu",
        "causal_conv1d_fn": "vllm torch vllm.model_executor.layers.mamba.ops.cpu.gdn_attention._spec_aware_nonspec",
        "bogus": 3}}
    logged = vllm.settings_from_log(VLLM_START)
    record = gdn.record("vllm", probe, logged, {"torch_chunk_gated_delta_rule": "from the log",
                                                 "spec_decode": "vllm CPU spec-decode kernel (logged)"},
                        {"dtype": "bfloat16", "enable_prefix_caching": "False", "mamba_cache_mode": "none"})
    assert record.functions == {  # the probe's exact names win; the log fills in what it did not name
        "torch_chunk_gated_delta_rule": "vllm C++ kernel vllm._custom_ops.chunk_gated_delta_rule_cpu",
        "causal_conv1d_fn": "vllm torch vllm.model_executor.layers.mamba.ops.cpu.gdn_attention._spec_aware_nonspec",
        "spec_decode": "vllm CPU spec-decode kernel (logged)"}
    assert record.settings == {"dtype": "bfloat16", "enable_prefix_caching": "False", "mamba_cache_mode": "none",
                               "mamba_ssm_cache_dtype": "float32", "enforce_eager": "True", "model_runner": "V1",
                               "gdn_prefill_kernel": "CPU", "gdn_spec_decode_kernel": "CPU"}
    assert record.capabilities == {"amx": False, "arm_bf16": False}
    assert record.summary == ("vllm on cpu: conv prefill: vllm torch; chunk rule (prefill): vllm C++ kernel; "
                              "spec-decode path: vllm CPU spec-decode kernel")
    unknown = gdn.record("sglang", None, {}, {}, {"disable_radix_cache": True})
    assert unknown.functions == {} and unknown.platform is None and unknown.sources == ["the server's report"]
    assert unknown.summary.startswith("sglang: unknown")


def test_a_probe_that_fails_or_lies_gives_an_unknown_record():
    ok = server.start_probe(sys.executable, "print('noise'); import json; print(json.dumps({'platform': 'cpu'}))")
    assert server.finish_probe(ok) == {"platform": "cpu"}
    for code in ("raise SystemExit(3)", "print('[1, 2]')", "print('not json')"):
        assert server.finish_probe(server.start_probe(sys.executable, code)) is None, code
    assert server.start_probe("/nonexistent/python", "pass") is None and server.finish_probe(None) is None


def test_hybrid_serving_problems_are_said_before_anything_starts():
    assert config.engine_hybrid_problem("vllm", "cpu", "fp32") == (
        "vllm's cpu Gated DeltaNet kernels take bf16 only; this hybrid target was asked for in fp32: use --dtype bf16")
    assert config.engine_hybrid_problem("vllm", "cpu", "bf16") is None
    assert config.engine_hybrid_problem("vllm", "cuda:1", "fp32") is None
    assert "no cpu path" in config.engine_hybrid_problem("sglang", "cpu", "bf16")
    assert config.engine_hybrid_problem("sglang", "cuda", "bf16") is None
    assert em.prefix_cache({"enable_prefix_caching": "True"}) and em.prefix_cache({}) is None
    assert em.prefix_cache({"disable_radix_cache": False}) and not em.prefix_cache({"disable_radix_cache": True})
    assert em.prefix_cache({"cache_prompt": False}) is False


def _fp(functions: dict | None, path: str = "fallback") -> dict:
    return {"numerics": {"linear_attention_path": path,
                         "linear_attention": None if functions is None else {"functions": functions}}}


def test_sides_are_compared_per_piece():
    training = _fp({"causal_conv1d_fn": "torch", "torch_chunk_gated_delta_rule": "torch", "gated_norm": "torch"})
    offline = _fp({"causal_conv1d_fn": "causal_conv1d.causal_conv1d_fn", "torch_chunk_gated_delta_rule": "torch",
                   "gated_norm": "torch"}, "partial")
    serving = _fp({"causal_conv1d_fn": "vllm torch x", "torch_chunk_gated_delta_rule": "torch",
                   "spec_decode": "vllm C++ kernel y"}, "vllm-native")
    rows = {r.piece: r for r in linear_attn.side_by_side([training, offline, serving])}
    assert rows["conv prefill"].severity == "critical"  # three different implementations
    assert rows["chunk rule (prefill)"] == linear_attn.PieceRow("chunk rule (prefill)", ("torch",) * 3, "ok")
    assert rows["spec-decode path"].values == ("not run", "not run", "vllm C++ kernel y")
    assert rows["spec-decode path"].severity == "ok"  # only one side runs it: nothing to compare
    assert rows["gated norm"].values == ("torch", "torch", "not run") and rows["gated norm"].severity == "ok"
    # a side that does not say what ran (an attached engine on another box) is a warning, never "ok"
    rows = {r.piece: r for r in linear_attn.side_by_side([training, _fp({}, "vllm-native")])}
    assert rows["chunk rule (prefill)"] == linear_attn.PieceRow("chunk rule (prefill)", ("torch", None), "warning")
    assert linear_attn.side_by_side([_fp(None, "n/a"), _fp({}, "n/a")]) == []  # no GDN layers on any side


@pytest.mark.parametrize("implementation, kind", [
    ("vllm C++ kernel vllm._custom_ops.chunk_gated_delta_rule_cpu", "vllm C++ kernel"),
    ("vllm triton (fla copy) (logged: Triton/FLA)", "vllm triton"),
    ("torch", "torch"),
])
def test_the_summary_names_each_kind_of_code(implementation, kind):
    assert gdn._kind(implementation) == kind
