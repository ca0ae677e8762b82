"""The DFlash drafter: its config (`config`), the model in plain PyTorch (`model`), loading and saving (`io`)."""

from evaluators.drafter.config import (ARCHITECTURE_ALIASES, ARCHITECTURES, DFLASH, DFLASH2, JETSPEC, DrafterConfig,
                                       build_target_layer_ids)
from evaluators.drafter.io import (LM_HEAD_KEYS, CheckedDrafter, LoadedDrafter, Precision, StoredDrafter, TargetDims,
                                   autocast_precision, load_drafter, open_drafter, parse_dtype, parse_precision,
                                   save_zlab, stored_drafter)
from evaluators.drafter.model import DFlashDrafter, context_from_hidden_states

__all__ = [
    "ARCHITECTURE_ALIASES",
    "ARCHITECTURES",
    "DFLASH",
    "DFLASH2",
    "JETSPEC",
    "LM_HEAD_KEYS",
    "CheckedDrafter",
    "DFlashDrafter",
    "DrafterConfig",
    "LoadedDrafter",
    "Precision",
    "StoredDrafter",
    "TargetDims",
    "autocast_precision",
    "build_target_layer_ids",
    "context_from_hidden_states",
    "load_drafter",
    "open_drafter",
    "parse_dtype",
    "parse_precision",
    "save_zlab",
    "stored_drafter",
]
