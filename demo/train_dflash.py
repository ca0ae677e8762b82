"""A small DFlash drafter trainer in plain PyTorch, for the demo's tiny target.

How DFlash drafters are trained (z-lab, SpecForge), reduced to its core:
- The target is frozen. The data is self-distilled: prompts plus the target's own greedy
  completions, so the drafter learns to predict what the target will actually say.
- A training example is an anchor p inside the completion. Its block is [token p, MASK x (B-1)]
  embedded with the target's embedding matrix; its context is the tapped target features of
  positions < p. The drafter predicts tokens p+1 .. p+B-1 in one pass, through the target's
  (frozen) lm_head. Many anchors of one sequence share one context pass via the drafter's
  `forward_anchors` (the same masked attention the evals use).
- The loss is cross-entropy per block position k = 1..B-1, weighted by exp(-(k-1)/gamma):
  early positions matter most, since a draft is only accepted up to its first miss.
- DFlash2 (`family="dflash2"`, z-lab's DFlash2DraftModel) adds a grouped dynamic conv around every
  sublayer, trained by the same loss, and a candidate selector that rescores each position's top-k
  unary candidates given the token before it. The selector's loss is cross-entropy over the k
  candidates, teacher-forced (the predecessor is the recorded token), on the positions whose label
  is among them (a missed label is the backbone's failure, not the selector's: SpecForge's rule),
  weighted like the base loss and added with weight `selector_alpha`.

The target is frozen, so its features for every training sequence are computed once in
`prepare_data` (for every layer, so runs tapping different layers share them) and training
touches only the drafter.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from demo import bytetok
from demo.target import lr_factor, use_cpu_threads
from evaluators.ddtree import ddtree_acceptance_batch
from evaluators.drafter import (DFLASH, DFLASH2, DFlashDrafter, DrafterConfig, autocast_precision,
                                build_target_layer_ids, parse_dtype, parse_precision, save_zlab)
from evaluators.drafter.config import DFLASH2_FIELDS  # TrainConfig names its DFlash2 fields as the config does
from evaluators.metrics import chain_acceptance
from tracker.config import EVAL_DTYPES
from tracker.store import names

DDTREE_BUDGET = 8
# The frozen target runs (and its features are stored) in fp32 whatever the drafter's dtype.
TARGET_DTYPE = "fp32"


@dataclass
class TrainConfig:
    """One drafter training run; logged as the run's params."""

    name: str = "dflash"
    target_layer_ids: list[int] | None = None  # None: z-lab's choice for n_tapped layers
    n_tapped: int = 1
    layers: int = 1  # drafter decoder layers
    heads: int = 4  # head_dim = target hidden / heads
    block_size: int = 8
    steps: int = 200
    lr: float = 3e-3
    batch: int = 4  # sequences per step
    anchors_per_seq: int = 16
    gamma: float | None = 4.0  # loss weight exp(-(k-1)/gamma); None: uniform
    ckpt_every: int = 50
    seed: int = 0
    dtype: str = "fp32"  # the drafter's compute; "bf16": bf16 autocast (fp32 master weights), target stays fp32
    linear_attn: str = "auto"  # the target's linear-attention path, as recorded in the fingerprint
    family: str = DFLASH  # or DFLASH2: convs around every sublayer and a candidate selector
    selector_top_k: int = 8  # DFlash2: the unary candidates the selector rescores
    selector_rank: int = 16  # DFlash2: the rank of its predecessor x hidden interaction
    conv_kernel_size: int = 2  # DFlash2: taps of each dynamic conv
    conv_group_size: int = 8  # DFlash2: channels sharing one dynamic kernel
    selector_alpha: float = 1.0  # DFlash2: weight of the selector's loss beside the base loss


@dataclass
class TrainData:
    """Self-distilled sequences and their frozen target features, shared by all runs."""

    target_dir: Path
    target: torch.nn.Module  # the loaded target (for fingerprints)
    linear_attn_path: str  # the path the features were computed on
    sequences: list[torch.Tensor]  # LongTensor [T_i]: prompt + greedy completion
    prompt_lens: list[int]
    features: list[torch.Tensor]  # [n_layers, T_i, H]: output of every decoder layer (z-lab indexing)
    embed: torch.Tensor  # [V, H] target input embeddings
    lm_head: torch.Tensor  # [V, H] target output head
    num_layers: int
    max_new_tokens: int
    seconds: dict = field(default_factory=dict)

    @property
    def hidden_size(self) -> int:
        return self.embed.shape[1]

    def completions(self) -> list[list[int]]:
        """The greedy completion tokens of each sequence (what an eval of these prompts scores)."""
        return [s[p:].tolist() for s, p in zip(self.sequences, self.prompt_lens)]


# --------------------------------------------------------------------------- data


@torch.no_grad()
def prepare_data(target_dir: str | Path, prompts: list[list[int]], max_new_tokens: int, *,
                 linear_attn_mode: str = "auto", batch_size: int = 16, progress=None) -> TrainData:
    """Greedy completions of `prompts` (KV cache) and every layer's features of prompt + completion.

    A completion that reaches EOS ends there (EOS included). `progress(done, total)` is called
    after each batch of prompts.
    """
    from transformers import AutoModelForCausalLM

    from tracker.environment import linear_attn

    use_cpu_threads()
    target_dir = Path(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=parse_dtype(TARGET_DTYPE), trust_remote_code=False).eval()
    resolution = linear_attn.apply(linear_attn_mode, "cpu", linear_attn.module_of(model))
    sequences, prompt_lens, features = [], [], []
    t0 = time.perf_counter()
    gen_s = 0.0
    for start in range(0, len(prompts), batch_size):
        group = prompts[start : start + batch_size]
        t = time.perf_counter()
        rows = _greedy(model, group, max_new_tokens)
        gen_s += time.perf_counter() - t
        for row in rows:
            hidden = model(input_ids=row[None], output_hidden_states=True, use_cache=False).hidden_states
            features.append(torch.stack([h[0] for h in hidden[1:]]))  # [n_layers, T, H]
        sequences += rows
        prompt_lens += [len(p) for p in group]
        if progress:
            progress(len(sequences), len(prompts))
    return TrainData(
        target_dir=target_dir,
        target=model,
        linear_attn_path=resolution.path,
        sequences=sequences,
        prompt_lens=prompt_lens,
        features=features,
        embed=model.get_input_embeddings().weight.detach().clone(),
        lm_head=model.get_output_embeddings().weight.detach().clone(),
        num_layers=model.config.num_hidden_layers,
        max_new_tokens=max_new_tokens,
        seconds={"generate": round(gen_s, 2), "total": round(time.perf_counter() - t0, 2)},
    )


def _greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[torch.Tensor]:
    """Greedy prompt + completion per prompt, cut after the first EOS of the completion.

    Prompts of one call are left-padded to a common length; the padding is dropped again.
    """
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), bytetok.PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, longest - len(p):] = torch.tensor(p)
        mask[row, longest - len(p):] = 1
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=bytetok.EOS, pad_token_id=bytetok.PAD)
    rows = []
    for p, seq in zip(prompts, out):
        completion = seq[longest:]
        eos = (completion == bytetok.EOS).nonzero()
        if len(eos):
            completion = completion[: int(eos[0]) + 1]
        rows.append(torch.cat([torch.tensor(p), completion]))
    return rows


# --------------------------------------------------------------------------- model


def layer_ids(cfg: TrainConfig, num_target_layers: int) -> list[int]:
    """The tapped target layers: as configured, else z-lab's spacing for `n_tapped` layers."""
    if cfg.target_layer_ids:
        return list(cfg.target_layer_ids)
    return build_target_layer_ids(num_target_layers, cfg.n_tapped)


def drafter_config(cfg: TrainConfig, data: TrainData) -> DrafterConfig:
    """A z-lab drafter config sized from the target: hidden = target hidden, MLP 2x hidden."""
    hidden = data.hidden_size
    return DrafterConfig(
        hidden_size=hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        head_dim=hidden // cfg.heads,
        intermediate_size=2 * hidden,
        target_layer_ids=layer_ids(cfg, data.num_layers),
        block_size=cfg.block_size,
        mask_token_id=bytetok.MASK,
        num_target_layers=data.num_layers,
        vocab_size=data.lm_head.shape[0],
        max_position_embeddings=data.target.config.max_position_embeddings,
        family=cfg.family,
        **({name: getattr(cfg, name) for name in DFLASH2_FIELDS} if cfg.family == DFLASH2 else {}),
    )


def position_weights(block_size: int, gamma: float | None) -> torch.Tensor:
    """Loss weight of block positions k = 1..B-1: exp(-(k-1)/gamma), or 1 when gamma is None."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.ones_like(k) if gamma is None else torch.exp(-(k - 1) / gamma)


# --------------------------------------------------------------------------- training


@dataclass
class Batch:
    logits: torch.Tensor  # [N, B-1, V]
    labels: torch.Tensor  # [N, B-1]; -1 past the end of the sequence
    drafts: torch.Tensor  # [N, B-1]: the T = 0 drafts (DFlash2: the selector's), teacher-forced
    # DFlash2: each position's top-k candidates and the selector's scores of them, [N, B-1, K]
    candidates: torch.Tensor | None = None
    scores: torch.Tensor | None = None


def forward_batch(drafter: DFlashDrafter, contexts, data: TrainData, seq_ids: list[int],
                  anchors_per_seq: int, gen: torch.Generator) -> Batch:
    """Random anchors inside the completions of `seq_ids`, drafted teacher-forced."""
    B = drafter.block_size
    logits, labels, predecessors, hiddens = [], [], [], []
    for i in seq_ids:
        seq, P = data.sequences[i], data.prompt_lens[i]
        T = seq.numel()
        # anchor p holds a verified token and needs at least one label (p + 1 < T)
        n = min(anchors_per_seq, T - 1 - P)
        anchors = P + torch.randperm(T - 1 - P, generator=gen)[:n]  # [n]
        embeds = drafter.block_embeddings(seq[anchors], data.embed)  # [n, B, H]
        hidden = drafter.forward_anchors(contexts[i], anchors, embeds)  # [n, B, H]
        hiddens.append(hidden)
        logits.append(drafter.logits(hidden, data.lm_head))  # [n, B-1, V]
        pos = anchors[:, None] + torch.arange(1, B)  # [n, B-1]
        labels.append(torch.where(pos < T, seq[pos.clamp(max=T - 1)], -1))
        predecessors.append(seq[(pos - 1).clamp(max=T - 1)])  # the recorded token before each label
    logits, labels, predecessors, hidden = (torch.cat(x) for x in (logits, labels, predecessors, hiddens))
    if drafter.candidate_selector is None:
        return Batch(logits, labels, logits.detach().argmax(-1))
    candidates, scores = drafter.candidate_selector.teacher_forced(hidden[:, 1:], logits, predecessors)
    drafts = candidates.gather(-1, scores.detach().argmax(-1, keepdim=True))[..., 0]
    return Batch(logits, labels, drafts, candidates, scores)


def weighted_loss(batch: Batch, weights: torch.Tensor, selector_alpha: float = 0.0) -> torch.Tensor:
    """Cross-entropy per block position, weighted by position, over labels inside the sequence; for DFlash2
    plus `selector_alpha` x the selector's cross-entropy over the candidates, where the label is one."""
    N, D, V = batch.logits.shape
    ce = F.cross_entropy(batch.logits.float().reshape(N * D, V), batch.labels.reshape(N * D).clamp(min=0),
                         reduction="none").view(N, D)  # [N, D]
    w = weights[None, :] * (batch.labels >= 0)  # [N, D]
    loss = (ce * w).sum() / w.sum()
    if batch.scores is None:
        return loss
    hit = batch.candidates == batch.labels[..., None]  # [N, D, K]
    covered = hit.any(-1)  # [N, D]
    K = batch.scores.shape[-1]
    selector_ce = F.cross_entropy(batch.scores.float().reshape(N * D, K), hit.float().argmax(-1).reshape(N * D),
                                  reduction="none").view(N, D)  # [N, D]
    ws = w * covered
    return loss + selector_alpha * (selector_ce * ws).sum() / ws.sum().clamp(min=1e-9)


@torch.no_grad()
def batch_metrics(batch: Batch) -> dict[str, float]:
    """acc: top-1 per position of the drafts (DFlash2: the selector's); streak / dds8: accepted drafts per
    block (chain, DDTree at 8 over the unary logits); DFlash2 also candidate_recall (labels among the top-k).

    streak and dds8 are taken over the blocks that lie wholly inside their sequence.
    """
    logits = batch.logits.detach().float()
    valid = batch.labels >= 0
    acc = ((batch.drafts == batch.labels) & valid).sum() / valid.sum()
    full = valid.all(dim=1)
    streak = chain_acceptance(batch.drafts[full], batch.labels[full]).float().mean() - 1
    tree = ddtree_acceptance_batch(logits[full], batch.labels[full], [DDTREE_BUDGET])[DDTREE_BUDGET]
    out = {"acc": acc.item(), "streak": streak.item(), "dds8": tree.float().mean().item() - 1}
    if batch.candidates is not None:
        covered = (batch.candidates == batch.labels[..., None]).any(-1) & valid
        out["candidate_recall"] = (covered.sum() / valid.sum()).item()
    return out


def train(cfg: TrainConfig, target_dir: str | Path, data: TrainData, tracker, out_dir: str | Path,
          progress=None) -> str:
    """Train one drafter, log it as a training run of `tracker`, return the run id.

    Checkpoints (z-lab format) go to `<out_dir>/step_<N>/` every `ckpt_every` steps and at the
    last step. `progress(step, steps, loss)` is called after every step.
    """
    from tracker.environment import fingerprint, linear_attn

    if cfg.dtype not in EVAL_DTYPES:
        raise ValueError(f"unknown dtype {cfg.dtype!r}; use one of {', '.join(EVAL_DTYPES)}")
    if Path(target_dir).resolve() != data.target_dir.resolve():
        raise ValueError(f"data was prepared from {data.target_dir}, not {target_dir}")
    use_cpu_threads()
    dcfg = drafter_config(cfg, data)
    ids = dcfg.target_layer_ids
    linear_attn.apply(cfg.linear_attn, "cpu", linear_attn.module_of(data.target))  # capture() only reads
    # The numerics training really uses: the target (features, probe) in TARGET_DTYPE, the drafter
    # in fp32 weights under autocast at cfg.dtype. `draftboard eval --dtype fp32 --drafter-precision
    # bf16-autocast` repeats exactly this; `--dtype bf16` would cast the target too.
    precision = parse_precision(autocast_precision(cfg.dtype))
    fp = fingerprint.capture(data.target, "cpu", TARGET_DTYPE, probe_layers=ids, drafter_precision=precision.name)
    if fp["numerics"]["linear_attention_path"] != data.linear_attn_path:
        raise ValueError(f"linear_attn={cfg.linear_attn!r} resolves to {fp['numerics']['linear_attention_path']}, "
                         f"but the features were computed on {data.linear_attn_path}")
    torch.manual_seed(cfg.seed)
    drafter = DFlashDrafter(dcfg).train()
    # an anchor needs a completion token after it; a completion that is just EOS has none
    usable = [i for i, (s, p) in enumerate(zip(data.sequences, data.prompt_lens)) if s.numel() - p >= 2]
    if not usable:
        raise ValueError("no completion is longer than one token: nothing to train on")
    contexts = [f[ids].permute(1, 0, 2).reshape(1, f.shape[1], -1) for f in data.features]  # [1, T, n_tapped*H]
    weights = position_weights(cfg.block_size, cfg.gamma)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.steps))
    gen = torch.Generator().manual_seed(cfg.seed)
    out_dir = Path(out_dir)
    dflash2_only = () if cfg.family == DFLASH2 else (*DFLASH2_FIELDS, "selector_alpha")
    params = {**{k: v for k, v in asdict(cfg).items() if k not in dflash2_only}, "target_layer_ids": ids,
              "data": {"sequences": len(data.sequences), "max_new_tokens": data.max_new_tokens}}

    with tracker.training_run(cfg.name, params, str(target_dir), tags={names.DRAFTER_FAMILY: cfg.family},
                              fingerprint=fp) as run:
        for step in range(1, cfg.steps + 1):
            seq_ids = [usable[i] for i in torch.randint(len(usable), (cfg.batch,), generator=gen).tolist()]
            with precision.context("cpu"):
                batch = forward_batch(drafter, contexts, data, seq_ids, cfg.anchors_per_seq, gen)
                loss = weighted_loss(batch, weights, cfg.selector_alpha if cfg.family == DFLASH2 else 0.0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opt.step()
            schedule.step()
            run.log_step(step, loss=loss.item(), **batch_metrics(batch))
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                path = save_zlab(drafter, dcfg, out_dir / f"step_{step}")
                run.log_checkpoint(path, step)
            if progress:
                progress(step, cfg.steps, loss.item())
        return run.run_id

