"""DraftboardCallback inside a real (tiny) transformers.Trainer."""

import pytest
import torch
from mlflow import MlflowClient
from transformers import Qwen3ForCausalLM, Trainer, TrainerCallback, TrainingArguments

from tiny import VOCAB, qwen3_config
from tracker.store.checkpoints import digest
from tracker.store.hf_callback import DraftboardCallback


class _TokenData(torch.utils.data.Dataset):
    def __init__(self, n=32, length=12):
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (n, length), generator=gen)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(tmp_path, callbacks, max_steps=6):
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        qwen3_config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "drafter-v4"), max_steps=max_steps, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=2, save_steps=3, report_to=[], use_cpu=True,
        disable_tqdm=True, save_only_model=True,
    )
    return Trainer(model=model, args=args, train_dataset=_TokenData(), callbacks=callbacks)


def test_trainer_run_is_logged_with_checkpoints(tracker, store_uri, machine_fp, tmp_path):
    callback = DraftboardCallback(tracker, target="Qwen/Qwen3.5-4B", fingerprint=machine_fp)
    _trainer(tmp_path, [callback]).train()

    assert callback.run is None  # closed by on_train_end
    runs = tracker.find_runs(kind="train", filter="attributes.run_name = 'drafter-v4'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["draftboard.target"] == "Qwen/Qwen3.5-4B"
    params = run.data.params
    assert params["learning_rate"] == "0.001" and params["max_steps"] == "6"
    assert params["optim"].startswith("adamw_torch") and params["model.hidden_size"] == "16"
    assert int(params["model.num_parameters"]) > 0
    history = MlflowClient(tracking_uri=store_uri).get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [2, 4, 6]
    assert "train_runtime" in run.data.metrics

    checkpoints = tracker.checkpoints(run.info.run_id)
    assert [c.step for c in checkpoints] == [3, 6]
    for ckpt in checkpoints:
        assert ckpt.path == str(tmp_path / "drafter-v4" / f"checkpoint-{ckpt.step}")
        assert (ckpt.size_bytes, ckpt.sha256) == digest(tmp_path / "drafter-v4" / f"checkpoint-{ckpt.step}")


class _Crash(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 4:
            raise RuntimeError("CUDA out of memory")


def test_crashed_training_closed_by_the_caller_is_failed_with_its_steps(tracker, store_uri, machine_fp, tmp_path):
    callback = DraftboardCallback(tracker, name="crashing", fingerprint=machine_fp)
    with pytest.raises(RuntimeError) as crash:
        _trainer(tmp_path, [callback, _Crash()]).train()
    run_id = callback.run.run_id
    callback.close(crash.value)

    run = tracker.run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["draftboard.error"] == "RuntimeError: CUDA out of memory"
    assert "draftboard.target" not in run.data.tags
    history = MlflowClient(tracking_uri=store_uri).get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [2]
    assert [c.step for c in tracker.checkpoints(run_id)] == [3]
