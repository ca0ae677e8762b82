"""Foreign training runs in the run index, and `draftboard watch` on the tools' checkpoint folders.

A store of its own holds a SpecForge-legacy-style run and a speculators-style run, written with a
bare `MlflowClient` as the tools write them, and their checkpoint folders are written exactly as
the tools write them (tests/toolformats.py).
"""

from __future__ import annotations

import json
import time

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from hostile import plant_code
from tests import toolformats
from tracker import Tracker
from tracker.cli import main
from tracker.dashboard.index import load_run_index
from tracker.dashboard.tables import runs_table
from tracker.environment import fingerprint
from tracker.errors import DraftboardError
from tracker.jobs import watch
from tracker.jobs.queue import JobQueue
from tracker.jobs.worker import run_worker
from tracker.store import adoption, checkpoints, names


def _log(client, run_id, metrics: dict, step: int) -> None:
    client.log_batch(run_id, metrics=[Metric(k, float(v), 0, step) for k, v in metrics.items()], synchronous=True)


@pytest.fixture
def store(tmp_path, machine_fp):
    """(tracker, legacy run id, speculators run id) in a fresh sqlite store, plus one draftboard run."""
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    client = MlflowClient(tracking_uri=uri)
    legacy = client.create_run(client.create_experiment("dflash-qwen3-8b"), run_name="train_dflash").info.run_id
    args = {"target_model_path": "Qwen/Qwen3-8B", "block_size": 16, "num_anchors": 512, "mask_token_id": 151669,
            "loss_decay_gamma": 7.0, "learning_rate": 6e-4}
    client.log_batch(legacy, params=[Param(k, str(v)) for k, v in args.items()], synchronous=True)
    for step in (50, 100):
        _log(client, legacy, {"train/loss": 3.0 / step, "train/accuracy": step / 300, "train/lr": 6e-4}, step)
    spec = client.create_run(client.create_experiment("speculators"), run_name="2026-12-01T10:00").info.run_id
    _log(client, spec, {"dflash/block_size": 8, "draft/num_layers": 5}, 0)
    for step in range(3):
        _log(client, spec, {"train/loss": 2.0 - step / 10, "train/full_acc": 0.2, "train/eal": 1.5}, step)
    tracker = Tracker(uri)
    with Tracker(uri, experiment="other-team").training_run("theirs", {}, "t", fingerprint=machine_fp):
        pass
    return tracker, legacy, spec


def test_foreign_runs_are_listed_as_training_runs_with_their_badge(store):
    tracker, legacy, spec = store
    index = load_run_index(tracker)
    assert {r.run_id for r in index.of_kind("train")} == {legacy, spec}  # not the other team's run
    assert index.get(legacy).kind_label == "train · SpecForge (train_dflash.py)"
    assert index.get(spec).kind_label == "train · vLLM speculators"
    assert index.get(legacy).tags[names.STEP_UNIT] == "micro-batch"
    assert index.get(spec).steps == 2 and index.get(legacy).target_name == "Qwen3-8B"
    table = runs_table(index, index.of_kind("train")).set_index("run_id")
    assert table.loc[legacy, "kind"] == "train · SpecForge (train_dflash.py) · step = micro-batch"
    assert table.loc[legacy, "steps"] == 100
    assert names.KIND not in tracker.run(legacy).data.tags  # listed in memory, nothing written


def _preset(tmp_path) -> str:
    path = tmp_path / "preset.json"
    path.write_text(json.dumps({"target": str(tmp_path / "models" / "Qwen3-8B"),
                                "prompts": str(tmp_path / "data" / "prompts.jsonl"), "budgets": [4, 8], "device": "cpu"}))
    return str(path)


def _watch(tracker, run_id, folder, jobs, *extra) -> int:
    return main(["watch", run_id, str(folder), "--settle", "0", "--tracking-uri", tracker.uri,
                 "--jobs-uri", jobs, *extra])


def test_watch_auto_eval_records_and_queues_each_checkpoint_once(store, tmp_path, monkeypatch, capsys):
    tracker, legacy, spec = store
    # The worker's scan: the tools' experiments are this deployment's, their folders under its roots.
    monkeypatch.setenv("DRAFTBOARD_WATCH_EXPERIMENTS", "dflash-qwen3-8b, speculators")
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(tmp_path))
    jobs = f"sqlite:///{tmp_path / 'jobs.db'}"
    model = toolformats.tiny_drafter()
    legacy_dir, spec_dir = tmp_path / "specforge-out", tmp_path / "spec-ckpts"
    toolformats.specforge_legacy(legacy_dir, 0, 1000, model)
    toolformats.specforge_legacy(legacy_dir, 0, 2000, model)
    toolformats.speculators(spec_dir, 0, 120, model)
    digests = []
    real_digest = checkpoints.digest
    monkeypatch.setattr(checkpoints, "digest", lambda root: digests.append(root) or real_digest(root))

    assert _watch(tracker, legacy, legacy_dir, jobs, "--auto-eval", _preset(tmp_path)) == 0
    assert _watch(tracker, spec, spec_dir, jobs, "--auto-eval", _preset(tmp_path)) == 0
    assert [c.step for c in tracker.checkpoints(legacy)] == [1000, 2000]
    assert [c.step for c in tracker.checkpoints(spec)] == [120]  # global_step of training_state.json
    queue = JobQueue(jobs)
    queued = sorted(queue.list(), key=lambda j: j.id)
    assert [(j.params["train_run_id"], j.params["checkpoint_step"]) for j in queued] == [
        (legacy, 1000), (legacy, 2000), (spec, 120)]
    assert queued[0].params["drafter"] == str((legacy_dir / "epoch_0_step_1000").resolve())
    assert queued[0].params["budgets"] == [4, 8] and "tracking_uri" not in queued[0].params  # the worker's store
    assert len(digests) == 3  # the symlinks epoch0_step120 / checkpoint_best are not checkpoints

    # A restart (a new process reading the state from the store) queues and digests nothing again,
    # even after an eval was cancelled (the queue's own dedup would let it in again): the watcher
    # queued it once.
    queue.request_cancel(queued[0].id)
    assert _watch(tracker, legacy, legacy_dir, jobs) == 0
    assert watch.scan_all(tracker, queue) and len(queue.list()) == 3 and len(digests) == 3

    # A checkpoint that appears later is picked up, once.
    toolformats.specforge_legacy(legacy_dir, 1, 3000, model)
    results = watch.scan_all(tracker, queue)
    assert [f.step for r in results for f in r.recorded] == [3000]
    assert [c.step for c in tracker.checkpoints(legacy)] == [1000, 2000, 3000]
    assert len(queue.list()) == 4 and len(digests) == 4
    assert not any(r.recorded or r.queued for r in watch.scan_all(tracker, queue))
    assert "queued eval job(s)" in capsys.readouterr().out


def test_a_speculators_folder_tells_the_release_that_keys_its_eal(store, tmp_path):
    """speculators redefined `eal` in 0.9.0; the release is in the `train_command.txt` it writes beside its
    checkpoints, and a scan of the folder records it on the run (unless the run says its own)."""
    from tracker.store import names

    tracker, _, spec = store
    out = tmp_path / "spec-versioned"
    toolformats.speculators(out, 0, 40, toolformats.tiny_drafter(), version="0.8.1")
    assert watch.speculators_version(out) == "0.8.1"
    watch.start(tracker, spec, out, settle_s=0.0)
    watch.scan(tracker, JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}"), spec)
    assert tracker.run(spec).data.tags[names.TOOL_VERSION] == "0.8.1"
    (out / "train_command.txt").write_text(toolformats.speculators_train_command("not installed"))
    assert watch.speculators_version(out) is None  # no release named
    (out / "train_command.txt").write_text("# speculators: 0.9.0\n" + "x" * (65 << 10))
    assert watch.speculators_version(out) is None  # larger than any train_command.txt: not read


def test_a_checkpoint_still_being_written_waits(store, tmp_path):
    tracker, legacy, _ = store
    out = tmp_path / "runtime-out"
    toolformats.specforge_runtime(out, "run7", 100, toolformats.tiny_drafter())
    watch.start(tracker, legacy, out, settle_s=30.0)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    assert watch.scan(tracker, queue, legacy).recorded == []  # files written just now
    [found] = watch.scan(tracker, queue, legacy, now=time.time() + 60).recorded
    assert (found.step, found.layout, found.name) == (100, watch.SPECFORGE_RUNTIME, "run7-step100")
    assert queue.list() == []  # no preset: recorded, not evaluated


def test_bad_watch_input_is_one_error_line(store, tmp_path, capsys):
    tracker, legacy, _ = store
    jobs = f"sqlite:///{tmp_path / 'jobs.db'}"
    folder = tmp_path / "ckpts"
    folder.mkdir()
    assert _watch(tracker, legacy, folder, jobs, "--auto-eval", '{"target": "/m", "drafter": "/x"}') == 2
    assert "may not set drafter" in capsys.readouterr().err
    assert _watch(tracker, legacy, folder, jobs, "--auto-eval", '{"target": "/m"}') == 2
    assert "prompts" in capsys.readouterr().err
    assert _watch(tracker, legacy, tmp_path / "nowhere", jobs) == 2
    assert _watch(tracker, legacy, folder, jobs) == 0
    assert _watch(tracker, legacy, tmp_path, jobs) == 2
    assert "already watches" in capsys.readouterr().err
    with pytest.raises(DraftboardError, match="not watched"):
        watch.scan(tracker, JobQueue(jobs), store[2])


def test_fingerprint_attach_makes_an_unknown_environment_comparable(store, tmp_path, capsys, monkeypatch):
    tracker, legacy, spec = store
    assert main(["env-diff", legacy, spec, "--tracking-uri", tracker.uri]) == 2
    assert "no readable fingerprint.json" in capsys.readouterr().err
    assert main(["fingerprint", "--device", "cpu", "--attach", legacy, "--tracking-uri", tracker.uri]) == 0
    assert f"to run {legacy}" in capsys.readouterr().out
    # tracker.attach_fingerprint() in a launch script: the tool's active MLflow run
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracker.uri)
    with mlflow.start_run(run_id=spec):
        import tracker as package

        fp = package.attach_fingerprint()
    assert tracker.fingerprint(spec) == json.loads(json.dumps(fp))
    assert main(["env-diff", legacy, spec, "--tracking-uri", tracker.uri]) == 0
    assert "no differences" in capsys.readouterr().out
    index = load_run_index(tracker)
    assert index.get(legacy).env_hash == index.get(spec).env_hash != "unknown"
    assert adoption.detect(adoption.RunView.of(tracker.run(legacy), "x")).tool == adoption.SPECFORGE_LEGACY


def test_the_worker_runs_the_watchers_and_evaluates_what_they_find(store, tmp_path, monkeypatch):
    """A speculators checkpoint, as the tool writes it, evaluated end to end by the worker against a
    real (tiny, random) hybrid target whose shape the drafter was built for."""
    from transformers import Qwen3_5ForCausalLM

    from tiny import qwen35_config, save_target

    tracker, _, spec = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracker.uri)  # the worker's store
    monkeypatch.setenv("DRAFTBOARD_WATCH_EXPERIMENTS", "speculators")
    monkeypatch.setenv("DRAFTBOARD_ALLOWED_ROOTS", str(tmp_path))
    monkeypatch.setenv("DRAFTBOARD_HOME", str(tmp_path / "home"))
    target = save_target(Qwen3_5ForCausalLM(qwen35_config(
        vocab_size=toolformats.V, eos_token_id=toolformats.V - 2, hidden_size=toolformats.H,
        num_hidden_layers=toolformats.TARGET_LAYERS,
        layer_types=["linear_attention", "linear_attention", "full_attention"] * 2)).eval(),
        tmp_path / "target")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "input_ids": [3 + i, 7, 11 + i, 5]}) + "\n" for i in range(3)))
    folder = tmp_path / "spec-ckpts"
    toolformats.speculators(folder, 0, 7, toolformats.tiny_drafter())
    # issue 48 S1: both folders name code of their own (a .py, auto_map entries); the watch, the worker and
    # the eval it runs load them, and none of it runs
    marker = tmp_path / "code-ran"
    for planted in (target, *(p.parent for p in folder.rglob("config.json"))):
        plant_code(planted, marker)
    preset = {"target": str(target), "prompts": str(prompts), "budgets": [4], "device": "cpu",
              "max_new_tokens": 8}
    watch.start(tracker, spec, folder, preset, settle_s=0)
    jobs = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert run_worker(jobs, once=True, poll_s=0.05, watch_s=60) == 1  # queued by the watch, then run
    [job] = JobQueue(jobs).list()
    assert job.params["checkpoint_step"] == 7 and job.state == "succeeded", job.error
    assert not marker.exists()
    assert [c.step for c in tracker.checkpoints(spec)] == [7]
    [ev] = tracker.client.search_runs([tracker.experiment_id], f"tags.`{names.TRAIN_RUN_ID}` = '{spec}'")
    assert ev.data.tags[names.CHECKPOINT_STEP] == "7" and ev.data.metrics["tau"] >= 1


def test_the_dashboard_form_states_the_whole_watch_and_keeps_what_was_seen(store, tmp_path):
    tracker, legacy, _ = store
    folder = tmp_path / "specforge-out"
    toolformats.specforge_legacy(folder, 0, 10, toolformats.tiny_drafter())
    assert watch.state(tracker, legacy) is None
    watch.start(tracker, legacy, folder, json.loads(open(_preset(tmp_path)).read()), settle_s=0)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    assert len(watch.scan(tracker, queue, legacy).queued) == 1
    watch.start(tracker, legacy, folder, settle_s=0)  # the CLI without --auto-eval: the preset stays
    assert watch.state(tracker, legacy).preset is not None
    state = watch.start(tracker, legacy, folder, None, settle_s=5, keep_preset=False)  # the form, box unticked
    assert state.preset is None and state.settle_s == 5 and list(state.seen) == ["epoch_0_step_10"]
    toolformats.specforge_legacy(folder, 0, 20, toolformats.tiny_drafter())
    result = watch.scan(tracker, queue, legacy, now=time.time() + 60)
    assert [f.step for f in result.recorded] == [20] and result.queued == [] and len(queue.list()) == 1


def test_torchspec_checkpoints_are_recorded_at_their_iteration_and_never_queued(store, tmp_path, caplog):
    """Issue 51, layouts: TorchSpec writes `iter_NNNNNNN/` of torch.distributed.checkpoint shards (written here by
    torch's own DCP writer, as TorchSpec's `save` does). The watcher records each at its iteration; with a preset
    it queues nothing and says why once: the shards' `.metadata` is a pickle, which draftboard never loads."""
    tracker, legacy, _ = store
    jobs = f"sqlite:///{tmp_path / 'jobs.db'}"
    out = tmp_path / "torchspec" / "checkpoints"
    model = toolformats.tiny_drafter()
    for step in (749, 1499):
        toolformats.torchspec(out, step, model)
    assert (out / "iter_0000750" / "model" / ".metadata").is_file()  # DCP's own layout
    with caplog.at_level("INFO", logger="tracker.jobs.watch"):
        assert _watch(tracker, legacy, out, jobs, "--auto-eval", _preset(tmp_path)) == 0
        assert _watch(tracker, legacy, out, jobs) == 0  # again: nothing new to say
    assert [(c.step, c.path.endswith(f"iter_{c.step:07d}")) for c in tracker.checkpoints(legacy)] == [
        (750, True), (1500, True)]
    assert JobQueue(jobs).list() == []
    seen = tracker.read_json(legacy, names.WATCH_ARTIFACT)["seen"]
    assert {k: (v["layout"], v["not_queued"]) for k, v in seen.items()} == {
        "iter_0000750": (watch.TORCHSPEC, watch.TORCHSPEC_NOTE), "iter_0001500": (watch.TORCHSPEC, watch.TORCHSPEC_NOTE)}
    assert sum(watch.TORCHSPEC_NOTE in r.getMessage() for r in caplog.records) == 2  # once per checkpoint


def test_a_watched_folder_s_console_sets_the_environment_as_it_grows(store, tmp_path):
    tracker, legacy, _ = store
    out = tmp_path / "train-out"
    out.mkdir()
    log = out / "train.log"
    log.write_text("torch 2.13.0+cu130, 8 x H100\nstep=1 loss=2.0\n[transformers] `causal_conv1d_fn` is falling")
    watch.start(tracker, legacy, out, settle_s=0.0)
    queue = JobQueue(f"sqlite:///{tmp_path / 'jobs.db'}")
    watch.scan(tracker, queue, legacy)
    fp = tracker.fingerprint(legacy)
    assert fp["software"]["torch"] == "2.13.0+cu130" and "linear_attention" not in fp["numerics"]  # a half line waits
    with log.open("a") as fh:  # the training goes on: the line ends, the other piece falls back too
        fh.write(" back to its reference PyTorch implementation because `causal_conv1d` is not installed.\n"
                 "[transformers] `chunk_gated_delta_rule` is falling back to its reference PyTorch implementation "
                 "because `flash-linear-attention` is not installed.\n")
    watch.scan(tracker, queue, legacy)
    fp = tracker.fingerprint(legacy)
    assert fp["numerics"]["linear_attention_path"] == "fallback" and fp["software"]["torch"] == "2.13.0+cu130"
    assert fingerprint.citations(fp, "numerics.linear_attention.functions.causal_conv1d_fn")[0]["line"] == 3
    state = watch.state(tracker, legacy)
    assert state.evidence["train.log"] == {"offset": log.stat().st_size, "line": 5}
    assert tracker.client.get_run(legacy).data.tags["env.linear_attn"] == "fallback"
    # A checkpoint says what saved it: its config.json's transformers and the dtype of its weights (read as text).
    folder = toolformats.specforge_legacy(out, 0, 100, toolformats.tiny_drafter())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "transformers_version": "5.24.0",
                                                    "torch_dtype": "bfloat16"}))
    watch.scan(tracker, queue, legacy, now=time.time() + 60)
    fp = tracker.fingerprint(legacy)
    assert fp["software"]["transformers"] == "5.24.0" and fp["numerics"]["saved_dtype"] == "bf16"
    assert fingerprint.citations(fp, "software.transformers")[0]["file"] == "epoch_0_step_100/config.json"
    assert fp["numerics"]["linear_attention_path"] == "fallback"  # what the console said still stands
    # A run whose fingerprint draftboard captured live keeps it: a console never replaces a measurement.
    captured = tracker.attach_fingerprint(legacy, fingerprint.capture(with_probe=False))
    with log.open("a") as fh:
        fh.write("torch 2.12.0\n")
    watch.scan(tracker, queue, legacy)
    assert tracker.fingerprint(legacy)["software"]["torch"] == captured["software"]["torch"]

