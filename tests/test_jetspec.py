"""Drafter families that share DFlash's files (issue 51): JetSpec (NVIDIA Automodel #2913: `dflash_config.causal`
true, causal in-block attention, as vLLM 0.32's `_dflash_layer_causal` and llama.cpp's converter read the flag)
scored as its causal walk, z-lab's own loop with z-lab's own causal switch (tests/zlab.py); Automodel's class name
read as DFlash's; Domino and DSpark refused by name; files that disagree about their family refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from evaluators.drafter import DFLASH, JETSPEC, DrafterConfig, open_drafter, save_zlab
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from tiny import fit_drafter, greedy_sequences, qwen3_config, save_target
from tracker.errors import DraftboardError
from zlab import zlab_model

MAX_NEW = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen3 target, one fitted drafter saved twice: as DFlash, and as JetSpec (the same weights with
    `dflash_config.causal` true), and prompts."""
    root = tmp_path_factory.mktemp("jetspec")
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(qwen3_config(eos_token_id=None)).eval()
    drafter, cfg = fit_drafter(target, greedy_sequences(target, 8, 6, 48, seed=1), layer_ids=[1, 3], block_size=4,
                               steps=120)
    save_target(target, root / "target")
    save_zlab(drafter, cfg, root / "dflash")
    shutil.copytree(root / "dflash", root / "jetspec")
    config = json.loads((root / "jetspec" / "config.json").read_text())
    config["dflash_config"]["causal"] = True
    config["architectures"] = ["Qwen3DFlashDraftModel"]  # as Automodel writes it
    (root / "jetspec" / "config.json").write_text(json.dumps(config))
    prompts = torch.randint(2, 60, (5, 7), generator=torch.Generator().manual_seed(7)).tolist()
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root, target, prompts


def test_a_jetspec_drafter_is_scored_as_its_causal_walk_and_the_same_weights_without_the_flag_as_dflash(pair, tmp_path):
    """Block for block: the JetSpec folder's walk is z-lab's own loop with every layer causal in the block (z-lab's
    `is_causal` switch: what `dflash_config.causal` means to vLLM and llama.cpp); the DFlash folder's is z-lab's
    default loop; the two differ."""
    zlab = zlab_model()
    root, target, prompts = pair
    walks = {}
    for name, family, causal in (("jetspec", JETSPEC, True), ("dflash", DFLASH, None)):
        res = evaluate(EvalSettings(str(root / "target"), str(root / name), str(root / "prompts.jsonl"),
                                    max_new_tokens=MAX_NEW, budgets=(4,), device="cpu", cache_dir=str(tmp_path),
                                    last_block="cut"))
        assert res["drafter"]["family"] == family
        config = Qwen3Config.from_pretrained(str(root / "dflash"))
        config.is_causal = causal  # z-lab's own switch, read by its Qwen3DFlashAttention
        reference = zlab.DFlashDraftModel.from_pretrained(str(root / "dflash"), config=config).eval()
        for p, row in zip(prompts, res["prompts"]):
            out = zlab.dflash_generate(reference, target, torch.tensor([p]), MAX_NEW, None, return_stats=True)
            assert row["acceptance_lengths"] == out.acceptance_lengths, (name, row["id"])
        walks[name] = [row["acceptance_lengths"] for row in res["prompts"]]
    assert walks["jetspec"] != walks["dflash"]  # one mask apart: read as the other, tau would be wrong


def _config(**dflash) -> dict:
    return {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "intermediate_size": 48, "vocab_size": 64, "num_target_layers": 4,
            "dflash_config": {"target_layer_ids": [1], "mask_token_id": 63, "block_size": 4, **dflash}}


def test_the_family_is_decided_once_from_the_config_and_a_disagreement_is_refused():
    jet = DrafterConfig.from_dict(_config(causal=True))
    assert jet.family == JETSPEC and all(jet.layer_attention(i)[0] for i in range(2))
    assert jet.to_dict()["dflash_config"]["causal"] is True  # saved as read
    sliding = {"use_sliding_window": True, "sliding_window": 2, "layer_types": ["sliding_attention", "full_attention"]}
    # vLLM's order: is_causal, then dflash_config.causal (even false: the sliding layer goes bidirectional), then
    # the layer type
    assert [DrafterConfig.from_dict({**_config(causal=False), **sliding}).layer_attention(i)[0] for i in (0, 1)] == \
        [False, False]
    assert [DrafterConfig.from_dict({**_config(), **sliding}).layer_attention(i)[0] for i in (0, 1)] == [True, False]
    assert DrafterConfig.from_dict({**_config(), "architectures": ["Qwen3DFlashDraftModel"]}).family == DFLASH
    overruled = DrafterConfig.from_dict({**_config(causal=True), "is_causal": False})  # is_causal is read first
    assert overruled.family == DFLASH and not overruled.layer_attention(0)[0]
    with pytest.raises(DraftboardError, match="dflash_config.causal must be true or false"):
        DrafterConfig.from_dict(_config(causal="yes"))
    with pytest.raises(DraftboardError, match="Domino .* refused, not read as DFlash"):
        DrafterConfig.from_dict(_config(projector_type="domino"))
    with pytest.raises(DraftboardError, match="DeepSeek DSpark"):
        DrafterConfig.from_dict(_config(projector_type="dspark"))
    # Issue 64 (also): what cannot be classified with certainty is refused, never measured as DFlash.
    for variant, family in ((" domino", "Domino"), ("domino_gru", "Domino"), ("DSpark-v2", "DeepSeek DSpark")):
        with pytest.raises(DraftboardError, match=family):
            DrafterConfig.from_dict(_config(projector_type=variant))
    for odd in (["dspark"], "mlp"):
        with pytest.raises(DraftboardError, match="names no family draftboard knows"):
            DrafterConfig.from_dict(_config(projector_type=odd))
    with pytest.raises(DraftboardError, match="Domino"):
        DrafterConfig.from_dict({**_config(), "projector_type": "domino"})  # at the top level too
    for switch in ("sample_from_anchor", "bonus_anchor"):
        with pytest.raises(DraftboardError, match=f"{switch} = True: DeepSeek DSpark"):
            DrafterConfig.from_dict({**_config(), switch: True})
    assert DrafterConfig.from_dict({**_config(), "sample_from_anchor": False}).family == DFLASH  # the 1+N layout
    with pytest.raises(DraftboardError, match="is_causal must be true, false or null"):
        DrafterConfig.from_dict({**_config(), "is_causal": "false"})
    relabelled = {**_config(conv_kernel_size=4, conv_group_size=8, selector_rank=8, selector_top_k=8),
                  "architectures": ["DFlashDraftModel"]}
    with pytest.raises(DraftboardError, match="the files disagree about the family"):
        DrafterConfig.from_dict(relabelled)


def test_a_domino_checkpoint_is_refused_by_its_weight_names(pair, tmp_path):
    """Domino's GRU correction head (`prefix_gru`) in DFlash's files: named, refused, nothing allocated from it."""
    root, _, _ = pair
    shutil.copytree(root / "dflash", tmp_path / "domino")
    tensors = load_file(str(tmp_path / "domino" / "model.safetensors"))
    tensors["prefix_gru.weight_ih_l0"] = torch.zeros(96, 32)
    save_file(tensors, str(tmp_path / "domino" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DraftboardError, match=r"a Domino \(a GRU correction head.*by its weight names"):
        open_drafter(tmp_path / "domino")
