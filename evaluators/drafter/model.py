"""The DFlash block-diffusion drafter in plain PyTorch (z-lab's ``dflash/model.py``, ``DFlashDraftModel``
and, at 07ebd93, ``DFlash2DraftModel``).

Same maths, so released z-lab weights give the same outputs, written as small modules:

    context = hidden_norm(fc(cat([h[i + 1] for i in target_layer_ids], -1)))   # [T, H]
    x       = embed([anchor, mask, ..., mask]) * input_embedding_scale         # [Bs, H]
    for each layer:
        x = x + attn(input_layernorm(x), context)    # Q: block; K, V: cat(context, block)
        x = x + mlp(post_attention_layernorm(x))     # SwiGLU
    logits = lm_head(norm(x)[1:]) * output_multiplier  (optional tanh softcap)

DFlash2 (``cfg.family == "dflash2"``) adds, in every layer, a grouped dynamic causal conv along
the block around the attention and around the MLP (`GroupedDynamicCausalConv`), and a
`CandidateSelector` that picks each position's token among the top-k of its logits with a
bilinear predecessor x successor score, so position i's choice depends on the token at i - 1.

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
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from evaluators.drafter.config import DFLASH2, DrafterConfig
from tracker.errors import DraftboardError

# forward_anchors runs at most CHUNK anchors at a time (small chunks of sorted anchors
# waste little on the context a chunk's earlier anchors must not see), and fewer when
# their attention scores (n_anchors * heads * block_size * context_len elements) would
# exceed SCORE_BUDGET (2**27 fp32 = 512 MiB).
CHUNK = 64
SCORE_BUDGET = 1 << 27
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


def grouped_dynamic_convolve(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group_size: int):
    """Causal conv along the block with a per-position kernel (z-lab ``_grouped_dynamic_convolve``).

    x [N, S, H]; dynamic [N, S, k, G] (one weight per position, tap and group of group_size channels);
    base [k, H]  ->  y [N, S, H] with y[t] = sum_{o<k} (base[o] + dynamic[t, o]) * x[t - o], zero before slot 0.
    """
    N, S, H = x.shape
    k, G = base.shape[0], H // group_size
    groups = x.view(N, S, G, group_size)
    dynamic = dynamic.reshape(N, S, k, G, 1)
    out = torch.zeros_like(groups)
    for o in range(k):  # same order of sums as z-lab, so fp32 outputs match bit for bit
        shifted = groups if o == 0 else F.pad(groups[:, :-o], (0, 0, 0, 0, o, 0))  # x[t - o]
        out = out + base[o].view(1, 1, G, group_size).to(x.dtype) * shifted
        out = torch.addcmul(out, dynamic[:, :, o], shifted)
    return out.view_as(x)


class GroupedDynamicCausalConv(nn.Module):
    """DFlash2's conv around a sublayer: kernel row 0 on its input, row 1 on its output, both with a
    dynamic part projected from the input (the block's own states: the context is never convolved)."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden))  # [in/out, k, H]
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * (hidden // group_size), bias=False)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, S, H] -> (conv of x [N, S, H], the output's dynamic kernel [N, S, k, G])."""
        G = x.shape[-1] // self.group_size
        dynamic = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, G)
        return (grouped_dynamic_convolve(x, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size),
                dynamic[..., 1, :, :])

    def finish(self, y: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return grouped_dynamic_convolve(y, dynamic, self.base_kernel[1], self.group_size)


class CandidateSelector(nn.Module):
    """DFlash2's choice among the top-k candidates of each position (z-lab ``CandidateSelector``).

    score(i, c) = logit_i(c) + <pred[x_{i-1}] * W h_i, succ[c]>: the token chosen at i - 1 (the
    anchor for i = 1) reweighs position i's candidates. z-lab walks the positions in order, each
    choice feeding the next (`select`). Scored against a known continuation the predecessors are
    that continuation's tokens (`teacher_forced`), so all positions go at once.
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
        self.successor_codebook = nn.Embedding(cfg.vocab_size, cfg.selector_rank)
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def _candidates(self, hidden, logits):
        # hidden [N, S, H], logits [N, S, V] -> unary, candidates [N, S, K]; hidden_r [N, S, R]
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)
        return unary, candidates, self.hidden_projection(hidden)

    def _scores(self, unary, candidates, hidden_r, predecessors):
        # unary, candidates [N, K]; hidden_r [N, R]; predecessors [N] -> scores [N, K]
        pair = self.predecessor_codebook(predecessors) * hidden_r
        return unary + torch.einsum("br,bkr->bk", pair, self.successor_codebook(candidates))

    def teacher_forced(self, hidden: torch.Tensor, logits: torch.Tensor, predecessors: torch.Tensor):
        """hidden [N, S, H], logits [N, S, V], predecessors [N, S] (the token before each position)
        -> (candidates [N, S, K], scores [N, S, K])."""
        unary, candidates, hidden_r = self._candidates(hidden, logits)
        scores = torch.stack([self._scores(unary[:, i], candidates[:, i], hidden_r[:, i], predecessors[:, i])
                              for i in range(hidden.shape[1])], dim=1)
        return candidates, scores

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, temperature: float,
               generator: torch.Generator | None = None):
        """z-lab's path: hidden [N, S, H], logits [N, S, V], anchor [N] -> (path [N, S], candidates
        [N, S, K], q [N, S, K] | None: the distribution each choice was sampled from, T > 0)."""
        unary, candidates, hidden_r = self._candidates(hidden, logits)
        predecessor, path, rows = anchor, [], []
        for i in range(hidden.shape[1]):
            scores = self._scores(unary[:, i], candidates[:, i], hidden_r[:, i], predecessor)
            if temperature > 0:  # z-lab: temperature alone, no top-p / top-k over the candidates
                q = torch.softmax(scores.float() / temperature, dim=-1)
                index = torch.multinomial(q, 1, generator=generator)[:, 0]
                rows.append(q)
            else:
                index = scores.argmax(-1)
            predecessor = candidates[:, i].gather(-1, index[:, None])[:, 0]
            path.append(predecessor)
        return torch.stack(path, 1), candidates, torch.stack(rows, 1) if rows else None


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(cfg, layer_idx)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention_conv = self.mlp_conv = None
        if cfg.family == DFLASH2:
            self.attention_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    @staticmethod
    def _sublayer(x, norm, conv, sublayer):
        h = norm(x)
        if conv is None:
            return x + sublayer(h)
        h, dynamic = conv.prepare(h)
        return x + conv.finish(sublayer(h), dynamic)

    def _mlp(self, x):
        return self._sublayer(x, self.post_attention_layernorm, self.mlp_conv, self.mlp)

    def forward(self, x, ctx, cos, sin, mask):
        x = self._sublayer(x, self.input_layernorm, self.attention_conv,
                           lambda h: self.self_attn(h, ctx, cos, sin, mask))
        return self._mlp(x)

    def forward_anchors(self, x, kc, vc, ctx_masked, blk_vis, cos, sin):
        x = self._sublayer(x, self.input_layernorm, self.attention_conv,
                           lambda h: self.self_attn.forward_anchors(h, kc, vc, ctx_masked, blk_vis, cos, sin))
        return self._mlp(x)


class DFlashDrafter(nn.Module):
    """The DFlash drafter (no embeddings, no lm_head: both come from the target); with
    ``cfg.family == "dflash2"``, DFlash2 (convs in every layer, `candidate_selector`)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.n_tapped * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.candidate_selector = CandidateSelector(cfg) if cfg.family == DFLASH2 else None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module, std: float = 0.02) -> None:
        if next(module.parameters(recurse=False), torch.empty(0)).device.type == "meta":
            return
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, GroupedDynamicCausalConv):  # starts as the identity: y[t] = x[t]
            with torch.no_grad():
                module.base_kernel.zero_()[:, 0] = 1.0

    # -- properties --------------------------------------------------------
    @property
    def family(self) -> str:
        return self.cfg.family

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

    def greedy_drafts(self, hidden: torch.Tensor, logits: torch.Tensor, predecessors: torch.Tensor) -> torch.Tensor:
        """The T = 0 drafts of blocks scored against a known continuation: logits [N, S, V] of
        positions 1.., predecessors [N, S] the continuation's token before each  ->  tokens [N, S].

        DFlash: the argmax of each position. DFlash2: the selector's choice with the continuation's
        token as predecessor. z-lab's path feeds its own choice forward instead, but a draft only
        counts while every earlier draft was accepted, i.e. equal to the continuation: along the
        accepted prefix both predecessors are the same token, and the first rejected draft is the
        same too, so the chain acceptance is the same.
        """
        if self.candidate_selector is None:
            return logits.argmax(-1)
        candidates, scores = self.candidate_selector.teacher_forced(hidden[..., 1:, :], logits, predecessors)
        return candidates.gather(-1, scores.argmax(-1, keepdim=True))[..., 0]

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


def context_from_hidden_states(hidden_states, target_layer_ids) -> torch.Tensor:
    """The drafter's context from a target's `output_hidden_states` (z-lab extract_context_feature).

    hidden_states: L+1 tensors [..., T, H] (h[0] is the embeddings) -> [..., T, n_tapped*H] =
    cat([h[i + 1] for i in ids], -1).
    """
    return torch.cat([hidden_states[i + 1] for i in target_layer_ids], dim=-1)


def parameter_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every weight name of DFlashDrafter(cfg) and its shape, without building the model.

    Layers differ in their attention masks, never in their weights, so a one-layer model on the
    meta device stands for all of them: the cost does not grow with num_hidden_layers.
    """
    with torch.device("meta"):
        one = DFlashDrafter(replace(cfg, num_hidden_layers=1, layer_types=cfg.layer_types[:1]))
    state = one.state_dict()
    layer = {k.removeprefix("layers.0."): tuple(v.shape) for k, v in state.items() if k.startswith("layers.0.")}
    shapes = {k: tuple(v.shape) for k, v in state.items() if not k.startswith("layers.")}
    shapes.update({f"layers.{i}.{k}": s for i in range(cfg.num_hidden_layers) for k, s in layer.items()})
    return shapes
