"""The demo's models: byte tokenizer, tiny hybrid target, DFlash trainer (real training, small)."""

import json

import pytest
import torch
from mlflow import MlflowClient

from demo import bytetok
from demo import target as demo_target
from demo import train_dflash
from evaluators.drafter import load_drafter

TEXT = "def f(x):\n\treturn x  # héllo, 日本語, emoji 🐍\r\n  \x00end"


# --------------------------------------------------------------------------- tokenizer


def test_byte_functions_round_trip_utf8():
    ids = bytetok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and max(ids) < 256
    assert bytetok.decode(ids) == TEXT
    assert bytetok.decode([bytetok.BOS, *bytetok.encode("hi"), bytetok.EOS, bytetok.MASK]) == "hi"
    assert bytetok.decode([0xE6, 0x97]) == "\ufffd"  # a cut multi-byte character does not raise


def test_hf_tokenizer_saves_and_loads_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    bytetok.save(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == bytetok.VOCAB_SIZE
    assert (tok.bos_token_id, tok.eos_token_id, tok.mask_token_id, tok.pad_token_id) == (256, 257, 258, 257)
    ids = tok.encode(TEXT)
    assert ids == bytetok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.decode([256, *ids, 257], skip_special_tokens=True) == TEXT
    assert tok.convert_ids_to_tokens([256, 257, 258]) == ["<|bos|>", "<|eos|>", "<|mask|>"]


def test_the_sentencepiece_face_has_the_same_ids(tmp_path):
    """tokenizer.model (what llama.cpp's converter reads) encodes and decodes as the byte tokenizer does."""
    import sentencepiece as spm

    bytetok.save(tmp_path)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    assert sp.vocab_size() == bytetok.VOCAB_SIZE
    assert sp.encode(TEXT) == bytetok.encode(TEXT) and sp.decode(bytetok.encode(TEXT)) == TEXT
    assert (sp.bos_id(), sp.eos_id(), sp.unk_id()) == (bytetok.BOS, bytetok.EOS, bytetok.MASK)
    assert [sp.id_to_piece(i) for i in (0, 10, 255, 256, 257, 258)] == \
        ["<0x00>", "<0x0A>", "<0xFF>", "<|bos|>", "<|eos|>", "<|mask|>"]
    assert all(sp.is_byte(i) for i in range(256)) and sp.is_control(256) and sp.is_control(257)


# --------------------------------------------------------------------------- target


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return demo_target.build_target(tmp_path_factory.mktemp("target"), steps=30, seed=0)


def test_target_loss_falls(target_dir):
    losses = demo_target.training_log(target_dir)["loss"]
    assert len(losses) == 30
    assert losses[0] > 5.0  # ~ln(259) at initialisation
    assert sum(losses[-5:]) / 5 < losses[0] - 2.0


def test_target_reloads_as_hybrid_qwen35(target_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir)
    cfg = model.config
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert {"linear_attention", "full_attention"} <= set(cfg.layer_types)
    assert (cfg.vocab_size, cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id) == (259, 257, 256, 257)
    assert cfg.max_position_embeddings >= 1024 and not cfg.tie_word_embeddings
    assert model.generation_config.eos_token_id == bytetok.EOS
    tok = AutoTokenizer.from_pretrained(target_dir)
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_prompts_are_deterministic_and_held_out():
    a = demo_target.make_prompts(5, seed=3, length=40)
    assert a == demo_target.make_prompts(5, seed=3, length=40)
    assert a != demo_target.make_prompts(5, seed=4, length=40)
    assert all(len(p) == 40 and max(p) < 256 for p in a)
    splits = {name: set(demo_target.split_files(name)) for name in ("target", "drafter", "eval")}
    assert all(splits.values())
    assert not (splits["target"] & splits["drafter"] or splits["target"] & splits["eval"]
                or splits["drafter"] & splits["eval"])


# --------------------------------------------------------------------------- DFlash training


@pytest.fixture(scope="module")
def data(target_dir):
    prompts = demo_target.make_prompts(16, seed=0, length=32, split="drafter")
    return train_dflash.prepare_data(target_dir, prompts, 24)


def test_prepare_data_self_distills(data):
    assert len(data.sequences) == 16 and data.linear_attn_path == "fallback"
    for seq, p, feats in zip(data.sequences, data.prompt_lens, data.features):
        assert p == 32 and 33 <= seq.numel() <= 32 + 24
        assert feats.shape == (data.num_layers, seq.numel(), data.hidden_size)
    # the completion is the target's greedy choice given the prefix, read off the final features
    seq, feats = data.sequences[0], data.features[0]
    greedy = (feats[-1] @ data.lm_head.T).argmax(-1)  # [T, V] -> [T]
    assert torch.equal(greedy[31:-1], seq[32:])


def test_position_weights():
    assert torch.equal(train_dflash.position_weights(4, None), torch.ones(3))
    w = train_dflash.position_weights(4, 2.0)
    assert torch.allclose(w, torch.exp(-torch.tensor([0.0, 1.0, 2.0]) / 2.0))


def test_training_run_learns_and_checkpoints_reload(target_dir, data, tracker, store_uri, tmp_path):
    cfg = train_dflash.TrainConfig(name="demo-test", target_layer_ids=[1, 2], steps=40, ckpt_every=20, lr=5e-3)
    run_id = train_dflash.train(cfg, target_dir, data, tracker, tmp_path / "ckpt")

    client = MlflowClient(tracking_uri=store_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert json.loads(run.data.params["target_layer_ids"]) == [1, 2] and run.data.params["gamma"] == "4.0"
    assert run.data.tags["env.dtype"] == "fp32" and run.data.tags["env.linear_attn"] == "fallback"
    history = {key: [m.value for m in client.get_metric_history(run_id, key)]
               for key in ("loss", "acc", "streak", "dds8")}
    assert all(len(values) == 40 for values in history.values())
    assert sum(history["loss"][-5:]) / 5 < history["loss"][0] - 1.0
    assert sum(history["acc"][-5:]) / 5 > history["acc"][0]

    checkpoints = tracker.checkpoints(run_id)
    assert [c.step for c in checkpoints] == [20, 40]
    loaded = load_drafter(checkpoints[-1].path, target_hidden_size=data.hidden_size,
                          target_num_layers=data.num_layers, target_vocab_size=bytetok.VOCAB_SIZE)
    assert loaded.config.target_layer_ids == [1, 2] and loaded.config.mask_token_id == bytetok.MASK
    assert loaded.config.block_size == cfg.block_size


def test_bf16_run_records_the_numerics_it_used_and_its_reevaluation_matches(target_dir, data, tracker, tmp_path):
    """The headline flow: a bf16-autocast training run, re-evaluated with the flags its
    fingerprint calls for, gives an eval with no critical difference from it."""
    from evaluators.harness import evaluate
    from evaluators.settings import EvalSettings
    from tracker.environment import fingerprint
    from tracker.dashboard.envmatrix import training_environment

    cfg = train_dflash.TrainConfig(name="demo-bf16", dtype="bf16", gamma=None, steps=4, ckpt_every=4)
    run_id = train_dflash.train(cfg, target_dir, data, tracker, tmp_path / "ckpt")
    train_fp = tracker.fingerprint(run_id)
    # The target (features, probe) ran fp32; only the drafter computed under bf16 autocast.
    assert train_fp["numerics"]["dtype"] == "fp32" and tracker.run(run_id).data.tags["env.dtype"] == "fp32"
    assert train_fp["numerics"]["drafter_precision"] == "bf16-autocast"
    loaded = load_drafter(tmp_path / "ckpt" / "step_4")
    assert loaded.model.fc.weight.dtype == torch.float32  # fp32 master weights are what is saved
    assert loaded.config.target_layer_ids == [2]  # z-lab's choice for 1 tapped layer of 4

    flags, why = training_environment(train_fp)
    assert why is None and flags == {"linear_attn": "fallback", "dtype": "fp32", "drafter_precision": "bf16-autocast",
                                     "device": "cpu"}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "input_ids": s[:p].tolist()}) + "\n"
                               for i, (s, p) in enumerate(zip(data.sequences[:3], data.prompt_lens))))
    base = EvalSettings(target=str(target_dir), drafter=str(tmp_path / "ckpt" / "step_4"), prompts=str(prompts),
                        max_new_tokens=8, budgets=(4,), cache_dir=str(tmp_path / "cache"))
    matched = evaluate(EvalSettings(**{**base.__dict__, **flags}))
    assert not fingerprint.has_critical(fingerprint.diff(train_fp, matched["fingerprint"]))
    # What the button used to queue: --dtype bf16 casts the target too, so its features differ.
    cast = evaluate(EvalSettings(**{**base.__dict__, **flags, "dtype": "bf16", "drafter_precision": None}))
    critical = {r.field for r in fingerprint.diff(train_fp, cast["fingerprint"]) if r.severity == "critical"}
    assert {"numerics.dtype", "numerics.drafter_precision", "probe.max_rel_diff"} <= critical


def test_a_dflash2_run_trains_its_selector_and_reloads_as_dflash2(target_dir, data, tracker, store_uri, tmp_path):
    """DFlash2: the selector's loss is added where the label is among the candidates; the checkpoint is
    z-lab's DFlash2 layout (the loader and every eval read it as DFlash2)."""
    from evaluators.drafter import DFLASH2

    cfg = train_dflash.TrainConfig(name="demo-dflash2", target_layer_ids=[1, 2], steps=40, ckpt_every=40, lr=5e-3,
                                   family=DFLASH2)
    run_id = train_dflash.train(cfg, target_dir, data, tracker, tmp_path / "ckpt")
    client = MlflowClient(tracking_uri=store_uri)
    history = {key: [m.value for m in client.get_metric_history(run_id, key)]
               for key in ("loss", "acc", "candidate_recall")}
    assert sum(history["loss"][-5:]) / 5 < history["loss"][0] - 1.0
    assert sum(history["candidate_recall"][-5:]) / 5 > history["candidate_recall"][0]
    assert client.get_run(run_id).data.params["selector_top_k"] == "8"
    loaded = load_drafter(tmp_path / "ckpt" / "step_40", target_hidden_size=data.hidden_size,
                          target_num_layers=data.num_layers, target_vocab_size=bytetok.VOCAB_SIZE)
    assert loaded.config.family == DFLASH2 and loaded.config.selector_top_k == 8
    # The selector was trained: its codebooks moved off their initialisation, and they steer its choices.
    assert loaded.model.candidate_selector.successor_codebook.weight.abs().max() > 0.05


def test_a_dflash_run_does_not_log_dflash2s_settings(target_dir, data, tracker, store_uri, tmp_path):
    cfg = train_dflash.TrainConfig(name="demo-plain", steps=2, ckpt_every=2)
    run_id = train_dflash.train(cfg, target_dir, data, tracker, tmp_path / "ckpt")
    params = MlflowClient(tracking_uri=store_uri).get_run(run_id).data.params
    assert params["family"] == "dflash" and "selector_top_k" not in params and "selector_alpha" not in params


def test_train_refuses_data_of_another_target(data, tracker, tmp_path):
    with pytest.raises(ValueError, match="prepared from"):
        train_dflash.train(train_dflash.TrainConfig(steps=1), tmp_path, data, tracker, tmp_path / "ckpt")


@pytest.mark.parametrize("cores, load, threads", [
    (2, 0.1, 2),  # a quiet 2-core box: a thread per core
    (2, 1.2, 1),  # one core busy with other work: one thread
    (8, 7.0, 1),  # the walk's busy laptop (load 5-10): one thread, never eight fighting
    (16, 0.0, 2),  # a quiet big box: the demo's small models gain nothing past 2
    (1, 3.0, 1),  # always at least one
])
def test_demo_threads_follow_the_cores_left_free(cores, load, threads):
    assert demo_target.cpu_threads(cores, load) == threads
