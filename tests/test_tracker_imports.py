"""W&B and SwanLab run folders, written by the trackers themselves, imported with the environment their files state."""

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tracker.cli import main
from tracker.environment import fingerprint
from tracker.errors import DraftboardError
from tracker.store import names
from tracker.store.importers import foreign_run, swanlab_run, wandb_run
from tracker.store.tracker import Tracker
from tracker.untrusted.record_log import LogRecords

SWANLOG = Path(__file__).parent / "data" / "swanlog"


@pytest.fixture(scope="session")
def wandb_folder(tmp_path_factory) -> Path:
    """A W&B offline run made by wandb 0.31 around a tiny Qwen3.5 training loop (tests/trackerruns.py)."""
    out = tmp_path_factory.mktemp("wandb-run")
    subprocess.run([sys.executable, str(Path(__file__).parent / "trackerruns.py"), "wandb", str(out)], check=True,
                   capture_output=True, timeout=300, env={**__import__("os").environ, "WANDB_MODE": "offline",
                                                          "WANDB_SILENT": "true"})
    (run,) = (out / "wandb").glob("offline-run-*")
    return run


def _tags(uri: str, run_id: str) -> dict:
    return MlflowClient(tracking_uri=uri).get_run(run_id).data.tags


def _run_ids(capsys) -> list[str]:
    return capsys.readouterr().out.strip().rsplit(" ", 1)[-1].split(", ")


def test_a_wandb_run_imports_with_its_history_config_and_evidence(wandb_folder, sqlite_store_uri, tmp_path, capsys):
    assert main(["import-results", "--format", "wandb", str(wandb_folder.parent), "--name", "wb",
                 "--tracking-uri", sqlite_store_uri]) == 0
    (run_id,) = _run_ids(capsys)
    client = MlflowClient(tracking_uri=sqlite_store_uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags[names.KIND] == "train" and tags[names.IMPORTED] == "1"
    assert tags["env.linear_attn"] == "fallback"  # what its console stated
    assert tags["env.torch"] == "2.13.0+cpu" and tags["env.transformers"] == "5.24.0"  # its requirements.txt
    # fla 0.6.0 is in its requirements, yet its console says the chunk rule fell back (no triton here): Runs flags it.
    assert tags[names.ENV_EVIDENCE_CONFLICTS] == "1"
    from tracker.dashboard.index import load_run_index
    from tracker.dashboard.tables import runs_table
    from tracker.store.tracker import Tracker

    index = load_run_index(Tracker(sqlite_store_uri))
    assert runs_table(index, [index.runs[run_id]]).iloc[0]["status"].startswith("⁉️")
    assert run.data.params["block_size"] == "16" and run.data.params["target"] == "tiny-qwen3.5"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [0, 10, 20, 30, 40]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/best_tau")] == [(40, 3.25)]
    artifacts = {a.path for a in client.list_artifacts(run_id, "evidence/files")}
    assert artifacts == {"evidence/files/output.log", "evidence/files/requirements.txt"}
    record = json.loads(Path(client.download_artifacts(run_id, foreign_run.EVIDENCE_ARTIFACT, str(tmp_path))).read_text())
    assert any(f["file"] == "files/output.log" and f["line"] == 1 for f in record["facts"])

    # env-diff against a box that ran the kernels names each evidence field's file and line.
    live = fingerprint.capture(with_probe=False)
    live["numerics"]["linear_attention"]["functions"].update({
        "causal_conv1d_fn": "causal_conv1d.causal_conv1d_interface.causal_conv1d_fn",
        "causal_conv1d_update": "causal_conv1d.causal_conv1d_interface.causal_conv1d_update",
        "torch_chunk_gated_delta_rule": "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule",
        "torch_recurrent_gated_delta_rule": "fla.ops.gated_delta_rule.fused_recurrent.fused_recurrent_gated_delta_rule"})
    live["numerics"]["linear_attention_path"] = "fast"
    (tmp_path / "eval_box.json").write_text(json.dumps(live))
    assert main(["env-diff", run_id, str(tmp_path / "eval_box.json"), "--tracking-uri", sqlite_store_uri]) == 1
    out = capsys.readouterr().out
    assert "numerics.linear_attention_path" in out and "critical" in out
    assert "numerics.linear_attention.functions.causal_conv1d_fn = 'torch': files/output.log:1" in out
    assert "software.torch = '2.13.0+cpu': files/requirements.txt:" in out
    assert "its files disagree: flash-linear-attention 0.6.0 is installed" in out


def test_a_crashed_or_damaged_wandb_log(wandb_folder, tmp_path, sqlite_store_uri, capsys):
    (log,) = wandb_folder.glob("run-*.wandb")
    whole = list(LogRecords(log, wandb_run.MAGIC, wandb_run.IDENT))
    data = log.read_bytes()
    cut = tmp_path / "offline-run-cut"
    shutil.copytree(wandb_folder, cut, ignore=shutil.ignore_patterns("logs", "tmp"))
    (cut_log,) = cut.glob("run-*.wandb")
    cut_log.write_bytes(data[:len(data) - 40])  # killed mid-write
    reader = LogRecords(cut_log, wandb_run.MAGIC, wandb_run.IDENT)
    assert len(list(reader)) < len(whole) and "truncated mid-write" in reader.stopped
    (run,) = wandb_run.read_folder(cut)
    assert run.notes and "truncated mid-write" in run.notes[0] and run.history
    assert main(["import-results", "--format", "wandb", str(cut), "--tracking-uri", sqlite_store_uri]) == 0
    assert "note: .: run-" in capsys.readouterr().err  # the partial read is said

    bad_crc = bytearray(data)
    bad_crc[7] ^= 0xFF  # the first chunk's checksum
    cut_log.write_bytes(bytes(bad_crc))
    reader = LogRecords(cut_log, wandb_run.MAGIC, wandb_run.IDENT)
    assert list(reader) == [] and "bad checksum" in reader.stopped
    # A chunk claiming more bytes than its block holds (the longest a 16-bit length can say).
    cut_log.write_bytes(data[:7] + struct.pack("<IHB", 0, 0xFFFF, 1) + data[14:])
    reader = LogRecords(cut_log, wandb_run.MAGIC, wandb_run.IDENT)
    assert list(reader) == [] and "runs past its block" in reader.stopped
    # A record spanning chunks past the bound: cut there, never assembled.
    reader = LogRecords(log, wandb_run.MAGIC, wandb_run.IDENT, max_record=64)
    list(reader)
    assert "a record over 64 bytes" in reader.stopped
    cut_log.write_bytes(b"not a wandb log at all")
    with pytest.raises(DraftboardError, match="not a :W&B log"):
        wandb_run.read_folder(cut)
    with pytest.raises(DraftboardError, match="not a W&B run folder"):
        wandb_run.read_folder(tmp_path / "offline-run-cut" / "files")


def test_a_swanlab_run_imports_with_its_evidence(sqlite_store_uri, capsys):
    assert main(["import-results", "--format", "swanlab", str(SWANLOG), "--name", "sl",
                 "--tracking-uri", sqlite_store_uri]) == 0
    (run_id,) = _run_ids(capsys)
    tags = _tags(sqlite_store_uri, run_id)
    assert tags["env.linear_attn"] == "fallback" and tags["env.torch"] == "2.13.0+cpu"
    assert tags["env.transformers"] == "5.24.0"
    run = MlflowClient(tracking_uri=sqlite_store_uri).get_run(run_id)
    assert run.data.params["block_size"] == "16" and "swanlab/column_1" in run.data.metrics
    assert "swanlab/column_<id>" in run.data.params["import.partial"]
    with pytest.raises(DraftboardError, match="not a SwanLab run folder"):
        swanlab_run.read_folder(Path(__file__).parent / "data")


@pytest.mark.parametrize("line, linear_attn", [
    ("[transformers] `causal_conv1d_fn` is falling back to its reference PyTorch implementation because "
     "`causal_conv1d` is not installed. This is correct but much slower; install `causal_conv1d` for the optimized "
     "kernel.\n[transformers] `fused_recurrent_gated_delta_rule` is falling back to its reference PyTorch "
     "implementation because `flash-linear-attention` is not installed.", "fallback"),
    ("The fast path is not available because one of the required library is not installed. Falling back to torch "
     "implementation. To install follow https://github.com/fla-org/flash-linear-attention#installation", "fallback"),
    ("loading checkpoint shards: 100%", "unknown"),
])
def test_import_log_reads_the_console_it_is(tmp_path, sqlite_store_uri, capsys, line, linear_attn):
    log = tmp_path / "train.log"
    log.write_text(f"torch 2.13.0+cu130, 8 x H100\n{line}\nstep=10 loss=2.3\nstep=20 loss=2.1\n")
    assert main(["import-log", str(log), "--name", "log", "--tracking-uri", sqlite_store_uri]) == 0
    tags = _tags(sqlite_store_uri, _run_ids(capsys)[0])
    assert tags["env.linear_attn"] == linear_attn and tags["env.torch"] == "2.13.0+cu130" and tags["env.gpu"] == "H100"


def test_metric_names_mlflow_cannot_store_are_left_out_and_said_before_any_run_is_made(tmp_path, sqlite_store_uri):
    from tracker.store.importers.foreign_run import ForeignRun, log_runs

    run = ForeignRun(str(tmp_path), ".", "wandb", {}, {1: {"loss (train)": 2.0, "train/loss": 1.0}},
                     summary={"best/../x": 3.0})
    (run_id,) = log_runs(Tracker(sqlite_store_uri), [run], "odd names")
    stored = MlflowClient(tracking_uri=sqlite_store_uri).get_run(run_id)
    assert set(stored.data.metrics) == {"train/loss"} and stored.info.status == "FINISHED"
    assert "2 metric name(s) MLflow cannot store were left out" in stored.data.params["import.partial"]


def test_console_beside_a_log_and_a_tensorboard_folder(tmp_path, sqlite_store_uri, capsys):
    from torch.utils.tensorboard import SummaryWriter

    console = tmp_path / "console.txt"
    console.write_text("The fast path is not available because one of the required library is not installed.\n")
    log = tmp_path / "train.jsonl"
    log.write_text('{"step": 1, "loss": 2.0}\n')
    assert main(["import-log", str(log), "--name", "j", "--console", str(console),
                 "--tracking-uri", sqlite_store_uri]) == 0
    assert _tags(sqlite_store_uri, _run_ids(capsys)[0])["env.linear_attn"] == "fallback"
    writer = SummaryWriter(str(tmp_path / "runs"))
    writer.add_scalar("train/loss", 1.0, 5)
    writer.close()
    assert main(["import-results", "--format", "tensorboard", str(tmp_path / "runs"), "--console", str(console),
                 "--name", "tb", "--tracking-uri", sqlite_store_uri]) == 0
    assert _tags(sqlite_store_uri, _run_ids(capsys)[0])["env.linear_attn"] == "fallback"
    assert main(["import-results", "--format", "ddtree", str(log), "--console", str(console),
                 "--tracking-uri", sqlite_store_uri]) == 2
    assert "--console goes with a training run's import" in capsys.readouterr().err


def test_adopt_reads_the_runs_own_console_artifact(tmp_path, sqlite_store_uri, capsys):
    client = MlflowClient(tracking_uri=sqlite_store_uri)
    experiment = client.get_experiment_by_name("Default") or client.get_experiment("0")
    run = client.create_run(experiment.experiment_id, tags={"mlflow.runName": "specforge-run"})
    client.log_metric(run.info.run_id, "train/loss", 1.0, step=1)
    console = tmp_path / "output.log"
    console.write_text("[transformers] `chunk_gated_delta_rule` is falling back to its reference PyTorch "
                       "implementation because `flash-linear-attention` is not installed.\n")
    client.log_artifact(run.info.run_id, str(console))
    client.set_terminated(run.info.run_id)
    assert main(["adopt", run.info.run_id, "--tool", "specforge", "--tracking-uri", sqlite_store_uri]) == 0
    assert "environment from its files" in capsys.readouterr().out
    fp = json.loads(Path(client.download_artifacts(run.info.run_id, names.FINGERPRINT_ARTIFACT, str(tmp_path))).read_text())
    assert fp["numerics"]["linear_attention"]["functions"]["torch_chunk_gated_delta_rule"] == "torch"
    assert fingerprint.citations(fp, "numerics.linear_attention.functions.torch_chunk_gated_delta_rule")[0]["line"] == 1
    # A fingerprint captured in the run's own environment is a measurement: adopting again reads no console over it.
    Tracker(sqlite_store_uri).attach_fingerprint(run.info.run_id, fingerprint.capture(with_probe=False))
    assert main(["adopt", run.info.run_id, "--tool", "specforge", "--tracking-uri", sqlite_store_uri]) == 0
    assert "keeps the fingerprint captured in its own environment" in capsys.readouterr().out
    kept = json.loads(Path(client.download_artifacts(run.info.run_id, names.FINGERPRINT_ARTIFACT,
                                                     str(tmp_path / "again"))).read_text())
    assert kept["source"]["kind"] == "captured"
