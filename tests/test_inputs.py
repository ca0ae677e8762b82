"""tracker/jobs/inputs.py: what Launch and a worker look at before an eval is queued or started."""

from __future__ import annotations

import json

import pytest

from tracker.jobs.inputs import checkpoint_problem, inputs_problem, prompts_problem, target_problem


def test_real_inputs_pass_and_each_kind_of_wrong_one_is_named(tmp_path):
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir(), drafter.mkdir()
    (target / "config.json").write_text("{}")
    (drafter / "model.safetensors").write_bytes(b"")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n" + json.dumps({"id": "a", "input_ids": [1, 2]}) + "\n")
    good = {"target": str(target), "drafter": str(drafter), "prompts": str(prompts)}
    assert inputs_problem(good) is None and prompts_problem("hf:openai/gsm8k:main:test") is None

    # Issue 52's walk: each of these was queued, then refused by the worker seconds later
    progress = tmp_path / "demo-progress.json"
    progress.write_text(json.dumps({"stage": "training", "done": 3}))
    assert "no config.json" in target_problem(str(tmp_path))
    assert "not a drafter checkpoint" in checkpoint_problem(str(progress))
    assert "its first line is not a prompt" in prompts_problem(str(progress))
    (tmp_path / "notes.txt").write_text("hello\n")
    assert "not JSON" in prompts_problem(str(tmp_path / "notes.txt"))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert "empty" in prompts_problem(str(tmp_path / "empty.jsonl"))
    assert "without a config.json or weight files" in checkpoint_problem(str(tmp_path / "target" / ".."))
    assert inputs_problem({**good, "prompts": str(progress)}).startswith("prompts ")
    # the long-context formats (evaluators/long_context.py) are prompt lines too
    for row in ({"_id": "x", "input": "q", "context": "a story", "dataset": "narrativeqa"},
                {"id": "s", "conversations": [{"from": "human", "value": "hi"}]}):
        prompts.write_text(json.dumps(row) + "\n")
        assert prompts_problem(str(prompts)) is None


def test_the_first_line_is_read_bounded(tmp_path):
    """A first line of 3 MB is not read whole here (the eval reads and checks it): passed on."""
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"id": "a", "input_ids": [1] * 1_000_000}) + "\n")
    assert prompts_problem(str(big)) is None


@pytest.mark.parametrize("missing", ["target", "drafter", "prompts"])
def test_a_missing_path_is_a_problem(tmp_path, missing):
    params = {"target": str(tmp_path / "t"), "drafter": str(tmp_path / "d"), "prompts": str(tmp_path / "p.jsonl")}
    assert inputs_problem({missing: params[missing]}) is not None
