"""`draftboard doctor` (evaluators/doctor/): each check on a checkpoint built to fail it, and on one that passes.

The target is the demo's text-trained Qwen3 target (the serving pair: byte tokenizer with a special
`<|mask|>`); drafters are fitted to its greedy text with tests/tiny.py, once on z-lab's
`hidden_states[layer_id + 1]` and once on the off-by-one `hidden_states[layer_id]`. They tap layer 0,
whose off-by-one neighbour is the embeddings: on a target this small, adjacent decoder layers carry
nearly the same information, and a drafter fitted to one reads its neighbour almost as well (with
tapped layers 1 and 2 the two conventions measured within 0.25 of each other either way).
"""

import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from demo.target import make_prompts
from evaluators.doctor import checkpoint, environment, layers, serving, tokens
from evaluators.doctor.report import CRITICAL, INFO, OK, WARNING
from evaluators.drafter import open_drafter, save_zlab
from evaluators.target import load_target, load_tokenizer
from tiny import fit_drafter
from tracker.environment import fingerprint, linear_attn
from tracker.cli import main
from tracker.errors import DraftboardError

MASK = 258  # the byte tokenizer's <|mask|>
N_PROMPTS = 32


@pytest.fixture(scope="module")
def pair(serving_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor")
    model = AutoModelForCausalLM.from_pretrained(serving_pair / "target").eval()
    prompts = torch.tensor(make_prompts(32, seed=5, length=24, split="drafter"))
    with torch.no_grad():
        text = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=64, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
    for name, offset in (("zlab", 1), ("off_by_one", 0)):
        drafter, cfg = fit_drafter(model, text, layer_ids=[0], block_size=4, steps=600, mask_token_id=MASK,
                                   head_dim=16, offset=offset)
        save_zlab(drafter, cfg, root / name)
    (root / "target").symlink_to(serving_pair / "target")
    # The layer check's evidence for the right convention is a small gain (an embedding is most of
    # tapped layer 0's output), so it is scored on the target's domain (held-out source text) and on
    # enough prompts that the paired bootstrap's interval is clear of 0 on any machine's arithmetic.
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n" for i, p in
                                                enumerate(make_prompts(N_PROMPTS, seed=3, length=24, split="eval"))))
    return root


def _copy(pair, tmp_path, name="zlab"):
    """A copy of the z-lab-trained drafter to break, under `name`."""
    out = tmp_path / name
    shutil.copytree(pair / "zlab", out)
    return out


def test_a_drafter_trained_one_layer_off_is_caught_with_the_fix_and_a_correct_one_passes(pair):
    target = load_target(pair / "target")
    prompts = [json.loads(line)["input_ids"] for line in (pair / "prompts.jsonl").read_text().splitlines()]
    bad = layers.check(target, open_drafter(pair / "off_by_one").load(), prompts)
    assert bad.name == "layer_offset" and bad.severity == CRITICAL, bad
    assert "hidden_states[layer_id]" in bad.verdict and "auxiliary layers [0], not [1]" in bad.fix
    assert "#42505" in bad.fix
    good = layers.check(target, open_drafter(pair / "zlab").load(), prompts)
    assert good.severity == OK, good


def test_the_cli_exits_1_on_a_critical_finding_and_prints_the_checks_as_json(pair, capsys):
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "off_by_one"), "--device",
                 "cpu", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["critical"] and by_name["layer_offset"]["severity"] == CRITICAL
    assert set(by_name) == {"layer_offset", "architecture", "tapped_layers", "mask_token", "stop_tokens", "thinking",
                            "environment"}
    assert all(set(c) == {"name", "severity", "verdict", "evidence", "fix"} for c in report["checks"])
    assert by_name["architecture"]["severity"] == by_name["mask_token"]["severity"] == OK


def test_a_drafter_with_its_own_lm_head_is_critical_and_a_copy_of_the_targets_is_not(pair, tmp_path):
    target = load_target(pair / "target")
    own = _copy(pair, tmp_path)
    tensors = load_file(str(own / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn(target.config.vocab_size, target.config.hidden_size)
    save_file(tensors, str(own / "model.safetensors"))
    found = checkpoint.architecture(own, target, target.num_layers)
    assert found.severity == CRITICAL and "own head" in found.verdict and "lm_head.weight [259, 64]" in found.evidence
    tensors["lm_head.weight"] = target.lm_head_weight.detach().clone()
    save_file(tensors, str(own / "model.safetensors"))
    assert checkpoint.architecture(own, target, target.num_layers).severity == OK


def test_other_architecture_findings(pair, tmp_path):
    target = load_target(pair / "target")
    wide = _copy(pair, tmp_path, "wide")  # config and fc disagree on the tapped layers
    config = json.loads((wide / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 2, 3]
    (wide / "config.json").write_text(json.dumps(config))
    found = checkpoint.architecture(wide, target, target.num_layers)
    assert found.severity == CRITICAL and "fc.weight" in found.evidence
    config["dflash_config"]["target_layer_ids"] = [3]  # the target's last layer
    (wide / "config.json").write_text(json.dumps(config))
    last = checkpoint.architecture(wide, target, target.num_layers)
    assert last.severity == WARNING and "last layer (3)" in last.verdict
    hybrid = ["linear_attention"] * 3 + ["full_attention"]
    assert "SpecForge's Qwen3.5 recipe" in checkpoint.tapped_layers([3], hybrid).verdict
    assert checkpoint.tapped_layers([1], ["full_attention"] * 4).verdict == "the target has one kind of layer"
    mixed = checkpoint.tapped_layers([1, 3], hybrid)
    assert mixed.severity == INFO and "1 of 2" in mixed.verdict and "1: linear_attention" in mixed.evidence


def test_a_mask_token_that_is_an_ordinary_token_is_critical(pair, tmp_path):
    tokenizer = load_tokenizer(pair / "target")
    ordinary = tokens.mask_token(tokenizer, ord("A"))
    assert ordinary.severity == CRITICAL and "'A'" in ordinary.evidence
    assert tokens.mask_token(tokenizer, MASK).severity == OK
    plain = _copy(pair, tmp_path, "plain")
    config = json.loads((plain / "config.json").read_text())
    config["dflash_config"]["mask_token_id"] = ord("A")
    (plain / "config.json").write_text(json.dumps(config))
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(plain), "--device", "cpu",
                 "--n-prompts", "2", "--max-new-tokens", "8"]) == 1


@pytest.mark.parametrize("config, severities", [
    ({"method": "dflash", "model": "d", "num_speculative_tokens": 15}, {"speculation_length": CRITICAL}),
    ({"method": "dflash", "model": "d", "num_speculative_tokens": 3}, {"speculation_length": OK, "serving_method": OK}),
    ({"method": "dflash", "model": "d", "num_speculative_tokens": 2}, {"speculation_length": WARNING}),
    ({"speculative_config": {"method": "eagle3", "num_speculative_tokens": 3}}, {"serving_method": CRITICAL}),
    ({"speculative-algorithm": "DFLASH", "speculative-num-draft-tokens": 4, "mamba_ssm_dtype": "bfloat16"},
     {"speculation_length": OK, "serving_method": OK, "mamba_ssm_dtype": WARNING}),
    ({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16}, {"speculation_length": CRITICAL}),
])
def test_a_serving_config_against_the_drafter(pair, tmp_path, config, severities):
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(config))
    served = serving.read_serving_config(path)
    drafter = open_drafter(pair / "zlab").config  # block 4: 3 drafts
    got = {c.name: c.severity for c in (serving.speculation_length(served, drafter), serving.method(served, drafter),
                                        serving.ssm_dtype(served))}
    assert {k: got[k] for k in severities} == severities


def test_thinking_offline_and_served_must_agree(pair, tmp_path):
    tokenizer = load_tokenizer(pair / "target")
    tokenizer.chat_template = ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
                               "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% else %}"
                               "<think>{% endif %}{% endif %}")
    assert tokens.thinking(tokenizer, None, None).severity == OK
    assert tokens.thinking(tokenizer, None, False).severity == CRITICAL  # the default thinks, the server does not
    assert tokens.thinking(tokenizer, False, False).severity == OK


def test_bad_input_is_one_error_line(pair, tmp_path, capsys):
    broken = tmp_path / "serving.json"
    broken.write_text("{not json")
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "zlab"), "--serving-config",
                 str(broken)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --serving-config") and "not a readable JSON file" in err[-1]
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(DraftboardError, match="no speculative config"):
        serving.read_serving_config(tmp_path / "empty.json")


def _functions(conv: str, rule: str) -> dict:
    return {"causal_conv1d_fn": conv, "causal_conv1d_update": conv, "torch_chunk_gated_delta_rule": rule,
            "torch_recurrent_gated_delta_rule": rule, linear_attn.GATED_NORM: linear_attn.TORCH_ONLY}


def _with_functions(fp: dict, functions: dict, path: str) -> dict:
    out = copy.deepcopy(fp)
    la = out["numerics"]["linear_attention"]
    la.update(functions=functions, summary=linear_attn.summary(functions), linear_attention_path=path)
    out["numerics"]["linear_attention_path"] = path
    return out


def test_a_mixed_kernel_state_is_named_per_function():
    here = fingerprint.capture()  # this box: every piece on the torch fallback
    mixed = _with_functions(here, _functions("torch", "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule"),
                            "partial")
    found = environment.check(here, mixed, "run abc")
    assert found.severity == CRITICAL and "torch_chunk_gated_delta_rule" in found.verdict
    assert "run abc: mixed: conv torch fallback, chunk rule fla kernel" in found.evidence
    assert "torch_chunk_gated_delta_rule: fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule there, torch here" \
        in found.evidence
    both = environment.check(mixed, mixed)
    assert both.severity == WARNING and "mixed kernel state" in both.verdict
    assert environment.check(here, here).severity == OK
    assert environment.check(here, None).severity == INFO


def test_a_drafter_precision_difference_says_so_and_the_doctor_can_match_it(pair, tmp_path, capsys):
    """Issue 39: a drafter trained under bf16 autocast, doctored in fp32, was reported as "this machine
    computes the target's features differently" while the probe said they agree, with no flag to match
    it (always exit 1). Now the verdict names the drafter's precision and `--drafter-precision` matches it."""
    from tracker.store.tracker import Tracker

    here = fingerprint.capture()
    trained = copy.deepcopy(here)
    trained["numerics"]["drafter_precision"] = "bf16-autocast"
    found = environment.check(here, trained)
    assert found.severity == CRITICAL and "runs the drafter in another precision" in found.verdict
    assert "fp32 here, bf16-autocast there" in found.verdict and "features agree" in found.verdict
    assert found.fix.startswith("rerun with --drafter-precision bf16-autocast")

    target = load_target(pair / "target")
    machine = fingerprint.capture(target.model, "cpu", "fp32", probe_layers=[0], drafter_precision="bf16-autocast")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("autocast run", {}, str(pair / "target"), fingerprint=machine) as run:
        pass
    base = ["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "zlab"), "--run", run.run_id,
            "--prompts", str(pair / "prompts.jsonl"), "--n-prompts", str(N_PROMPTS), "--tracking-uri", uri,
            "--device", "cpu", "--json"]
    assert main(base) == 1
    by_name = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert by_name["environment"]["severity"] == CRITICAL and "precision" in by_name["environment"]["verdict"]
    assert main([*base, "--drafter-precision", "bf16-autocast"]) == 0
    by_name = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert by_name["environment"]["severity"] in (OK, WARNING)
    # Under bf16 autocast the two conventions' gap is near the interval's edge on some CPUs (AMX-bf16:
    # [-0.250, +0.005] over 32 prompts): never critical, and z-lab's convention still drafts better.
    layer = by_name["layer_offset"]
    assert layer["severity"] in (OK, WARNING) and "off-by-one minus z-lab -" in layer["evidence"], layer


def test_the_transformers_version_matters_on_the_fallback_and_the_kernels_versions_on_the_fast_path():
    here = fingerprint.capture()
    older = copy.deepcopy(here)
    older["software"]["transformers"] = "5.20.0"
    assert environment.check(here, older).severity == CRITICAL  # both on the torch fallback: PR #47625's change
    fast = {"causal_conv1d_fn": "causal_conv1d.fn", "causal_conv1d_update": "causal_conv1d.update",
            "torch_chunk_gated_delta_rule": "fla.chunk", "torch_recurrent_gated_delta_rule": "fla.recurrent",
            linear_attn.GATED_NORM: linear_attn.TORCH_ONLY}
    a, b = _with_functions(here, fast, "fast"), _with_functions(older, fast, "fast")
    assert environment.check(a, b).severity == WARNING
    b["software"]["flash-linear-attention"], a["software"]["flash-linear-attention"] = "0.3.1", "0.4.0"
    assert environment.check(a, b).severity == CRITICAL


def test_doctor_on_a_run_attaches_its_report(pair, tmp_path, capsys):
    from tracker.store import names
    from tracker.store.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    with tracker.training_run("trained here", {}, "demo") as run:
        pass
    tracker.attach_fingerprint(run.run_id)
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "zlab"), "--run", run.run_id,
                 "--prompts", str(pair / "prompts.jsonl"), "--n-prompts", str(N_PROMPTS), "--tracking-uri", uri,
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "OK       layer_offset" in out and "evidence: " in out and out.strip().endswith("no critical finding")
    report = tracker.read_json(run.run_id, names.DOCTOR_ARTIFACT)
    assert {c["name"] for c in report["checks"]} >= {"layer_offset", "environment"}
    assert tracker.run(run.run_id).data.tags[names.DOCTOR] in (OK, INFO, WARNING)
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "zlab"), "--run", "0" * 32,
                 "--tracking-uri", uri]) == 2


def test_doctor_drafts_on_the_prompts_of_the_stores_eval_of_the_checkpoint_by_default(pair, tmp_path, capsys):
    """Issue 39: with no --prompts, the layer check uses the drafter's own domain, the prompts of the
    store's eval of that checkpoint (the doctor's generic texts could not tell the conventions apart
    on a real drafter): the off-by-one drafter is critical and the z-lab one passes, each saying
    which eval's prompts it drafted on."""
    from tracker.store.tracker import Tracker

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tracker = Tracker(uri)
    prompts = str(pair / "prompts.jsonl")
    evals = {}
    for name in ("off_by_one", "zlab"):
        with tracker.eval_run(f"{name} @ 600", target=str(pair / "target"), checkpoint=str(pair / name),
                              checkpoint_step=600, params={"drafter": str(pair / name), "prompts": prompts}) as ev:
            ev.log_metrics({"tau": 2.0}, step=0)
        evals[name] = ev.run_id
    for name, exit_status, severity in (("off_by_one", 1, CRITICAL), ("zlab", 0, OK)):
        assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / name), "--n-prompts",
                     str(N_PROMPTS), "--tracking-uri", uri, "--device", "cpu", "--json"]) == exit_status
        check = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "layer_offset")
        assert check["severity"] == severity, check
        assert f"the prompts of eval {name} @ 600 ({evals[name]}), of this checkpoint: {prompts}" in check["evidence"]
    # No eval of the checkpoint and no --run: the generic prompts, said as such; no store is created.
    missing = tmp_path / "none.db"
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "zlab"), "--tracking-uri",
                 f"sqlite:///{missing}", "--device", "cpu", "--json"]) in (0, 1)
    check = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "layer_offset")
    assert "the doctor's default prompts, not the drafter's domain" in check["evidence"] and not missing.exists()


def test_an_undecided_layer_check_says_how_many_prompts_would_decide_it():
    """Hand-worked: Δτ +0.20 with [-0.10, +0.50] over 8 prompts: half-width 0.30 must shrink below 0.20,
    8 x (0.30 / 0.20)^2 = 18 prompts; equal walks (Δτ 0) no number of prompts separates."""
    from tracker.measurement.uncertainty import Interval

    assert layers.prompts_needed(8, Interval(0.20, -0.10, 0.50)) == 18
    assert layers.prompts_needed(8, Interval(0.0, -0.10, 0.10)) is None
    assert layers.prompts_needed(8, Interval(-0.5, -0.6, 0.1)) == 9  # at least one more than it had


@pytest.mark.parametrize("config, hybrid, expected", [
    # vLLM before 0.28.0 on a GDN target with speculative decoding: not lossless (PR #51812)
    ({"version": "0.27.1rc2+cu128"}, True, {"engine_version": CRITICAL}),
    ({"version": "0.27.1"}, False, {"engine_version": OK}),  # no GDN layers: nothing misaligned
    ({"vllm_version": "0.28.0"}, True, {"engine_version": WARNING}),  # its long-context drafter schedule, #54374
    ({"vllm_version": "0.28.1"}, True, {"engine_version": OK}),
    # 0.28.0's probabilistic drafting is not lossless (#54282), greedy drafting is
    ({"version": "0.28.0", "speculative_config": {"method": "dflash", "num_speculative_tokens": 7,
                                                  "draft_sample_method": "probabilistic"}}, False,
     {"engine_version": CRITICAL}),
    ({}, True, {"engine_version": WARNING, "model_runner": INFO, "prefix_cache": INFO}),
    ({"env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}}, False, {"model_runner": CRITICAL}),  # vLLM #49559
    ({"env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}, True, {"model_runner": OK}),
    ({"enable_prefix_caching": True}, True, {"prefix_cache": WARNING}),
    ({"enable_prefix_caching": True}, False, {"prefix_cache": OK}),
    ({"enable_prefix_caching": False}, True, {"prefix_cache": OK}),
])
def test_doctor_knows_the_vllm_serving_box(tmp_path, config, hybrid, expected):
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({"speculative_config": {"method": "dflash", "num_speculative_tokens": 7}, **config}))
    served = serving.read_serving_config(path)
    got = {c.name: c.severity for c in (serving.engine_version(served, hybrid), serving.model_runner(served),
                                         serving.prefix_cache(served, hybrid))}
    assert {k: got[k] for k in expected} == expected


def test_doctor_reads_sglangs_radix_cache_and_an_engine_evals_box(tmp_path):
    path = tmp_path / "sglang.json"
    path.write_text(json.dumps({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8,
                                "disable_radix_cache": False, "sglang_version": "0.5.23"}))
    served = serving.read_serving_config(path)
    check = serving.prefix_cache(served, hybrid=True)
    assert (served.prefix_cache, check.severity) == (True, WARNING) and "sglang #31850" in check.verdict
    # An engine eval's results: the serving box it measured, its GDN record's settings included.
    path.write_text(json.dumps({"protocol": {"scoring": "engine"}, "engine": {
        "name": "vllm", "version": "0.32.0", "method": "dflash", "num_speculative_tokens": 7,
        "linear_attention": {"settings": {"enable_prefix_caching": "False", "mamba_ssm_cache_dtype": "bfloat16",
                                          "model_runner": "V1"}}}}))
    served = serving.read_serving_config(path)
    assert (served.engine, served.version, served.draft_tokens, served.prefix_cache, served.model_runner,
            served.mamba_ssm_dtype) == ("vllm", "0.32.0", 7, False, "V1", "bfloat16")
    assert serving.ssm_dtype(served).severity == WARNING  # narrower than the offline reference's float32
    assert served.where == "the engine eval's vllm"


DRAFT_KV = serving.DRAFT_KV_CACHE


@pytest.mark.parametrize("line, expected", [
    # llama.cpp's default --spec-draft-n-max is 3: a block-8 drafter accepts at most 4 a step
    ("llama-server -m t.gguf -md d.gguf --spec-type draft-dflash", {"speculation_length": WARNING, "serving_method": OK}),
    ("llama-server -m t.gguf -md d.gguf --spec-type draft-dflash --spec-draft-n-max 7  # served as evaluated",
     {"speculation_length": OK, DRAFT_KV: OK}),
    ("llama-server -md d.gguf --spec-type=draft-simple --spec-draft-n-max 9", {"speculation_length": CRITICAL,
                                                                              "serving_method": CRITICAL}),
    ("llama-server -md d.gguf --spec-type draft-dflash --spec-draft-n-max 7 --cache-type-k-draft q8_0",
     {DRAFT_KV: WARNING}),  # llama.cpp #25725
    ("LLAMA_ATTN_ROT_DISABLE=1 llama-server --spec-type draft-dflash --spec-draft-n-max 7 -ctkd q8_0", {DRAFT_KV: OK}),
])
def test_doctor_reads_a_llama_server_command_line(tmp_path, line, expected):
    from evaluators.drafter import DrafterConfig

    path = tmp_path / "serve.sh"
    path.write_text(line + "\n")
    served = serving.read_serving_config(path)
    drafter = DrafterConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, intermediate_size=64, target_layer_ids=[1], block_size=8, mask_token_id=1,
                            num_target_layers=4, vocab_size=64)
    checks = {c.name: c for c in (serving.speculation_length(served, drafter), serving.method(served, drafter),
                                  serving.draft_kv_cache(served))}
    assert {k: checks[k].severity for k in expected} == expected
    if served.defaulted:
        assert "capped at 4" in checks["speculation_length"].verdict
        assert "(not set: llamacpp's default)" in checks["speculation_length"].evidence
        assert checks["speculation_length"].fix == "set --spec-draft-n-max=7 to serve what was evaluated"


def _drafter_gguf(path, target_layers):
    """A drafter GGUF's metadata as llama.cpp's own writer (the `gguf` package) writes it."""
    import gguf

    writer = gguf.GGUFWriter(path, "dflash")
    if target_layers is not None:
        writer.add_array("dflash.target_layers", target_layers)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("layers_in_gguf, severity", [([2, 4], OK), ([1, 3], CRITICAL), (None, CRITICAL)])
def test_doctor_checks_the_drafter_ggufs_target_layers(tmp_path, layers_in_gguf, severity):
    """llama.cpp taps the layers `dflash.target_layers` names; the converter writes target_layer_ids + 1
    (so [1, 3] is a drafter converted with the off-by-one convention)."""
    _drafter_gguf(tmp_path / "drafter.gguf", layers_in_gguf)
    (tmp_path / "serve.sh").write_text("llama-server -m t.gguf -md drafter.gguf --spec-type draft-dflash\n")
    check = serving.gguf_target_layers(serving.read_serving_config(tmp_path / "serve.sh"), [1, 3])
    assert check.severity == severity, check
    assert "target_layer_ids [1, 3] + 1 = [2, 4]" in check.evidence
    if severity == CRITICAL:
        assert "--target-model-dir" in check.fix


def test_doctor_refuses_a_gguf_header_claiming_billions_of_fields(tmp_path):
    """The header's counts are checked before anything is read or allocated for them (gguf_fields)."""
    import struct

    (tmp_path / "d.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1 << 40))
    (tmp_path / "serve.sh").write_text("llama-server -md d.gguf --spec-type draft-dflash\n")
    check = serving.gguf_target_layers(serving.read_serving_config(tmp_path / "serve.sh"), [1])
    assert check.severity == WARNING and "metadata fields is not a model GGUF" in check.verdict


@pytest.mark.parametrize("version_line, family, severity", [
    ("# version: 9836 (1a2b3c4)", "dflash", CRITICAL),  # DFlash landed in b9837 (PR #22105)
    ("# version: 9837 (1a2b3c4)", "dflash", OK),
    ("# version: 10645 (1a2b3c4)", "dflash2", CRITICAL),  # DFlash2 in b10662
    ("# version: 10662 (1a2b3c4)", "dflash2", OK),
    ("", "dflash", INFO),
])
def test_doctor_checks_the_llama_cpp_build(tmp_path, version_line, family, severity):
    from types import SimpleNamespace

    (tmp_path / "serve.sh").write_text(f"{version_line}\nllama-server -md d.gguf --spec-type draft-dflash\n")
    served = serving.read_serving_config(tmp_path / "serve.sh")
    check = serving.llamacpp_build(served, SimpleNamespace(family=family))
    assert check.severity == severity, check
    assert ("DFlash2 needs b10662" if family == "dflash2" else "DFlash needs b9837") in check.evidence


def test_the_default_prompts_search_never_waits_on_a_server_nobody_named(tmp_path, monkeypatch):
    """A store server the command does not name (MLFLOW_TRACKING_URI of the shell) is not consulted for
    domain prompts: a down one retries for minutes. A missing local store is not created."""
    from tracker.cli.doctor import domain_prompts

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    assert domain_prompts(None, str(tmp_path / "ckpt"), None) is None
    missing = tmp_path / "none.db"
    assert domain_prompts(f"sqlite:///{missing}", str(tmp_path / "ckpt"), None) is None and not missing.exists()


def test_a_serving_config_that_simulates_acceptance_is_critical(pair, tmp_path, capsys):
    """SGLang #32595: with SGLANG_SIMULATE_ACC_LEN set, the acceptance SGLang reports is the variable's, not the
    drafter's. doctor flags the serving config critical (exit 1); the same config without it passes the check."""
    config = {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 4,
              "env": {"SGLANG_SIMULATE_ACC_LEN": "3.5"}}
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(config))
    assert main(["doctor", "--target", str(pair / "target"), "--drafter", str(pair / "zlab"), "--device", "cpu",
                 "--n-prompts", "2", "--max-new-tokens", "8", "--serving-config", str(path), "--json"]) == 1
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks[serving.SIMULATED]["severity"] == CRITICAL and "SGLANG_SIMULATE_ACC_LEN" in \
        checks[serving.SIMULATED]["evidence"]
    path.write_text(json.dumps({**config, "env": {"SGLANG_LOG_LEVEL": "info"}}))
    assert serving.simulated_acceptance(serving.read_serving_config(path)).severity == OK


def test_hostile_serving_configs_are_one_error_line_or_the_check_s_warning(tmp_path):
    """Issue 64, F6: each of these gave a traceback, hung, or was read whole before the cut."""
    import os

    def refused(name: str, data: bytes, match: str) -> None:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DraftboardError, match=match):
            serving.read_serving_config(path)

    refused("other.json", json.dumps({"engine": {"name": "tgi"}, "protocol": {"scoring": "engine"}}).encode(),
            "names engine 'tgi'")
    refused("deep.json", b"[" * 60_000 + b"]" * 60_000, "nested too deep")
    refused("n.sh", "llama-server -m t.gguf --spec-type draft-dflash --spec-draft-n-max ²".encode(), "is not a number")
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(serving.MAX_SERVING_FILE + 2)  # sparse: nothing to write, the size is what counts
    with pytest.raises(DraftboardError, match="over 64 MiB"):
        serving.read_serving_config(big)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(DraftboardError, match="not a readable file"):
        serving.read_serving_config(fifo)
    gguf_fifo = tmp_path / "drafter.gguf"
    os.mkfifo(gguf_fifo)
    (tmp_path / "serve.sh").write_text(f"llama-server -m t.gguf --spec-type draft-dflash -md {gguf_fifo}\n")
    check = serving.gguf_target_layers(serving.read_serving_config(tmp_path / "serve.sh"), [1])
    assert check.severity == WARNING and "not a regular file" in check.verdict
