"""Loading and saving drafters: z-lab folders and teams' training checkpoints (.safetensors, .pt, .bin).

Loading runs in two steps. `open_drafter` reads only what is cheap: the config and the tensor
shapes (safetensors headers; a `.pt` unpickled onto the meta device), and checks them against
each other and against the target: the layer count against the layer keys, every key and shape
against the config, sizes against their bounds. Nothing is allocated from the config before
those checks pass. `CheckedDrafter.load` then reads the tensors and builds the model.

Every problem is a one-line ``DraftboardError``. ``.pt`` / ``.bin`` files are only ever read with
``torch.load(..., weights_only=True)``. Files a drafter folder names (shards, sidecar configs)
must lie inside it (`evaluators.weights.inside`).
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evaluators.drafter.config import (OTHER_FAMILIES, OTHER_FAMILY_WEIGHTS, SPECULATORS_TYPE, WHERE, DrafterConfig,
                                      as_int, from_speculators)
from evaluators.drafter.model import DFlashDrafter, parameter_shapes
from evaluators.limits import check_sizes
from evaluators.weights import (INDEX_SUFFIX, SAFETENSORS, SAFETENSORS_INDEX, Shapes, index_shards, inside, one_line,
                                read_json, read_safetensors, safetensors_header, safetensors_shapes)
from tracker.config import AUTOCAST_SUFFIX, CHECKPOINT_SUFFIXES, DRAFTER_PRECISIONS, DTYPES
from tracker.errors import DraftboardError

# Prefixes that wrappers put in front of the drafter's keys (DDP, trainer wrappers).
KEY_PREFIXES = ("module.", "model.", "draft_model.")
# Checkpoint keys the drafter may carry besides its own weights.
LM_HEAD_KEYS = ("lm_head.weight", "verifier_lm_head.weight")
# Entries of a .pt dict that may hold the state_dict, in the order they are tried.
STATE_DICT_ENTRIES = ("state_dict", "model", "model_state_dict", "draft_model", "module")
WEIGHT_SUFFIXES = CHECKPOINT_SUFFIXES
# z-lab's DFlash2DraftModel.from_pretrained key_mapping: the codebooks may be stored without `.weight`.
BARE_KEYS = {f"candidate_selector.{name}": f"candidate_selector.{name}.weight"
             for name in ("predecessor_codebook", "successor_codebook")}
# speculators' DFlash weights copy the verifier's embeddings and norm and its vocab maps next to the body.
SPECULATORS_EXTRA_KEYS = frozenset({"embed_tokens.weight", "verifier_norm.weight", "t2d", "d2t"})
# SpecForge's unified runtime saves `{run_id}-step{N}/training_state.pt`, not a model folder.
SPECFORGE_STATE = "training_state.pt"
SPECFORGE_DFLASH = ("block_size", "mask_token_id", "target_layer_ids")  # its `dflash_*` entries we read
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")

# The eval's dtype flags (tracker.config) and the torch names they stand for.
_TORCH_DTYPES = {name: getattr(torch, torch_name) for flag, torch_name in DTYPES.items()
                 for name in (flag, torch_name)}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _TORCH_DTYPES:
        raise DraftboardError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}")
    return _TORCH_DTYPES[key]


@dataclass(frozen=True)
class Precision:
    """How the drafter computes: its weights' dtype, and the autocast dtype if any (None: none)."""

    name: str  # one of tracker.config.DRAFTER_PRECISIONS
    weights: torch.dtype
    autocast: torch.dtype | None

    def context(self, device: str | torch.device):
        """The autocast context this precision computes under (a no-op without autocast)."""
        kind = torch.device(device).type
        return torch.autocast(kind, dtype=self.autocast or torch.float32, enabled=self.autocast is not None)


def parse_precision(name: str) -> Precision:
    """`bf16` -> weights cast to bf16; `bf16-autocast` -> fp32 weights under bf16 autocast."""
    if name not in DRAFTER_PRECISIONS:
        raise DraftboardError(f"unknown drafter precision {name!r}: use {', '.join(DRAFTER_PRECISIONS)}")
    if name.endswith(AUTOCAST_SUFFIX):
        return Precision(name, torch.float32, parse_dtype(name.removesuffix(AUTOCAST_SUFFIX)))
    return Precision(name, parse_dtype(name), None)


def autocast_precision(dtype: str) -> str:
    """The precision name of fp32 weights computing under autocast at `dtype` (fp32: no autocast)."""
    return dtype if parse_dtype(dtype) == torch.float32 else dtype + AUTOCAST_SUFFIX


def _shape(shape) -> str:
    return str(list(shape))


# --------------------------------------------------------------------------- stored tensors


@dataclass
class StoredWeights:
    """A checkpoint's tensors as stored: names and shapes now, the data only on request."""

    shapes: Shapes  # stored key -> shape
    config: dict | None  # the config embedded in the file, if any
    read: Callable[[list[str]], dict[str, torch.Tensor]]  # stored keys -> tensors (CPU)


def _stored_safetensors(files: list[Path]) -> StoredWeights:
    shapes, where = safetensors_shapes(files)

    def read(keys: list[str]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for path in dict.fromkeys(where[k] for k in keys):
            out.update(read_safetensors(path, [k for k in keys if where[k] == path]))
        return out

    return StoredWeights(shapes, None, read)


def _safetensors_file(path: Path) -> StoredWeights:
    shapes, meta = safetensors_header(path)
    config = None
    if "config" in meta:
        try:
            config = json.loads(meta["config"])
        except ValueError as e:
            raise DraftboardError(f"{path}: metadata 'config' is not valid JSON ({one_line(e)})") from None
    return StoredWeights(shapes, config, lambda keys: read_safetensors(path, keys))


def _torch_load(path: Path, map_location: str) -> tuple[dict[str, torch.Tensor], dict | None]:
    """(state_dict, embedded config) of a .pt / .bin file, unpickled with weights_only=True."""
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights only" in str(e).lower() or "weights_only" in str(e).lower():
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise DraftboardError(
                f"{path}: refused to unpickle: the file needs code execution to load "
                f"(torch.load weights_only=True failed: {first[:160]}); re-save it as a plain "
                "state_dict or safetensors"
            ) from None
        raise DraftboardError(f"cannot read {path}: truncated or corrupt checkpoint ({one_line(e)})") from None
    except Exception as e:  # zip / EOF / IO errors of a damaged file
        raise DraftboardError(f"cannot read {path}: truncated or corrupt checkpoint ({one_line(e)})") from None
    if not isinstance(obj, dict):
        raise DraftboardError(f"{path}: expected a state_dict or a dict with 'state_dict', got {type(obj).__name__}")
    config = obj.get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError as e:
            raise DraftboardError(f"{path}: entry 'config' is not valid JSON ({one_line(e)})") from None
    if config is not None and not isinstance(config, dict):
        raise DraftboardError(f"{path}: entry 'config' must be a dict or JSON string")
    for key in STATE_DICT_ENTRIES:
        entry = obj.get(key)
        if isinstance(entry, dict) and entry and all(isinstance(v, torch.Tensor) for v in entry.values()):
            return dict(entry), config
    sd = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not sd:
        raise DraftboardError(
            f"{path}: no tensors found (expected a state_dict, or a dict with 'state_dict' or 'model')"
        )
    return sd, config


def _torch_file(path: Path) -> StoredWeights:
    shapes_only, config = _torch_load(path, "meta")  # meta tensors: shapes, no data

    def read(keys: list[str]) -> dict[str, torch.Tensor]:
        sd, _ = _torch_load(path, "cpu")
        return {k: sd[k] for k in keys}

    return StoredWeights({k: tuple(v.shape) for k, v in shapes_only.items()}, config, read)


def stored_weights(path: Path) -> StoredWeights:
    """The tensors of a weight file: safetensors, a sharded index, or a .pt / .bin."""
    if path.name.endswith(INDEX_SUFFIX):
        return _stored_safetensors(sorted(set(index_shards(path).values())))
    if path.suffix == ".safetensors":
        return _safetensors_file(path)
    if path.suffix in (".pt", ".pth", ".bin"):
        return _torch_file(path)
    raise DraftboardError(f"{path}: unknown checkpoint format (use .safetensors, .pt or .bin)")


def _strip_prefixes(keys: list[str], path: Path) -> dict[str, str]:
    """{drafter key: stored key}: wrapper prefixes removed, derived buffers dropped, bare codebook names
    given their `.weight` (BARE_KEYS)."""
    out: dict[str, str] = {}
    for key in keys:
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
        name = BARE_KEYS.get(name, name)
        if name in out:
            raise DraftboardError(f"{path}: key {key!r} collides with another key after stripping prefixes")
        out[name] = key
    return out


# --------------------------------------------------------------------------- finding the files


def _find_weights(directory: Path) -> Path:
    for name in (SAFETENSORS, SAFETENSORS_INDEX, "pytorch_model.bin"):
        if (directory / name).is_file():
            return inside(directory, name, "weights file")
    found = [p for p in sorted(directory.iterdir()) if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    if len(found) == 1:
        return inside(directory, found[0].name, "weights file")
    raise DraftboardError(
        f"{directory}: expected {SAFETENSORS} (found {len(found)} candidate weight files); "
        "pass the checkpoint file itself"
    )


def _sidecar_config(path: Path) -> Path:
    """`<file>.json`, else `config.json`, next to a checkpoint file (inside its folder)."""
    for name in (path.name + ".json", "config.json"):
        if (path.parent / name).is_file() and name != path.name:
            return inside(path.parent, name, "sidecar config")
    raise DraftboardError(
        f"{path}: no drafter config: embed it (safetensors metadata 'config', or a .pt "
        f"dict with 'config'), or put {path.name}.json or config.json next to it"
    )


@dataclass
class _Found:
    """What a drafter path holds, before any check: its kind, config and stored tensors."""

    kind: str
    weights_path: Path
    raw: dict
    config_src: str
    stored: StoredWeights
    warnings: list[str] = field(default_factory=list)
    ignored: frozenset[str] = frozenset()  # stored keys that are not the drafter's (after prefix stripping)


def _export_hint(folder: Path) -> str:
    return (f"export it to a model folder with `specforge export --to hf --checkpoint {folder} --draft-config "
            "DRAFT_CONFIG.json` and evaluate that folder")


def _specforge_runtime(path: Path) -> _Found:
    """A SpecForge runtime checkpoint: `draft_state_dict` (z-lab key names) and `dflash_*` settings
    in a pickle read with weights_only=True; the architecture from the draft config next to it."""
    try:
        obj = torch.load(path, map_location="meta", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DraftboardError(f"{path}: refused to unpickle this SpecForge checkpoint: it needs code execution "
                              f"to load (torch.load weights_only=True failed: {first[:120]}); "
                              f"{_export_hint(path.parent)}") from None
    except Exception as e:  # zip / EOF / IO errors of a damaged file
        raise DraftboardError(f"cannot read {path}: truncated or corrupt checkpoint ({one_line(e)})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("draft_state_dict"), dict):
        raise DraftboardError(f"{path}: not a SpecForge runtime checkpoint (no draft_state_dict)")
    if obj.get("strategy", "dflash") != "dflash":
        raise DraftboardError(f"{path}: a SpecForge {obj['strategy']!r} checkpoint, not a DFlash drafter")
    shapes = {k: tuple(v.shape) for k, v in obj["draft_state_dict"].items() if isinstance(v, torch.Tensor)}

    def read(keys: list[str]) -> dict[str, torch.Tensor]:
        state = torch.load(path, map_location="cpu", weights_only=True)["draft_state_dict"]
        return {k: state[k] for k in keys}

    try:
        sidecar = _sidecar_config(path)
    except DraftboardError:
        raise DraftboardError(f"{path}: SpecForge keeps the drafter's architecture (rope, norms, heads) out of "
                              "training_state.pt: put the --draft-config JSON it trained with next to it as "
                              f"config.json, or {_export_hint(path.parent)}") from None
    raw = read_json(sidecar, WHERE)
    dflash = dict(raw.get("dflash_config") or {})
    dflash.update({name: obj[f"dflash_{name}"] for name in SPECFORGE_DFLASH if obj.get(f"dflash_{name}") is not None})
    raw["dflash_config"] = dflash
    stored = StoredWeights(shapes, None, read)
    return _Found("SpecForge runtime checkpoint", path, raw, f"{sidecar.name} + dflash_* of {SPECFORGE_STATE}", stored)


def _find(path: Path) -> _Found:
    if not path.exists():
        raise DraftboardError(f"drafter checkpoint {path} does not exist")
    if path.name == SPECFORGE_STATE and path.is_file():
        return _specforge_runtime(path)
    if path.is_dir() and (path / SPECFORGE_STATE).is_file() and not any(
            (path / name).is_file() for name in (SAFETENSORS, SAFETENSORS_INDEX, "pytorch_model.bin")):
        return _specforge_runtime(inside(path, SPECFORGE_STATE, "SpecForge checkpoint"))
    if path.is_dir():
        weights_path = _find_weights(path)
        config_path = inside(path, "config.json", "config")
        if not config_path.is_file():
            raise DraftboardError(f"{path}: no config.json in the drafter directory")
        stored = stored_weights(weights_path)
        raw = read_json(config_path, WHERE)
        if isinstance(raw, dict) and SPECULATORS_TYPE in raw:
            return _Found("speculators directory", weights_path, from_speculators(raw),
                          "config.json, speculators format converted", stored, ignored=SPECULATORS_EXTRA_KEYS)
        found = _Found("z-lab directory", weights_path, raw, "config.json", stored)
        if stored.config is not None:
            found.warnings.append("ignored the config embedded in the weights; config.json wins in a directory")
        return found
    stored = stored_weights(path)
    kind = f"{path.suffix.lstrip('.')} checkpoint"
    if stored.config is not None:
        return _Found(kind, path, stored.config, "embedded config", stored)
    sidecar = _sidecar_config(path)
    return _Found(kind, path, read_json(sidecar, WHERE), sidecar.name, stored)


# --------------------------------------------------------------------------- checks


def _check_layer_count(raw: dict, shapes: Shapes, where: str, config_src: str) -> None:
    """num_hidden_layers must be the number of `layers.{i}.` indices the weights hold."""
    layers = as_int(raw.get("num_hidden_layers"), "num_hidden_layers")
    held = sorted({int(m.group(1)) for key in shapes if (m := _LAYER_KEY.match(key))})
    if layers is not None and held != list(range(layers)):
        shown = f"layers {held[0]}..{held[-1]} ({len(held)} indices)" if held else "no layers"
        raise DraftboardError(
            f"{where}: the {config_src} says num_hidden_layers={layers} but the weights hold {shown}: "
            "config and weights do not belong together"
        )


def _config(found: _Found, shapes: Shapes, target_num_layers: int | None) -> DrafterConfig:
    """The drafter config, checked against the shapes (fc width gives the tapped count, q_norm the head_dim)."""
    where, raw, src = str(found.weights_path), dict(found.raw), found.config_src
    check_sizes(raw, WHERE)
    _check_layer_count(raw, shapes, where, src)
    fc = shapes.get("fc.weight")
    if fc is None:
        raise DraftboardError(f"{where}: missing key fc.weight: not a DFlash drafter checkpoint")
    hidden = raw.get("hidden_size")
    if hidden is None:
        raise DraftboardError(f"{where}: the {src} has no hidden_size")
    if len(fc) != 2 or not isinstance(hidden, int) or hidden < 1 or fc[1] % hidden or fc[0] != hidden:
        raise DraftboardError(
            f"{where}: fc.weight has shape {_shape(fc)}, expected [hidden_size, n_tapped*hidden_size] "
            f"with hidden_size={hidden!r} from the {src}"
        )
    n_tapped = fc[1] // hidden
    q_norm = shapes.get("layers.0.self_attn.q_norm.weight")
    if raw.get("head_dim") is None and q_norm is not None and len(q_norm) == 1:
        raw["head_dim"] = q_norm[0]  # z-lab would use Qwen3Config's default; trust the weights
    cfg = DrafterConfig.from_dict(raw, n_tapped=n_tapped, num_target_layers=target_num_layers)
    if cfg.n_tapped != n_tapped:
        raise DraftboardError(
            f"{where}: fc.weight has shape {_shape(fc)} = {n_tapped} tapped layers x hidden {hidden}, "
            f"but dflash_config.target_layer_ids {cfg.target_layer_ids} has {cfg.n_tapped}"
        )
    if cfg.mask_token_id is None:
        raise DraftboardError(f"{where}: the {src} has no dflash_config.mask_token_id")
    return cfg


@dataclass(frozen=True)
class TargetDims:
    """What a drafter must agree with in its target (None: not known, not checked)."""

    hidden_size: int | None = None
    num_layers: int | None = None
    vocab_size: int | None = None


def _check_against_target(cfg: DrafterConfig, shapes: Shapes, target: TargetDims, where: str) -> list[str]:
    """Hidden size, tapped layer range, vocab and the drafter's own lm_head against the target; warnings."""
    if target.hidden_size is not None and cfg.hidden_size != target.hidden_size:
        raise DraftboardError(
            f"{where}: drafter hidden_size {cfg.hidden_size} (fc.weight {_shape(shapes['fc.weight'])}) does not "
            f"match the target's hidden size {target.hidden_size}: this drafter is for another target"
        )
    n_layers = target.num_layers if target.num_layers is not None else cfg.num_target_layers
    if n_layers is not None:
        bad = [i for i in cfg.target_layer_ids if i >= n_layers]
        if bad:
            raise DraftboardError(
                f"{where}: target_layer_ids {cfg.target_layer_ids} out of range for a target with "
                f"{n_layers} layers (ids must be < {n_layers})"
            )
    warnings = []
    if target.num_layers is not None and cfg.num_target_layers not in (None, target.num_layers):
        warnings.append(
            f"config num_target_layers={cfg.num_target_layers} but the target has {target.num_layers} layers"
        )
    if target.vocab_size is not None and cfg.vocab_size is not None and cfg.vocab_size != target.vocab_size:
        raise DraftboardError(
            f"{where}: drafter vocab_size {cfg.vocab_size} does not match the target's vocab size {target.vocab_size}"
        )
    vocab = target.vocab_size if target.vocab_size is not None else cfg.vocab_size
    if vocab is not None and cfg.mask_token_id >= vocab:
        raise DraftboardError(f"{where}: mask_token_id {cfg.mask_token_id} is outside the vocab of {vocab} tokens")
    for key in LM_HEAD_KEYS:
        head = shapes.get(key)
        if head is None:
            continue
        if len(head) != 2 or head[1] != cfg.hidden_size:
            raise DraftboardError(f"{where}: {key} has shape {_shape(head)}, expected [vocab, {cfg.hidden_size}]")
        if vocab is not None and head[0] != vocab:
            raise DraftboardError(
                f"{where}: {key} has shape {_shape(head)}: {head[0]} rows but the "
                f"{'target' if target.vocab_size is not None else 'config'} vocab size is {vocab}"
            )
    return warnings


def _check_keys(expected: Shapes, shapes: Shapes, where: str) -> None:
    other = next((OTHER_FAMILY_WEIGHTS[part] for k in shapes for part in k.split(".") if part in OTHER_FAMILY_WEIGHTS),
                 None)
    if other is not None:  # a family sharing DFlash's files whose own code draftboard does not run
        raise DraftboardError(f"{where}: a {OTHER_FAMILIES[other]} drafter, by its weight names: draftboard does "
                              "not run its own code, so it is refused, not read as DFlash")
    missing = [k for k in expected if k not in shapes]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DraftboardError(
            f"{where}: missing key {missing[0]}{more}: the checkpoint does not match the config "
            f"(expected shape {_shape(expected[missing[0]])})"
        )
    unexpected = [k for k in shapes if k not in expected and k not in LM_HEAD_KEYS]
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise DraftboardError(
            f"{where}: unexpected key {unexpected[0]} {_shape(shapes[unexpected[0]])}{more}: "
            "not part of a DFlash drafter with this config"
        )
    for key, ref in expected.items():
        if shapes[key] != ref:
            raise DraftboardError(f"{where}: tensor {key} has shape {_shape(shapes[key])}, the config expects {_shape(ref)}")


# --------------------------------------------------------------------------- loading


@dataclass
class LoadedDrafter:
    model: DFlashDrafter
    config: DrafterConfig
    own_lm_head: torch.Tensor | None
    source: str
    own_lm_head_key: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class CheckedDrafter:
    """A drafter whose config, keys and shapes passed every check; no tensor data read yet."""

    config: DrafterConfig
    source: str
    weights_path: Path
    stored: StoredWeights
    keys: dict[str, str]  # drafter key -> stored key
    own_lm_head_key: str | None
    warnings: list[str]

    def load(self, device: str | torch.device = "cpu", dtype: torch.dtype | str = torch.float32) -> LoadedDrafter:
        """Read the tensors (refusing NaN / Inf), then build the model on them."""
        dtype = parse_dtype(dtype)
        wanted = [*parameter_shapes(self.config), *([self.own_lm_head_key] if self.own_lm_head_key else [])]
        stored = self.stored.read([self.keys[k] for k in wanted])
        tensors = {k: stored[self.keys[k]] for k in wanted}
        for key, value in tensors.items():
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise DraftboardError(
                    f"{self.weights_path}: tensor {key} {_shape(value.shape)} contains NaN or Inf values"
                )
        with torch.device("meta"):
            model = DFlashDrafter(self.config)
        state = {k: tensors[k].to(device=device, dtype=dtype).contiguous() for k in model.state_dict()}
        model.load_state_dict(state, assign=True)
        model.eval().requires_grad_(False)
        own = tensors[self.own_lm_head_key].to(device=device, dtype=dtype) if self.own_lm_head_key else None
        return LoadedDrafter(model=model, config=self.config, own_lm_head=own, source=self.source,
                             own_lm_head_key=self.own_lm_head_key, warnings=list(self.warnings))


@dataclass(frozen=True)
class StoredDrafter:
    """A drafter checkpoint as stored, before any check: what `draftboard doctor` inspects where a
    strict load (`open_drafter`) would refuse."""

    kind: str
    raw_config: dict
    shapes: Shapes  # every stored tensor, wrapper prefixes stripped
    extra: frozenset[str]  # stored keys a loader skips on purpose (speculators' copies of the verifier's)


def stored_drafter(path: str | Path) -> StoredDrafter:
    found = _find(Path(path))
    keys = _strip_prefixes(list(found.stored.shapes), found.weights_path)
    return StoredDrafter(found.kind, dict(found.raw), {k: found.stored.shapes[s] for k, s in keys.items()},
                         found.ignored)


def open_drafter(path: str | Path, target: TargetDims = TargetDims()) -> CheckedDrafter:
    """Find a drafter's config and tensor shapes and check them, against each other and `target`.

    Config precedence for a file: embedded (safetensors metadata "config", or a .pt dict's
    "config") > ``<file>.json`` > ``config.json`` next to it; in a directory, ``config.json``.
    """
    path = Path(path)
    found = _find(path)
    keys = {k: stored for k, stored in _strip_prefixes(list(found.stored.shapes), found.weights_path).items()
            if k not in found.ignored}
    shapes = {k: found.stored.shapes[stored] for k, stored in keys.items()}
    where = str(found.weights_path)
    cfg = _config(found, shapes, target.num_layers)
    warnings = found.warnings + _check_against_target(cfg, shapes, target, where)
    _check_keys(parameter_shapes(cfg), shapes, where)
    return CheckedDrafter(
        config=cfg, source=f"{found.kind} {path} (config: {found.config_src})", weights_path=found.weights_path,
        stored=found.stored, keys=keys, own_lm_head_key=next((k for k in LM_HEAD_KEYS if k in shapes), None),
        warnings=warnings,
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
    """Load a z-lab drafter directory or a team's checkpoint file, validated against the target."""
    dtype = parse_dtype(dtype)
    checked = open_drafter(path, TargetDims(target_hidden_size, target_num_layers, target_vocab_size))
    return checked.load(device, dtype)


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
    save_file(tensors, str(out / SAFETENSORS), metadata={"format": "pt"})
    return out
