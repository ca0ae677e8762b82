"""`draftboard eval` end to end on a tiny hybrid (Qwen3.5) target, and its bad-input errors."""

import json

import mlflow
import pytest
import torch
from transformers import Qwen3_5ForCausalLM

from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab
from evaluators.harness import evaluate
from evaluators.settings import EvalSettings
from evaluators.scoring import completion_bounds
from evaluators.target import cache_key
from tracker import events
from tracker.environment import fingerprint
from tracker.cli import main
from tiny import VOCAB, qwen35_config, save_target

FIXED_KEYS = {"schema", "block_size", "tau", "tau_pooled", "tau_all_anchors", "streak", "accept_rate_by_position",
              "accept_len_histogram", "ddtree", "prompts", "fingerprint", "timing"}


def _drafter(root, name, layer_ids, seed):
    torch.manual_seed(seed)
    cfg = DrafterConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, intermediate_size=64, target_layer_ids=layer_ids, block_size=4,
                        mask_token_id=1, num_target_layers=4, vocab_size=VOCAB)
    return save_zlab(DFlashDrafter(cfg), cfg, root / name)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    torch.manual_seed(0)
    save_target(Qwen3_5ForCausalLM(qwen35_config()).eval(), root / "target")
    _drafter(root, "drafter_a", [1, 2], seed=1)
    _drafter(root, "drafter_b", [1, 2], seed=2)
    prompts = torch.randint(2, 60, (3, 9), generator=torch.Generator().manual_seed(3)).tolist()
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": i, "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root


def _eval_args(root, *extra):
    return ["eval", "--target", str(root / "target"), "--drafter", str(root / "drafter_a"),
            "--prompts", str(root / "prompts.jsonl"), "--max-new-tokens", "12", "--budgets", "2,8",
            "--device", "cpu", "--cache-dir", str(root / "cache"), *extra]


def test_eval_cli_writes_results_and_logs_a_linked_run(hybrid, tracker, store_uri, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(events.ASKED, "1")  # run as a worker's job: it reports on the protocol's lines
    with tracker.training_run("train-for-eval", {"lr": 1e-3}, str(hybrid / "target")) as train:
        train.log_step(0, loss=1.0)
    out = tmp_path / "results.json"
    rc = main(_eval_args(hybrid, "--out", str(out), "--tracking-uri", store_uri,
                         "--train-run-id", train.run_id, "--checkpoint-step", "100"))
    assert rc == 0
    printed = capsys.readouterr().out
    assert "@@draftboard" in printed and '"event": "result"' in printed
    res = json.loads(out.read_text())
    assert FIXED_KEYS <= set(res) and res["schema"] == "draftboard.eval/1"
    assert set(res["ddtree"]) == {"2", "8"} and res["block_size"] == 4
    assert len(res["accept_len_histogram"]) == 4 and len(res["accept_rate_by_position"]) == 3
    assert res["fingerprint"]["numerics"]["linear_attention_path"] == "fallback"
    assert set(res["fingerprint"]["probe"]["layers"]) == {"1", "2"}

    client = mlflow.MlflowClient(store_uri)
    run_id = next(line for line in printed.splitlines() if '"event": "result"' in line)
    run_id = json.loads(run_id.split(" ", 1)[1])["run_id"]
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags["draftboard.kind"] == "eval" and tags["draftboard.train_run_id"] == train.run_id
    assert tags["draftboard.checkpoint_step"] == "100" and tags["env.linear_attn"] == "fallback"
    assert run.data.metrics["tau"] == pytest.approx(res["tau"])
    assert {"ddtree_tau_b2", "dds8", "accept_rate_pos1", "tau_all_anchors"} <= set(run.data.metrics)
    logged = json.loads(open(client.download_artifacts(run_id, "eval_results.json")).read())
    assert logged["tau"] == res["tau"]
    # The protocol it was measured under, in the results and as tags; intervals as metrics.
    proto = res["protocol"]
    assert proto["datasets"] == {"prompts": 3} and proto["completions"] == "generated"
    assert (proto["last_block"], proto["scoring"], proto["block_size"], proto["max_new_tokens"]) == ("cut", "offline", 4, 12)
    assert proto["stop_token_ids"] == [VOCAB - 1] and proto["temperature"] == 0 and proto["enable_thinking"] == "unknown"
    assert tags["protocol.last_block"] == "cut" and tags["protocol.prompt_digest"] == proto["prompt_digest"]
    assert res["ci"]["tau"][0] <= res["tau"] <= res["ci"]["tau"][1]
    assert run.data.metrics["tau_ci_low"] == pytest.approx(res["ci"]["tau"][0])
    assert "ddtree_tau_b8_ci_high" in run.data.metrics
    assert res["by_dataset"]["prompts"]["n_prompts"] == 3 and {p["dataset"] for p in res["prompts"]} == {"prompts"}
    # cut: no block produces past max_new_tokens; a walk that runs to the limit sums to 12 - 1.
    for p in res["prompts"]:
        stopped = VOCAB - 1 in p["completion_ids"]
        assert sum(p["acceptance_lengths"]) == (len(p["completion_ids"]) - 1 if stopped else 11)


def test_env_diff_shows_both_sections_and_a_new_prompt_set_is_critical(hybrid, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(_eval_args(hybrid, "--no-log", "--out", str(a))) == 0
    assert main(_eval_args(hybrid, "--no-log", "--out", str(b), "--limit-per-dataset", "2")) == 0
    capsys.readouterr()
    assert main(["env-diff", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "environment:" in out and "protocol:" in out and out.count("no differences") == 2
    assert main(["env-diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("protocol.")}
    assert rows["protocol.prompt_digest"] == "critical" and rows["protocol.datasets"] == "critical"
    assert json.loads(b.read_text())["protocol"]["datasets"] == {"prompts": 2}


def test_second_checkpoint_reuses_the_target_pass(hybrid, tmp_path):
    stages = []
    settings = dict(target=str(hybrid / "target"), prompts=str(hybrid / "prompts.jsonl"), max_new_tokens=12,
                    budgets=(2,), device="cpu", cache_dir=str(tmp_path))
    evaluate(EvalSettings(drafter=str(hybrid / "drafter_a"), **settings))
    evaluate(EvalSettings(drafter=str(hybrid / "drafter_b"), **settings), lambda s, d, t: stages.append(s))
    assert "target: continuations (cached)" in stages and "target: features (cached)" in stages
    assert "target: features" not in stages


def test_fast_and_fallback_features_never_share_a_cache_key(machine_fp):
    fast = json.loads(json.dumps(machine_fp))
    fast["numerics"]["linear_attention_path"] = "fast"
    fast["numerics"]["linear_attention"]["functions"]["torch_chunk_gated_delta_rule"] = "fla.ops.chunk_gated_delta_rule"
    seqs = [[1, 2, 3]]
    keys = {cache_key("features", "digest", fingerprint.numbers_relevant(fp), seqs) for fp in (machine_fp, fast)}
    assert len(keys) == 2
    bf16 = json.loads(json.dumps(machine_fp))
    bf16["numerics"]["dtype"] = "bf16"
    assert cache_key("features", "digest", fingerprint.numbers_relevant(bf16), seqs) not in keys


@pytest.mark.parametrize("continuation, max_new, stops, expected", [
    ([5, 6, 7, 8], 3, set(), ([5, 6, 7], 3)),      # cut at max_new: every token anchors
    ([5, 9, 7, 8], 4, {9}, ([5, 9], 1)),           # stop token ends it and never anchors
    ([9, 7], 4, {9}, ([9], 0)),                    # immediate stop: no block at all
])
def test_completion_bounds(continuation, max_new, stops, expected):
    assert completion_bounds(continuation, max_new, stops) == expected


def _error_line(capsys):
    """The one `error:` line, last on stderr (progress bars may precede it)."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    return errors[0]


@pytest.mark.parametrize("content, message", [
    ("", "empty"),
    ('{"id": 1, "input_ids": [1, 2]}\n{oops\n', ":2: malformed JSON"),
    ('{"id": 1, "prompt": "hello"}\n', "need a tokenizer"),
    ('{"id": 1, "input_ids": [1, 999]}\n', "outside the target's vocabulary"),
    ('{"id": 1, "input_ids": [1, 2]}\n{"id": 1, "input_ids": [3]}\n', "duplicate id"),
    ('{"id": 1, "input_ids": ' + json.dumps(list(range(2, 60)) * 9) + '}\n', "exceeds the target's context"),
])
def test_bad_prompts_are_one_error_line(hybrid, tmp_path, capsys, content, message):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(content)
    args = _eval_args(hybrid, "--no-log")
    args[args.index("--prompts") + 1] = str(prompts)
    assert main(args) == 2
    assert message in _error_line(capsys)


def test_missing_prompts_file_and_out_of_range_layers(hybrid, tmp_path, capsys):
    args = _eval_args(hybrid, "--no-log")
    args[args.index("--prompts") + 1] = str(tmp_path / "nope.jsonl")
    assert main(args) == 2
    assert "no such file" in _error_line(capsys)
    _drafter(tmp_path, "deep", [1, 7], seed=0)
    args = _eval_args(hybrid, "--no-log")
    args[args.index("--drafter") + 1] = str(tmp_path / "deep")
    assert main(args) == 2
    line = _error_line(capsys)
    assert "7" in line and "4" in line


def test_unknown_train_run_is_refused_before_work(hybrid, store_uri, capsys):
    assert main(_eval_args(hybrid, "--tracking-uri", store_uri, "--train-run-id", "0" * 32)) == 2
    _error_line(capsys)
