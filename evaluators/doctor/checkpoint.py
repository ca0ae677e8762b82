"""The drafter checkpoint against what it will run with: its tensors, its config, the target's layers.

A DFlash drafter shares the target's embedding and lm_head (z-lab's `_raw_input_embeddings` and
`_output_head(target)`; vLLM and SGLang do the same), so a checkpoint that carries its own was
trained with a head no server will use. Its fc reads `len(target_layer_ids)` tapped layers; the
target's last layer is the final norm's output, which z-lab's `build_target_layer_ids` never picks
(it stops at num_layers - 3) and speculators' converter drops. On a hybrid target the tapped
layers may be linear-attention or full-attention layers; SpecForge's Qwen3.5 recipe taps
full-attention layers only (SpecForge #495).
"""

from __future__ import annotations

from pathlib import Path

import torch

from evaluators.doctor.report import CRITICAL, INFO, OK, WARNING, Check
from evaluators.drafter import ARCHITECTURES, DFLASH2, LM_HEAD_KEYS, StoredDrafter, TargetDims, open_drafter, stored_drafter
from evaluators.target import TargetHeads
from evaluators.weights import read_safetensors
from tracker.errors import DraftboardError

ARCHITECTURE, TAPPED_LAYERS = "architecture", "tapped_layers"
EMBED_KEYS = ("embed_tokens.weight",)


def _shape(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _own_heads(stored: StoredDrafter) -> dict[str, tuple[int, ...]]:
    return {k: s for k, s in stored.shapes.items() if k in (*LM_HEAD_KEYS, *EMBED_KEYS) and k not in stored.extra}


def _same_as_target(path: Path, key: str, heads: TargetHeads) -> bool:
    """Whether a stored head is a copy of the target's (then it changes nothing)."""
    if not str(path).endswith(".safetensors"):
        return False
    try:
        own = read_safetensors(path, [key])[key].float()
    except (DraftboardError, KeyError, OSError):
        return False
    theirs = (heads.embed_weight if key in EMBED_KEYS else heads.lm_head_weight).float().cpu()
    return own.shape == theirs.shape and bool(torch.equal(own, theirs))


def architecture(drafter: str | Path, heads: TargetHeads, num_layers: int) -> Check:
    """Own heads, a config the weights do not fit (fc width, keys, shapes), the target's last layer tapped, and a
    DFlash2 checkpoint that vLLM would not serve as DFlash2."""
    dims = TargetDims(heads.config.hidden_size, num_layers, heads.config.vocab_size)
    try:
        stored = stored_drafter(drafter)
        checked = open_drafter(drafter, dims)
    except DraftboardError as exc:
        return Check(ARCHITECTURE, CRITICAL, "the checkpoint does not fit its config or this target", str(exc),
                     "export the drafter the way it was trained (config and weights together), for this target")
    cfg = checked.config
    own = {k: s for k, s in _own_heads(stored).items() if not _same_as_target(checked.weights_path, k, heads)}
    if own:
        listed = ", ".join(f"{k} {_shape(s)}" for k, s in own.items())
        return Check(ARCHITECTURE, CRITICAL, "the drafter carries its own head, which z-lab's loop, vLLM and SGLang "
                     "never use: they feed it the target's embedding and lm_head", f"{listed} in {checked.weights_path}"
                     f" ({stored.kind}); draftboard's offline eval scores with it, so offline and served numbers part",
                     "train with the target's lm_head and embedding frozen and shared (z-lab's recipe), or drop the "
                     "copy and re-evaluate: the served number is the one without it")
    evidence = (f"fc {_shape(stored.shapes['fc.weight'])} = {cfg.n_tapped} tapped layers x hidden {cfg.hidden_size}; "
                f"{cfg.num_hidden_layers} drafter layers, block {cfg.block_size}, family {cfg.family}; no own "
                f"lm_head or embedding")
    if cfg.family == DFLASH2 and ARCHITECTURES[DFLASH2] not in (stored.raw_config.get("architectures") or []):
        return Check(ARCHITECTURE, CRITICAL, "a DFlash2 checkpoint whose config does not name DFlash2DraftModel: vLLM "
                     "picks its DFlash2 speculator by that name and would serve it as plain DFlash", evidence,
                     'set "architectures": ["DFlash2DraftModel"] in its config.json')
    last = num_layers - 1
    if last in cfg.target_layer_ids:
        return Check(ARCHITECTURE, WARNING, f"the drafter taps the target's last layer ({last}), whose feature is the "
                     "final norm's output: z-lab's build_target_layer_ids stops at num_layers - 3 and speculators' "
                     "converter drops that layer", f"target_layer_ids {cfg.target_layer_ids}; {evidence}",
                     "check that the engine you serve with feeds that layer the way training did")
    return Check(ARCHITECTURE, OK, "tensors, config and target agree", f"target_layer_ids {cfg.target_layer_ids}; "
                 f"{evidence}")


def tapped_layers(layer_ids: list[int], layer_types: list[str] | None) -> Check:
    """Which kind of target layer each tapped one is (hybrid targets)."""
    if not layer_types or len(set(layer_types)) == 1:
        return Check(TAPPED_LAYERS, OK, "the target has one kind of layer", f"tapped layers {layer_ids}")
    kinds = {i: layer_types[i] if i < len(layer_types) else "?" for i in layer_ids}
    linear = [i for i, kind in kinds.items() if kind == "linear_attention"]
    evidence = ", ".join(f"{i}: {kind}" for i, kind in kinds.items())
    if not linear:
        return Check(TAPPED_LAYERS, OK, "every tapped layer is a full-attention layer, as SpecForge's Qwen3.5 recipe "
                     "taps", evidence)
    return Check(TAPPED_LAYERS, INFO, f"{len(linear)} of {len(layer_ids)} tapped layers are Gated DeltaNet "
                 "(linear-attention) layers: their features carry the recurrent state, whose kernel path and "
                 "rollback (cache crop) differ between boxes and engines", f"{evidence}; SpecForge's Qwen3.5 recipe "
                 "taps full-attention layers only (SpecForge #495)")
