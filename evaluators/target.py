"""The target model: loading under a chosen kernel path, greedy completions, tapped features.

Features are captured with forward hooks on the tapped decoder layers only, so an eval never
holds every layer's hidden states. Indexing follows `output_hidden_states` (0 = embeddings,
i + 1 = output of decoder layer i, the last one after the final norm), which is what z-lab's
`extract_context_feature` reads.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from evaluators import sizing
from evaluators.limits import check_sizes
from evaluators.sampling import Sampling, sampling_probs
from evaluators.weights import (SAFETENSORS, SAFETENSORS_INDEX, index_shards, inside, one_line,
                                read_safetensors, safetensors_shapes)
from tracker.environment import linear_attn
from tracker.config import DTYPES
from tracker.errors import DraftboardError

_SAMPLE_BYTES = 1 << 20  # bytes hashed at each end of a weight file


@dataclass
class Target:
    """A loaded target and the handles the harness needs."""

    model: nn.Module  # the causal LM
    path: Path
    device: str
    dtype: str
    resolution: linear_attn.Resolution
    tokenizer: object | None  # None when the directory has no tokenizer files

    @property
    def text_model(self) -> nn.Module:
        """The decoder stack: `model.model`, or `model.model.language_model` for multimodal."""
        inner = self.model.model
        return getattr(inner, "language_model", inner)

    @property
    def config(self):
        cfg = self.model.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    @property
    def num_layers(self) -> int:
        return len(self.text_model.layers)

    @property
    def embed_weight(self) -> torch.Tensor:  # [V, H]
        return self.model.get_input_embeddings().weight

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H]
        return self.model.get_output_embeddings().weight

    @property
    def max_positions(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)

    def stop_token_ids(self) -> list[int]:
        return _stop_ids(self.model.generation_config, self.config)


def _stop_ids(generation_config, text_cfg) -> list[int]:
    ids = getattr(generation_config, "eos_token_id", None)
    if ids is None:
        ids = text_cfg.eos_token_id
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else list(ids)


@dataclass
class HeadLocation:
    """Where the embedding and lm_head sit in the weight files (tied: one tensor for both)."""

    embed: tuple[str, Path]  # (stored tensor name, file)
    lm_head: tuple[str, Path]


@dataclass
class TargetHeads:
    """What a warm eval needs of the target: its embedding and lm_head, config and stop tokens.

    Read as two tensors from the safetensors files (never the decoder stack): with the target's
    continuations and features cached, the drafter needs nothing else of it.
    """

    path: Path
    device: str
    dtype: str
    config: object  # the text config
    embed_weight: torch.Tensor  # [V, H]
    lm_head_weight: torch.Tensor  # [V, H]
    stop_ids: list[int]

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def stop_token_ids(self) -> list[int]:
        return list(self.stop_ids)


def content_digest(path: str | Path) -> str:
    """A digest of a model directory that is cheap for 50 GB checkpoints.

    Config files are hashed whole; each weight file contributes its size and the first and last
    MiB (the safetensors header, which lists every tensor's dtype, shape and offset, sits at the
    start). Retraining changes every tensor, so sampled bytes change too.
    """
    path = Path(path)
    if not path.exists():  # a mistyped --target or --drafter: one line, before anything else reads it
        raise DraftboardError(f"{path}: no such model folder or file")
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        size = f.stat().st_size
        h.update(str(size).encode())
        with f.open("rb") as fh:
            if f.suffix in (".json", ".txt", ".model", ".jinja") or size <= 2 * _SAMPLE_BYTES:
                h.update(fh.read())
            else:
                h.update(fh.read(_SAMPLE_BYTES))
                fh.seek(size - _SAMPLE_BYTES)
                h.update(fh.read())
    return h.hexdigest()[:16]


def _check_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise DraftboardError(f"target {path}: no config.json (expected a transformers model directory)")


def model_config(path: str | Path):
    """The target's config.json as transformers reads it, without loading weights."""
    from transformers import AutoConfig

    path = Path(path)
    _check_dir(path)
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except RecursionError:  # transformers walks the config recursively: a config nested hundreds deep overflows it
        raise DraftboardError(f"target {path}: unreadable config.json: nested too deep for a model config") from None
    except (OSError, ValueError, KeyError) as exc:
        raise DraftboardError(f"target {path}: unreadable config.json: {str(exc).splitlines()[0]}") from exc


def text_config(path: str | Path):
    """The target's (text) config without loading weights: vocab and context checks come first."""
    cfg = model_config(path)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files from_pretrained reads: the index's shards, else model.safetensors."""
    if (path / SAFETENSORS_INDEX).is_file():
        return sorted(set(index_shards(inside(path, SAFETENSORS_INDEX, "weights index")).values()))
    if (path / SAFETENSORS).is_file():
        return [inside(path, SAFETENSORS, "weights file")]
    return []


def architecture_names(cfg) -> frozenset[str]:
    """The model classes transformers maps the target's config to (any auto class, for the config's own
    model type and its text config's): the architectures a checkpoint of this config may declare. The
    class draftboard loads is chosen by model type; a folder naming another class is read as another
    model by tools that choose by `architectures` (llama.cpp's converter)."""
    from transformers.models.auto import modeling_auto

    types = {cfg.model_type, getattr(cfg.get_text_config(), "model_type", None)}
    names: set[str] = set()
    for table, mapping in vars(modeling_auto).items():
        if table.startswith("MODEL_") and table.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            for model_type in types & mapping.keys():
                value = mapping[model_type]
                names.update([value] if isinstance(value, str) else value)
    return frozenset(names)


def _by_suffix(keys) -> dict[str, list[str]]:
    """Every dotted tail of every key -> the keys ending in it (`a.b.c` -> `b.c`, `c`)."""
    tails: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        for i in range(1, len(parts)):
            tails.setdefault(".".join(parts[i:]), []).append(key)
    return tails


def _meta_model(path: Path, cfg):
    """The model `cfg` describes, on the meta device: names and shapes, no memory."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise DraftboardError(f"target {path}: config.json does not describe a causal LM: {one_line(exc)}") from exc


def _stored_name(name: str, stored, tails: dict[str, list[str]]) -> str | None:
    """The checkpoint's name for parameter `name`: itself, else the one stored name ending in its tail."""
    same = [name] if name in stored else tails.get(name.split(".", 1)[-1], [])
    return same[0] if len(same) == 1 else None


def _locate_heads(model, stored, where: dict[str, Path], tails) -> HeadLocation | None:
    """Where the embedding and lm_head of `model` are stored; None when either cannot be told apart."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    names = dict.fromkeys(("embed", "head"))
    for name, param in model.named_parameters(remove_duplicate=False):
        for role, p in (("embed", embed), ("head", head)):
            found = _stored_name(name, stored, tails) if param is p else None
            names[role] = names[role] or found
    if head is embed:  # tied: a checkpoint stores the shared matrix once, under either name
        names["head"] = names["embed"] = names["embed"] or names["head"]
    if names["embed"] is None or names["head"] is None:
        return None
    return HeadLocation((names["embed"], where[names["embed"]]), (names["head"], where[names["head"]]))


# Parameters one stored element can hold at most: one bit each, in the widest (64-bit) element.
QUANTIZED_MAX_PACKING = 64


def check_weights(path: str | Path) -> HeadLocation | None:
    """The target folder against its config, before from_pretrained allocates anything.

    Every entry of the folder resolves inside it; the config's sizes are bounded; every
    safetensors header is whole (a truncated file is refused here); the model the config
    describes, built on the meta device (no memory), has the shapes the files hold and no more
    elements than they hold. Checkpoints name their tensors in more than one way (a
    multimodal release keeps the text model under `model.language_model.`), so a parameter is
    matched by its full name, else by the one stored name ending in its name without the first
    component. Targets stored only as `.bin` get the bounds check.

    Returns where the embedding and lm_head are stored (what a warm eval reads), or None for a
    target without safetensors files.
    """
    path = Path(path)
    cfg = model_config(path)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    check_sizes(text.to_dict(), f"target {path} config.json")
    files = safetensors_files(path)
    if not files:
        return None
    stored, where = safetensors_shapes(files)
    model = _meta_model(path, cfg)
    tails = _by_suffix(stored)
    for name, param in model.state_dict().items():
        same = _stored_name(name, stored, tails)
        if same is not None and stored[same] != tuple(param.shape):
            raise DraftboardError(
                f"target {path}: config.json gives {name} the shape {list(param.shape)} but "
                f"{where[same].name} holds {same} {list(stored[same])}: config and weights do not belong together"
            )
    needed = sum(p.numel() for p in model.parameters())
    held = sum(math.prod(shape) for shape in stored.values())
    # A quantized checkpoint packs several parameters into one stored element, but no method keeps
    # a parameter in less than one bit and no safetensors element is wider than 64 bits: so a config
    # (which a file can simply claim is quantized) still needs at least needed / 64 stored elements.
    packing = QUANTIZED_MAX_PACKING if getattr(cfg, "quantization_config", None) is not None else 1
    if needed > held * packing:
        quantized = f" (quantized: at least {math.ceil(needed / packing):,})" if packing > 1 else ""
        raise DraftboardError(
            f"target {path}: config.json describes {needed:,} parameters but the weight files hold {held:,}"
            f"{quantized}: config and weights do not belong together"
        )
    return _locate_heads(model, stored, where, tails)


@dataclass(frozen=True)
class CheckedTarget:
    """What reading a target's files concluded: its text config as plain values (attribute access,
    `getattr(config, "head_dim", None)` as on a transformers config), where its embedding and lm_head
    are stored (None: no safetensors files), and its stop tokens. A fact of the files' content
    digest: `EvalCache` keeps it, so a warm eval neither parses the config through AutoConfig nor
    builds the model on the meta device (`check_target`)."""

    config: SimpleNamespace
    heads: HeadLocation | None
    stop_ids: list[int]
    key: str = ""  # its EvalCache key: (content digest, transformers version)
    cached: bool = False  # read from the cache (else `remember` writes it there)

    def remember(self, cache, path: Path, digest: str) -> None:
        """Keep it for the next eval of these files; the caller does it once the whole eval's input
        has passed its checks, so a refused eval leaves nothing behind."""
        if not self.cached:
            cache.put_checks(self.key, self.to_json(Path(path)), target=digest)

    def to_json(self, path: Path) -> dict:
        files = safetensors_files(path)

        def place(where: tuple[str, Path]) -> list:
            return [where[0], files.index(where[1])]

        return {"config": vars(self.config), "stop_ids": self.stop_ids,
                "heads": None if self.heads is None else {"embed": place(self.heads.embed),
                                                          "lm_head": place(self.heads.lm_head)}}

    @staticmethod
    def from_json(data, path: Path) -> CheckedTarget | None:
        """None unless `data` has the shape `to_json` writes and names files the folder still has
        (a damaged or hand-edited cache entry is a miss: the checks run again)."""
        try:
            files = safetensors_files(path)  # the folder's own index, checked inside it as on a miss
            heads = data["heads"]
            if heads is not None:
                places = [(str(heads[r][0]), int(heads[r][1])) for r in ("embed", "lm_head")]
                if any(not 0 <= i < len(files) for _, i in places):
                    return None
                heads = HeadLocation(*((name, files[i]) for name, i in places))
            stops = [int(t) for t in data["stop_ids"]]
            return CheckedTarget(SimpleNamespace(**data["config"]), heads, stops, cached=True)
        except (KeyError, IndexError, TypeError, ValueError):
            return None


def config_values(cfg) -> SimpleNamespace:
    """A transformers config as plain JSON values, its attribute aliases (`attribute_map`) included."""
    values = cfg.to_dict()
    for alias, name in getattr(cfg, "attribute_map", {}).items():
        if name in values:
            values[alias] = values[name]
    return SimpleNamespace(**values)


def check_target(path: str | Path, cache, digest: str, between=None) -> CheckedTarget:
    """The target's config, heads and stop tokens, checked (`check_weights`) once per content digest
    and transformers version, and read from `cache` (an EvalCache) after that (`remember`).
    `between(config)` runs once the config is known and before the weight files are checked: the
    prompts' checks, which must fail before anything is sized from the files. The config's size
    bounds and the files' places inside the folder are checked every time."""
    path = Path(path)
    key = cache_key("target-checks", digest, importlib.metadata.version("transformers"))
    data = cache.get_checks(key)
    known = CheckedTarget.from_json(data, path) if data is not None else None
    config = known.config if known is not None else config_values(text_config(path))
    check_sizes(vars(config), f"target {path} config.json")
    if between is not None:
        between(config)
    if known is None:
        return CheckedTarget(config, check_weights(path), stop_token_ids(path, config), key)
    return replace(known, key=key)


def load_heads(path: str | Path, heads: HeadLocation, text_cfg, stop_ids: list[int], device: str = "cpu",
               dtype: str = "fp32") -> TargetHeads:
    """The embedding and lm_head alone, as from_pretrained would hold them (cast to `dtype`)."""
    torch_dtype = getattr(torch, DTYPES[dtype])

    def read(name: str, file: Path) -> torch.Tensor:
        return read_safetensors(file, [name])[name].to(device=device, dtype=torch_dtype)

    embed = read(*heads.embed)
    head = embed if heads.lm_head == heads.embed else read(*heads.lm_head)
    return TargetHeads(Path(path), device, dtype, text_cfg, embed, head, list(stop_ids))


# The heads this process read last, by (folder, content digest, device, dtype). A warm host takes one
# eval after another (tracker/jobs/launchers/warm.py), so a sweep of checkpoints reads a target's heads
# once. One entry: another target, device or dtype replaces it, so no process holds two targets' heads.
_held: dict[tuple[str, str, str, str], TargetHeads] = {}


def held_heads(path: str | Path, digest: str, heads: HeadLocation, text_cfg, stop_ids: list[int],
               device: str = "cpu", dtype: str = "fp32") -> tuple[TargetHeads, bool]:
    """`load_heads`, kept for this process's next eval of the same target: (heads, whether they were
    held already). The digest covers the config and the weight files, so changed files are read again."""
    key = (str(Path(path).resolve()), digest, device, dtype)
    if key in _held:
        return _held[key], True
    _held.clear()  # before reading: the old heads' memory is free for the new ones
    _held[key] = load_heads(path, heads, text_cfg, stop_ids, device, dtype)
    return _held[key], False


def stop_token_ids(path: str | Path, text_cfg) -> list[int]:
    """The target's stop tokens as a loaded model's generation config gives them, from the files alone."""
    from transformers import GenerationConfig

    if (Path(path) / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(path)
    else:  # what from_pretrained derives when the file is missing
        generation = GenerationConfig.from_model_config(model_config(path))
    return _stop_ids(generation, text_cfg)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(path: str | Path):
    """The target's tokenizer, or None for a directory without tokenizer files (token-id prompts)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if any((path / name).is_file() for name in _TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    return None


class DeferredTokenizer:
    """The target's tokenizer, read the first time something uses it: prompts given as token ids and
    a protocol without a chat template never do, and importing transformers' tokenizers is most of
    what a warm eval would otherwise spend before its drafter runs. Used as the tokenizer itself."""

    def __init__(self, path: Path):
        self._path, self._tokenizer = path, None

    def _loaded(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._path)
        return self._tokenizer

    def __getattr__(self, name: str):
        return getattr(self._loaded(), name)

    def __call__(self, *args, **kwargs):
        return self._loaded()(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._loaded())


def deferred_tokenizer(path: str | Path) -> DeferredTokenizer | None:
    """`load_tokenizer`, read on first use; None (at once) for a directory without tokenizer files."""
    path = Path(path)
    return DeferredTokenizer(path) if any((path / name).is_file() for name in _TOKENIZER_FILES) else None


def load_target(path: str | Path, device: str = "cpu", dtype: str = "fp32", linear_attn_mode: str = "auto",
                gpus: int | None = None) -> Target:
    """Load a causal LM (Qwen3.5 text or multimodal, Qwen3, Llama, ...) for evaluation: on `device`, or on cuda with
    `gpus` > 1 spread over the first `gpus` GPUs this process sees by accelerate's plan (evaluators.sizing) for their
    free memory; its inputs then go where its embedding is."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    path = Path(path)
    _check_dir(path)
    if dtype not in DTYPES:
        raise DraftboardError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    spread = device.startswith("cuda") and (gpus or 1) > 1
    placed = {"device_map": _spread_plan(path, dtype, gpus).device_map} if spread else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, DTYPES[dtype]), trust_remote_code=False,
                                                     **placed)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        raise DraftboardError(f"target {path}: cannot load: {one_line(exc)}") from exc
    if spread:
        device = str(model.get_input_embeddings().weight.device)
    else:
        model.to(device)
    model.eval()
    resolution = linear_attn.apply(linear_attn_mode, device, linear_attn.module_of(model))
    return Target(model, path, device, dtype, resolution, load_tokenizer(path))


def _spread_plan(path: Path, dtype: str, gpus: int):
    """accelerate's plan of the target over the first `gpus` GPUs by their free memory; DraftboardError in one line
    where they cannot hold it."""
    from transformers import AutoConfig

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < gpus:
        raise DraftboardError(f"--gpus {gpus}: this process sees {seen} GPU(s)")
    free = [int(torch.cuda.mem_get_info(i)[0]) for i in range(gpus)]
    plan = sizing.target_plan(AutoConfig.from_pretrained(path, trust_remote_code=False), dtype, free)
    if not plan.fits:
        raise DraftboardError(f"target {path}: {plan.weights / 2**30:.3g} GiB of weights in {dtype} do not fit the "
                              f"{gpus} GPUs this eval holds ({', '.join(f'{f / 2**30:.3g}' for f in free)} GiB free, "
                              f"{sizing.GPU_HEADROOM:.0%} of each kept for activations): ask for more GPUs (--gpus)")
    return plan


def greedy_continuations(target: Target, prompts: list[list[int]], n_tokens: int, stop_after: int,
                         batch_size: int = 8, progress=None) -> list[list[int]]:
    """Greedy tokens after each prompt, batched with a KV cache (left padding).

    Stops a sequence `stop_after` tokens past its first stop token (the metrics need the
    target's greedy tokens up to block_size - 1 beyond the last anchor), or at `n_tokens`.
    """
    return [row for row, _ in _continuations(target, prompts, n_tokens, stop_after, batch_size, progress)]


@dataclass(frozen=True)
class Sampled:
    """One sampled continuation: its tokens and the probability each was drawn with."""

    tokens: list[int]
    probs: list[float]  # p(tokens[t] | prompt, tokens[:t]) under the sampling distribution


def sampled_continuations(target: Target, prompts: list[list[int]], seeds: list[int], n_tokens: int,
                          stop_after: int, sampling: Sampling, batch_size: int = 8, progress=None) -> list[Sampled]:
    """One continuation of each prompt drawn from the target under `sampling` (z-lab's
    `_sampling_probs`), prompt i from its own generator seeded with seeds[i]: the same draw
    whatever batch it shares. Bounded as `greedy_continuations`."""
    rows = _continuations(target, prompts, n_tokens, stop_after, batch_size, progress, sampling, seeds)
    out = []
    for tokens, probs in rows:
        n = _kept(tokens, set(target.stop_token_ids()), stop_after)
        out.append(Sampled(tokens[:n], probs[:n]))
    return out


def _continuations(target: Target, prompts: list[list[int]], n_tokens: int, stop_after: int, batch_size: int,
                   progress, sampling: Sampling | None = None,
                   seeds: list[int] | None = None) -> list[tuple[list[int], list[float] | None]]:
    stops = set(target.stop_token_ids())
    pad = target.config.pad_token_id
    pad = pad if pad is not None else (min(stops) if stops else 0)
    out: list[tuple[list[int], list[float] | None]] = [([], None) for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        longest = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), longest), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):
            ids[row, longest - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, longest - len(prompts[i]):] = 1
        draw = None if sampling is None else _Draw([seeds[i] for i in idx], sampling)
        gen = _generate(target, ids.to(target.device), mask.to(target.device), n_tokens, stops, stop_after, pad,
                        draw)
        for row, i in enumerate(idx):
            out[i] = (gen[row], None if draw is None else draw.probs[row])
        if progress:
            progress(len(idx))
    return out


class _Draw:
    """A logits processor that draws each row's next token itself (z-lab's sampling distribution,
    one uniform number per row and step from the row's own generator, inverted through the fp64
    cumulative distribution: exact, and the same draw for the same probabilities on any device but
    for rounding) and leaves generate only that token to pick."""

    def __init__(self, seeds: list[int], sampling: Sampling):
        self.sampling = sampling
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.probs: list[list[float]] = [[] for _ in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = sampling_probs(scores, self.sampling)  # [N, V]
        cdf = probs.double().cumsum(-1)  # [N, V]
        u = 1.0 - torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])  # (0, 1]
        # the first token whose cumulative mass reaches u (a token of probability 0 never does first)
        chosen = (cdf < u.to(cdf.device)[:, None] * cdf[:, -1:]).sum(-1).clamp_(max=probs.shape[-1] - 1)  # [N]
        for row, p in enumerate(probs.gather(-1, chosen[:, None])[:, 0].tolist()):
            self.probs[row].append(p)
        picked = torch.full_like(scores, float("-inf"))
        return picked.scatter_(1, chosen[:, None], 0.0)


@torch.no_grad()
def _generate(target: Target, ids, mask, n_tokens: int, stops: set[int], stop_after: int,
              pad: int, draw: _Draw | None = None) -> list[list[int]]:
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    class PastStop(StoppingCriteria):
        """Every row has produced a stop token and `stop_after` tokens after it."""

        def __call__(self, input_ids, scores, **kwargs):
            new = input_ids[:, ids.shape[1]:].tolist()
            return torch.tensor([_done(row, stops, stop_after) for row in new], device=input_ids.device)

    seqs = target.model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=n_tokens, do_sample=False,
        eos_token_id=None, pad_token_id=pad, stopping_criteria=StoppingCriteriaList([PastStop()]),
        logits_processor=LogitsProcessorList([draw] if draw is not None else []),
        temperature=None, top_p=None, top_k=None,
    )
    return [row[ids.shape[1]:].tolist() for row in seqs]


def _done(tokens: list[int], stops: set[int], stop_after: int) -> bool:
    for i, t in enumerate(tokens):
        if t in stops:
            return len(tokens) - i - 1 >= stop_after
    return False


def _kept(tokens: list[int], stops: set[int], stop_after: int) -> int:
    """How many of a row's tokens are its own: through `stop_after` past its first stop token (a
    finished row is padded while its batch goes on), else all of them."""
    for i, t in enumerate(tokens):
        if t in stops:
            return min(len(tokens), i + 1 + stop_after)
    return len(tokens)


class FeatureTap:
    """Forward hooks that keep the outputs of the tapped decoder layers, nothing else."""

    def __init__(self, target: Target, layer_ids: list[int]):
        n = target.num_layers
        bad = [i for i in layer_ids if not 0 <= i < n]
        if bad:
            raise DraftboardError(f"target_layer_ids {bad} out of range for a target with {n} layers")
        self.layer_ids = list(layer_ids)
        self.final_norm = target.text_model.norm
        self.last = n - 1
        self.outputs: dict[int, torch.Tensor] = {}
        self._handles = [target.text_model.layers[i].register_forward_hook(self._hook(i)) for i in layer_ids]

    def _hook(self, i: int):
        def keep(module, inputs, output):
            h = output[0] if isinstance(output, tuple) else output
            # hidden_states[n] of `output_hidden_states` is the final norm of the last layer.
            self.outputs[i] = self.final_norm(h) if i == self.last else h

        return keep

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def layer_hidden_states(target: Target, sequence: list[int], layer_ids: list[int]) -> dict[int, torch.Tensor]:
    """Hidden states of `layer_ids` for one token sequence: {layer: [T, H]} (the target's dtype, CPU).

    The reference for the batched pass: a batch of one has no padding at all."""
    return layer_hidden_states_batch(target, [sequence], layer_ids)[0]


@torch.no_grad()
def layer_hidden_states_batch(target: Target, sequences: list[list[int]],
                              layer_ids: list[int]) -> list[dict[int, torch.Tensor]]:
    """`layer_hidden_states` of several sequences in one forward, right-padded.

    The decoder is causal (attention and the linear-attention recurrence alike), so a real
    position never sees the padding after it: no attention mask is needed, and each row is cut
    back to its own length. Features equal the per-sequence pass to float rounding (batched
    matmuls may block differently; tests/test_target.py bounds the gap).
    """
    limit = target.max_positions
    for seq in sequences:
        if limit is not None and len(seq) > limit:
            raise DraftboardError(f"sequence of {len(seq)} tokens exceeds the target's context of {limit}")
    ids = torch.zeros((len(sequences), max(map(len, sequences))), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq)
    tap = FeatureTap(target, layer_ids)
    try:
        target.text_model(input_ids=ids.to(target.device), use_cache=False)
    finally:
        tap.close()
    return [{i: tap.outputs[i][row, :len(seq)].cpu() for i in layer_ids} for row, seq in enumerate(sequences)]


def describe(target: Target) -> dict:
    """What the results and cache keys say about the target."""
    return {
        "path": str(target.path),
        "model_type": getattr(target.config, "model_type", None),
        "num_layers": target.num_layers,
        "hidden_size": target.config.hidden_size,
        "vocab_size": target.config.vocab_size,
        "content_digest": content_digest(target.path),
    }


def cache_key(*parts) -> str:
    """A stable digest of JSON-able parts (target digest, token ids, numbers-relevant env ...)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]
