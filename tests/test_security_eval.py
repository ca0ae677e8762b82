"""Issue 10, the eval's findings, reproduced as they were tried and now failing safely.

#6 absurd drafter configs, #7 absurd or broken targets, #12 shard and sidecar files escaping a
model folder, #13 `eval --out` to a folder that is not there, #10 unbounded DDTree budgets. Each
ends in one `error:` line and exit 2 from `draftboard eval`, before anything is allocated from
the bad value, and with nothing logged or written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from evaluators.drafter import DrafterConfig, load_drafter
from evaluators.settings import EvalSettings
from evaluators.target import check_weights
from tiny import hybrid_eval_files
from tracker.cli import main
from tracker.config import MAX_BUDGET
from tracker.errors import DraftboardError
from tracker.store.tracker import Tracker

MIB = 1024  # ru_maxrss is in KiB on Linux


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny Qwen3.5 target, a z-lab drafter for it and token-id prompts."""
    return hybrid_eval_files(tmp_path_factory.mktemp("security-eval"))


def _copy(src: Path, dst: Path, **config) -> Path:
    """A copy of a model folder with config.json fields replaced."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _eval(files: Path, tmp_path: Path, *extra: str, target: Path | None = None, drafter: Path | None = None):
    """`draftboard eval` on the tiny files, logging to a store of its own; (exit status, args)."""
    args = ["eval", "--target", str(target or files / "target"), "--drafter", str(drafter or files / "drafter"),
            "--prompts", str(files / "prompts.jsonl"), "--max-new-tokens", "6", "--budgets", "2,4",
            "--device", "cpu", "--cache-dir", str(tmp_path / "cache"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'store.db'}", *extra]
    return main(args)


def _refused(capsys, tmp_path: Path, *needles: str) -> str:
    """The one `error:` line (last on stderr, no traceback), holding every needle; nothing was done."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and not any("Traceback" in line for line in err), err
    assert sum(line.startswith("error: ") for line in err) == 1, err
    for needle in needles:
        assert needle in err[-1], (needle, err[-1])
    assert not (tmp_path / "cache").exists(), "the target ran before the refusal"
    if (tmp_path / "store.db").exists():
        assert Tracker(f"sqlite:///{tmp_path / 'store.db'}").find_runs(kind="eval") == []
    return err[-1]


# The refusal measured alone, in a fresh process: imports first, then time and peak-RSS growth of the call.
MEASURE = """
import json, resource, sys, time
import safetensors.torch
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401 (imported before the clock starts)
from evaluators import drafter, target
from tracker.errors import DraftboardError
call = {"drafter": drafter.load_drafter, "target": target.check_weights}[sys.argv[1]]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    call(sys.argv[2])
    outcome = None
except DraftboardError as exc:
    outcome = str(exc)
print(json.dumps({"seconds": time.perf_counter() - t0, "grew_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                  - before, "error": outcome}))
"""


def _measure(what: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, what, str(path)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- #6 absurd drafter configs


@pytest.mark.parametrize("layers", [10**9, 10**6])
def test_absurd_drafter_layer_count_is_refused_in_under_a_second_and_200_mb(files, tmp_path, layers):
    # As tried: the z-lab folder's config.json says num_hidden_layers 10**9 (a MemoryError at 7 GB
    # before) or 10**6 (still building at 300 s); the weights hold one layer.
    drafter = _copy(files / "drafter", tmp_path / "drafter", num_hidden_layers=layers)
    measured = _measure("drafter", drafter)
    assert measured["error"] and f"num_hidden_layers {layers}" in measured["error"], measured
    assert measured["seconds"] < 1.0 and measured["grew_kib"] < 200 * MIB, measured
    control = _measure("drafter", files / "drafter")  # the same measurement loads the untouched drafter
    assert control["error"] is None, control


def test_absurd_drafter_config_is_one_error_line_from_eval(files, tmp_path, capsys):
    drafter = _copy(files / "drafter", tmp_path / "drafter", num_hidden_layers=10**9)
    assert _eval(files, tmp_path, drafter=drafter) == 2
    _refused(capsys, tmp_path, "num_hidden_layers 1000000000", "limit")


def test_layer_count_must_match_the_layer_keys(files, tmp_path):
    # Within the bounds, but the weights hold layer 0 only: refused before any layer is built.
    drafter = _copy(files / "drafter", tmp_path / "drafter", num_hidden_layers=3)
    with pytest.raises(DraftboardError, match=r"num_hidden_layers=3 but the weights hold layers 0\.\.0"):
        load_drafter(drafter)


def test_drafter_config_sizes_are_bounded_when_built_directly():
    with pytest.raises(DraftboardError, match="num_hidden_layers 1000000000 is above the limit"):
        DrafterConfig(hidden_size=32, num_hidden_layers=10**9, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, intermediate_size=64, target_layer_ids=[1])


def test_config_larger_than_its_weights_is_refused_naming_the_tensor(files, tmp_path):
    drafter = _copy(files / "drafter", tmp_path / "drafter", intermediate_size=100_000)
    with pytest.raises(DraftboardError, match=r"mlp.*\[64, 32\].*\[100000, 32\]"):
        load_drafter(drafter)


# --------------------------------------------------------------------------- #7 absurd or broken targets


def test_absurd_target_intermediate_size_is_refused_before_allocating(files, tmp_path, capsys):
    # As tried: intermediate_size 10**9 made from_pretrained try to allocate 128 GB.
    target = _copy(files / "target", tmp_path / "target", intermediate_size=10**9)
    measured = _measure("target", target)
    assert measured["error"] and "intermediate_size 1000000000" in measured["error"], measured
    assert measured["seconds"] < 1.0 and measured["grew_kib"] < 200 * MIB, measured
    assert _eval(files, tmp_path, target=target) == 2
    _refused(capsys, tmp_path, "intermediate_size 1000000000", "limit")


def test_target_config_that_does_not_match_its_weights_is_refused(files, tmp_path, capsys):
    # Within the bounds, but 64x the weights' MLP width: compared on the meta device, nothing allocated.
    target = _copy(files / "target", tmp_path / "target", intermediate_size=4096)
    assert _eval(files, tmp_path, target=target) == 2
    _refused(capsys, tmp_path, "mlp", "[4096, 32]", "[64, 32]", "do not belong together")
    check_weights(files / "target")  # control: the untouched target passes


def test_truncated_target_safetensors_is_one_error_line(files, tmp_path, capsys):
    target = _copy(files / "target", tmp_path / "target")
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert _eval(files, tmp_path, target=target) == 2
    _refused(capsys, tmp_path, "truncated or corrupt", "model.safetensors")


# --------------------------------------------------------------------------- #12 files escaping a model folder


def _shard_drafter(files: Path, folder: Path, shard: str) -> Path:
    """A copy of the drafter whose weights live in `shard`, named by a sharded index."""
    shutil.copytree(files / "drafter", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    (folder / shard).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(tensors, shard)}))
    return folder


def test_sharded_drafter_inside_its_folder_loads(files, tmp_path):
    drafter = _shard_drafter(files, tmp_path / "drafter", "model-00001-of-00001.safetensors")
    loaded, plain = load_drafter(drafter), load_drafter(files / "drafter")
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), plain.model.state_dict().values()))


def test_shard_path_with_dotdot_is_refused(files, tmp_path, capsys):
    # As tried: the index of an allowed drafter folder names a shard outside it.
    drafter = _shard_drafter(files, tmp_path / "allowed" / "drafter", "../../outside/weights.safetensors")
    assert (tmp_path / "outside" / "weights.safetensors").is_file()
    assert _eval(files, tmp_path, drafter=drafter) == 2
    _refused(capsys, tmp_path, "shard", "../../outside/weights.safetensors", "outside that folder")


def test_a_folder_of_symlinks_loads_like_a_hugging_face_cache_snapshot(files, tmp_path):
    # HF cache snapshots are folders of symlinks into ../../blobs: a symlink is a file like any
    # other to the loader. Whether its target lies in the allowed roots is the worker's check
    # (tests/test_security_jobs.py), which resolves every file of the folder.
    blobs = tmp_path / "blobs"
    shutil.copytree(files / "drafter", blobs)
    snapshot = tmp_path / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for f in blobs.iterdir():
        (snapshot / f.name).symlink_to(Path("..") / ".." / "blobs" / f.name)
    loaded, plain = load_drafter(snapshot), load_drafter(files / "drafter")
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(), plain.model.state_dict().values()))


def test_a_sidecar_name_leaving_the_folder_is_refused(files, tmp_path):
    index = {"metadata": {}, "weight_map": {"fc.weight": "/etc/passwd"}}
    drafter = _copy(files / "drafter", tmp_path / "drafter")
    (drafter / "model.safetensors").rename(drafter / "model-00001-of-00001.safetensors")
    (drafter / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(DraftboardError, match="outside that folder"):
        load_drafter(drafter)


# --------------------------------------------------------------------------- #13 eval --out


@pytest.mark.parametrize("where, needle", [("missing/results.json", "does not exist"), (".", "is a directory")])
def test_out_that_cannot_be_written_is_refused_before_the_eval(files, tmp_path, capsys, where, needle):
    # As tried: --out into a missing folder gave a traceback after the run was logged, so a
    # requeued job logged a duplicate. Now: refused first, nothing logged, the target never ran.
    assert _eval(files, tmp_path, "--out", str(tmp_path / where)) == 2
    _refused(capsys, tmp_path, "--out", needle)
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: permissions cannot refuse it")
def test_out_in_an_unwritable_folder_is_refused_before_the_eval(files, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert _eval(files, tmp_path, "--out", str(locked / "results.json")) == 2
    _refused(capsys, tmp_path, "no permission")


# --------------------------------------------------------------------------- #10 budgets


def test_budgets_are_capped_in_the_harness_and_the_cli(files, tmp_path, capsys):
    # As tried: a budget of 10**6 took 2.8 s per block, tying a worker up for hours.
    base = dict(target=str(files / "target"), drafter=str(files / "drafter"), prompts=str(files / "prompts.jsonl"))
    with pytest.raises(DraftboardError, match=f"1000000 is above the limit of {MAX_BUDGET}"):
        EvalSettings(**base, budgets=(4, 10**6))
    assert EvalSettings(**base, budgets=(MAX_BUDGET,)).budgets == (MAX_BUDGET,)
    with pytest.raises(SystemExit) as exit_:
        _eval(files, tmp_path, "--budgets", "4,1000000")
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--budgets" in err[-1] and str(MAX_BUDGET) in err[-1] and not (tmp_path / "cache").exists()
