"""DFlash drafter: z-lab semantics, the many-anchor evaluation path, loading and saving."""

from __future__ import annotations

import builtins
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from evaluators.drafter import (
    DFlashDrafter,
    DrafterConfig,
    build_target_layer_ids,
    context_from_hidden_states,
    load_drafter,
    save_zlab,
)
from tracker.errors import DraftboardError

H, V, BS = 32, 40, 4
TARGET_LAYERS = 6


def cfg_dict(**over) -> dict:
    d = {
        "hidden_size": H,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 48,
        "vocab_size": V,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "block_size": BS,
        "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": V - 1, "block_size": BS},
    }
    d.update(over)
    return d


SLIDING = {"use_sliding_window": True, "sliding_window": 3,
           "layer_types": ["sliding_attention", "full_attention"]}


def make_model(seed: int = 0, **over) -> DFlashDrafter:
    """A drafter with O(1) random weights, so that every path visibly matters."""
    torch.manual_seed(seed)
    model = DFlashDrafter(DrafterConfig.from_dict(cfg_dict(**over)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]) * (1.5 if p.dim() > 1 else 0.3))
    return model.eval()


def inputs(model: DFlashDrafter, T: int = 12, N: int = 5, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    context = torch.randn(1, T, model.fc.in_features, generator=g)
    blocks = torch.randn(N, model.block_size, H, generator=g)
    return context, blocks


def per_anchor(model, context, anchors, blocks):
    outs = []
    for i, p in enumerate(anchors.tolist()):
        outs.append(model.forward_block(
            context[:, :p], torch.arange(p), blocks[i : i + 1], p + torch.arange(blocks.shape[1])[None]
        ))
    return torch.cat(outs)


# ---------------------------------------------------------------------------
# forward semantics
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("over", [{}, SLIDING, {"attention_bias": True, "num_key_value_heads": 4},
                                  {"num_key_value_heads": 1, "is_causal": True}])
@pytest.mark.parametrize("chunk", [None, 2])
def test_forward_anchors_equals_forward_block_per_anchor(over, chunk):
    model = make_model(**over)
    anchors = torch.tensor([7, 0, 1, 12, 5, 3, 5, 11])  # unsorted, duplicate, p=0 and p=T
    context, blocks = inputs(model, T=12, N=len(anchors))
    with torch.no_grad():
        got = model.forward_anchors(context, anchors, blocks, chunk=chunk)
        want = per_anchor(model, context, anchors, blocks)
    assert got.shape == (len(anchors), BS, H)
    assert (got - want).abs().max().item() < 1e-5


def test_no_mask_inside_the_block():
    model = make_model()
    context, blocks = inputs(model, T=6, N=1)
    pos = 6 + torch.arange(BS)[None]
    with torch.no_grad():
        base = model.forward_block(context, torch.arange(6), blocks, pos)
        later = blocks.clone()
        later[0, BS - 1] += 1.0
        changed = model.forward_block(context, torch.arange(6), later, pos)
    assert (changed[0, 0] - base[0, 0]).abs().max() > 1e-4  # position 0 sees position Bs-1


def test_context_strictly_before_the_anchor():
    model = make_model()
    T, p = 10, 6
    context, blocks = inputs(model, T=T, N=2)
    anchors = torch.tensor([p, p + 2])
    with torch.no_grad():
        base = model.forward_anchors(context, anchors, blocks)
        at_p = context.clone()
        at_p[0, p] += 1.0
        moved = model.forward_anchors(context=at_p, anchors=anchors, block_embeds=blocks)
        assert torch.equal(moved[0], base[0])  # anchor p does not see position p
        assert (moved[1] - base[1]).abs().max() > 1e-4  # anchor p+2 does
        before = context.clone()
        before[0, p - 1] += 1.0
        moved = model.forward_anchors(before, anchors, blocks)
        assert (moved[0] - base[0]).abs().max() > 1e-4


def test_sliding_layer_is_causal_in_block_with_window():
    model = make_model(num_hidden_layers=1, use_sliding_window=True, sliding_window=2,
                       layer_types=["sliding_attention"])
    T = 8
    context, blocks = inputs(model, T=T, N=1)
    pos = T + torch.arange(BS)[None]

    def run(ctx, blk):
        with torch.no_grad():
            return model.forward_block(ctx, torch.arange(T), blk, pos)[0]

    base = run(context, blocks)
    last = blocks.clone()
    last[0, BS - 1] += 1.0
    out = run(context, last)
    assert torch.equal(out[: BS - 1], base[: BS - 1])  # earlier slots do not see a later one
    first = blocks.clone()
    first[0, 0] += 1.0
    out = run(context, first)
    assert (out[1] - base[1]).abs().max() > 1e-4  # slot 1 sees slot 0 (window 2)
    assert torch.equal(out[2:], base[2:])  # slot 2 is 2 away: outside the window
    far = context.clone()
    far[0, T - 2] += 1.0  # slot 0 at position T only sees T-1
    assert torch.equal(run(far, blocks), base)


def test_single_layer_attention_by_hand():
    """One head, one layer: the z-lab formula written out with plain matmuls (float64)."""
    d = cfg_dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                 head_dim=8, intermediate_size=12, rope_theta=100.0)
    d["dflash_config"] = {"target_layer_ids": [2], "mask_token_id": 3, "block_size": BS}
    torch.manual_seed(3)
    model = DFlashDrafter(DrafterConfig.from_dict(d)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if name.endswith("norm.weight") else torch.randn_like(p) * 0.5)
    C, p0, eps = 5, 5, 1e-6
    feats = torch.randn(1, C, 8)
    blk = torch.randn(1, BS, 8)
    with torch.no_grad():
        got = model.forward_block(feats, torch.arange(C), blk, p0 + torch.arange(BS)[None])[0]

    W = {k: v.double() for k, v in model.state_dict().items()}

    def rms(x, w):
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    def rope(x, positions):
        out = x.clone()
        half = x.shape[-1] // 2
        for r, pos in enumerate(positions):
            for i in range(half):
                a = pos / 100.0 ** (2 * i / x.shape[-1])
                c, s = math.cos(a), math.sin(a)
                out[r, i] = x[r, i] * c - x[r, i + half] * s
                out[r, i + half] = x[r, i + half] * c + x[r, i] * s
        return out

    x = blk[0].double()
    ctx = rms(feats[0].double() @ W["fc.weight"].T, W["hidden_norm.weight"])
    L = "layers.0."
    h = rms(x, W[L + "input_layernorm.weight"])
    kv_in = torch.cat([ctx, h])
    q = rope(rms(h @ W[L + "self_attn.q_proj.weight"].T, W[L + "self_attn.q_norm.weight"]),
             range(p0, p0 + BS))
    k = rope(rms(kv_in @ W[L + "self_attn.k_proj.weight"].T, W[L + "self_attn.k_norm.weight"]),
             range(0, C + BS))
    v = kv_in @ W[L + "self_attn.v_proj.weight"].T
    att = torch.softmax(q @ k.T / math.sqrt(8), dim=-1)  # no mask at all
    x = x + (att @ v) @ W[L + "self_attn.o_proj.weight"].T
    h = rms(x, W[L + "post_attention_layernorm.weight"])
    gate, up = h @ W[L + "mlp.gate_proj.weight"].T, h @ W[L + "mlp.up_proj.weight"].T
    x = x + (gate * torch.sigmoid(gate) * up) @ W[L + "mlp.down_proj.weight"].T
    want = rms(x, W["norm.weight"])
    assert (got.double() - want).abs().max().item() < 1e-5


def test_matches_a_zlab_style_forward_built_from_transformers_qwen3():
    """Same weights through transformers' Qwen3 RMSNorm / RoPE / sdpa, wired as z-lab's model."""
    mq = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    over = dict(SLIDING, attention_bias=True)
    model = make_model(**over)
    hf_cfg = mq.Qwen3Config(**{k: v for k, v in cfg_dict(**over).items() if k != "dflash_config"})
    rotary = mq.Qwen3RotaryEmbedding(hf_cfg)
    W = model.state_dict()

    def norm(x, key, dim):
        n = mq.Qwen3RMSNorm(dim, eps=1e-6)
        n.weight.data.copy_(W[key])
        return n(x)

    def lin(x, key):
        return F.linear(x, W[key + ".weight"], W.get(key + ".bias"))

    def zlab_mask(q_len, k_len, is_causal, window):  # z-lab's _attention_mask (index based)
        qp = k_len - q_len + torch.arange(q_len)[:, None]
        kp = torch.arange(k_len)[None, :]
        vis = torch.ones(q_len, k_len, dtype=torch.bool)
        if is_causal:
            vis &= kp <= qp
        if window is not None:
            vis &= qp - kp < window
        return vis[None, None]

    T, p = 9, 9
    context, blocks = inputs(model, T=T, N=2)
    target_hidden = lin(context.expand(2, -1, -1), "fc")
    target_hidden = norm(target_hidden, "hidden_norm.weight", H)
    position_ids = torch.arange(p + BS)[None].expand(2, -1)
    cos, sin = rotary(blocks, position_ids)
    x = blocks
    for i in range(2):
        L = f"layers.{i}."
        causal = hf_cfg.layer_types[i] == "sliding_attention"
        window = hf_cfg.sliding_window if causal else None
        res = x
        h = norm(x, L + "input_layernorm.weight", H)
        q = norm(lin(h, L + "self_attn.q_proj").view(2, BS, -1, 8), L + "self_attn.q_norm.weight", 8).transpose(1, 2)
        k = torch.cat([lin(target_hidden, L + "self_attn.k_proj"), lin(h, L + "self_attn.k_proj")], 1)
        v = torch.cat([lin(target_hidden, L + "self_attn.v_proj"), lin(h, L + "self_attn.v_proj")], 1)
        k = norm(k.view(2, T + BS, -1, 8), L + "self_attn.k_norm.weight", 8).transpose(1, 2)
        v = v.view(2, T + BS, -1, 8).transpose(1, 2)
        q = q * cos[:, None, -BS:] + mq.rotate_half(q) * sin[:, None, -BS:]
        k = k * cos[:, None] + mq.rotate_half(k) * sin[:, None]
        mod = torch.nn.Module()
        mod.num_key_value_groups, mod.is_causal, mod.training = 2, causal, False
        mask = zlab_mask(BS, T + BS, causal, window) if causal or window else None
        attn, _ = sdpa_attention_forward(mod, q, k, v, mask, scaling=8 ** -0.5)
        x = res + lin(attn.reshape(2, BS, -1), L + "self_attn.o_proj")
        h = norm(x, L + "post_attention_layernorm.weight", H)
        x = x + lin(F.silu(lin(h, L + "mlp.gate_proj")) * lin(h, L + "mlp.up_proj"), L + "mlp.down_proj")
    want = norm(x, "norm.weight", H)
    with torch.no_grad():
        got = model.forward_block(context, torch.arange(T), blocks, p + torch.arange(BS)[None])
        got_anchors = model.forward_anchors(context, torch.tensor([p, p]), blocks)
    assert (got - want).abs().max().item() < 1e-5
    assert (got_anchors - want).abs().max().item() < 1e-5


def test_logits_block_embeddings_and_context_from_hidden_states():
    model = make_model(dflash_config={"target_layer_ids": [1, 3], "mask_token_id": 7, "block_size": BS,
                                      "output_multiplier": 2.0, "final_logit_softcapping": 1.5,
                                      "input_embedding_scale": 3.0})
    embed = torch.randn(V, H)
    blocks = model.block_embeddings(torch.tensor([5, 9]), embed)
    assert blocks.shape == (2, BS, H)
    assert torch.equal(blocks[1, 0], embed[9] * 3.0) and torch.equal(blocks[0, 2], embed[7] * 3.0)
    hidden = torch.randn(2, BS, H)
    logits = model.logits(hidden, embed)
    assert logits.shape == (2, BS - 1, V)
    plain = hidden[:, 1:] @ embed.T * 2.0
    assert torch.allclose(logits, torch.tanh(plain / 1.5) * 1.5, atol=1e-6)
    hs = [torch.full((1, 3, 2), float(i)) for i in range(TARGET_LAYERS + 1)]
    assert context_from_hidden_states(hs, [1, 3])[0, 0].tolist() == [2.0, 2.0, 4.0, 4.0]


def test_forward_anchors_is_differentiable():
    model = make_model().train()
    context, blocks = inputs(model, T=8, N=3)
    model.forward_anchors(context, torch.tensor([2, 5, 8]), blocks).square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------

def test_config_round_trip_and_defaults():
    cfg = DrafterConfig.from_dict(cfg_dict(**SLIDING))
    assert DrafterConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.layer_attention(0) == (True, 3) and cfg.layer_attention(1) == (False, None)
    # rope_parameters (transformers 5) and no use_sliding_window -> no window (Qwen3Config)
    d = cfg_dict(rope_parameters={"rope_type": "default", "rope_theta": 5e5}, sliding_window=7)
    d.pop("head_dim")
    cfg = DrafterConfig.from_dict(d)
    assert cfg.rope_theta == 5e5 and cfg.sliding_window is None and cfg.head_dim == H // 4
    with pytest.raises(DraftboardError, match="rope type 'yarn'"):
        DrafterConfig.from_dict(cfg_dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    # block_size / mask_token_id at the top level too
    d = cfg_dict(mask_token_id=11, block_size=8)
    d["dflash_config"] = {"target_layer_ids": [0]}
    cfg = DrafterConfig.from_dict(d)
    assert (cfg.block_size, cfg.mask_token_id) == (8, 11)


def test_build_target_layer_ids_matches_zlab_releases():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B-DFlash
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.6-27B-DFlash
    assert build_target_layer_ids(36, 1) == [18]


# ---------------------------------------------------------------------------
# loading and saving
# ---------------------------------------------------------------------------

def same_outputs(a: DFlashDrafter, b: DFlashDrafter) -> bool:
    context, blocks = inputs(a, T=7, N=3)
    anchors = torch.tensor([1, 4, 7])
    with torch.no_grad():
        return torch.equal(a.forward_anchors(context, anchors, blocks), b.forward_anchors(context, anchors, blocks))


def test_save_zlab_round_trip(tmp_path):
    model = make_model(**SLIDING)
    out = save_zlab(model, model.cfg, tmp_path / "zlab")
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"] == {"target_layer_ids": [1, 3], "mask_token_id": V - 1, "block_size": BS}
    assert config["block_size"] == BS and config["num_target_layers"] == TARGET_LAYERS
    keys = set(load_file(str(out / "model.safetensors")))
    for key in ("fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_proj.weight",
                "layers.1.self_attn.k_norm.weight", "layers.1.mlp.down_proj.weight",
                "layers.0.post_attention_layernorm.weight"):
        assert key in keys
    assert len(keys) == 2 + 2 * 11 + 1
    loaded = load_drafter(out, target_hidden_size=H, target_num_layers=TARGET_LAYERS, target_vocab_size=V)
    assert loaded.config == model.cfg and loaded.own_lm_head is None
    assert "z-lab directory" in loaded.source
    assert same_outputs(model, loaded.model)
    bf16 = load_drafter(out, dtype="bf16")
    assert bf16.model.fc.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("prefix", ["module.", "model.", "draft_model.", "module.draft_model."])
def test_prefixes_are_stripped(tmp_path, prefix):
    model = make_model()
    path = tmp_path / "step_100.safetensors"
    save_file({prefix + k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    (tmp_path / "step_100.safetensors.json").write_text(json.dumps(model.cfg.to_dict()))
    loaded = load_drafter(path, target_hidden_size=H)
    assert same_outputs(model, loaded.model)
    assert "step_100.safetensors.json" in loaded.source


def test_safetensors_with_embedded_config_and_lm_head(tmp_path):
    model = make_model()
    head = torch.randn(V, H)
    sd = {**model.state_dict(), "draft_model.lm_head.weight": head}
    path = tmp_path / "ckpt.safetensors"
    save_file(sd, str(path), metadata={"config": json.dumps(model.cfg.to_dict())})
    loaded = load_drafter(path, target_vocab_size=V)
    assert torch.equal(loaded.own_lm_head, head) and loaded.own_lm_head_key == "lm_head.weight"
    assert same_outputs(model, loaded.model)


@pytest.mark.parametrize("entry", ["state_dict", "model"])
def test_pt_with_embedded_config(tmp_path, entry):
    model = make_model()
    path = tmp_path / "ckpt.pt"
    torch.save({"config": model.cfg.to_dict(), entry: {"module." + k: v for k, v in model.state_dict().items()},
                "step": 100, "optimizer": {"lr": 1e-4}}, path)
    loaded = load_drafter(path, target_hidden_size=H, target_num_layers=TARGET_LAYERS)
    assert same_outputs(model, loaded.model)
    assert "embedded config" in loaded.source


def test_target_layer_ids_built_from_num_target_layers(tmp_path):
    model = make_model(dflash_config={"target_layer_ids": [1, 1], "mask_token_id": 5})
    d = model.cfg.to_dict()
    d["dflash_config"].pop("target_layer_ids")
    path = tmp_path / "ckpt.bin"
    torch.save({"config": json.dumps(d), "state_dict": model.state_dict()}, path)
    loaded = load_drafter(path)  # 2 tapped layers (fc width 64 / 32) of a 6-layer target
    assert loaded.config.target_layer_ids == build_target_layer_ids(TARGET_LAYERS, 2) == [1, 3]


class _WritesAFile:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def test_pt_that_runs_code_is_refused(tmp_path):
    model = make_model()
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"config": model.cfg.to_dict(), "state_dict": model.state_dict(),
                "payload": _WritesAFile(marker)}, path)
    with pytest.raises(DraftboardError, match="refused to unpickle") as err:
        load_drafter(path)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    # control: the payload is real (an unsafe load would have run it)
    control = tmp_path / "control.pt"
    torch.save({"payload": _WritesAFile(tmp_path / "ran")}, control)
    torch.load(control, weights_only=False)
    assert (tmp_path / "ran").exists()


def _zlab_dir(tmp_path, model, mutate=None, config=None):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if mutate:
        mutate(sd)
    d = tmp_path / "ckpt"
    d.mkdir()
    save_file(sd, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config or model.cfg.to_dict()))
    return d


def _nan(sd):
    sd["layers.1.mlp.up_proj.weight"][0, 0] = float("nan")


LOADER_ERRORS = {
    "missing key": (lambda sd: sd.pop("layers.1.mlp.down_proj.weight"), {},
                    ["missing key", "layers.1.mlp.down_proj.weight"]),
    "unexpected key": (lambda sd: sd.update({"embed_tokens.weight": torch.zeros(V, H)}), {},
                       ["unexpected key", "embed_tokens.weight", "[40, 32]"]),
    "hidden mismatch": (None, {"target_hidden_size": 48}, ["hidden_size 32", "fc.weight [32, 64]", "48"]),
    "layer id out of range": (None, {"target_num_layers": 3}, ["target_layer_ids [1, 3]", "3 layers"]),
    "vocab via own lm_head": (lambda sd: sd.update({"lm_head.weight": torch.zeros(V + 1, H)}),
                              {"target_vocab_size": V}, ["lm_head.weight", "[41, 32]", "40"]),
    "shape": (lambda sd: sd.update({"layers.0.self_attn.k_proj.weight": torch.zeros(8, H)}), {},
              ["layers.0.self_attn.k_proj.weight", "[8, 32]", "[16, 32]"]),
    "tapped count": (lambda sd: sd.update({"fc.weight": torch.zeros(H, 3 * H)}), {},
                     ["fc.weight", "[32, 96]", "3 tapped", "[1, 3]"]),
    "non-finite": (_nan, {}, ["layers.1.mlp.up_proj.weight", "NaN"]),
}


@pytest.mark.parametrize("case", list(LOADER_ERRORS))
def test_loader_errors_name_the_tensor_and_shapes(tmp_path, case):
    mutate, kwargs, needles = LOADER_ERRORS[case]
    path = _zlab_dir(tmp_path, make_model(), mutate)
    with pytest.raises(DraftboardError) as err:
        load_drafter(path, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_truncated_safetensors_is_one_line_error(tmp_path):
    path = _zlab_dir(tmp_path, make_model())
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(DraftboardError, match="truncated or corrupt") as err:
        load_drafter(path)
    assert "\n" not in str(err.value) and "model.safetensors" in str(err.value)


def test_missing_path_and_config(tmp_path):
    with pytest.raises(DraftboardError, match="does not exist"):
        load_drafter(tmp_path / "nope")
    path = tmp_path / "lonely.safetensors"
    save_file({k: v.contiguous() for k, v in make_model().state_dict().items()}, str(path))
    with pytest.raises(DraftboardError, match="no drafter config"):
        load_drafter(path)


# --------------------------------------------------------------------------- other tools' formats


def test_speculators_folder_loads_with_its_config_converted(tmp_path):
    from tests import toolformats

    model = toolformats.tiny_drafter()
    folder = toolformats.speculators(tmp_path / "checkpoints", 0, 12, model)
    loaded = load_drafter(folder, target_hidden_size=H, target_num_layers=TARGET_LAYERS, target_vocab_size=V)
    assert loaded.config.target_layer_ids == toolformats.TAPPED  # aux ids [2, 4] shifted back
    assert loaded.config.mask_token_id == V - 1 and loaded.config.block_size == BS
    assert "speculators" in loaded.source and loaded.own_lm_head_key == "lm_head.weight"
    as_saved = {k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()}  # bf16 on disk
    assert all(torch.equal(loaded.model.state_dict()[k], v) for k, v in as_saved.items())
    config = json.loads((folder / "config.json").read_text())
    config["draft_vocab_size"] = V // 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftboardError, match="reduced draft vocabulary"):
        load_drafter(folder)


def test_specforge_runtime_checkpoint_loads_with_its_draft_config(tmp_path):
    from tests import toolformats

    model = toolformats.tiny_drafter()
    folder = toolformats.specforge_runtime(tmp_path / "out", "run7", 400, model)
    with pytest.raises(DraftboardError, match="specforge export --to hf --checkpoint") as err:
        load_drafter(folder)  # the architecture is not in training_state.pt
    assert "\n" not in str(err.value)
    draft_config = model.cfg.to_dict()
    draft_config["dflash_config"] = {}  # the dflash_* entries of the pickle fill it
    (folder / "config.json").write_text(json.dumps(draft_config))
    for path in (folder, folder / "training_state.pt"):
        loaded = load_drafter(path, target_hidden_size=H, target_num_layers=TARGET_LAYERS, target_vocab_size=V)
        assert loaded.config == model.cfg and "SpecForge runtime" in loaded.source
        assert same_outputs(model, loaded.model)


def test_specforge_checkpoint_that_needs_code_is_refused_with_the_export_command(tmp_path):
    import argparse

    from tests import toolformats

    model = toolformats.tiny_drafter()
    folder = tmp_path / "run7-step5"
    folder.mkdir()
    torch.save({"draft_state_dict": model.state_dict(), "strategy": "dflash",
                "args": argparse.Namespace(lr=1e-4)}, folder / "training_state.pt")
    (folder / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    with pytest.raises(DraftboardError, match=r"refused to unpickle.*specforge export --to hf --checkpoint"):
        load_drafter(folder)
