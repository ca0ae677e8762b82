"""A warm eval (the target's work cached) reads only the target's embedding and lm_head, and gives
exactly the cold eval's results; the features cache streams prompt by prompt, in the eval's dtype."""

import json

import pytest
import torch
from transformers import PreTrainedModel, Qwen3_5ForCausalLM

from evaluators.cache import EvalCache
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from evaluators.target import (check_weights, content_digest, held_heads, load_heads, load_target,
                               stop_token_ids, text_config)
from tiny import hybrid_eval_files, qwen35_config, save_target


def _settings(root, cache, **kw):
    return EvalSettings(target=str(root / "target"), drafter=str(root / "drafter"), prompts=str(root / "prompts.jsonl"),
                        max_new_tokens=12, budgets=(2, 8), device="cpu", cache_dir=str(cache), **kw)


def _comparable(results: dict) -> dict:
    """Everything but the timing, and the working tree's state (captured afresh by every eval, the
    same way warm or cold, and edited by whoever works on the checkout meanwhile)."""
    fp = {k: v for k, v in results["fingerprint"].items() if k != "code"}
    return {**{k: v for k, v in results.items() if k != "timing"}, "fingerprint": fp}


def _refuse_full_loads(monkeypatch):
    """Make building the target from its weights impossible: any from_pretrained raises."""

    def refuse(cls, *args, **kwargs):
        raise AssertionError(f"{cls.__name__}.from_pretrained called: the warm eval loaded the whole target")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return hybrid_eval_files(tmp_path_factory.mktemp("warm"))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_warm_eval_equals_cold_and_never_builds_the_target(files, tmp_path, monkeypatch, dtype):
    cold = evaluate(_settings(files, tmp_path, dtype=dtype))
    assert cold["timing"]["loaded"] == "model"
    _refuse_full_loads(monkeypatch)
    stages = []
    warm = evaluate(_settings(files, tmp_path, dtype=dtype), lambda stage, done, total: stages.append(stage))
    assert warm["timing"]["loaded"] == "heads"
    assert _comparable(warm) == _comparable(cold)
    assert {"target: continuations (cached)", "target: features (cached)"} <= set(stages)
    assert set(warm["timing"]) == {"load_s", "target_s", "fingerprint_s", "drafter_s", "total_s", "loaded",
                                   "heads_held"}
    # The next eval in this process uses the heads this one read (a warm host's sweep), to the same numbers.
    again = evaluate(_settings(files, tmp_path, dtype=dtype))
    assert (warm["timing"]["heads_held"], again["timing"]["heads_held"]) == (False, True)
    assert _comparable(again) == _comparable(cold)
    # features are stored in the dtype the target computed them in: bf16 halves the cache
    layer = next(tmp_path.glob("features/*/layer_1.safetensors"))
    header = json.loads(layer.read_bytes()[8:8 + int.from_bytes(layer.read_bytes()[:8], "little")])
    assert header["s0"]["dtype"] == {"fp32": "F32", "bf16": "BF16"}[dtype]


def test_a_changed_environment_loads_the_target_again(files, tmp_path, monkeypatch):
    evaluate(_settings(files, tmp_path))
    # another linear-attention mode is another environment: its probe and resolution are not known
    again = evaluate(_settings(files, tmp_path, linear_attn="fallback"))
    assert again["timing"]["loaded"] == "model"
    _refuse_full_loads(monkeypatch)
    assert evaluate(_settings(files, tmp_path, linear_attn="fallback"))["timing"]["loaded"] == "heads"


def test_a_warm_eval_imports_no_modeling_code_and_parses_no_config(files, tmp_path):
    """What checking the target concluded is cached by its content digest: a warm eval in a fresh
    interpreter neither builds the model on the meta device nor reads the config through AutoConfig."""
    import subprocess
    import sys

    cold = evaluate(_settings(files, tmp_path))
    code = (
        "import json, sys\n"
        "from evaluators.harness import EvalSettings, evaluate\n"
        f"r = evaluate(EvalSettings(target={str(files / 'target')!r}, drafter={str(files / 'drafter')!r}, "
        f"prompts={str(files / 'prompts.jsonl')!r}, max_new_tokens=12, budgets=(2, 8), device='cpu', "
        f"cache_dir={str(tmp_path)!r}))\n"
        "print(json.dumps({'tau': r['tau'], 'loaded': r['timing']['loaded'], "
        "'modules': sorted(m for m in sys.modules if m.startswith('transformers'))}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    warm = json.loads(out.stdout.strip().splitlines()[-1])
    assert warm["tau"] == cold["tau"] and warm["loaded"] == "heads"
    assert not [m for m in warm["modules"] if "modeling" in m or m.startswith("transformers.models.auto")], \
        warm["modules"]


def test_a_target_whose_files_changed_is_checked_again(files, tmp_path):
    from evaluators.cache import CHECKS
    from tracker.errors import DraftboardError

    cold = evaluate(_settings(files, tmp_path))
    (entry,) = [p for p in (tmp_path / CHECKS).glob("*.json") if not p.name.endswith(".meta.json")]
    entry.write_text('{"config": "damaged"}')  # a damaged entry is a miss: checked again, and rewritten
    assert _comparable(evaluate(_settings(files, tmp_path))) == _comparable(cold)
    assert json.loads(entry.read_text())["config"]["vocab_size"] > 0
    # A config that no longer fits the weights is a new digest: the checks run again and refuse it.
    changed = tmp_path / "changed"
    changed.mkdir()
    for name in ("drafter", "prompts.jsonl"):
        (changed / name).symlink_to(files / name)
    (changed / "target").mkdir()
    for f in (files / "target").iterdir():
        (changed / "target" / f.name).symlink_to(f)
    config = json.loads((files / "target" / "config.json").read_text())
    (changed / "target" / "config.json").unlink()
    (changed / "target" / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(DraftboardError, match="do not belong together"):
        evaluate(_settings(changed, tmp_path))


@pytest.mark.parametrize("tied", [False, True])
def test_heads_from_a_sharded_checkpoint_equal_the_loaded_models(tmp_path, tied):
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(qwen35_config(tie_word_embeddings=tied)).eval()
    save_target(model, tmp_path)
    model.save_pretrained(tmp_path, max_shard_size="20KB")  # several shards and an index
    (tmp_path / "model.safetensors").unlink(missing_ok=True)
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 2
    where = check_weights(tmp_path)
    assert (where.embed == where.lm_head) == tied
    for dtype in ("fp32", "bf16"):
        full = load_target(tmp_path, "cpu", dtype, "auto")
        heads = load_heads(tmp_path, where, text_config(tmp_path), stop_token_ids(tmp_path, text_config(tmp_path)),
                           "cpu", dtype)
        assert torch.equal(heads.embed_weight, full.embed_weight)
        assert torch.equal(heads.lm_head_weight, full.lm_head_weight)
        assert heads.stop_token_ids() == full.stop_token_ids() and heads.num_layers == full.num_layers


def test_a_process_holds_one_targets_heads_by_digest_device_and_dtype(files):
    target = files / "target"
    where, cfg = check_weights(target), text_config(target)
    stops, digest = stop_token_ids(target, cfg), content_digest(target)

    def held(digest: str, dtype: str):
        return held_heads(target, digest, where, cfg, stops, "cpu", dtype)

    first, _ = held(digest, "fp32")
    assert held(digest, "fp32") == (first, True)  # the same object: nothing read
    bf16, was_held = held(digest, "bf16")
    assert not was_held and bf16.embed_weight.dtype == torch.bfloat16
    assert not held("changed-files", "bf16")[1]  # changed files are a new digest: read again
    again, was_held = held(digest, "fp32")
    assert not was_held and again is not first  # one target's heads at a time: fp32's were let go
    assert torch.equal(again.lm_head_weight, first.lm_head_weight)


def test_warm_eval_on_a_sharded_tied_target(files, tmp_path, monkeypatch):
    root = tmp_path / "sharded"
    root.mkdir()
    for name in ("drafter", "prompts.jsonl"):
        (root / name).symlink_to(files / name)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(qwen35_config(tie_word_embeddings=True)).eval()
    save_target(model, root / "target")
    (root / "target" / "model.safetensors").unlink()
    model.save_pretrained(root / "target", max_shard_size="20KB")
    cold = evaluate(_settings(root, tmp_path / "cache"))
    _refuse_full_loads(monkeypatch)
    warm = evaluate(_settings(root, tmp_path / "cache"))
    assert warm["timing"]["loaded"] == "heads" and _comparable(warm) == _comparable(cold)


def test_old_and_damaged_feature_entries_are_read_or_recomputed(files, tmp_path):
    from safetensors.torch import save_file

    cold = evaluate(_settings(files, tmp_path))
    entry = next(tmp_path.glob("features/*"))
    layers = sorted(entry.glob("layer_*.safetensors"))
    # the layout earlier versions wrote: one save_file per layer, every prompt's fp32 tensor in it
    cache = EvalCache(tmp_path)
    for path in layers:
        f = cache.open_features(entry.name, int(path.stem.split("_")[1]), 3)
        tensors = {f"s{i}": f.read(i).float().clone() for i in range(len(f))}
        f.close()
        save_file(tensors, str(path))
    old = evaluate(_settings(files, tmp_path))
    assert old["timing"]["loaded"] == "heads" and _comparable(old) == _comparable(cold)
    layers[0].write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")  # damaged: a miss, recomputed
    stages = []
    again = evaluate(_settings(files, tmp_path), lambda stage, done, total: stages.append(stage))
    assert "target: features" in stages and _comparable(again) == _comparable(cold)
    assert EvalCache(tmp_path).open_features(entry.name, int(layers[0].stem.split("_")[1]), 3) is not None
