"""Offline teacher-forced evaluation equals the online speculative loop, block for block.

`--last-block full` against z-lab 44947fb's cached loop on a non-hybrid target (where its cache
is exact), `--last-block cut` (the default) against z-lab 07ebd93's loop with recomputation in
place of every cache, on a hybrid Qwen3.5 target with a trained drafter.
"""

import json

import pytest
import torch
from transformers import Qwen3ForCausalLM

from evaluators.drafter import save_zlab
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from online_loop import hybrid_pair, lossless_generate, speculative_generate
from tiny import fit_drafter, greedy_sequences, qwen3_config, save_target

MAX_NEW = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen3 target, a drafter fitted to its greedy text, prompts, and an EOS that fires."""
    root = tmp_path_factory.mktemp("pair")
    torch.manual_seed(0)
    target = Qwen3ForCausalLM(qwen3_config(eos_token_id=None)).eval()
    train = greedy_sequences(target, 8, 6, 48, seed=1)
    drafter, dcfg = fit_drafter(target, train, layer_ids=[1, 3], block_size=4, steps=120)
    prompts = torch.randint(2, 60, (5, 7), generator=torch.Generator().manual_seed(7)).tolist()
    # EOS = a token the greedy text reaches mid-completion, so one walk stops early.
    free = greedy_sequences(target, 5, 7, MAX_NEW, seed=7)[:, 7:]
    eos = int(free[0, 12])
    target.config.eos_token_id = eos
    save_target(target, root / "target")
    save_zlab(drafter, dcfg, root / "drafter")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root, target, drafter, prompts, eos


def test_offline_acceptance_equals_the_online_loop(pair, tmp_path):
    root, target, drafter, prompts, eos = pair
    res = evaluate(EvalSettings(str(root / "target"), str(root / "drafter"), str(root / "prompts.jsonl"),
                                max_new_tokens=MAX_NEW, budgets=(2, 8), device="cpu", cache_dir=str(tmp_path),
                                last_block="full"))
    online_taus, stopped = [], 0
    for p, row in zip(prompts, res["prompts"]):
        completion, lengths = speculative_generate(target, drafter, p, MAX_NEW, {eos})
        assert row["completion_ids"] == completion
        assert row["acceptance_lengths"] == lengths
        online_taus.append(sum(lengths) / len(lengths))
        stopped += completion[-1] == eos
    assert stopped >= 1  # the EOS boundary was exercised
    assert res["tau"] == pytest.approx(sum(online_taus) / len(online_taus), abs=1e-12)
    # The drafter really drafts: the equality covers multi-token blocks, not just rejections.
    assert sum(res["accept_len_histogram"][1:]) >= 0.1 * sum(res["accept_len_histogram"])
    assert res["streak"] == pytest.approx(res["tau"] - 1)
    assert sum(res["accept_len_histogram"]) == sum(len(r["acceptance_lengths"]) for r in res["prompts"])


def test_tree_walks_accept_at_least_as_much_as_the_chain_here(pair, tmp_path):
    root, *_ = pair
    res = evaluate(EvalSettings(str(root / "target"), str(root / "drafter"), str(root / "prompts.jsonl"),
                                max_new_tokens=MAX_NEW, budgets=(4, 16, 64), device="cpu", cache_dir=str(tmp_path)))
    taus = [res["ddtree"][b]["tau"] for b in ("4", "16", "64")]
    assert taus == sorted(taus)
    assert taus[0] >= res["tau"] - 1e-9


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_pair")
    return (root, *hybrid_pair(root, MAX_NEW))


def test_cut_equals_a_lossless_online_loop_on_a_hybrid_target(hybrid, tmp_path):
    root, target, drafter, prompts, eos = hybrid
    res = evaluate(EvalSettings(str(root / "target"), str(root / "drafter"), str(root / "prompts.jsonl"),
                                max_new_tokens=MAX_NEW, budgets=(4,), device="cpu", cache_dir=str(tmp_path)))
    assert res["protocol"]["last_block"] == "cut"
    to_limit = stopped = 0
    for p, row in zip(prompts, res["prompts"]):
        completion, lengths = lossless_generate(target, drafter, p, MAX_NEW, {eos})
        assert row["completion_ids"] == completion
        assert row["acceptance_lengths"] == lengths  # block for block, the last ones included
        stopped += completion[-1] == eos
        to_limit += sum(lengths) == MAX_NEW - 1
    assert stopped >= 1 and to_limit >= 1  # both ends of generation were exercised
    assert sum(res["accept_len_histogram"][1:]) >= 0.1 * sum(res["accept_len_histogram"])


def test_online_scoring_equals_offline_where_the_cache_is_exact(pair, tmp_path):
    """Qwen3 (attention only): crop is exact, so z-lab's cached loop scores what the offline walk scores."""
    root, target, drafter, prompts, eos = pair
    settings = dict(max_new_tokens=MAX_NEW, budgets=(2,), device="cpu", cache_dir=str(tmp_path))
    for rule in ("full", "cut"):
        online = evaluate(EvalSettings(str(root / "target"), str(root / "drafter"), str(root / "prompts.jsonl"),
                                       last_block=rule, scoring="online", **settings))
        assert online["protocol"]["scoring"] == "online"
        for row in online["prompts"]:
            assert row["acceptance_lengths"] == row["offline_acceptance_lengths"]
        assert online["tau"] == pytest.approx(online["offline"]["tau"], abs=1e-12)
        # tau by context: every block in one bucket, the buckets pooled back to tau_pooled (a 0,32 split: the
        # prompts' contexts start below 32 and run past it)
        for curve, pooled in (("tau_by_context", online["tau_pooled"]),
                              ("tau_all_anchors_by_context", online["tau_all_anchors"])):
            rows = online[curve]
            assert sum(r["blocks"] * (r["tau"] or 0) for r in rows) / sum(r["blocks"] for r in rows) == \
                pytest.approx(pooled)
        assert sum(r["blocks"] for r in online["tau_by_context"]) == online["n_blocks"]
        assert online["context_buckets"][0] == 0 and len(online["context_buckets"]) >= 2
        # z-lab's decoding speedup, its target alone (block size 1) timed in the same process: lossless, so
        # every completion is the drafter loop's
        decoding = online["decoding"]
        assert decoding["target_alone_equal"] == len(prompts) and decoding["speedup"] > 0
        assert online["decoding_speedup"] == pytest.approx(decoding["time_per_output_token_s_target_alone"]
                                                           / decoding["time_per_output_token_s"])
    for p, row in zip(prompts, online["prompts"]):  # cut: the lossless loop's, block for block
        assert (row["completion_ids"], row["acceptance_lengths"]) == lossless_generate(target, drafter, p, MAX_NEW, {eos})
