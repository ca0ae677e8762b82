"""The drafter's architecture: z-lab's config.json (a Qwen3 config plus DFlash fields), parsed and checked.

Sizes are bounded (`evaluators.limits`) before anything grows with them: a config saying
`num_hidden_layers` 10**9 is refused here, not after a 7 GB list of layer types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from evaluators.limits import check_sizes
from tracker.errors import DraftboardError

FULL_ATTENTION = "full_attention"
DFLASH, DFLASH2, JETSPEC = "dflash", "dflash2", "jetspec"  # results `drafter.family`
# The `architectures` name each family's checkpoints carry (z-lab's model classes): vLLM picks DFlash2's
# speculator and llama.cpp's converter its DFlashModel by it. JetSpec (NVIDIA Automodel #2913) is DFlash's class
# with `dflash_config.causal` true: vLLM 0.32's qwen3_dflash and llama.cpp's converter read that flag.
ARCHITECTURES = {DFLASH: "DFlashDraftModel", DFLASH2: "DFlash2DraftModel", JETSPEC: "DFlashDraftModel"}
# Other names of those classes: Automodel writes `Qwen3DFlashDraftModel` (serving rewrites it to DFlash's).
ARCHITECTURE_ALIASES = {"Qwen3DFlashDraftModel": "DFlashDraftModel"}
# Families sharing DFlash's format whose own code draftboard does not run: refused by name, never read as DFlash.
# Model-Optimizer's `dflash_config.projector_type`, and the weights each adds (Automodel #2913: Domino's GRU head).
OTHER_FAMILIES = {"domino": "Domino (a GRU correction head, `prefix_gru` / `embed_proj`, that no engine serves)",
                  "dspark": "DeepSeek DSpark (an anchor-first layout: `sample_from_anchor` / `bonus_anchor`)"}
OTHER_FAMILY_WEIGHTS = {"prefix_gru": "domino", "embed_proj": "domino"}
ANCHOR_SWITCHES = ("sample_from_anchor", "bonus_anchor")  # speculators' layout switch: set, it is DSpark's
# DFlash2's own fields (z-lab 07ebd93 DFlash2DraftModel / CandidateSelector), read as `_draft_value` reads them.
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SLIDING_ATTENTION = "sliding_attention"
WHERE = "drafter config"


def build_target_layer_ids(num_target_layers: int, n_tapped: int) -> list[int]:
    """z-lab's default tapped layers: 1 -> [n // 2]; else evenly spaced over [1, n - 3]."""
    num_target_layers, n_tapped = int(num_target_layers), int(n_tapped)
    if num_target_layers < 1 or n_tapped < 1:
        raise DraftboardError(
            f"cannot build target_layer_ids for {n_tapped} tapped layers of a "
            f"{num_target_layers}-layer target: both must be >= 1"
        )
    if n_tapped == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (n_tapped - 1))) for i in range(n_tapped)]


def as_int(value: Any, name: str, where: str = WHERE) -> Any:
    """value as int (None stays None); DraftboardError naming the field otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise DraftboardError(f"{where}: {name} must be an integer, got {value!r}")
    return int(value)


@dataclass
class DrafterConfig:
    """The drafter's architecture: a Qwen3 config plus the DFlash fields."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: list[int]
    block_size: int = 16
    mask_token_id: int | None = None
    num_target_layers: int | None = None
    vocab_size: int | None = None
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    layer_types: list[str] = field(default_factory=list)  # filled with full_attention
    sliding_window: int | None = None  # effective window (None unless use_sliding_window)
    is_causal: bool | None = None  # z-lab override of the per-layer-type causality
    causal: bool | None = None  # dflash_config.causal (JetSpec: causal in-block attention), below is_causal
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    family: str = DFLASH
    # DFlash2 only: the grouped dynamic causal convs and the candidate selector
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None

    def __post_init__(self) -> None:
        check_sizes(vars(self), WHERE)  # before layer_types grows with num_hidden_layers
        if not self.layer_types:
            self.layer_types = [FULL_ATTENTION] * self.num_hidden_layers
        self.validate()

    # -- derived -----------------------------------------------------------
    @property
    def n_tapped(self) -> int:
        return len(self.target_layer_ids)

    def layer_attention(self, layer_idx: int) -> tuple[bool, int | None]:
        """(is_causal, sliding_window) of one layer, as z-lab's Qwen3DFlashAttention and vLLM 0.32's
        `_dflash_layer_causal`: `is_causal` first, then `dflash_config.causal` for every layer, then causal
        exactly where the layer slides."""
        layer_type = self.layer_types[layer_idx]
        override = self.is_causal if self.is_causal is not None else self.causal
        causal = layer_type == SLIDING_ATTENTION if override is None else bool(override)
        window = self.sliding_window if layer_type == SLIDING_ATTENTION else None
        return causal, window

    def validate(self) -> None:
        where = WHERE
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise DraftboardError(f"{where}: {name} must be a positive integer, got {value!r}")
        if self.block_size < 2:
            raise DraftboardError(f"{where}: block_size must be >= 2, got {self.block_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise DraftboardError(
                f"{where}: num_attention_heads {self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise DraftboardError(f"{where}: head_dim must be even for RoPE, got {self.head_dim}")
        if not self.target_layer_ids:
            raise DraftboardError(f"{where}: dflash_config.target_layer_ids is empty")
        if any(not isinstance(i, int) or i < 0 for i in self.target_layer_ids):
            raise DraftboardError(
                f"{where}: dflash_config.target_layer_ids must be non-negative integers, "
                f"got {self.target_layer_ids}"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise DraftboardError(
                f"{where}: layer_types has {len(self.layer_types)} entries for "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        bad = sorted(set(self.layer_types) - {FULL_ATTENTION, SLIDING_ATTENTION})
        if bad:
            raise DraftboardError(
                f"{where}: layer_types supports full_attention and sliding_attention, got {bad}"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise DraftboardError(f"{where}: sliding_window must be >= 1, got {self.sliding_window}")
        if self.hidden_act != "silu":
            raise DraftboardError(f"{where}: hidden_act {self.hidden_act!r} is not supported (only silu)")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise DraftboardError(f"{where}: mask_token_id must be >= 0, got {self.mask_token_id}")
        if self.family == DFLASH2:
            self._validate_dflash2()
        elif self.family not in (DFLASH, JETSPEC):
            raise DraftboardError(f"{where}: unknown drafter family {self.family!r}; expected one of "
                                  f"{', '.join(ARCHITECTURES)}")

    def _validate_dflash2(self) -> None:
        where = f"{WHERE} (DFlash2)"
        for name in DFLASH2_FIELDS:
            value = getattr(self, name)
            if value is None:
                raise DraftboardError(f"{where}: missing dflash_config.{name}")
            if not isinstance(value, int) or value < 1:
                raise DraftboardError(f"{where}: {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.conv_group_size:
            raise DraftboardError(f"{where}: conv_group_size {self.conv_group_size} does not divide hidden_size "
                                  f"{self.hidden_size} (the convs split the hidden state into equal groups)")
        if self.vocab_size is None:
            raise DraftboardError(f"{where}: missing vocab_size (the selector's codebooks have one row per token)")
        if self.selector_top_k > self.vocab_size:
            raise DraftboardError(f"{where}: selector_top_k {self.selector_top_k} exceeds vocab_size {self.vocab_size}")

    # -- (de)serialisation ---------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        d: dict,
        *,
        n_tapped: int | None = None,
        num_target_layers: int | None = None,
    ) -> DrafterConfig:
        """Parse a z-lab / Qwen3 config dict.

        DFlash fields are read from ``dflash_config`` first, then the top level (z-lab's
        ``_draft_value``). When ``target_layer_ids`` is missing they are built with
        ``build_target_layer_ids(num_target_layers, n_tapped)``; ``num_target_layers``
        comes from the config, else the argument; ``n_tapped`` defaults to
        ``num_hidden_layers`` (SpecForge's convention).
        """
        where = WHERE
        if not isinstance(d, dict):
            raise DraftboardError(f"{where}: expected a JSON object, got {type(d).__name__}")
        check_sizes(d, where)
        dflash = d.get("dflash_config") or {}
        if not isinstance(dflash, dict):
            raise DraftboardError(f"{where}: dflash_config must be an object")

        def draft(name: str, default: Any = None) -> Any:
            return dflash.get(name, d.get(name, default))

        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if d.get(key) is None:
                raise DraftboardError(f"{where}: missing {key}")
        hidden = as_int(d.get("hidden_size"), "hidden_size")
        heads = as_int(d.get("num_attention_heads"), "num_attention_heads")
        layers = as_int(d.get("num_hidden_layers"), "num_hidden_layers")
        kv_heads = as_int(d.get("num_key_value_heads"), "num_key_value_heads") or heads
        head_dim = as_int(d.get("head_dim"), "head_dim") or hidden // heads

        # RoPE: top-level rope_theta, legacy rope_scaling, or transformers-5 rope_parameters.
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
            raise DraftboardError(f"{where}: per-layer-type rope_parameters are not supported")
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type != "default":
            raise DraftboardError(
                f"{where}: rope type {rope_type!r} is not supported (only the default RoPE)"
            )
        if float(d.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
            raise DraftboardError(f"{where}: partial_rotary_factor is not supported")
        rope_theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))

        # Sliding windows as Qwen3Config: the window only exists with use_sliding_window.
        use_sw = bool(d.get("use_sliding_window", False))
        sliding_window = as_int(d.get("sliding_window"), "sliding_window") if use_sw else None
        layer_types = d.get("layer_types")
        if layer_types is None:
            max_window_layers = as_int(d.get("max_window_layers", 28), "max_window_layers")
            layer_types = [
                SLIDING_ATTENTION if sliding_window is not None and i >= max_window_layers
                else FULL_ATTENTION
                for i in range(layers)
            ]

        ntl = as_int(d.get("num_target_layers"), "num_target_layers")
        ids = draft("target_layer_ids")
        if ids is None:
            n_layers = ntl if ntl is not None else num_target_layers
            if n_layers is None:
                raise DraftboardError(
                    f"{where}: no dflash_config.target_layer_ids and no num_target_layers "
                    "to build them from; add target_layer_ids to the config"
                )
            ids = build_target_layer_ids(n_layers, n_tapped or layers)
        if not isinstance(ids, (list, tuple)):
            raise DraftboardError(f"{where}: dflash_config.target_layer_ids must be a list, got {ids!r}")
        ids = [as_int(i, "dflash_config.target_layer_ids entry") for i in ids]

        softcap = draft("final_logit_softcapping")
        softcap = float(softcap) if softcap is not None and float(softcap) > 0 else None
        is_causal = d.get("is_causal")
        if is_causal is not None and not isinstance(is_causal, bool):  # bool("false") is True: never guessed
            raise DraftboardError(f"{where}: is_causal must be true, false or null, got {is_causal!r:.20}")
        causal = dflash.get("causal")
        if causal is not None and not isinstance(causal, bool):
            raise DraftboardError(f"{where}: dflash_config.causal must be true or false, got {causal!r:.20}")
        dflash2 = {name: as_int(draft(name), f"dflash_config.{name}") for name in DFLASH2_FIELDS}
        family = decide_family(d, dflash, dflash2, causal)
        return cls(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=as_int(d.get("intermediate_size"), "intermediate_size"),
            target_layer_ids=ids,
            block_size=as_int(draft("block_size", 16), "block_size"),
            mask_token_id=as_int(draft("mask_token_id"), "dflash_config.mask_token_id"),
            num_target_layers=ntl,
            vocab_size=as_int(d.get("vocab_size"), "vocab_size"),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            attention_bias=bool(d.get("attention_bias", False)),
            hidden_act=str(d.get("hidden_act", "silu")),
            rope_theta=rope_theta,
            max_position_embeddings=as_int(d.get("max_position_embeddings", 32768), "max_position_embeddings"),
            layer_types=list(layer_types),
            sliding_window=sliding_window,
            is_causal=None if is_causal is None else bool(is_causal),
            causal=causal,
            input_embedding_scale=float(draft("input_embedding_scale", 1.0)),
            output_multiplier=float(draft("output_multiplier", 1.0)),
            final_logit_softcapping=softcap,
            family=family,
            **(dflash2 if family == DFLASH2 else {}),
        )

    def to_dict(self) -> dict:
        """z-lab's config.json layout (Qwen3 keys + block_size + num_target_layers + dflash_config)."""
        dflash: dict[str, Any] = {
            "target_layer_ids": list(self.target_layer_ids),
            "mask_token_id": self.mask_token_id,
            "block_size": self.block_size,
        }
        if self.input_embedding_scale != 1.0:
            dflash["input_embedding_scale"] = self.input_embedding_scale
        if self.output_multiplier != 1.0:
            dflash["output_multiplier"] = self.output_multiplier
        if self.final_logit_softcapping is not None:
            dflash["final_logit_softcapping"] = self.final_logit_softcapping
        if self.family == DFLASH2:
            dflash.update({name: getattr(self, name) for name in DFLASH2_FIELDS})
        if self.causal is not None:
            dflash["causal"] = self.causal
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.family]],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "attention_dropout": 0.0,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": False,
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": dflash,
        }
        if self.is_causal is not None:
            d["is_causal"] = self.is_causal
        return d


def decide_family(d: dict, dflash: dict, dflash2: dict, causal: bool | None) -> str:
    """The one decision of a drafter config's family: DFlash2 (its architecture or its fields), JetSpec
    (`dflash_config.causal` true), else DFlash; a family draftboard does not run, or files that disagree (an
    architecture naming one family over another's fields), refused in one line."""
    where = WHERE
    for place, holder in (("dflash_config.projector_type", dflash), ("projector_type", d)):
        projector = holder.get("projector_type")
        if projector is None:
            continue
        words = set(re.split(r"[^a-z0-9]+", projector.lower())) if isinstance(projector, str) else set()
        family = next((name for name in OTHER_FAMILIES if name in words), None)
        if family is not None:
            raise DraftboardError(f"{where}: a {OTHER_FAMILIES[family]} drafter ({place} {projector!r:.40}): draftboard "
                                  "does not run its own code, so it is refused, not read as DFlash")
        raise DraftboardError(f"{where}: {place} {projector!r:.40} names no family draftboard knows; a drafter it "
                              "cannot classify with certainty is refused, not read as DFlash")
    for switch in ANCHOR_SWITCHES:  # speculators' DFlash 1+N / DSpark anchor-first switch
        value = dflash.get(switch, d.get(switch))
        if value is not None and value is not False:
            raise DraftboardError(f"{where}: {switch} = {value!r:.20}: {OTHER_FAMILIES['dspark']}, whose own code "
                                  "draftboard does not run; refused, not read as DFlash")
    raw = d.get("architectures") if isinstance(d.get("architectures"), list) else []
    named = {ARCHITECTURE_ALIASES.get(a, a) for a in raw if isinstance(a, str)}
    fields = sorted(name for name, v in dflash2.items() if v is not None)
    if ARCHITECTURES[DFLASH2] in named or fields:
        if named and ARCHITECTURES[DFLASH2] not in named:
            raise DraftboardError(f"{where}: architectures name {sorted(named)} but dflash_config holds DFlash2's "
                                  f"fields ({', '.join(fields)}): the files disagree about the family; refused")
        return DFLASH2
    # JetSpec where its flag decides the attention: z-lab's `is_causal`, read first, may overrule it
    return JETSPEC if causal and d.get("is_causal") in (None, True) else DFLASH


SPECULATORS_TYPE = "speculators_model_type"


def from_speculators(d: dict) -> dict:
    """z-lab's config.json from a vLLM speculators DFlash config.json (`speculators_model_type: dflash`).

    speculators keeps the drafter's Qwen3 config in `transformer_layer_config` and counts the
    tapped layers from the embeddings (`aux_hidden_state_layer_ids` = target layer ids + 1, its
    convert/dflash/converter.py), so the ids are shifted back here.
    """
    where = f"{WHERE} (speculators format)"
    if d.get(SPECULATORS_TYPE) != "dflash":
        raise DraftboardError(f"{where}: {SPECULATORS_TYPE} is {d.get(SPECULATORS_TYPE)!r}, not a DFlash drafter")
    layer = d.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DraftboardError(f"{where}: transformer_layer_config must be an object")
    aux = d.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux:
        raise DraftboardError(f"{where}: aux_hidden_state_layer_ids must be a non-empty list, got {aux!r}")
    aux = [as_int(a, "aux_hidden_state_layer_ids entry", where) for a in aux]
    if min(aux) < 1:
        raise DraftboardError(f"{where}: aux_hidden_state_layer_ids {aux} count the embeddings as 0 (target "
                              "layer id + 1), so each must be >= 1")
    vocab, draft_vocab = layer.get("vocab_size"), d.get("draft_vocab_size")
    if draft_vocab is not None and vocab is not None and draft_vocab != vocab:
        raise DraftboardError(f"{where}: draft_vocab_size {draft_vocab} differs from vocab_size {vocab}: a reduced "
                              "draft vocabulary (t2d/d2t maps) is not supported")
    block_size = d.get("block_size", layer.get("block_size"))
    out = {k: v for k, v in layer.items() if k != "dflash_config"}
    out["block_size"] = block_size
    out["dflash_config"] = {"target_layer_ids": [a - 1 for a in aux], "mask_token_id": d.get("mask_token_id"),
                            "block_size": block_size}
    return out
