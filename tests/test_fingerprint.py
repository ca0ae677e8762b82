import copy

import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3ForCausalLM

from tracker.environment import fingerprint, linear_attn
from tracker.environment.fingerprint import DiffRow
from tiny import qwen3_config, qwen35_config

SOFTWARE_KEYS = {"python", "torch", "cuda", "cudnn", "transformers", "flash-linear-attention", "fla-core",
                 "causal-conv1d", "triton", "kernels", "flash-attn", "draftboard"}


@pytest.fixture(scope="module")
def hybrid_target():
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(qwen35_config()).eval()


def test_fixed_top_level_keys_and_fields_on_this_machine(machine_fp):
    assert {"software", "hardware", "numerics", "code"} <= set(machine_fp)
    assert SOFTWARE_KEYS <= set(machine_fp["software"])
    assert machine_fp["software"]["torch"] == torch.__version__
    assert machine_fp["software"]["causal-conv1d"] is None  # not installable without CUDA
    assert machine_fp["hardware"]["device"] == "cpu"
    assert machine_fp["hardware"]["cpu"]
    num = machine_fp["numerics"]
    assert num["dtype"] == "fp32"
    assert num["linear_attention_path"] == "fallback"
    assert "causal-conv1d" in num["linear_attention"]["reason"]
    assert set(num["sdpa_backends"]) == {"flash", "mem_efficient", "math", "cudnn"}
    assert {"git_commit", "dirty", "diff_digest"} <= set(machine_fp["code"])


def test_env_tags_are_the_fixed_names(machine_fp):
    tags = fingerprint.env_tags(machine_fp)
    assert set(tags) == {"env.hash", "env.linear_attn", "env.device", "env.dtype", "env.torch", "env.transformers",
                         "env.gpu", "env.critical_key", "env.warning_key", "env.probe_digest", "env.drafter_precision",
                         "env.source"}
    assert tags["env.linear_attn"] == "fallback" and tags["env.device"] == "cpu" and tags["env.gpu"] == "none"


def test_target_fingerprint_has_a_probe_and_the_fallback_warnings(hybrid_target):
    # As an eval starts (evaluators/harness.py): the path transformers chose (an earlier test may have
    # forced its own torch stand-ins, which warn nothing), and this run's warnings only.
    linear_attn.apply("auto", "cpu")
    linear_attn.FALLBACK_WARNINGS.start()
    fp = fingerprint.capture(hybrid_target, "cpu", "fp32", probe_layers=[1, 3])
    assert fp["numerics"]["linear_attention"]["module"].endswith("modeling_qwen3_5")
    assert fp["numerics"]["attn_implementation"] == "sdpa"
    assert set(fp["probe"]["layers"]) == {"1", "3"}
    assert all(s["std"] > 0 for s in fp["probe"]["layers"].values())
    # The probe's forward ran the torch path, and transformers said so.
    assert any("falling back" in w for w in fp["numerics"]["linear_attention"]["fallback_warnings"])
    again = fingerprint.capture(hybrid_target, "cpu", "fp32", probe_layers=[1, 3])
    assert again["probe"]["digest"] == fp["probe"]["digest"]


def test_non_hybrid_target_reports_na():
    fp = fingerprint.capture(Qwen3ForCausalLM(qwen3_config()).eval(), "cpu", "fp32", with_probe=False)
    assert fp["numerics"]["linear_attention_path"] == "n/a"


def _with(fp, **changes):
    out = copy.deepcopy(fp)
    for dotted, value in changes.items():
        section, key = dotted.split("__", 1)
        out[section][key.replace("_dash_", "-")] = value
    return out


def _severity(rows, field):
    return {r.field: r.severity for r in rows}[field]


def test_identical_fingerprints_have_no_diff(machine_fp):
    assert fingerprint.diff(machine_fp, copy.deepcopy(machine_fp)) == []


@pytest.mark.parametrize("section_key, a, b, severity", [
    ("numerics__linear_attention_path", "fast", "fallback", "critical"),
    ("numerics__dtype", "bf16", "fp32", "critical"),
    ("hardware__device", "cuda", "cpu", "critical"),
    ("numerics__attn_implementation", "sdpa", "flash_attention_2", "critical"),
    ("numerics__tf32_matmul", True, False, "critical"),
    ("software__torch", "2.13.0", "2.14.0", "critical"),
    ("software__torch", "2.13.0", "2.13.1", "warning"),
    ("software__transformers", "5.24.0", "5.23.2", "critical"),
    ("software__flash_dash_linear_dash_attention", "0.6.0", "0.6.1", "warning"),
    ("hardware__gpu_name", "NVIDIA H100", "NVIDIA H200", "warning"),
    ("software__python", "3.11.7", "3.12.1", "info"),
    ("code__git_commit", "abc", "def", "info"),
    # An unknown value (an imported or published run) cannot prove a mismatch.
    ("numerics__linear_attention_path", None, "fast", "warning"),
])
def test_diff_severity_rules(machine_fp, section_key, a, b, severity):
    rows = fingerprint.diff(_with(machine_fp, **{section_key: a}), _with(machine_fp, **{section_key: b}))
    field = section_key.replace("__", ".").replace("_dash_", "-")
    assert _severity(rows, field) == severity
    assert all(isinstance(r, DiffRow) and len(r) == 4 for r in rows)


def test_per_function_kernel_difference_is_critical(machine_fp):
    fast = copy.deepcopy(machine_fp)
    fast["numerics"]["linear_attention"]["functions"]["causal_conv1d_fn"] = "causal_conv1d.causal_conv1d_fn"
    rows = fingerprint.diff(machine_fp, fast)
    assert _severity(rows, "numerics.linear_attention.functions.causal_conv1d_fn") == "critical"


def _probe(scale):
    return {"seed": 1, "length": 8, "digest": f"d{scale}",
            "layers": {"0": {"mean": 0.1 * scale, "std": 1.0 * scale, "absmax": 3.0 * scale}}}


def test_probe_tolerance(machine_fp):
    a, near, far = (dict(machine_fp, probe=_probe(s)) for s in (1.0, 1.0 + 1e-5, 1.1))
    assert _severity(fingerprint.diff(a, near), "probe.max_rel_diff") == "warning"
    assert _severity(fingerprint.diff(a, far), "probe.max_rel_diff") == "critical"
    assert fingerprint.diff(a, dict(machine_fp, probe=_probe(1.0))) == []
    same_stats = dict(machine_fp, probe={**_probe(1.0), "digest": "other"})
    assert _severity(fingerprint.diff(a, same_stats), "probe.max_rel_diff") == "info"


def test_rows_are_sorted_most_severe_first(machine_fp):
    b = _with(machine_fp, software__python="0.0", numerics__dtype="bf16", hardware__gpu_name="X")
    assert [r.severity for r in fingerprint.diff(machine_fp, b)] == ["critical", "warning", "info"]


def test_env_hash_tracks_only_what_changes_numbers(machine_fp):
    h = fingerprint.env_hash(machine_fp)
    assert h == fingerprint.env_hash(copy.deepcopy(machine_fp))
    assert h == fingerprint.env_hash(_with(machine_fp, software__python="3.99", code__git_commit="x"))
    assert h == fingerprint.env_hash(_with(machine_fp, software__torch=machine_fp["software"]["torch"] + "1"))
    assert h != fingerprint.env_hash(_with(machine_fp, numerics__dtype="bf16"))
    assert h != fingerprint.env_hash(_with(machine_fp, numerics__linear_attention_path="fast"))


def test_imported_fingerprint_invents_nothing(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step=1 loss=2.0\n")
    fp = fingerprint.imported(log, "kv")
    assert fp["source"]["kind"] == "imported" and fp["source"]["file"] == str(log)
    assert fp["software"]["torch"] is None and fp["numerics"]["linear_attention_path"] is None
    assert fingerprint.env_tags(fp)["env.linear_attn"] == "unknown"


def test_capture_only_reads_the_kernel_path():
    # Whoever loads a model applies the mode; recording the environment must not undo or redo it.
    assert linear_attn.apply("fallback", "cpu").forced
    try:
        fp = fingerprint.capture(device="cpu", dtype="fp32", with_probe=False)
        assert fp["numerics"]["linear_attention"]["forced_by_draftboard"] is True
        assert linear_attn.resolve().forced  # still forced after the capture
        linear_attn.apply("auto", "cpu")
        fp = fingerprint.capture(device="cpu", dtype="fp32", with_probe=False)
        assert fp["numerics"]["linear_attention"]["forced_by_draftboard"] is False
        assert not linear_attn.resolve().forced
    finally:
        linear_attn.apply("auto", "cpu")


def test_drafter_precision_is_recorded_and_a_difference_is_critical():
    autocast = fingerprint.capture(None, "cpu", "fp32", drafter_precision="bf16-autocast", code_dir="/")
    cast = fingerprint.capture(None, "cpu", "fp32", code_dir="/")  # default: the drafter cast to the dtype
    assert autocast["numerics"]["drafter_precision"] == "bf16-autocast"
    assert cast["numerics"]["drafter_precision"] == "fp32"
    rows = [r for r in fingerprint.diff(autocast, cast) if r.field == "numerics.drafter_precision"]
    assert rows == [("numerics.drafter_precision", "bf16-autocast", "fp32", "critical")]
    assert fingerprint.env_hash(autocast) != fingerprint.env_hash(cast)


def test_equal_keys_mean_no_critical_or_no_warned_difference(machine_fp):
    """`critical_key` and `warning_key` stand for the fingerprint in a listing (tracker/dashboard/lineage.py):
    equal keys must mean `diff` has no critical row (no row above info). Each change is checked both ways."""
    import copy

    base = {**copy.deepcopy(machine_fp), "probe": {"seed": 1234, "length": 64, "digest": "a" * 16,
                                                   "layers": {"1": {"mean": 0.1, "std": 1.0, "absmax": 2.0}}}}

    def changed(edit):
        other = copy.deepcopy(base)
        edit(other)
        return other

    info_only = changed(lambda f: f["code"].update(git_commit="f" * 40))  # another commit: an info row
    patch_release = changed(lambda f: f["software"].update(torch=f["software"]["torch"].replace("2.13.0", "2.13.1")))
    critical = [changed(lambda f: f["numerics"].update(dtype="bf16")),
                changed(lambda f: f["numerics"].update(linear_attention_path="fast")),
                changed(lambda f: f["software"].update(transformers="4.0.0")),
                changed(lambda f: f["probe"].update(digest="0" * 16, layers={
                    k: {s: v * 2 + 1 for s, v in stats.items()} for k, stats in f["probe"]["layers"].items()}))]
    other_gpu = changed(lambda f: f["hardware"].update(gpu_name="NVIDIA A100"))  # a warning row
    key, warned = fingerprint.critical_key(base), fingerprint.warning_key(base)
    assert key.startswith(fingerprint.CRITICAL_KEY_VERSION + "-") and warned != key
    no_probe = {k: v for k, v in info_only.items() if k != "probe"}  # a training run's, captured without target

    def agree(a, b, key_of):
        return key_of(a) == key_of(b) and fingerprint.probes_agree(fingerprint.probe_digest(a),
                                                                   fingerprint.probe_digest(b))

    for other in (info_only, patch_release, other_gpu, no_probe):
        assert not fingerprint.has_critical(fingerprint.diff(base, other))
        assert agree(base, other, fingerprint.critical_key)
    for other in critical:
        assert fingerprint.has_critical(fingerprint.diff(base, other))
        assert not agree(base, other, fingerprint.critical_key)
    # The warning key: agreeing only where `diff` has nothing but info rows.
    for other in (info_only, no_probe):
        assert {r.severity for r in fingerprint.diff(base, other)} == {"info"}
        assert agree(base, other, fingerprint.warning_key)
    for other in (patch_release, other_gpu, *critical):
        assert {r.severity for r in fingerprint.diff(base, other)} - {"info"}
        assert not agree(base, other, fingerprint.warning_key)
    assert fingerprint.probe_digest(no_probe) == fingerprint.NO_PROBE
    assert fingerprint.probe_digest(base) == 'digest:"' + "a" * 16 + '"'
    # An imported file's digest cannot pass for "no probe", and two digests `diff` tells apart stay apart.
    for digest, other in (("none", None), ("", None), ("x" * 100, "x" * 99 + "y")):
        a, b = ({**base, "probe": {**base["probe"], "digest": d}} for d in (digest, other))
        assert not fingerprint.probes_agree(fingerprint.probe_digest(a), fingerprint.probe_digest(b))
        assert not fingerprint.probes_agree(fingerprint.probe_digest(a), fingerprint.probe_digest(base))
        assert [r.field for r in fingerprint.diff(a, b)] == ["probe.max_rel_diff"]
    assert len(fingerprint.probe_digest({**base, "probe": {**base["probe"], "digest": "x" * 10_000}})) < 100
