"""Bad input end to end: each is one clear `error: ...` line and exit 2 (or a refused job), never a
traceback, never code run, never a number averaged over garbage.

Already covered elsewhere, not repeated here:
- tests/test_drafter.py: at the loader (`load_drafter`): truncated safetensors
  (test_truncated_safetensors_is_one_line_error), a `.pt` whose pickle runs code, with the proof
  that the payload is real (test_pt_that_runs_code_is_refused), hidden size / vocab / tapped-layer
  / shape / NaN-weight mismatches (test_loader_errors_name_the_tensor_and_shapes).
- tests/test_harness.py, through `draftboard eval`: empty, malformed, tokenizer-less, out-of-vocab,
  duplicate-id and too-long prompts (test_bad_prompts_are_one_error_line), a missing prompts file
  and target_layer_ids out of range (test_missing_prompts_file_and_out_of_range_layers).
- tests/test_app.py::test_launch_refuses_paths_outside_the_allowed_roots (the Launch page) and
  tests/test_views.py::test_allowed_roots_and_path_checks (`tracker.dashboard.launch_form.check_path`).
- tests/test_eval_job.py (a job's params -> the CLI's arguments, the roots check's folder walk),
  tests/test_worker.py::test_the_job_runs_the_cli_with_arguments_built_from_its_params and
  tests/test_ray_launcher.py::test_shell_metacharacters_in_arguments_stay_literal (argv quoting);
  tests/test_security_jobs.py (commands smuggled into the queue).

Added here: the loader errors above through the CLI, NaN target features, undecodable prompts
and completions files, the worker's own allowed-roots check (and its agreement with the
dashboard's), and shell metacharacters in names stored literally through import-log, eval and a
queued job run by a real worker.
"""

from __future__ import annotations

import builtins
import json
import uuid
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from transformers import Qwen3_5ForCausalLM

from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab
from tiny import VOCAB, qwen35_config, save_target
from tracker.cli import main
from tracker.errors import DraftboardError
from tracker.jobs.queue import FAILED, SUCCEEDED, JobQueue
from tracker.config import allowed_roots
from tracker.dashboard.launch_form import LaunchForm, eval_params
from tracker.store.tracker import Tracker
from tracker.jobs.worker import job_args, run_worker

FAST = dict(poll_s=0.05, heartbeat_s=0.1, stale_s=30.0, grace_s=5.0)


def _drafter_cfg(**over) -> DrafterConfig:
    kw = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              intermediate_size=64, target_layer_ids=[1, 2], block_size=4, mask_token_id=1, num_target_layers=4,
              vocab_size=VOCAB)
    kw.update(over)
    return DrafterConfig(**kw)


def _save_drafter(path: Path, seed: int = 1, **over) -> Path:
    torch.manual_seed(seed)
    cfg = _drafter_cfg(**over)
    return save_zlab(DFlashDrafter(cfg), cfg, path)


class _WritesAFile:
    """Unpickling this creates `marker`: the payload a weights_only load must never run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny hybrid target (and a copy with NaN in layer 2), good and broken drafters, prompts, a store."""
    root = tmp_path_factory.mktemp("bad-input")
    torch.manual_seed(0)
    target = Qwen3_5ForCausalLM(qwen35_config()).eval()
    save_target(target, root / "target")
    with torch.no_grad():  # one weight of decoder layer 2 only: layers 0-1 stay finite
        target.model.layers[2].mlp.down_proj.weight[0, 0] = float("nan")
    save_target(target, root / "nan_target")

    good = _save_drafter(root / "drafter")
    truncated = _save_drafter(root / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    _save_drafter(root / "hidden48", hidden_size=48, head_dim=12)
    _save_drafter(root / "vocab72", vocab_size=VOCAB + 8)
    model = DFlashDrafter(_drafter_cfg())
    torch.save({"config": model.cfg.to_dict(), "state_dict": model.state_dict(),
                "payload": _WritesAFile(root / "pwned-by-pickle")}, root / "evil.pt")

    prompts = torch.randint(2, 60, (3, 9), generator=torch.Generator().manual_seed(3)).tolist()
    (root / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "input_ids": p}) + "\n"
                                                for i, p in enumerate(prompts)))
    return root, good, f"sqlite:///{root / 'store' / 'draftboard.db'}"


def _eval_args(root: Path, *extra: str, drafter: str | Path | None = None, target: str = "target",
               prompts: str | Path | None = None) -> list[str]:
    return ["eval", "--target", str(root / target), "--drafter", str(drafter or root / "drafter"),
            "--prompts", str(prompts or root / "prompts.jsonl"), "--max-new-tokens", "12", "--budgets", "2,8",
            "--device", "cpu", "--linear-attn", "fallback", "--cache-dir", str(root / "cache"), *extra]


def _eval_runs_of(uri: str, target: Path) -> list:
    return Tracker(uri).find_runs(kind="eval", filter=f"tags.`draftboard.target` = '{target}'")


def _error_line(capsys) -> str:
    """The one `error:` line, last on stderr (progress bars may precede it); no traceback."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    assert not any("Traceback" in line for line in err), err
    return errors[0]


# --------------------------------------------------------------------------- checkpoints through the CLI


def test_an_index_naming_a_missing_shard_says_which_shard(models, capsys):
    """A release copied without one of its shards is not a corrupt file: the error names the shard."""
    root, _, _ = models
    sharded = root / "sharded_target"
    if not sharded.exists():
        torch.manual_seed(0)
        model = Qwen3_5ForCausalLM(qwen35_config()).eval()
        save_target(model, sharded)
        (sharded / "model.safetensors").unlink()
        model.save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    assert main(_eval_args(root, "--no-log", target="sharded_target")) == 2
    assert _error_line(capsys) == (f"error: missing: {shards[1].name} (named by model.safetensors.index.json) "
                                   f"in {sharded}")


def test_a_mistyped_target_or_drafter_is_one_error_line(models, capsys):
    """Issue 39: a mistyped --target printed a traceback and exited 1; every bad path is one line, exit 2."""
    root, _, _ = models
    assert main(_eval_args(root, "--no-log", target="targte")) == 2
    assert _error_line(capsys) == f"error: {root / 'targte'}: no such model folder or file"
    assert main(_eval_args(root, "--no-log", drafter=root / "drafterr")) == 2
    assert "drafterr" in _error_line(capsys)


@pytest.mark.parametrize("drafter, needles", [
    ("truncated", ["truncated or corrupt", "model.safetensors"]),
    ("hidden48", ["hidden_size 48", "32"]),
    ("vocab72", ["vocab_size 72", "vocab size 64"]),
])
def test_broken_checkpoint_is_one_error_line(models, capsys, drafter, needles):
    root, _, _ = models
    assert main(_eval_args(root, "--no-log", drafter=root / drafter)) == 2
    line = _error_line(capsys)
    for needle in needles:
        assert needle in line, (needle, line)


def test_pickle_that_runs_code_is_refused_through_the_cli(models, capsys):
    root, _, _ = models
    assert main(_eval_args(root, "--no-log", drafter=root / "evil.pt")) == 2
    assert "refused to unpickle" in _error_line(capsys)
    assert not (root / "pwned-by-pickle").exists()  # the payload never ran


# --------------------------------------------------------------------------- numbers


def test_nan_target_features_stop_the_eval_naming_prompt_layer_position(models, capsys, tmp_path):
    root, _, uri = models
    out = tmp_path / "results.json"
    assert main(_eval_args(root, "--tracking-uri", uri, "--out", str(out), target="nan_target")) == 2
    line = _error_line(capsys)
    assert "non-finite target features for prompt 'p0' at layer 2, position 0" in line, line
    assert not out.exists()  # nothing was averaged into a result
    assert _eval_runs_of(uri, root / "nan_target") == []  # and nothing was logged


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("flag, content, message", [
    ("--prompts", b"\xff\xfe\x00\x89PNG binary", "not UTF-8 text (byte 0)"),
    ("--prompts", b"  \n\n \t\n", "no prompts (the file is empty)"),
    ("--prompts", b'["not", "an", "object"]\n', ":1: expected a JSON object, got list"),
    ("--completions", b"\x80 latin-1 \xe9t\xe9", "not UTF-8 text"),
    ("--completions", b'{"prompts": 3}', "'prompts' must be a list"),
    ("--completions", b'{"prompts": [[1, 2]]}', ":1: a completion needs 'id' and 'completion_ids'"),
])
def test_undecodable_or_malformed_files_are_one_error_line(models, tmp_path, capsys, flag, content, message):
    root, _, _ = models
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    args = _eval_args(root, "--no-log", prompts=bad if flag == "--prompts" else None)
    if flag == "--completions":
        args += ["--completions", str(bad)]
    assert main(args) == 2
    line = _error_line(capsys)
    assert message in line and str(bad) in line, line


# --------------------------------------------------------------------------- allowed roots


def test_dashboard_and_worker_both_refuse_a_path_outside_the_allowed_roots(models, tmp_path, monkeypatch):
    root, good, uri = models
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the worker's store
    outside = tmp_path / "elsewhere" / "target"
    outside.mkdir(parents=True)
    form = LaunchForm(target=str(outside), prompts=str(root / "prompts.jsonl"), drafter=str(good))
    with pytest.raises(DraftboardError, match="outside the allowed roots"):
        eval_params(form, allowed_roots())  # the dashboard's Launch check

    # The same params queued around the dashboard: the worker refuses them before starting anything.
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    params = {"target": str(outside), "drafter": str(good), "prompts": str(root / "prompts.jsonl")}
    job = queue.submit("eval", params)
    assert run_worker(queue.uri, once=True, **FAST) == 1
    done = queue.get(job.id)
    assert done.state == FAILED and done.pid is None, done
    assert done.error == (f"refused: --target {outside.resolve()} is outside the allowed roots ({root}) of this "
                          "worker's DRAFTBOARD_ALLOWED_ROOTS; nothing was run")
    assert done.error in queue.log_tail(done, 1)
    assert _eval_runs_of(uri, outside) == []


def test_worker_trusts_registered_checkpoints_like_the_dashboard_and_checks_nothing_without_roots(
        models, tmp_path, monkeypatch, machine_fp):
    root, good, uri = models
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the worker's store: where it reads what the run registered
    elsewhere = _save_drafter(tmp_path / "ckpt" / "step_5")  # outside the roots, like a training box's disk
    with Tracker(uri).training_run("registers-a-checkpoint", {}, str(root / "target"), fingerprint=machine_fp) as run:
        run.log_checkpoint(elsewhere, 5)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")

    def job(**extra):
        return queue.submit("eval", {"target": str(root / "target"), "drafter": str(elsewhere),
                                     "prompts": str(root / "prompts.jsonl"), **extra})

    linked, unlinked = job(train_run_id=run.run_id, checkpoint_step=5), job()
    monkeypatch.delenv("DRAFTBOARD_ALLOWED_ROOTS", raising=False)
    assert str(elsewhere) in job_args(unlinked)  # no roots configured for the worker: no path is checked

    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(root))
    assert str(elsewhere) in job_args(linked)  # a checkpoint the training run registered is trusted
    with pytest.raises(DraftboardError, match=r"refused: --drafter .*step_5 is outside the allowed roots"):
        job_args(unlinked)
    other = _save_drafter(tmp_path / "ckpt" / "step_6")
    spoofed = queue.submit("eval", {**linked.params, "drafter": str(other)})
    with pytest.raises(DraftboardError, match=r"refused: --drafter .*step_6"):
        job_args(spoofed)  # linked to the run, but not one of its checkpoints


def test_worker_takes_the_same_first_look_as_launch_before_it_runs_anything(models, tmp_path, monkeypatch):
    """Issue 52: a job whose prompts file is not one (the demo's progress file) or whose target has no config.json,
    queued around Launch, is refused by the worker in one line before the eval starts (tracker/jobs/inputs.py)."""
    root, good, uri = models
    progress = root / "demo-progress.json"
    progress.write_text('{"stage": "training"}')
    bare = root / "bare-target"
    bare.mkdir(exist_ok=True)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(root))
    fine = {"target": str(root / "target"), "drafter": str(good), "prompts": str(root / "prompts.jsonl")}
    assert "--prompts" in job_args(queue.submit("eval", fine))
    for params, message in (({**fine, "prompts": str(progress)}, "its first line is not a prompt"),
                            ({**fine, "target": str(bare)}, "no config.json there")):
        with pytest.raises(DraftboardError, match=rf"^refused: .*{message}.*; nothing was run$"):
            job_args(queue.submit("eval", params))


# --------------------------------------------------------------------------- shell metacharacters


def _metachar(tmp_path: Path, what: str) -> tuple[str, Path]:
    """A name that would create a marker file if any shell ever ran it."""
    marker = tmp_path / f"pwned-{what}-{uuid.uuid4().hex[:8]}"
    return f"x; touch {marker} && echo $(touch {marker}) `touch {marker}` '\"", marker


def test_shell_metacharacters_in_cli_names_are_stored_literally(models, tmp_path, capsys):
    root, _, uri = models
    log_name, log_marker = _metachar(tmp_path, "import")
    log = tmp_path / "train.jsonl"
    log.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    assert main(["import-log", str(log), "--name", log_name, "--tracking-uri", uri]) == 0
    imported = capsys.readouterr().out.split("as run ")[1].strip()

    eval_name, eval_marker = _metachar(tmp_path, "eval")
    prompt_id, id_marker = _metachar(tmp_path, "prompt-id")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": prompt_id, "input_ids": [5, 6, 7, 8, 9]}) + "\n")
    out = tmp_path / "results.json"
    assert main(_eval_args(root, "--tracking-uri", uri, "--name", eval_name, "--out", str(out), prompts=prompts)) == 0
    run_id = capsys.readouterr().out.split("  run: ")[-1].split()[0]  # the summary line names the run

    client = MlflowClient(uri)
    assert client.get_run(imported).info.run_name == log_name
    evaluated = client.get_run(run_id)
    assert evaluated.info.run_name == eval_name and evaluated.info.status == "FINISHED"
    assert [p["id"] for p in json.loads(out.read_text())["prompts"]] == [prompt_id]
    table = json.loads(Path(client.download_artifacts(run_id, "per_prompt.json", str(tmp_path / "dl"))).read_text())
    assert table["data"][0][table["columns"].index("id")] == prompt_id
    assert not any(m.exists() for m in (log_marker, eval_marker, id_marker))


def test_shell_metacharacters_in_a_queued_jobs_params_reach_the_eval_as_literal_text(models, tmp_path, monkeypatch):
    root, _, uri = models
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the worker's store
    dir_name, dir_marker = _metachar(tmp_path, "drafter-dir")
    ref_name, ref_marker = _metachar(tmp_path, "reference")
    drafter = _save_drafter(root / dir_name)  # a real directory: `<root>/x; touch /tmp/.../pwned-... && ...`
    params = {"target": str(root / "target"), "drafter": str(drafter), "prompts": str(root / "prompts.jsonl"),
              "max_new_tokens": 12, "budgets": [2], "device": "cpu", "linear_attn": "fallback",
              "reference": ref_name}
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    job = queue.submit("eval", params)
    assert run_worker(queue.uri, once=True, **FAST) == 1

    done = queue.get(job.id)
    assert done.state == SUCCEEDED, f"{done.error}\n{queue.log_tail(done, 40)}"
    run = MlflowClient(uri).get_run(done.mlflow_run_id)
    assert run.data.tags["draftboard.reference_name"] == ref_name and run.info.run_name == ref_name
    assert run.data.tags["draftboard.checkpoint"] == str(drafter)
    assert not any(m.exists() for m in (dir_marker, ref_marker))
