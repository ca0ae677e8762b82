import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3ForCausalLM

from tracker.environment import linear_attn
from tracker.errors import DraftboardError
from tiny import qwen3_config, qwen35_config


def test_this_machine_resolves_the_torch_fallback_with_a_reason():
    res = linear_attn.apply("auto", "cpu")
    assert res.path == "fallback"
    kernels = {name: impl for name, impl in res.functions.items() if name != linear_attn.GATED_NORM}
    assert set(kernels) == set(linear_attn.LINEAR_ATTN_FUNCTIONS)
    assert all(impl == "torch" for impl in kernels.values())
    # transformers 5.x's Qwen3.5 has only its own torch RMSNormGated: named, never a fallback
    assert res.functions[linear_attn.GATED_NORM] in ("torch", linear_attn.TORCH_ONLY)
    assert res.to_dict()["summary"].startswith("all torch: conv torch fallback, chunk rule torch fallback")
    # The reason names what is missing, not just that something is.
    assert "causal-conv1d" in res.reason and "flash-linear-attention" in res.reason


def test_forcing_the_fallback_swaps_what_the_layers_call_and_is_reversible():
    import transformers.models.qwen3_5.modeling_qwen3_5 as modeling

    original = modeling.torch_chunk_gated_delta_rule
    forced = linear_attn.apply("fallback", "cpu")
    try:
        assert forced.forced and forced.path == "fallback"
        assert modeling.torch_chunk_gated_delta_rule is not original
        model = Qwen3_5ForCausalLM(qwen35_config()).eval()
        ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            forced_logits = model(ids).logits
    finally:
        restored = linear_attn.apply("auto", "cpu")
    assert not restored.forced
    assert modeling.torch_chunk_gated_delta_rule is original
    with torch.no_grad():
        # On this box both are the torch reference: the forced path must give identical numbers.
        assert torch.equal(model(ids).logits, forced_logits)


def test_fast_mode_refuses_when_kernels_are_not_what_transformers_resolved():
    with pytest.raises(DraftboardError, match="--linear-attn fast"):
        linear_attn.apply("fast", "cpu")


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(DraftboardError, match="unknown linear-attention mode"):
        linear_attn.apply("turbo", "cpu")


def test_models_without_linear_attention_report_na():
    model = Qwen3ForCausalLM(qwen3_config())
    assert linear_attn.apply("auto", "cpu", linear_attn.module_of(model)).path == "n/a"


TRITON_SITE = os.environ.get("DRAFTBOARD_TRITON_SITE")


@pytest.mark.skipif(not TRITON_SITE, reason="needs DRAFTBOARD_TRITON_SITE (scripts/test.sh installs it)")
def test_with_triton_on_a_cpu_box_fla_is_picked_and_auto_forces_the_fallback():
    # A fresh interpreter: the kernel choice is made once, when the modeling module is imported.
    script = textwrap.dedent("""
        import torch
        from transformers import Qwen3_5ForCausalLM
        from tracker.environment import linear_attn
        from tiny import qwen35_config

        chosen = linear_attn.resolve()
        print("resolved", chosen.path, chosen.functions["torch_chunk_gated_delta_rule"])
        model = Qwen3_5ForCausalLM(qwen35_config()).eval()
        ids = torch.randint(0, 64, (1, 12))
        try:
            model(ids)
            print("fla forward: ran")
        except Exception as exc:
            print("fla forward: crashed", type(exc).__name__)
        res = linear_attn.apply("auto", "cpu")
        print("auto", res.path, res.forced)
        print("logits", tuple(model(ids).logits.shape))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TRITON_SITE, os.path.dirname(__file__), os.getcwd()]))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("resolved partial fla.ops.gated_delta_rule")
    assert lines[1] == "fla forward: crashed" or lines[1].startswith("fla forward: crashed")
    assert lines[2] == "auto fallback True"
    assert lines[3] == "logits (1, 12, 64)"


def test_every_gated_deltanet_piece_is_named_and_a_mixed_state_says_so():
    resolved = linear_attn.resolve()
    assert set(resolved.functions) == {*linear_attn.LINEAR_ATTN_FUNCTIONS, linear_attn.GATED_NORM}
    assert resolved.functions[linear_attn.GATED_NORM] == linear_attn.TORCH_ONLY  # transformers 5.24's Qwen3.5
    fast = {"causal_conv1d_fn": "causal_conv1d.cpp_functions.causal_conv1d_fn",
            "causal_conv1d_update": "causal_conv1d.cpp_functions.causal_conv1d_update",
            "torch_chunk_gated_delta_rule": "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule",
            "torch_recurrent_gated_delta_rule": "fla.ops.gated_delta_rule.fused_recurrent.fused_recurrent_gdr",
            linear_attn.GATED_NORM: linear_attn.TORCH_ONLY}
    assert linear_attn.summary(fast) == ("all kernels: conv causal_conv1d kernel, chunk rule fla kernel, recurrent "
                                         "rule fla kernel, gated norm torch (the only implementation)")
    conv_missing = {**fast, "causal_conv1d_fn": "torch", "causal_conv1d_update": "torch"}
    assert linear_attn.summary(conv_missing).startswith("mixed: conv torch fallback, chunk rule fla kernel")
    older = {**fast, linear_attn.GATED_NORM: "torch"}  # a module that could have used fla's fused norm
    assert linear_attn.summary(older).startswith("mixed: ") and "gated norm torch fallback" in linear_attn.summary(older)


def test_an_evals_fallback_warnings_cover_the_whole_run_decoding_included(tmp_path):
    """transformers warns once per function, at its first call: the probe's prefill runs the chunk rule
    and the conv, the continuations' decoding first runs the recurrent rule. The results list every
    one (a fresh process: nothing warned before), and so does a warm rerun that never loads the target."""
    from tiny import hybrid_eval_files

    root = hybrid_eval_files(tmp_path)
    args = ["-m", "tracker.cli", "eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"),
            "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens", "8", "--device", "cpu", "--no-log",
            "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    import json

    warned = []
    for run in ("cold", "warm"):
        out = tmp_path / f"{run}.json"
        done = subprocess.run([sys.executable, *args, "--out", str(out)], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        results = json.loads(out.read_text())
        warned.append(results["target"]["linear_attention"]["fallback_warnings"])
        assert results["fingerprint"]["numerics"]["linear_attention"]["fallback_warnings"] == warned[-1]
    assert results["timing"]["loaded"] == "heads"
    for name in ("causal_conv1d_fn", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        assert any(f"`{name}`" in w for w in warned[0]), (name, warned[0])
    assert warned[1] == warned[0]


def test_a_warm_process_records_each_evals_own_fallback_warnings(tmp_path):
    """Issue 37, finding 5: a warm host runs one job after another in one process. A warning an earlier
    job logged is not the next one's (nor its on-disk fingerprint cache's), and the next job's own
    fallbacks warn again although transformers warns once per process."""
    import json

    from tiny import hybrid_eval_files
    from tracker.cli import main
    from transformers.utils import logging as hf_logging

    root = hybrid_eval_files(tmp_path)
    earlier = "falling back to torch for `an_earlier_jobs_function` (the previous job's)"
    hf_logging.get_logger("transformers.models.qwen3_next.modeling_qwen3_next").warning_once(earlier)
    out = tmp_path / "next.json"
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"), "--prompts",
                 str(root / "prompts.jsonl"), "--max-new-tokens", "8", "--device", "cpu", "--no-log",
                 "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]) == 0
    warned = json.loads(out.read_text())["fingerprint"]["numerics"]["linear_attention"]["fallback_warnings"]
    assert earlier not in warned
    for name in ("causal_conv1d_fn", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        assert any(f"`{name}`" in w for w in warned), (name, warned)
    cached = "".join(p.read_text(errors="replace") for p in (tmp_path / "cache").rglob("*.json"))
    assert "an_earlier_jobs_function" not in cached
