"""Importing JSON-lines and key=value training logs as train runs."""

import json

import pytest
from mlflow import MlflowClient

from tracker.errors import DraftboardError
from tracker.store.importers.training_log import MAX_LINE_CHARS, import_log, scan_log


def _history(store_uri, run_id, key):
    return [(m.step, m.value) for m in MlflowClient(tracking_uri=store_uri).get_metric_history(run_id, key)]


def test_jsonl_round_trip(tracker, store_uri, tmp_path):
    log = tmp_path / "train.jsonl"
    rows = [
        {"step": 10, "loss": 2.3, "streak": 1.1, "phase": "warmup"},
        {"step": 20, "loss": 2.1, "streak": 1.4, "done": False, "grads": [1, 2]},
        {"step": 30.0, "loss": 1.9},
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n")

    run_id = import_log(tracker, log, "v3-import", target="Qwen/Qwen3.5-4B")
    run = tracker.run(run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["draftboard.imported"] == "1" and tags["draftboard.kind"] == "train"
    assert tags["draftboard.target"] == "Qwen/Qwen3.5-4B"
    assert tags["env.torch"] == "unknown" and tags["env.linear_attn"] == "unknown"
    assert run.data.params["import.format"] == "jsonl" and run.data.params["import.records"] == "3"
    assert _history(store_uri, run_id, "loss") == [(10, 2.3), (20, 2.1), (30, 1.9)]
    assert _history(store_uri, run_id, "streak") == [(10, 1.1), (20, 1.4)]  # strings, bools, lists: not metrics
    assert set(MlflowClient(tracking_uri=store_uri).get_run(run_id).data.metrics) == {"loss", "streak"}
    fp = tracker.fingerprint(run_id)
    assert fp["source"]["kind"] == "imported" and fp["source"]["file"] == str(log.resolve())
    assert fp["software"]["torch"] is None and fp["numerics"]["linear_attention_path"] is None


def test_key_value_round_trip_skips_lines_without_a_step(tracker, store_uri, tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "starting training on 8 GPUs\n"
        "step=10 loss=2.31 acc=0.4 lr=1e-4\n"
        "2025-01-02 10:00:01 INFO step=20, loss=2.05, acc=0.45, lr=9e-5, tag=warm\n"
        "eval loss=1.9\n"
        "step=30;loss=nan\n"
    )
    summary = scan_log(log)
    assert (summary.format, summary.records, summary.skipped_lines) == ("kv", 3, 2)

    run_id = import_log(tracker, log, "kv-import")
    run = tracker.run(run_id)
    assert "draftboard.target" not in run.data.tags  # not given, so not invented
    assert run.data.params["import.skipped_lines"] == "2" and run.data.params["import.format"] == "kv"
    assert _history(store_uri, run_id, "acc") == [(10, 0.4), (20, 0.45)]
    assert _history(store_uri, run_id, "lr") == [(10, 1e-4), (20, 9e-5)]  # `tag=warm` is not a metric
    assert [s for s, _ in _history(store_uri, run_id, "loss")] == [10, 20, 30]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", '{"step": 1, "loss": 2}\n{"step": 2, "loss": \n', r"bad\.jsonl:2: malformed JSON"),
        ("nostep.jsonl", '{"step": 1}\n{"step": 2}\n{"loss": 2}\n', r'nostep\.jsonl:3: no "step" field'),
        ("list.jsonl", '{"step": 1}\n[1, 2]\n', r"list\.jsonl:2: expected a JSON object"),
        ("frac.jsonl", '{"step": 1.5, "loss": 2}\n', r"frac\.jsonl:1: step must be an integer"),
        ("neg.log", "step=-3 loss=1\n", r"neg\.log:1: step must be an integer"),
        ("name.jsonl", '{"step": 1, "loss (avg)": 2}\n', r"name\.jsonl:1: invalid metric name"),
        ("empty.jsonl", "\n\n", r"empty\.jsonl: no step records found"),
        ("nosteps.log", "hello\nloss=1\n", r"nosteps\.log: no step records found"),
        ("late.log", "step=1 loss=1\n" * 3 + "step=x loss=1\n", r"late\.log:4: step must be an integer"),
        ("long.log", "step=1 loss=1\n" + "x" * (MAX_LINE_CHARS + 1) + "\n", r"long\.log:2: line longer than"),
    ],
)
def test_malformed_logs_name_file_and_line_and_create_no_run(tracker, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    before = len(tracker.find_runs())
    with pytest.raises(DraftboardError, match=message):
        import_log(tracker, path, "bad")
    assert len(tracker.find_runs()) == before  # checked before anything was written


@pytest.mark.parametrize("content, message", [
    (None, r"absent\.log: no such log file"),
    (b"step=1 loss=1\n\xff\xfe\x00step=2\n", r"blob\.log:2: not a UTF-8 text log"),
])
def test_missing_and_binary_files_are_draftboard_errors(tracker, tmp_path, content, message):
    path = tmp_path / ("absent.log" if content is None else "blob.log")
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DraftboardError, match=message):
        import_log(tracker, path, "bad")


def _automodel_console(path, *, dflash2: bool = True) -> list[dict]:
    """A console log written as Automodel's DFlash2 recipe writes it: its logger calls, with its format
    strings and arguments (recipes/llm/train_dflash.py, train_dflash2.py), through `logging`."""
    import logging

    logger = logging.getLogger(f"nemo_automodel.recipes.llm.train_dflash.{path.stem}")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logged = []
    step = 0
    for epoch_idx in range(2):
        for _ in range(2):
            step += 2  # log_every_steps=2
            m = {"loss": 3.0 / step, "acc": step / 20, "lr": 1e-4 / step, "base_loss": 2.5 / step,
                 "selector_loss": 1.5 / step, "base_acc": step / 25, "accept_len": 1 + step / 8,
                 "base_accept_len": 1 + step / 10, "candidate_recall": 0.5 + step / 100}
            logged.append({"step": step, **m})
            logger.info("epoch=%d step=%d loss=%.4f acc=%.4f lr=%.6g", epoch_idx, step, m["loss"], m["acc"], m["lr"])
            if dflash2:
                logger.info("  dflash2: base_loss=%.4f selector_loss=%.4f base_acc=%.4f "
                            "accept_len=%.3f base_accept_len=%.3f candidate_recall=%.4f", m["base_loss"],
                            m["selector_loss"], m["base_acc"], m["accept_len"], m["base_accept_len"],
                            m["candidate_recall"])
            logger.info("Saved %s checkpoint to %s/epoch_%d_step_%d", "step", "ckpts", epoch_idx, step)
        eval_metrics = {"val_loss": 2.0 - epoch_idx, "val_accuracy": 0.3, "val_accept_len": 2.5 + epoch_idx,
                        "val_selector_loss": 1.0}
        msg = f"Finished epoch {epoch_idx + 1}/2 completed_steps=4 skipped_short_micro_batches=0"
        msg += " " + " ".join(f"{name}={value:.4f}" for name, value in eval_metrics.items())
        logger.info(msg)
    logger.removeHandler(handler)
    handler.close()
    return logged


def test_automodel_console_round_trip_reads_its_dflash2_and_validation_lines(tracker, store_uri, tmp_path):
    from tracker.store import adoption, names

    log = tmp_path / "automodel.log"
    logged = _automodel_console(log)
    run_id = import_log(tracker, log, "automodel-dflash2", fmt="automodel")
    run = tracker.run(run_id)
    assert run.data.tags[names.TOOL] == adoption.AUTOMODEL and run.data.tags[names.STEP_UNIT] == "optimizer step"
    assert run.data.params["import.format"] == "automodel" and run.data.params["import.records"] == "10"
    steps = [row["step"] for row in logged]
    assert _history(store_uri, run_id, "train/loss") == [(s, round(row["loss"], 4)) for s, row in zip(steps, logged)]
    assert _history(store_uri, run_id, "train/selector_loss") == [
        (s, round(row["selector_loss"], 4)) for s, row in zip(steps, logged)]
    assert _history(store_uri, run_id, "train/accept_len") == [(2, 1.25), (4, 1.5), (6, 1.75), (8, 2.0)]
    # validation at the end of each epoch: after 4, then 8 optimizer steps
    assert _history(store_uri, run_id, "val/accept_len") == [(4, 2.5), (8, 3.5)]
    curves = {a.source: a.canonical for a in adoption.aliases(run.data.tags[names.TOOL], run.data.metrics)}
    assert curves["train/selector_loss"] == "selector_loss" and curves["val/accept_len"] == "val_accept_len"


def test_automodel_console_without_a_step_line_first_is_refused_with_its_line(tracker, tmp_path, capsys):
    from tracker.cli import main

    log = tmp_path / "cut.log"
    _automodel_console(log)
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[1:]) + "\n")  # the log starts at a dflash2 line
    assert main(["import-log", str(log), "--name", "x", "--format", "automodel",
                 "--tracking-uri", tracker.uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and f"{log}:1: a `dflash2:` line before any" in err and "\n" not in err
    plain = tmp_path / "plain.log"
    plain.write_text("step=1 loss=2\n")
    with pytest.raises(DraftboardError, match="no step records found; expected Automodel's"):
        scan_log(plain, "automodel")
