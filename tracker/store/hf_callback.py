"""Record a `transformers.Trainer` run in draftboard.

    trainer = Trainer(..., callbacks=[DraftboardCallback(Tracker(), target="Qwen/Qwen3.5-4B")])

The run opens on `on_train_begin`, every `on_log` becomes one `log_step` at the
global step (numeric values only), every `on_save` registers the checkpoint
directory the Trainer just wrote, and `on_train_end` closes the run FINISHED.
Only the main process (world rank 0) logs.

The Trainer has no hook for a crash inside `train()`, so a run still open when
the interpreter exits, or when the next `train()` begins, is closed FAILED with
whatever steps it logged. In a notebook, call `close(error)` after catching one.
"""

from __future__ import annotations

import atexit
import enum
import logging
import numbers
from pathlib import Path
from typing import Any, Mapping

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from tracker.store.runs import TrainingRun

log = logging.getLogger(__name__)

_ARG_PARAMS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "max_grad_norm",
    "optim",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "seed",
    "bf16",
    "fp16",
    "output_dir",
)
_CONFIG_PARAMS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "block_size")


class TrainingInterrupted(Exception):
    """Recorded on a run that was still open when training stopped without `on_train_end`."""


class DraftboardCallback(TrainerCallback):
    """Logs a Trainer's steps and checkpoints as a draftboard training run.

    tracker: the store (default: `Tracker()`, the default store); target: the target
    model the drafter is trained against (tag omitted when not given); name: run name
    (default: `args.run_name`, else the output directory's name); params, tags,
    fingerprint: passed to `Tracker.training_run` (params override the defaults).
    """

    def __init__(
        self,
        tracker=None,
        *,
        target: str | None = None,
        name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        fingerprint: dict | None = None,
    ) -> None:
        self._tracker = tracker
        self._target = target
        self._name = name
        self._params = dict(params or {})
        self._tags = tags
        self._fingerprint = fingerprint
        self.run: TrainingRun | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.run is not None:
            self.close(TrainingInterrupted("a new train() began before the previous one ended"))
        if self._tracker is None:
            from tracker.store.tracker import Tracker

            self._tracker = Tracker()
        name = self._name or args.run_name or Path(args.output_dir).name
        params = {**training_params(args, model), **self._params}
        self.run = self._tracker.training_run(
            name, params, self._target, tags=self._tags, fingerprint=self._fingerprint
        )
        atexit.register(self._close_at_exit)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not logs:
            return
        metrics = {
            key: value
            for key, value in logs.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }
        if metrics:
            self.run.log_step(state.global_step, **metrics)

    def on_save(self, args, state, control, **kwargs):
        if self.run is None:
            return
        path = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if path.is_dir():
            self.run.log_checkpoint(path, state.global_step)
        else:  # e.g. hyperparameter-search trials save under another directory
            log.warning("draftboard: checkpoint %s not found; not registered", path)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        """End the open run: FINISHED, or FAILED with `error` recorded."""
        run, self.run = self.run, None
        atexit.unregister(self._close_at_exit)
        if run is not None:
            run.close(error)

    def _close_at_exit(self) -> None:
        self.close(TrainingInterrupted("the process exited before the Trainer's on_train_end"))


def training_params(args, model=None) -> dict[str, Any]:
    """The TrainingArguments and model-config values that identify a training setup."""
    params = {}
    for key in _ARG_PARAMS:
        value = getattr(args, key, None)
        if value is not None:
            params[key] = value.value if isinstance(value, enum.Enum) else value  # optim, scheduler
    params["world_size"] = args.world_size
    if model is not None:
        params["model.num_parameters"] = sum(p.numel() for p in model.parameters())
        config = getattr(model, "config", None)
        for key in _CONFIG_PARAMS:
            value = getattr(config, key, None)
            if value is not None:
                params[f"model.{key}"] = value
    return params
