"""DFlash block-diffusion drafter in plain PyTorch, loading and saving.

Same maths as z-lab's ``dflash/model.py`` (``DFlashDraftModel``), so released
z-lab weights give the same outputs, written as small modules:

    context = hidden_norm(fc(cat([h[i + 1] for i in target_layer_ids], -1)))   # [T, H]
    x       = embed([anchor, mask, ..., mask]) * input_embedding_scale         # [Bs, H]
    for each layer:
        x = x + attn(input_layernorm(x), context)    # Q: block; K, V: cat(context, block)
        x = x + mlp(post_attention_layernorm(x))     # SwiGLU
    logits = lm_head(norm(x)[1:]) * output_multiplier  (optional tanh softcap)

Attention inside a block is bidirectional, except for layers whose
``layer_types`` entry is ``sliding_attention``: those are causal with a sliding
window (z-lab's ``is_causal`` / ``_attention_mask``). RoPE positions are absolute:
context feature t sits at position t, block slot j of an anchor at p at p + j.

Two ways to run it:
- ``forward_block``: the z-lab call, each block sees all the context it is given.
- ``forward_anchors``: teacher-forced evaluation of many anchors of one sequence in
  one call; the context K/V are computed once, each anchor attends to the context
  strictly before it plus its own block (an explicit boolean mask, as SpecForge
  trains). Equal to one ``forward_block`` per anchor with ``context[:, :p]``.

Loading accepts z-lab directories and teams' training checkpoints and turns every
problem into a one-line ``DraftboardError``. ``.pt`` / ``.bin`` files are only ever
read with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tracker.errors import DraftboardError

__all__ = [
    "DrafterConfig",
    "DFlashDrafter",
    "LoadedDrafter",
    "build_target_layer_ids",
    "tapped_features",
    "load_drafter",
    "save_zlab",
    "parse_dtype",
]

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

# forward_anchors runs at most CHUNK anchors at a time (small chunks of sorted anchors
# waste little on the context a chunk's earlier anchors must not see), and fewer when
# their attention scores (n_anchors * heads * block_size * context_len elements) would
# exceed SCORE_BUDGET (2**27 fp32 = 512 MiB).
CHUNK = 64
SCORE_BUDGET = 1 << 27

# Prefixes that wrappers put in front of the drafter's keys (DDP, trainer wrappers).
KEY_PREFIXES = ("module.", "model.", "draft_model.")
# Checkpoint keys the drafter may carry besides its own weights.
LM_HEAD_KEYS = ("lm_head.weight", "verifier_lm_head.weight")


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------

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


def _as_int(value: Any, name: str, where: str = "drafter config") -> Any:
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
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            self.layer_types = [FULL_ATTENTION] * self.num_hidden_layers
        self.validate()

    # -- derived -----------------------------------------------------------
    @property
    def n_tapped(self) -> int:
        return len(self.target_layer_ids)

    def layer_attention(self, layer_idx: int) -> tuple[bool, int | None]:
        """(is_causal, sliding_window) of one layer, as z-lab's Qwen3DFlashAttention."""
        layer_type = self.layer_types[layer_idx]
        causal = layer_type == SLIDING_ATTENTION if self.is_causal is None else bool(self.is_causal)
        window = self.sliding_window if layer_type == SLIDING_ATTENTION else None
        return causal, window

    def validate(self) -> None:
        where = "drafter config"
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

    # -- (de)serialisation ---------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        d: dict,
        *,
        n_tapped: int | None = None,
        num_target_layers: int | None = None,
    ) -> "DrafterConfig":
        """Parse a z-lab / Qwen3 config dict.

        DFlash fields are read from ``dflash_config`` first, then the top level (z-lab's
        ``_draft_value``). When ``target_layer_ids`` is missing they are built with
        ``build_target_layer_ids(num_target_layers, n_tapped)``; ``num_target_layers``
        comes from the config, else the argument; ``n_tapped`` defaults to
        ``num_hidden_layers`` (SpecForge's convention).
        """
        where = "drafter config"
        if not isinstance(d, dict):
            raise DraftboardError(f"{where}: expected a JSON object, got {type(d).__name__}")
        dflash = d.get("dflash_config") or {}
        if not isinstance(dflash, dict):
            raise DraftboardError(f"{where}: dflash_config must be an object")

        def draft(name: str, default: Any = None) -> Any:
            return dflash.get(name, d.get(name, default))

        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            if d.get(key) is None:
                raise DraftboardError(f"{where}: missing {key}")
        hidden = _as_int(d.get("hidden_size"), "hidden_size")
        heads = _as_int(d.get("num_attention_heads"), "num_attention_heads")
        layers = _as_int(d.get("num_hidden_layers"), "num_hidden_layers")
        kv_heads = _as_int(d.get("num_key_value_heads"), "num_key_value_heads") or heads
        head_dim = _as_int(d.get("head_dim"), "head_dim") or hidden // heads

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
        sliding_window = _as_int(d.get("sliding_window"), "sliding_window") if use_sw else None
        layer_types = d.get("layer_types")
        if layer_types is None:
            max_window_layers = _as_int(d.get("max_window_layers", 28), "max_window_layers")
            layer_types = [
                SLIDING_ATTENTION if sliding_window is not None and i >= max_window_layers
                else FULL_ATTENTION
                for i in range(layers)
            ]

        ntl = _as_int(d.get("num_target_layers"), "num_target_layers")
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
        ids = [_as_int(i, "dflash_config.target_layer_ids entry") for i in ids]

        softcap = draft("final_logit_softcapping")
        softcap = float(softcap) if softcap is not None and float(softcap) > 0 else None
        is_causal = d.get("is_causal")
        return cls(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=_as_int(d.get("intermediate_size"), "intermediate_size"),
            target_layer_ids=ids,
            block_size=_as_int(draft("block_size", 16), "block_size"),
            mask_token_id=_as_int(draft("mask_token_id"), "dflash_config.mask_token_id"),
            num_target_layers=ntl,
            vocab_size=_as_int(d.get("vocab_size"), "vocab_size"),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            attention_bias=bool(d.get("attention_bias", False)),
            hidden_act=str(d.get("hidden_act", "silu")),
            rope_theta=rope_theta,
            max_position_embeddings=_as_int(d.get("max_position_embeddings", 32768), "max_position_embeddings"),
            layer_types=list(layer_types),
            sliding_window=sliding_window,
            is_causal=None if is_causal is None else bool(is_causal),
            input_embedding_scale=float(draft("input_embedding_scale", 1.0)),
            output_multiplier=float(draft("output_multiplier", 1.0)),
            final_logit_softcapping=softcap,
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
        d: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
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


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in fp32, scale in the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Default RoPE tables for integer positions [...] -> cos, sin [..., head_dim] (fp32 maths)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim)
    )
    freqs = positions[..., None].float() * inv_freq  # [..., D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, S, D]; cos, sin [..., S, D] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    return x * cos + _rotate_half(x) * sin


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None):
    """Boolean visibility of keys at k_pos from queries at q_pos (broadcasting), or None if all."""
    if not causal and window is None:
        return None
    dist = q_pos - k_pos  # query position - key position
    vis = dist >= 0 if causal else torch.ones_like(dist, dtype=torch.bool)
    if window is not None:
        vis = vis & (dist < window)
        if not causal:
            vis = vis & (-dist < window)
    return vis


_BMM_OUT_DTYPE_OK = True


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched matmul with fp32 output: half inputs keep tensor cores (CUDA out_dtype) where possible."""
    global _BMM_OUT_DTYPE_OK
    if a.dtype == torch.float32:
        return torch.bmm(a, b)
    if _BMM_OUT_DTYPE_OK and a.is_cuda and a.dtype in (torch.float16, torch.bfloat16):
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            _BMM_OUT_DTYPE_OK = False
    return torch.bmm(a.float(), b.float())


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

class DFlashAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer_idx: int):
        super().__init__()
        H, D = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, D
        self.scaling = D ** -0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(H, self.n_heads * D, bias=bias)
        self.k_proj = nn.Linear(H, self.n_kv * D, bias=bias)
        self.v_proj = nn.Linear(H, self.n_kv * D, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * D, H, bias=bias)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.is_causal, self.sliding_window = cfg.layer_attention(layer_idx)

    def _q(self, h, cos, sin):  # h [B, S, H] -> [B, nh, S, D]
        B, S, _ = h.shape
        q = self.q_norm(self.q_proj(h).view(B, S, self.n_heads, self.head_dim)).transpose(1, 2)
        return _apply_rope(q, cos, sin)

    def _k(self, x, cos, sin):  # x [..., S, H] -> [..., nkv, S, D]
        k = self.k_proj(x).unflatten(-1, (self.n_kv, self.head_dim))
        return _apply_rope(self.k_norm(k).transpose(-3, -2), cos, sin)

    def _v(self, x):  # x [..., S, H] -> [..., nkv, S, D]
        return self.v_proj(x).unflatten(-1, (self.n_kv, self.head_dim)).transpose(-3, -2)

    def forward(self, h, ctx, cos, sin, mask):
        """z-lab attention. h [B, S, H] (block), ctx [B, C, H], cos/sin [B, C+S, D], mask [B, 1, S, C+S] | None."""
        B, S, _ = h.shape
        C = ctx.shape[1]
        q = self._q(h, cos[:, C:], sin[:, C:])  # [B, nh, S, D]
        k = torch.cat([self.k_proj(ctx), self.k_proj(h)], dim=1)  # [B, C+S, nkv*D]
        k = self.k_norm(k.view(B, C + S, self.n_kv, self.head_dim)).transpose(1, 2)
        k = _apply_rope(k, cos, sin)  # [B, nkv, C+S, D]
        v = torch.cat([self.v_proj(ctx), self.v_proj(h)], dim=1)
        v = v.view(B, C + S, self.n_kv, self.head_dim).transpose(1, 2)  # [B, nkv, C+S, D]
        g = self.n_heads // self.n_kv
        if g > 1:  # GQA: query head i uses kv head i // g
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim))

    def context_kv(self, ctx, cos, sin):
        """K, V of the projected context ctx [T, H] at positions with cos/sin [T, D] -> [nkv, T, D] each."""
        return self._k(ctx, cos, sin), self._v(ctx)

    def forward_anchors(self, h, kc, vc, ctx_masked, blk_vis, cos, sin):
        """Many anchors of one sequence against a shared context.

        h [n, S, H] block states; kc, vc [nkv, L, D] context K/V (already sliced);
        ctx_masked [n, S or 1, L] bool, True where a context key is NOT visible;
        blk_vis [S, S] bool (True = visible) | None; cos, sin [n, S, D].
        """
        n, S, _ = h.shape
        nkv, L, D = kc.shape
        g = self.n_heads // nkv
        dtype = h.dtype
        q = self._q(h, cos, sin)  # [n, nh, S, D], head = kv * g + i
        kb = self._k(h, cos, sin)  # [n, nkv, S, D]
        vb = self._v(h)  # [n, nkv, S, D]
        qg = q.reshape(n, nkv, g * S, D)

        # block scores [n, nkv, g, S, S] (fp32)
        s_blk = _bmm_f32(qg.reshape(n * nkv, g * S, D), kb.reshape(n * nkv, S, D).transpose(1, 2))
        s_blk = s_blk.mul_(self.scaling).view(n, nkv, g, S, S)
        if blk_vis is not None:
            s_blk = s_blk.masked_fill_(~blk_vis, float("-inf"))
        m = s_blk.detach().amax(-1, keepdim=True)  # every row sees its own slot: finite
        if L > 0:
            # context scores [nkv, n, g, S, L]: one GEMM per kv head over all anchors
            q_kv = qg.transpose(0, 1).reshape(nkv, n * g * S, D)
            s_ctx = _bmm_f32(q_kv, kc.transpose(1, 2)).mul_(self.scaling).view(nkv, n, g, S, L)
            s_ctx = s_ctx.masked_fill_(ctx_masked[None, :, None], float("-inf"))
            m = torch.maximum(m, s_ctx.detach().amax(-1, keepdim=True).transpose(0, 1))
        # joint softmax over [context | block] without concatenating
        e_blk = (s_blk - m).exp_()  # [n, nkv, g, S, S]
        denom = e_blk.sum(-1, keepdim=True)
        out = _bmm_f32(e_blk.to(dtype).view(n * nkv, g * S, S), vb.reshape(n * nkv, S, D))
        out = out.view(n, nkv, g, S, D)
        if L > 0:
            e_ctx = s_ctx.sub_(m.transpose(0, 1)).exp_()  # [nkv, n, g, S, L], in place
            denom = denom + e_ctx.sum(-1, keepdim=True).transpose(0, 1)
            o_ctx = _bmm_f32(e_ctx.to(dtype).view(nkv, n * g * S, L), vc)  # [nkv, n*g*S, D]
            out = out + o_ctx.view(nkv, n, g, S, D).transpose(0, 1)
        out = (out / denom).to(dtype)  # [n, nkv, g, S, D]
        out = out.permute(0, 3, 1, 2, 4).reshape(n, S, self.n_heads * D)
        return self.o_proj(out)


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(cfg, layer_idx)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def _mlp(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, ctx, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, mask)
        return self._mlp(x)

    def forward_anchors(self, x, kc, vc, ctx_masked, blk_vis, cos, sin):
        x = x + self.self_attn.forward_anchors(self.input_layernorm(x), kc, vc, ctx_masked, blk_vis, cos, sin)
        return self._mlp(x)


class DFlashDrafter(nn.Module):
    """The DFlash drafter (no embeddings, no lm_head: both come from the target)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.n_tapped * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module, std: float = 0.02) -> None:
        if isinstance(module, nn.Linear) and module.weight.device.type != "meta":
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # -- properties --------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def mask_token_id(self) -> int | None:
        return self.cfg.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.cfg.target_layer_ids)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    # -- inputs / outputs ----------------------------------------------------
    def block_embeddings(self, anchor_tokens: torch.Tensor, embed_weight: torch.Tensor,
                         block_size: int | None = None) -> torch.Tensor:
        """[anchor, mask x (Bs-1)] through the target's embedding: anchor_tokens [N] -> [N, Bs, H]."""
        if self.cfg.mask_token_id is None:
            raise DraftboardError("drafter config has no dflash_config.mask_token_id")
        Bs = block_size or self.cfg.block_size
        ids = torch.full((anchor_tokens.shape[0], Bs), self.cfg.mask_token_id,
                         dtype=torch.long, device=anchor_tokens.device)
        ids[:, 0] = anchor_tokens
        return F.embedding(ids, embed_weight) * float(self.cfg.input_embedding_scale)

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """hidden [..., Bs, H] -> logits [..., Bs-1, V] of block positions 1.. (z-lab compute_logits)."""
        logits = F.linear(hidden[..., 1:, :], lm_head_weight.to(hidden.dtype))
        logits = logits * float(self.cfg.output_multiplier)
        cap = self.cfg.final_logit_softcapping
        if cap is not None and cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def project_context(self, context: torch.Tensor) -> torch.Tensor:
        """Tapped features [..., T, n_tapped*H] -> context states [..., T, H]."""
        if context.shape[-1] != self.fc.in_features:
            raise DraftboardError(
                f"drafter context has width {context.shape[-1]}, expected {self.fc.in_features} "
                f"({self.cfg.n_tapped} tapped layers x hidden {self.cfg.hidden_size})"
            )
        return self.hidden_norm(self.fc(context.to(self.dtype)))

    def _rope(self, positions: torch.Tensor):
        return rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.dtype)

    # -- forward passes --------------------------------------------------------
    def forward_block(
        self,
        context: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
    ) -> torch.Tensor:
        """z-lab forward: every block sees all given context and its whole block.

        context [B or 1, C, n_tapped*H]; ctx_positions [C] or [B, C];
        block_embeds [B, Bs, H]; block_positions [Bs] or [B, Bs]  ->  hidden [B, Bs, H] (after norm).
        """
        B, Bs, _ = block_embeds.shape
        ctx = self.project_context(context)  # [B|1, C, H]
        C = ctx.shape[1]
        ctx = ctx.expand(B, C, -1)
        ctx_pos = ctx_positions.to(self.device).long().expand(B, C)
        blk_pos = block_positions.to(self.device).long().expand(B, Bs)
        pos = torch.cat([ctx_pos, blk_pos], dim=1)  # [B, C+Bs]
        cos, sin = self._rope(pos)  # [B, C+Bs, D]
        masks: dict[tuple[bool, int | None], torch.Tensor | None] = {}
        x = block_embeds.to(self.dtype)
        for layer in self.layers:
            kind = (layer.self_attn.is_causal, layer.self_attn.sliding_window)
            if kind not in masks:
                vis = _visible(blk_pos[:, :, None], pos[:, None, :], *kind)  # [B, Bs, C+Bs]
                masks[kind] = None if vis is None else vis[:, None]
            x = layer(x, ctx, cos, sin, masks[kind])
        return self.norm(x)

    forward = forward_block

    def forward_anchors(
        self,
        context: torch.Tensor,
        anchors: torch.Tensor,
        block_embeds: torch.Tensor,
        chunk: int | None = None,
    ) -> torch.Tensor:
        """Teacher-forced blocks at many anchors of ONE sequence.

        context [1, T, n_tapped*H] (tapped features of positions 0..T-1); anchors [N] with
        0 <= p <= T; block_embeds [N, Bs, H]  ->  hidden [N, Bs, H]. The block of anchor p
        sees context positions < p and its whole block (sliding layers: causal + window),
        at RoPE positions p..p+Bs-1: the same as ``forward_block(context[:, :p], arange(p),
        block_embeds[i:i+1], p + arange(Bs))``. Anchors are sorted and run ``chunk`` at a time
        (default: CHUNK, fewer if their scores would exceed SCORE_BUDGET); a chunk only reads
        the context its anchors can see (up to its last anchor, from the window's start).
        """
        if context.dim() != 3 or context.shape[0] != 1:
            raise DraftboardError(f"forward_anchors takes context [1, T, F], got {list(context.shape)}")
        anchors = anchors.to(self.device).long().reshape(-1)
        N = anchors.shape[0]
        if block_embeds.dim() != 3 or block_embeds.shape[0] != N:
            raise DraftboardError(
                f"forward_anchors: block_embeds {list(block_embeds.shape)} does not match {N} anchors"
            )
        T = context.shape[1]
        Bs = block_embeds.shape[1]
        H = self.cfg.hidden_size
        out = torch.empty(N, Bs, H, dtype=self.dtype, device=self.device)
        if N == 0:
            return out
        order = torch.argsort(anchors, stable=True)
        p_sorted = anchors[order]
        p_list = p_sorted.tolist()
        if p_list[0] < 0 or p_list[-1] > T:
            raise DraftboardError(f"forward_anchors: anchors must lie in [0, {T}], got {p_list[0]}..{p_list[-1]}")

        ctx = self.project_context(context)[0]  # [T, H], projected once
        cos_c, sin_c = self._rope(torch.arange(T, device=self.device))  # [T, D]
        ctx_kv = [layer.self_attn.context_kv(ctx, cos_c, sin_c) for layer in self.layers]  # [nkv, T, D] x2
        j = torch.arange(Bs, device=self.device)
        kinds = [(layer.self_attn.is_causal, layer.self_attn.sliding_window) for layer in self.layers]
        blk_vis = {kind: _visible(j[:, None], j[None, :], *kind) for kind in set(kinds)}  # [Bs, Bs]
        if chunk is None:
            chunk = min(CHUNK, SCORE_BUDGET // (self.cfg.num_attention_heads * Bs * (T + Bs)))
        chunk = max(1, int(chunk))
        block_embeds = block_embeds.to(device=self.device, dtype=self.dtype)

        for s in range(0, N, chunk):
            idx = order[s : s + chunk]
            p = p_sorted[s : s + chunk]  # [n], ascending
            hi = p_list[min(s + chunk, N) - 1]  # no anchor in the chunk sees positions >= hi
            blk_pos = p[:, None] + j  # [n, Bs]
            cos, sin = self._rope(blk_pos)  # [n, Bs, D]
            x = block_embeds[idx]
            ctx_masks: dict = {}  # per layer kind: (lo, masked-out [n, 1 or Bs, hi - lo])
            for layer, (kc, vc), kind in zip(self.layers, ctx_kv, kinds):
                if kind not in ctx_masks:
                    window = kind[1]
                    # the chunk's first anchor reaches furthest back: t > p_first - window
                    lo = min(hi, max(0, p_list[s] - window + 1)) if window is not None else 0
                    t = torch.arange(lo, hi, device=self.device)
                    masked = t >= p[:, None, None]  # [n, 1, L]: only t < p is visible
                    if window is not None:  # query p+j sees t > p+j-window
                        masked = masked | (blk_pos[:, :, None] - t >= window)  # [n, Bs, L]
                    ctx_masks[kind] = (lo, masked)
                lo, masked = ctx_masks[kind]
                x = layer.forward_anchors(x, kc[:, lo:hi], vc[:, lo:hi], masked, blk_vis[kind], cos, sin)
            out[idx] = self.norm(x)
        return out


def tapped_features(hidden_states, target_layer_ids) -> torch.Tensor:
    """z-lab extract_context_feature: cat([h[i + 1] for i in ids], -1); h[0] is the embeddings."""
    return torch.cat([hidden_states[i + 1] for i in target_layer_ids], dim=-1)


# ---------------------------------------------------------------------------
# Loading and saving
# ---------------------------------------------------------------------------

@dataclass
class LoadedDrafter:
    model: DFlashDrafter
    config: DrafterConfig
    own_lm_head: torch.Tensor | None
    source: str
    own_lm_head_key: str | None = None
    warnings: list[str] = field(default_factory=list)


_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise DraftboardError(f"unknown dtype {dtype!r}: use fp32, bf16 or fp16")
    return _DTYPES[key]


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text[:300]


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DraftboardError(f"cannot read drafter config {path}: {_one_line(e)}") from None
    if not isinstance(data, dict):
        raise DraftboardError(f"drafter config {path} is not a JSON object")
    return data


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            meta = fh.metadata() or {}
            sd = {k: fh.get_tensor(k) for k in fh.keys()}
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise DraftboardError(
            f"cannot read {path}: truncated or corrupt safetensors file ({_one_line(e)}); re-copy or re-save it"
        ) from None
    config = None
    if "config" in meta:
        try:
            config = json.loads(meta["config"])
        except ValueError as e:
            raise DraftboardError(f"{path}: metadata 'config' is not valid JSON ({_one_line(e)})") from None
    return sd, config


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _read_torch(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e).lower():
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise DraftboardError(
                f"{path}: refused to unpickle: the file needs code execution to load "
                f"(torch.load weights_only=True failed: {first[:160]}); re-save it as a plain "
                "state_dict or safetensors"
            ) from None
        raise DraftboardError(f"cannot read {path}: truncated or corrupt checkpoint ({_one_line(e)})") from None
    except Exception as e:  # zip / EOF / IO errors of a damaged file
        raise DraftboardError(f"cannot read {path}: truncated or corrupt checkpoint ({_one_line(e)})") from None
    if not isinstance(obj, dict):
        raise DraftboardError(f"{path}: expected a state_dict or a dict with 'state_dict', got {type(obj).__name__}")
    config = obj.get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError as e:
            raise DraftboardError(f"{path}: entry 'config' is not valid JSON ({_one_line(e)})") from None
    if config is not None and not isinstance(config, dict):
        raise DraftboardError(f"{path}: entry 'config' must be a dict or JSON string")
    for key in ("state_dict", "model", "model_state_dict", "draft_model", "module"):
        if _is_state_dict(obj.get(key)):
            return dict(obj[key]), config
    sd = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not sd:
        raise DraftboardError(
            f"{path}: no tensors found (expected a state_dict, or a dict with 'state_dict' or 'model')"
        )
    return sd, config


def _read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    if path.name.endswith(".safetensors.index.json"):
        index = _read_json(path)
        shards = sorted(set((index.get("weight_map") or {}).values()))
        if not shards:
            raise DraftboardError(f"{path}: empty weight_map")
        sd: dict[str, torch.Tensor] = {}
        for shard in shards:
            part, _ = _read_safetensors(path.parent / shard)
            sd.update(part)
        return sd, None
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    if path.suffix in (".pt", ".pth", ".bin"):
        return _read_torch(path)
    raise DraftboardError(f"{path}: unknown checkpoint format (use .safetensors, .pt or .bin)")


def _find_weights(directory: Path) -> Path:
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (directory / name).is_file():
            return directory / name
    found = [p for p in sorted(directory.iterdir())
             if p.is_file() and p.suffix in (".safetensors", ".pt", ".pth", ".bin")]
    if len(found) == 1:
        return found[0]
    raise DraftboardError(
        f"{directory}: expected model.safetensors (found {len(found)} candidate weight files); "
        "pass the checkpoint file itself"
    )


def _strip_prefixes(sd: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        name = key
        while True:
            for prefix in KEY_PREFIXES:
                if name.startswith(prefix):
                    name = name[len(prefix):]
                    break
            else:
                break
        if name.endswith("rotary_emb.inv_freq"):  # derived buffer some trainers save
            continue
        if name in out:
            raise DraftboardError(f"{path}: key {key!r} collides with another key after stripping prefixes")
        out[name] = value
    return out


def _check_keys(expected: dict[str, torch.Tensor], sd: dict[str, torch.Tensor], path: Path) -> None:
    missing = [k for k in expected if k not in sd]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DraftboardError(
            f"{path}: missing key {missing[0]}{more}: the checkpoint does not match the config "
            f"(expected shape {_shape(expected[missing[0]])})"
        )
    unexpected = [k for k in sd if k not in expected and k not in LM_HEAD_KEYS]
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise DraftboardError(
            f"{path}: unexpected key {unexpected[0]} {_shape(sd[unexpected[0]])}{more}: "
            "not part of a DFlash drafter with this config"
        )
    for key, ref in expected.items():
        if tuple(sd[key].shape) != tuple(ref.shape):
            raise DraftboardError(
                f"{path}: tensor {key} has shape {_shape(sd[key])}, the config expects {_shape(ref)}"
            )


def load_drafter(
    path: str | Path,
    *,
    target_hidden_size: int | None = None,
    target_num_layers: int | None = None,
    target_vocab_size: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
) -> LoadedDrafter:
    """Load a z-lab drafter directory or a team's checkpoint file, validated against the target.

    Config precedence for a file: embedded (safetensors metadata "config", or a .pt dict's
    "config") > ``<file>.json`` > ``config.json`` next to it.
    """
    path = Path(path)
    dtype = parse_dtype(dtype)
    if not path.exists():
        raise DraftboardError(f"drafter checkpoint {path} does not exist")
    warnings: list[str] = []

    # -- read weights and config ---------------------------------------------
    if path.is_dir():
        weights_path = _find_weights(path)
        if not (path / "config.json").is_file():
            raise DraftboardError(f"{path}: no config.json in the drafter directory")
        sd, embedded = _read_weights(weights_path)
        raw, config_src = _read_json(path / "config.json"), "config.json"
        if embedded is not None:
            warnings.append("ignored the config embedded in the weights; config.json wins in a directory")
        kind = "z-lab directory"
    else:
        weights_path = path
        sd, embedded = _read_weights(path)
        sidecars = [path.with_name(path.name + ".json"), path.parent / "config.json"]
        if embedded is not None:
            raw, config_src = embedded, "embedded config"
        else:
            sidecar = next((p for p in sidecars if p.is_file() and p != path), None)
            if sidecar is None:
                raise DraftboardError(
                    f"{path}: no drafter config: embed it (safetensors metadata 'config', or a .pt "
                    f"dict with 'config'), or put {path.name}.json or config.json next to it"
                )
            raw, config_src = _read_json(sidecar), sidecar.name
        kind = f"{path.suffix.lstrip('.')} checkpoint"
    where = str(weights_path)
    sd = _strip_prefixes(sd, weights_path)

    # -- config, with what the weights tell us -----------------------------------
    fc = sd.get("fc.weight")
    if fc is None:
        raise DraftboardError(f"{where}: missing key fc.weight: not a DFlash drafter checkpoint")
    hidden = raw.get("hidden_size")
    if hidden is None:
        raise DraftboardError(f"{where}: the {config_src} has no hidden_size")
    if fc.dim() != 2 or not isinstance(hidden, int) or hidden < 1 or fc.shape[1] % hidden or fc.shape[0] != hidden:
        raise DraftboardError(
            f"{where}: fc.weight has shape {_shape(fc)}, expected [hidden_size, n_tapped*hidden_size] "
            f"with hidden_size={hidden!r} from the {config_src}"
        )
    n_tapped = fc.shape[1] // hidden
    raw = dict(raw)
    if raw.get("head_dim") is None:  # z-lab would use Qwen3Config's default; trust the weights
        q_norm = sd.get("layers.0.self_attn.q_norm.weight")
        if q_norm is not None and q_norm.dim() == 1:
            raw["head_dim"] = int(q_norm.shape[0])
    cfg = DrafterConfig.from_dict(raw, n_tapped=n_tapped, num_target_layers=target_num_layers)
    if cfg.n_tapped != n_tapped:
        raise DraftboardError(
            f"{where}: fc.weight has shape {_shape(fc)} = {n_tapped} tapped layers x hidden {hidden}, "
            f"but dflash_config.target_layer_ids {cfg.target_layer_ids} has {cfg.n_tapped}"
        )

    # -- against the target ---------------------------------------------------------
    if target_hidden_size is not None and cfg.hidden_size != target_hidden_size:
        raise DraftboardError(
            f"{where}: drafter hidden_size {cfg.hidden_size} (fc.weight {_shape(fc)}) does not match "
            f"the target's hidden size {target_hidden_size}: this drafter is for another target"
        )
    n_layers = target_num_layers if target_num_layers is not None else cfg.num_target_layers
    if n_layers is not None:
        bad = [i for i in cfg.target_layer_ids if i >= n_layers]
        if bad:
            raise DraftboardError(
                f"{where}: target_layer_ids {cfg.target_layer_ids} out of range for a target with "
                f"{n_layers} layers (ids must be < {n_layers})"
            )
    if (target_num_layers is not None and cfg.num_target_layers is not None
            and cfg.num_target_layers != target_num_layers):
        warnings.append(
            f"config num_target_layers={cfg.num_target_layers} but the target has {target_num_layers} layers"
        )
    if target_vocab_size is not None and cfg.vocab_size is not None and cfg.vocab_size != target_vocab_size:
        raise DraftboardError(
            f"{where}: drafter vocab_size {cfg.vocab_size} does not match the target's vocab size {target_vocab_size}"
        )
    vocab = target_vocab_size if target_vocab_size is not None else cfg.vocab_size
    if cfg.mask_token_id is None:
        raise DraftboardError(f"{where}: the {config_src} has no dflash_config.mask_token_id")
    if vocab is not None and cfg.mask_token_id >= vocab:
        raise DraftboardError(f"{where}: mask_token_id {cfg.mask_token_id} is outside the vocab of {vocab} tokens")

    own_key = next((k for k in LM_HEAD_KEYS if k in sd), None)
    for key in LM_HEAD_KEYS:
        if key not in sd:
            continue
        head = sd[key]
        if head.dim() != 2 or head.shape[1] != cfg.hidden_size:
            raise DraftboardError(
                f"{where}: {key} has shape {_shape(head)}, expected [vocab, {cfg.hidden_size}]"
            )
        if vocab is not None and head.shape[0] != vocab:
            raise DraftboardError(
                f"{where}: {key} has shape {_shape(head)}: {head.shape[0]} rows but the "
                f"{'target' if target_vocab_size is not None else 'config'} vocab size is {vocab}"
            )

    # -- weights ------------------------------------------------------------------
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    expected = model.state_dict()
    _check_keys(expected, sd, weights_path)
    for key, value in sd.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise DraftboardError(f"{where}: tensor {key} {_shape(value)} contains NaN or Inf values")
    state = {k: sd[k].to(device=device, dtype=dtype).contiguous() for k in expected}
    model.load_state_dict(state, assign=True)
    model.eval().requires_grad_(False)
    own = sd[own_key].to(device=device, dtype=dtype) if own_key else None
    return LoadedDrafter(
        model=model,
        config=cfg,
        own_lm_head=own,
        source=f"{kind} {path} (config: {config_src})",
        own_lm_head_key=own_key,
        warnings=warnings,
    )


def save_zlab(
    model: DFlashDrafter,
    config: DrafterConfig | None,
    out_dir: str | Path,
    *,
    lm_head: torch.Tensor | None = None,
) -> Path:
    """Write config.json + model.safetensors in z-lab's layout (``load_drafter`` reads it back)."""
    from safetensors.torch import save_file

    config = config or model.cfg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if lm_head is not None:
        tensors["lm_head.weight"] = lm_head.detach().to("cpu").contiguous()
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
