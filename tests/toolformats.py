"""Checkpoint folders written exactly as the training tools write them (tiny sizes).

Layouts from the tools' sources (../shared/research/training-stacks.md):
- SpecForge legacy `scripts/train_dflash.py`: `{output_dir}/epoch_{e}_step_{s}/` holding the z-lab
  `config.json` + `model.safetensors`, `dflash.py` and `training_state.pt` (epoch, global_step, the
  argparse Namespace, the optimizer's state).
- SpecForge unified runtime: `{output_dir}/{run_id}-step{N}/training_state.pt` (draft_state_dict in
  z-lab key names, global_step, epoch, strategy, run_id, world_size, dflash_* settings) plus the
  rank-local optimizer/RNG state, and `{run_id}-latest` / `-best` symlinks.
- vLLM speculators: `{save_path}/{epoch}/` holding a speculators `config.json`, bf16
  `model.safetensors` (the z-lab body plus embed_tokens, lm_head, verifier_lm_head, verifier_norm,
  t2d, d2t), optimizer/scheduler state, `training_state.json`, with `epoch{e}_step{N}` and
  `checkpoint_best` symlinks.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from evaluators.drafter import DFlashDrafter, DrafterConfig, save_zlab

H, V, BS, TARGET_LAYERS = 32, 40, 4, 6
TAPPED = [1, 3]


def tiny_drafter(seed: int = 0) -> DFlashDrafter:
    """A 2-layer drafter for a 6-layer, hidden-32, vocab-40 target, with O(1) random weights."""
    torch.manual_seed(seed)
    cfg = DrafterConfig.from_dict({
        "hidden_size": H, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "intermediate_size": 48, "vocab_size": V, "rope_theta": 10000.0,
        "max_position_embeddings": 128, "block_size": BS, "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"target_layer_ids": TAPPED, "mask_token_id": V - 1, "block_size": BS},
    })
    model = DFlashDrafter(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight")
                    else torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return model.eval()


def specforge_legacy(output_dir: Path, epoch: int, step: int, model: DFlashDrafter) -> Path:
    folder = save_zlab(model, model.cfg, output_dir / f"epoch_{epoch}_step_{step}")
    (folder / "dflash.py").write_text("# modeling code copied next to the weights by train_dflash.py\n")
    args = argparse.Namespace(block_size=BS, num_anchors=512, learning_rate=6e-4, output_dir=str(output_dir))
    torch.save({"epoch": epoch, "global_step": step, "args": args, "state": {}, "param_groups": []},
               folder / "training_state.pt")
    return folder


def torchspec(output_dir: Path, step: int, model: DFlashDrafter) -> Path:
    """TorchSpec's `training/checkpoint.py` `save(actor, step)`: `iter_{step + 1:07d}/` with the model's and the
    optimizer's torch.distributed.checkpoint shards, the RNG state, `meta.json`, and the tracker file beside it."""
    import time

    import torch.distributed.checkpoint as dcp

    step_id = step + 1
    folder = output_dir / f"iter_{step_id:07d}"
    for part in ("model", "optimizer", "lr_scheduler"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    dcp.save({"model_state": {"model": model.state_dict()}}, checkpoint_id=str(folder / "model"))
    torch.save({"torch": torch.get_rng_state()}, folder / "rng.pt")
    meta = {"iteration": step_id, "step": step, "inference_id": step, "next_step": step + 1,
            "next_inference_id": step + 1, "global_step": step_id, "world_size": 1, "timestamp": time.time()}
    (folder / "meta.json").write_text(json.dumps(meta))
    (output_dir / "latest_checkpointed_iteration.txt").write_text(str(step_id))
    return folder


def specforge_runtime(output_dir: Path, run_id: str, step: int, model: DFlashDrafter) -> Path:
    folder = output_dir / f"{run_id}-step{step}"
    folder.mkdir(parents=True)
    torch.save({
        "draft_state_dict": {k: v.clone() for k, v in model.state_dict().items()},
        "global_step": step, "epoch": 0, "epoch_batch": step, "epoch_samples": 8 * step,
        "strategy": "dflash", "run_id": run_id, "world_size": 1,
        "dflash_block_size": BS, "dflash_mask_token_id": V - 1, "dflash_target_layer_ids": TAPPED,
        "dflash_draft_num_hidden_layers": 2, "dflash_num_anchors": 512, "dflash_loss_decay_gamma": 7.0,
    }, folder / "training_state.pt")
    torch.save({"optimizer": {"state": {}, "param_groups": []}, "rng": {"seed": 0}},
               folder / "training_state_rank0.pt")
    latest = output_dir / f"{run_id}-latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(folder.name)
    return folder


def speculators_config(model: DFlashDrafter) -> dict:
    zlab = model.cfg.to_dict()
    layer = {k: v for k, v in zlab.items() if k not in ("dflash_config", "block_size", "num_target_layers")}
    layer.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    return {
        "architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash", "speculators_version": "0.3.0",
        "transformer_layer_config": layer, "draft_vocab_size": V, "block_size": BS,
        "aux_hidden_state_layer_ids": [t + 1 for t in TAPPED], "mask_token_id": V - 1,
        "sample_from_anchor": False, "sliding_window_non_causal": False, "target_hidden_size": H,
        "speculators_config": {"algorithm": "dflash", "proposal_methods": [], "verifier": {"name_or_path": "t"}},
    }


def speculators_train_command(version: str) -> str:
    """`train_command.txt` as speculators' `train/utils.save_train_command` writes it (0.9.0): a provenance
    header, one `# pkg: version` line per package, then the command."""
    return ("# Timestamp: 2026-12-01T10:00:00+00:00\n# Git SHA: unknown\n# World size: 1\n"
            f"# speculators: {version}\n# vllm: 0.32.0\n# transformers: 5.2.0\n# torch: 2.13.0\n"
            "# compressed-tensors: not installed\nspeculators train --config run.yaml\n")


def speculators(save_path: Path, epoch: int, global_step: int, model: DFlashDrafter,
                version: str | None = None) -> Path:
    """A speculators checkpoint; with `version`, the provenance file its training command writes beside the
    checkpoints (and the trainer copies into each)."""
    folder = save_path / str(epoch)
    folder.mkdir(parents=True)
    if version is not None:
        (save_path / "train_command.txt").write_text(speculators_train_command(version))
    head = torch.randn(V, H)
    tensors = {**model.state_dict(), "embed_tokens.weight": torch.randn(V, H), "lm_head.weight": head,
               "verifier_lm_head.weight": head.clone(), "verifier_norm.weight": torch.ones(H)}
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    tensors["t2d"], tensors["d2t"] = torch.ones(V, dtype=torch.bool), torch.zeros(V, dtype=torch.int64)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(speculators_config(model), indent=2))
    torch.save({"state": {}, "param_groups": []}, folder / "optimizer_state_dict.pt")
    torch.save({"last_epoch": global_step}, folder / "scheduler_state_dict.pt")
    (folder / "training_state.json").write_text(json.dumps({"epoch": epoch, "local_step": global_step,
                                                            "global_step": global_step}))
    (folder / "train_command.txt").write_text(speculators_train_command(version) if version is not None
                                             else "speculators train --config run.yaml\n")
    (folder / "val_metrics.json").write_text(json.dumps({"val/loss_epoch": 1.5}))
    for link in (f"epoch{epoch}_step{global_step}", "checkpoint_best"):
        (save_path / link).unlink(missing_ok=True)
        (save_path / link).symlink_to(folder.name)
    return folder
