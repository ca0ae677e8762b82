"""DFlash2 drafters (z-lab 07ebd93 `DFlash2DraftModel`): read, checked, and scored as z-lab's own loop
scores them (z-lab's code as written: tests/zlab.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3ForCausalLM

from evaluators.drafter import DFLASH2, open_drafter, save_zlab
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from evaluators.scoring import DDTREE_DFLASH2
from tiny import dflash2_from, fit_drafter, greedy_sequences, qwen3_config, save_target
from tracker.cli import main
from tracker.errors import DraftboardError
from zlab import zlab_model

MAX_NEW = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen3 target, a DFlash2 drafter on a drafter fitted to its greedy text (codebooks
    stored without `.weight`, as z-lab's key_mapping allows), prompts, and an EOS that fires."""
    root = tmp_path_factory.mktemp("dflash2")
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(qwen3_config(eos_token_id=None)).eval()
    train = greedy_sequences(target, 8, 6, 48, seed=1)
    fitted, dcfg = fit_drafter(target, train, layer_ids=[1, 3], block_size=4, steps=120)
    drafter, cfg = dflash2_from(fitted, dcfg)
    prompts = torch.randint(2, 60, (5, 7), generator=torch.Generator().manual_seed(7)).tolist()
    free = greedy_sequences(target, 5, 7, MAX_NEW, seed=7)[:, 7:]
    target.config.eos_token_id = int(free[0, 12])
    save_target(target, root / "target")
    out = save_zlab(drafter, cfg, root / "drafter")
    tensors = load_file(str(out / "model.safetensors"))
    for name in ("predecessor_codebook", "successor_codebook"):
        tensors[f"candidate_selector.{name}"] = tensors.pop(f"candidate_selector.{name}.weight")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root, target, prompts


def test_greedy_tau_equals_zlabs_own_loop_block_for_block(pair, tmp_path):
    zlab = zlab_model()
    root, target, prompts = pair
    reference = zlab.DFlash2DraftModel.from_pretrained(str(root / "drafter")).eval()
    res = evaluate(EvalSettings(str(root / "target"), str(root / "drafter"), str(root / "prompts.jsonl"),
                                max_new_tokens=MAX_NEW, device="cpu", cache_dir=str(tmp_path), last_block="cut"))
    assert res["drafter"]["family"] == DFLASH2
    assert res["ddtree"] == {} and res["ddtree_skipped"] == DDTREE_DFLASH2
    stops = [target.config.eos_token_id]
    taus, stopped = [], 0
    for p, row in zip(prompts, res["prompts"]):
        out = zlab.dflash_generate(reference, target, torch.tensor([p]), MAX_NEW, stops, return_stats=True)
        assert row["completion_ids"] == out.output_ids[0, len(p):].tolist()
        assert row["acceptance_lengths"] == out.acceptance_lengths
        taus.append(sum(out.acceptance_lengths) / len(out.acceptance_lengths))
        stopped += row["completion_ids"][-1] in stops
    assert stopped >= 1
    assert res["tau"] == pytest.approx(sum(taus) / len(taus), abs=1e-12)
    assert sum(res["accept_len_histogram"][1:]) >= 0.1 * sum(res["accept_len_histogram"])  # it really drafts


def test_the_selector_changes_what_is_drafted(pair):
    """The selector's predecessor term reorders candidates: its choice differs from the logits' argmax."""
    root, target, _ = pair
    loaded = open_drafter(root / "drafter").load()
    model = loaded.model
    torch.manual_seed(3)
    hidden = torch.randn(64, model.block_size, model.cfg.hidden_size)
    logits = model.logits(hidden, target.get_output_embeddings().weight)
    predecessors = torch.randint(0, model.cfg.vocab_size, (64, model.block_size - 1))
    assert (model.greedy_drafts(hidden, logits, predecessors) != logits.argmax(-1)).any()


def _broken(root, tmp_path, edit_tensors=None, edit_config=None):
    out = tmp_path / "broken"
    out.mkdir()
    tensors = load_file(str(root / "drafter" / "model.safetensors"))
    config = json.loads((root / "drafter" / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("case, needle", [
    ("missing selector weight", "missing key candidate_selector.hidden_projection.weight"),
    ("wrong codebook shape", "tensor candidate_selector.successor_codebook.weight has shape"),
    ("conv group size", "conv_group_size 24 does not divide hidden_size 32"),
    ("missing selector field", "missing dflash_config.selector_top_k"),
])
def test_a_broken_dflash2_checkpoint_is_one_error_line_before_anything_is_allocated(pair, tmp_path, capsys,
                                                                                   monkeypatch, case, needle):
    root, _, _ = pair
    edits = {
        "missing selector weight": dict(edit_tensors=lambda t: t.pop("candidate_selector.hidden_projection.weight")),
        "wrong codebook shape": dict(edit_tensors=lambda t: t.update(
            {"candidate_selector.successor_codebook": t["candidate_selector.successor_codebook"][:, :4].clone()})),
        "conv group size": dict(edit_config=lambda c: c["dflash_config"].update(conv_group_size=24)),
        "missing selector field": dict(edit_config=lambda c: c["dflash_config"].pop("selector_top_k")),
    }
    broken = _broken(root, tmp_path, **edits[case])
    with pytest.raises(DraftboardError, match=needle):
        open_drafter(broken)  # reads headers and config only: nothing is built from them
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(broken), "--prompts",
                 str(root / "prompts.jsonl"), "--no-log", "--device", "cpu",
                 "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("error: ")]) == 1 and needle in err[-1]


def test_teacher_forced_q_is_the_q_zlabs_sampled_path_drew_from(pair):
    """Given the path z-lab's `select` sampled, `draft_probability` with that path's own tokens as
    predecessors gives, at every position, the probability `select` drew that token with."""
    from evaluators.sampling import Sampling, draft_probability

    root, target, _ = pair
    model = open_drafter(root / "drafter").load().model
    torch.manual_seed(5)
    hidden = torch.randn(16, model.block_size, model.cfg.hidden_size)
    logits = model.logits(hidden, target.get_output_embeddings().weight)
    anchor = torch.randint(0, model.cfg.vocab_size, (16,))
    path, candidates, q = model.candidate_selector.select(hidden[:, 1:], logits, anchor, 0.8,
                                                          torch.Generator().manual_seed(6))
    drawn = (q * (candidates == path[..., None])).sum(-1)  # [16, B-1]
    predecessors = torch.cat([anchor[:, None], path[:, :-1]], dim=1)
    assert torch.allclose(draft_probability(model, hidden, logits, predecessors, path, Sampling(0.8)), drawn)
    assert (drawn > 0).all() and (drawn < 1).any()


def test_margins_of_a_dflash2_drafter_follow_its_selector_not_its_logits(pair, tmp_path):
    """`reconcile --margins` on a DFlash2 drafter: at every accepted and every rejected draft position
    of its offline walk the margin agrees with the walk, which the logits' argmax would not (the
    selector reorders the candidates here; test_the_selector_changes_what_is_drafted)."""
    from evaluators.margins import MarginAsk, block_margins, settings_of

    root, _, _ = pair
    offline = evaluate(EvalSettings(str(root / "target"), str(root / "drafter"), str(root / "prompts.jsonl"),
                                    max_new_tokens=MAX_NEW, device="cpu", cache_dir=str(tmp_path), last_block="full"))
    block = offline["block_size"]
    asks, expected = [], []
    for p in offline["prompts"]:
        anchor = 0
        for length in p["acceptance_lengths"][:-1]:
            if length > 1:
                asks.append(MarginAsk(p["id"], p["completion_ids"], anchor, length - 2))
                expected.append(True)
            if length < block:
                asks.append(MarginAsk(p["id"], p["completion_ids"], anchor, length - 1))
                expected.append(False)
            anchor += length
    margins = block_margins(settings_of(offline), asks)
    assert len(asks) > 20 and sum(expected) >= 5
    assert [m.accepts for m in margins] == expected and all(m.value >= 0 for m in margins)
