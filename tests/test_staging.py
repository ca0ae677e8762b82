"""evaluators/engines/staging.py: what a managed engine and llama.cpp's converter are given of a model
folder (issue 48, S1): only what draftboard checked, no code, the architectures it decided."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from evaluators.drafter import open_drafter
from evaluators.engines import staging
from hostile import copy_folder, hostile_drafter
from tracker.errors import DraftboardError


def test_declared_architectures_are_the_top_levels_and_every_nested_text_configs():
    config = {"architectures": ["DFlashDraftModel"], "text_config": {"architectures": ["DreamModel"]},
              "thinker_config": {"text_config": {"architectures": ["Qwen2ForCausalLM"]}},
              "lfm": {"architectures": ["Lfm2ForCausalLM"]},
              "transformer_layer_config": {"architectures": ["Qwen3ForCausalLM"]}}  # speculators': not read as text
    assert staging.declared_architectures(config, "x") == ["DFlashDraftModel", "DreamModel", "Qwen2ForCausalLM",
                                                           "Lfm2ForCausalLM"]
    with pytest.raises(DraftboardError, match="list of names"):
        staging.declared_architectures({"architectures": "DFlashDraftModel"}, "x")
    deep: dict = {}
    node = deep
    for _ in range(staging.MAX_NESTING + 1):
        node["text_config"] = {}
        node = node["text_config"]
    with pytest.raises(DraftboardError, match="nested deeper"):
        staging.declared_architectures(deep, "x")


def test_without_code_drops_every_auto_map():
    config = {"auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "a": [{"auto_map": {}, "b": 1}],
              "text_config": {"auto_map": {"AutoConfig": "x.Y"}, "hidden_size": 8}}
    assert staging.without_code(config) == {"a": [{"b": 1}], "text_config": {"hidden_size": 8}}


def test_a_staged_pair_holds_only_what_draftboard_checked(serving_pair, tmp_path):
    """The serving pair's folders carry planted code (conftest): the staged folders hold no .py, no auto_map,
    the same weights (linked), and the drafter's file alone even when an index beside it names others."""
    target, drafter = serving_pair / "target", copy_folder(serving_pair / "drafter", tmp_path / "drafter")
    (drafter / "other.safetensors").write_bytes(b"not read by draftboard")
    (drafter / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "other.safetensors"}}))
    checked = open_drafter(drafter)
    assert checked.weights_path.name == "model.safetensors"  # what draftboard reads: the converter gets it alone
    with staging.staged(target, drafter, checked, tmp_path / "cache") as folders:
        staged_target, staged_drafter = Path(folders.target), Path(folders.drafter)
        assert (folders.target_source, folders.drafter_source) == (str(target.resolve()), str(drafter.resolve()))
        assert sorted(p.name for p in staged_drafter.iterdir()) == ["config.json", "model.safetensors"]
        for folder, source in ((staged_target, target), (staged_drafter, drafter)):
            assert not list(folder.glob("*.py")) and "auto_map" not in (folder / "config.json").read_text()
            assert json.loads((folder / "config.json").read_text())["architectures"] == \
                json.loads((source / "config.json").read_text())["architectures"]
            assert os.path.samefile(folder / "model.safetensors", source / "model.safetensors")
        assert "auto_map" not in (staged_target / "tokenizer_config.json").read_text()
        assert {"tokenizer.json", "tokenizer.model", "generation_config.json"} <= {p.name for p in staged_target.iterdir()}
        assert not (staged_target / "evil_code.py").exists() and (target / "evil_code.py").exists()
    assert not staged_target.exists() and (target / "model.safetensors").is_file()  # only the staged links went


def test_folders_that_name_another_model_are_refused_in_one_line(serving_pair, tmp_path, code_ran_marker):
    target = serving_pair / "target"
    drafter = hostile_drafter(serving_pair / "drafter", target, tmp_path / "drafter", code_ran_marker)
    with pytest.raises(DraftboardError, match=r"declares DreamModel, but draftboard read it as a dflash drafter"):
        staging.stage_drafter(drafter, open_drafter(drafter), tmp_path / "a")
    bad_target = copy_folder(target, tmp_path / "target")
    config = json.loads((bad_target / "config.json").read_text())
    (bad_target / "config.json").write_text(json.dumps({**config, "llm_config": {"architectures": ["DreamModel"]}}))
    with pytest.raises(DraftboardError, match=r"target .*declares DreamModel, but draftboard read it as a qwen3 model"):
        staging.stage_target(bad_target, tmp_path / "b")
    (bad_target / "config.json").write_text(json.dumps({**config, "architectures": []}))
    with pytest.raises(DraftboardError, match="declares no architectures"):
        staging.stage_target(bad_target, tmp_path / "c")
    # Issue 64, F9: a config nested 900 deep (json reads it) overflowed the recursive walks after: one line now.
    (bad_target / "config.json").write_text(json.dumps(config)[:-1] + ', "extra": ' + "[" * 900 + "]" * 900 + "}")
    with pytest.raises(DraftboardError, match="nested (deeper than 64 levels|too deep)"):
        staging.stage_target(bad_target, tmp_path / "d")
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c", "d"))  # refused before anything is made


def test_a_pickled_drafter_is_not_handed_to_an_engine(serving_pair, tmp_path):
    from safetensors.torch import load_file

    drafter = copy_folder(serving_pair / "drafter", tmp_path / "drafter")
    torch.save(load_file(drafter / "model.safetensors"), drafter / "pytorch_model.bin")
    (drafter / "model.safetensors").unlink()
    with pytest.raises(DraftboardError, match="torch pickle; a managed engine is given only safetensors"):
        staging.stage_drafter(drafter, open_drafter(drafter), tmp_path)


def test_automodels_class_name_is_staged_as_the_name_engines_know(serving_pair, tmp_path):
    """Automodel writes `Qwen3DFlashDraftModel` (issue 51); vLLM's registry and llama.cpp's converter know
    `DFlashDraftModel`: staged under that name, the rest of the config as it was (a JetSpec's causal flag too)."""
    drafter = copy_folder(serving_pair / "drafter", tmp_path / "drafter")
    config = json.loads((drafter / "config.json").read_text())
    config["architectures"] = ["Qwen3DFlashDraftModel"]
    config["dflash_config"]["causal"] = True
    (drafter / "config.json").write_text(json.dumps(config))
    checked = open_drafter(drafter)
    assert checked.config.family == "jetspec"
    (tmp_path / "a").mkdir()
    staged = json.loads((staging.stage_drafter(drafter, checked, tmp_path / "a") / "config.json").read_text())
    assert staged["architectures"] == ["DFlashDraftModel"] and staged["dflash_config"]["causal"] is True


def test_a_killed_eval_s_staged_folder_is_removed_by_the_next_and_a_live_one_stays(tmp_path):
    """Issue 64 (also): a SIGKILLed eval leaves cache/staged/eval-<pid>-*, whose hard links keep a deleted
    checkpoint's bytes; the next staging removes those of dead processes, and nothing else."""
    import os
    import subprocess
    import sys

    root = tmp_path / "staged"
    root.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = root / f"eval-{dead.stdout.strip()}-abc123"
    (gone / "target").mkdir(parents=True)
    (gone / "target" / "model.safetensors").write_bytes(b"x")
    (gone / staging.STAGED_MARK).write_text("1\n")
    alive = root / f"eval-{os.getpid()}-def456"
    alive.mkdir()
    (alive / staging.STAGED_MARK).write_text("1\n")
    mine = root / "notes"  # not a staged folder: never touched
    mine.mkdir()
    unmarked = root / f"eval-{dead.stdout.strip()}-ghi789"  # the name, but `staged` did not make it: never touched
    unmarked.mkdir()
    assert staging.remove_stale(root) == [gone]
    assert not gone.exists() and alive.exists() and mine.exists() and unmarked.exists()
