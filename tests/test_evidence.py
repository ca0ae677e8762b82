"""The environment a run ran in, read from its own files: console rules, package lists, the decision."""

import os
import time

import pytest

from tracker.environment import fingerprint
from tracker.environment.evidence import console, decide, files, packages
from tracker.errors import DraftboardError
from tracker.untrusted import textlines

# transformers 5.24's own line (integrations/hub_kernels.py), as its logger prints it.
TF5_CONV = ("[transformers] `causal_conv1d_fn` is falling back to its reference PyTorch implementation because "
            "`causal_conv1d` is not installed. This is correct but much slower; install `causal_conv1d` for the "
            "optimized kernel.")
TF5_RULE = ("[transformers] `chunk_gated_delta_rule` is falling back to its reference PyTorch implementation because "
            "`flash-linear-attention` is not installed. This is correct but much slower; install "
            "`flash-linear-attention` for the optimized kernel.")
# transformers 4.x, as a colourised logging handler printed it (seen in a public log).
TF4 = ("\x1b[33;1m2026-04-24 12:21:19 WARNING modeling_qwen3_5.py L411: The fast path is not available because one of "
       "the required library is not installed. Falling back to torch implementation. To install follow "
       "https://github.com/fla-org/flash-linear-attention#installation and https://github.com/Dao-AILab/causal-conv1d"
       "\x1b[0m")
COLLECT_ENV = """PyTorch version: 2.13.0+cu130
Is debug build: False
CUDA used to build PyTorch: 13.0
Python version: 3.12.3 (main, Nov  6 2025, 13:44:16) [GCC 13.2.0] (64-bit runtime)
GPU models and configuration:
GPU 0: NVIDIA H100 80GB HBM3
GPU 1: NVIDIA H100 80GB HBM3
Nvidia driver version: 580.65.06
[pip3] torch==2.13.0+cu130
[pip3] transformers==5.24.0"""
NVIDIA_SMI = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
|   1  NVIDIA H100 80GB HBM3          On  |   00000000:2A:00.0 Off |                    0 |
|   2  NVIDIA H100 80GB HBM3          On  |   00000000:3A:00.0 Off |                    0 |"""


def _decided(text: str, name: str = "train.log") -> decide.Decision:
    return decide.decide(console.read([(i, line, False) for i, line in enumerate(text.splitlines(), 1)], name))


def test_transformers_5_lines_state_each_piece_and_its_package():
    got = _decided(f"step 0 loss 4.1\n{TF5_CONV}\n{TF5_RULE}\n")
    record = got.known["numerics.linear_attention"]
    assert record["functions"] == dict.fromkeys(("causal_conv1d_fn", "causal_conv1d_update",
                                                 "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
                                                "torch")
    assert got.known["numerics.linear_attention_path"] == "fallback" and record["evidence_kind"] == "stated"
    (cite,) = got.evidence["numerics.linear_attention.functions.causal_conv1d_fn"]
    assert cite["file"] == "train.log" and cite["line"] == 2 and cite["rule"] == "transformers 5 kernel fallback"
    assert cite["text"].startswith("[transformers] `causal_conv1d_fn` is falling back")


def test_the_packed_sequence_error_states_the_piece_had_no_kernel():
    # transformers 5 raises instead of warning when a packed batch meets the torch reference; a traceback ends so.
    got = _decided("Traceback (most recent call last):\n  File \"train.py\", line 9\nValueError: "
                   "`chunk_gated_delta_rule` can't keep packed sequences apart without `flash-linear-attention`. Install "
                   "`flash-linear-attention` to train on packed sequences.\n")
    functions = got.known["numerics.linear_attention"]["functions"]
    assert functions == {"torch_chunk_gated_delta_rule": "torch", "torch_recurrent_gated_delta_rule": "torch"}
    assert got.evidence["numerics.linear_attention.functions.torch_chunk_gated_delta_rule"][0]["line"] == 3


def test_one_piece_stated_leaves_the_path_unknown():
    got = _decided(TF5_CONV)  # the conv fell back; nothing says what ran the rules
    assert set(got.known["numerics.linear_attention"]["functions"]) == {"causal_conv1d_fn", "causal_conv1d_update"}
    assert "numerics.linear_attention_path" not in got.known


def test_transformers_4_line_under_a_log_prefix_states_the_fallback():
    got = _decided(f"Loading model...\n{TF4}\n")
    assert got.known["numerics.linear_attention_path"] == "fallback"
    assert got.evidence["numerics.linear_attention.linear_attention_path"][0]["line"] == 2
    fp = fingerprint.imported("train.log", "kv", evidence=got)
    assert fingerprint.env_tags(fp)["env.linear_attn"] == "fallback"


def test_a_quoted_mention_is_not_a_statement():
    # The line must start with the message (after a log prefix): prose quoting it states nothing.
    got = _decided('note: HF warns "The fast path is not available because one of the required library is not '
                   'installed", ignore it\n')
    assert got.known == {}


def test_collect_env_and_nvidia_smi():
    got = _decided(COLLECT_ENV)
    assert got.known["software.torch"] == "2.13.0+cu130" and got.known["software.cuda"] == "13.0"
    assert got.known["software.python"] == "3.12.3" and got.known["hardware.driver"] == "580.65.06"
    assert got.known["hardware.gpu_count"] == 2 and got.known["hardware.gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert got.known["software.transformers"] == "5.24.0"
    smi = _decided(NVIDIA_SMI)
    assert smi.known["hardware.gpu_count"] == 3 and smi.known["hardware.driver"] == "580.65.06"
    assert smi.evidence["hardware.gpu_count"][0]["line"] == 4


def test_a_start_banner_and_nccl_s_own_line():
    got = _decided("torch 2.13.0+cu130, 8 x H100\nhost-1:4242:4242 [0] NCCL INFO NCCL version 2.27.3+cuda13.0\n")
    assert got.known["software.torch"] == "2.13.0+cu130" and got.known["hardware.gpu_count"] == 8
    assert got.known["hardware.gpu_name"] == "H100" and got.known["software.nccl"] == "2.27.3"
    fp = fingerprint.imported("train.log", "kv", evidence=got)
    tags = fingerprint.env_tags(fp)
    assert tags["env.torch"] == "2.13.0+cu130" and tags["env.gpu"] == "H100"


def test_a_log_that_states_nothing_stays_unknown():
    got = _decided("step=10 loss=2.3\nstep=20 loss=2.1\nepoch 1 done\n")
    assert got.known == {} and got.evidence == {} and got.contradictions == []
    tags = fingerprint.env_tags(fingerprint.imported("train.log", "kv", evidence=got))
    assert {tags[k] for k in ("env.linear_attn", "env.torch", "env.transformers", "env.gpu")} == {"unknown"}


def _packages(text: str, name="requirements.txt"):
    return packages.read([(i, line, False) for i, line in enumerate(text.splitlines(), 1)], name)


FREEZE = "flash-linear-attention==0.6.0\nfla-core==0.6.0\ntorch==2.13.0+cu130\ntransformers==5.24.0\ntriton==3.9.0\n"


def test_a_complete_freeze_without_causal_conv1d_implies_the_conv_fell_back():
    got = decide.decide(_packages(FREEZE))
    record = got.known["numerics.linear_attention"]
    assert record["functions"] == {"causal_conv1d_fn": "torch", "causal_conv1d_update": "torch"}
    assert record["evidence_kind"] == "inferred" and "numerics.linear_attention_path" not in got.known
    assert got.known["software.torch"] == "2.13.0+cu130" and got.known["software.cuda"] == "13.0"
    # fla is installed: what ran the rules is not known from a package list (it may not have imported)
    assert "torch_chunk_gated_delta_rule" not in record["functions"]


def test_a_spec_or_hub_kernels_infer_nothing():
    spec = decide.decide(_packages("torch>=2.6\ntransformers==5.24.0\n"))
    assert "numerics.linear_attention" not in spec.known
    with_hub = decide.decide(_packages(FREEZE + "kernels==0.9.0\n"))  # hub kernels could stand in
    assert "numerics.linear_attention" not in with_hub.known
    old = decide.decide(_packages(FREEZE.replace("5.24.0", "4.57.1")))  # transformers 4: the fast path is all or none
    assert old.known["numerics.linear_attention"]["functions"]["torch_chunk_gated_delta_rule"] == "torch"


def test_conda_environment_yml():
    text = "name: train\ndependencies:\n  - pytorch=2.13.0=py3.12_cuda13.0_cudnn9_0\n  - pip:\n    - transformers==5.24.0\n"
    got = decide.decide(_packages(text, "environment.yml"))
    assert got.known["software.torch"] == "2.13.0" and got.known["software.transformers"] == "5.24.0"


def test_the_console_beats_the_package_list_and_the_disagreement_is_named():
    facts = _packages(FREEZE + "causal-conv1d==1.5.0\n") + console.read([(7, TF5_CONV, False)], "output.log")
    got = decide.decide(facts)
    assert got.known["numerics.linear_attention"]["functions"]["causal_conv1d_fn"] == "torch"
    (line,) = got.contradictions
    assert "causal-conv1d 1.5.0 is installed (requirements.txt:6)" in line and "output.log:7" in line
    banner = decide.decide(_packages("torch==2.12.0\n") + console.read([(1, "torch 2.13.0+cu130", False)], "log"))
    assert banner.known["software.torch"] == "2.13.0+cu130" and "requirements.txt:1 says '2.12.0'" in banner.contradictions[0]


def test_a_checkpoint_config_says_what_saved_it_and_nothing_in_it_runs(tmp_path):
    (tmp_path / "config.json").write_text('{"transformers_version": "5.24.0", "torch_dtype": "bfloat16", '
                                          '"auto_map": {"AutoModel": "modeling.Model"}}')
    facts = {f.field: f for f in files.checkpoint_config(tmp_path, "ckpt/config.json")}
    assert facts["software.transformers"].value == "5.24.0" and facts["software.transformers"].rank == 2
    assert facts["numerics.saved_dtype"].value == "bf16"  # what the weights were saved in, not what training ran
    for hostile in ("[" * 100_000, '{"transformers_version": "5.24.0; rm -rf /"}', '{"torch_dtype": "bf1"}'):
        (tmp_path / "config.json").write_text(hostile)
        assert files.checkpoint_config(tmp_path, "c") == []


def test_hostile_files_are_bounded(tmp_path):
    long_line = tmp_path / "console.log"
    long_line.write_bytes(b"x" * (8 << 20) + b"\n" + TF5_CONV.encode() + b"\n")
    started = time.perf_counter()
    got = decide.decide(files.console_file(long_line))
    assert got.known["numerics.linear_attention"]["functions"]["causal_conv1d_fn"] == "torch"
    assert got.evidence["numerics.linear_attention.functions.causal_conv1d_fn"][0]["line"] == 2
    many = tmp_path / "requirements.txt"
    many.write_text("".join(f"pkg{i}==1.0\n" for i in range(1_000_000)) + "torch==2.13.0\n")
    facts = files.package_file(many)
    assert [f.value for f in facts if f.field == "software.torch"] == ["2.13.0"]
    assert time.perf_counter() - started < 60  # linear: a quadratic reader would take hours
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(DraftboardError, match="not a regular file"):
        files.console_file(fifo)
    # A pathological prefix: thousands of bracketed tokens, read in bounded steps.
    assert console.read([(1, "[a]" * 50_000 + TF5_CONV, False)], "x") == []
    assert list(textlines.lines(long_line, max_line=16))[0] == (1, "x" * 16, True)
