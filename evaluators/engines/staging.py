"""What a managed engine and llama.cpp's converter are given of a model folder: a private folder
holding only what draftboard read and checked (SECURITY.md: a checkpoint is data).

A model folder can name code three ways: `auto_map` entries in config.json or tokenizer_config.json
(a loader with `trust_remote_code` imports the folder's `.py`); an architecture in a nested text
config, which tools that choose by `architectures` prefer (llama.cpp's `get_model_architecture` takes
`text_config.architectures` first, and about 15 of its converter's model classes read the vocabulary
with `AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`); and an index naming other weight
files than the ones draftboard checked. The staged folder holds:
- config.json and the tokenizer's and generation config's JSON files, parsed and written anew without
  any `auto_map` (z-lab's drafters carry one for transformers' AutoModel; draftboard and the engines
  never use it);
- the tokenizer's other data files (tokenizer.json, tokenizer.model, vocab, merges, chat template);
- exactly the safetensors files draftboard read, under the names the engines look for (an index
  rewritten to its weight map).
No `.py` and nothing else. A folder whose declared architectures (the top level's and every nested
text config's the tools read) are not the ones draftboard decided is refused before anything starts.
Files are hard-linked (so a file renamed over the original after the check is not what loads), and
linked by name where the cache lies on another filesystem or the kernel refuses a hard link to
another user's file; the folder is removed when the eval ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from evaluators.drafter import ARCHITECTURE_ALIASES, ARCHITECTURES, CheckedDrafter
from evaluators.target import architecture_names, model_config, safetensors_files
from evaluators.weights import INDEX_SUFFIX, SAFETENSORS, SAFETENSORS_INDEX, index_shards, inside, one_line
from tracker.errors import DraftboardError
from tracker.untrusted.jsonlines import depth as json_depth

# The nested configs whose `architectures` llama.cpp's converter reads as the text model's
# (`ModelBase.load_hparams` renames llm_config, lm_config, thinker_config's text_config, language_config
# and lfm to text_config; vLLM's text config is text_config or thinker_config's).
TEXT_CONFIG_KEYS = ("text_config", "llm_config", "lm_config", "thinker_config", "language_config", "lfm")
# Parsed and written anew (without `auto_map`); a config or tokenizer config is a few KiB.
JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "added_tokens.json", "chat_template.json")
MAX_JSON_BYTES = 16 << 20
# Read by the tokenizers' own parsers as data; linked as they are.
DATA_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")
MAX_NESTING = 4
MAX_JSON_DEPTH = 64  # a model's config.json nests a few levels; 900 would overflow every recursive walk


def declared_architectures(config: dict, where: str) -> list[str]:
    """Every architecture name a tool may choose the model class by: the top level's `architectures`
    and each nested text config's (TEXT_CONFIG_KEYS, at any depth up to MAX_NESTING)."""
    found: list[str] = []

    def walk(d: dict, depth: int) -> None:
        names = d.get("architectures")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise DraftboardError(f"{where}: architectures must be a list of names, got {str(names)[:80]}")
            found.extend(names)
        for key in TEXT_CONFIG_KEYS:
            if isinstance(d.get(key), dict):
                if depth >= MAX_NESTING:
                    raise DraftboardError(f"{where}: {key} nested deeper than {MAX_NESTING} configs: refused")
                walk(d[key], depth + 1)

    walk(config, 0)
    return found


def without_code(value):
    """`value` with every `auto_map` entry removed, at any depth: what would name code to import."""
    if isinstance(value, dict):
        return {k: without_code(v) for k, v in value.items() if k != "auto_map"}
    if isinstance(value, list):
        return [without_code(v) for v in value]
    return value


def _read_json(path: Path, where: str):
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DraftboardError(f"{where}: {path.name} is over {MAX_JSON_BYTES >> 20} MiB: not a config file")
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise DraftboardError(f"{where}: {path.name} is not readable JSON ({one_line(exc)[:120]})") from None
    # Everything after this walks the JSON recursively (without_code, the staged copy's writer): bounded here.
    if json_depth(value) > MAX_JSON_DEPTH:
        raise DraftboardError(f"{where}: {path.name} is nested deeper than {MAX_JSON_DEPTH} levels: not a config file")
    return value


def _check_architectures(config: dict, allowed: frozenset[str], where: str, decided: str,
                         rename: Mapping[str, str]) -> None:
    declared = declared_architectures(config, where)
    wrong = sorted({name for name in declared if rename.get(name, name) not in allowed})
    if not declared or wrong:
        said = f"declares {', '.join(wrong)}" if declared else "declares no architectures"
        raise DraftboardError(f"{where}: config.json {said}, but draftboard read it as {decided}: refused (a tool "
                              "that chooses its model class by architectures, top level or text_config, would read "
                              "another model, and some run the folder's tokenizer code)")


def _link(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:  # another filesystem, or protected_hardlinks and another user's file
        dest.symlink_to(source)


def _stage(source: Path, into: Path, weights: dict[str, Path], index: dict | None, allowed: frozenset[str],
           what: str, decided: str, rename: Mapping[str, str] = MappingProxyType({})) -> Path:
    """`into` made to hold source's data files and `weights` ({name in the folder: checked file}); config.json's
    architectures written under the names engines know (`rename`: another tool's name for the same class)."""
    where = f"{what} {source}"
    config = _read_json(inside(source, "config.json", "config"), where)
    if not isinstance(config, dict):
        raise DraftboardError(f"{where}: config.json is not a JSON object")
    _check_architectures(config, allowed, where, decided, rename)
    into.mkdir()
    for name in JSON_FILES:
        if (source / name).is_file():
            data = without_code(_read_json(inside(source, name, "config file"), where))
            if name == "config.json" and isinstance(data.get("architectures"), list):
                data["architectures"] = [rename.get(a, a) for a in data["architectures"]]
            (into / name).write_text(json.dumps(data, ensure_ascii=False, indent=1))
    for name in DATA_FILES:
        if (source / name).is_file():
            _link(inside(source, name, "tokenizer file"), into / name)
    for name, path in weights.items():
        _link(path, into / name)
    if index is not None:
        (into / SAFETENSORS_INDEX).write_text(json.dumps(index))
    return into


def _index(path: Path) -> tuple[dict[str, Path], dict]:
    """A sharded checkpoint's shards by the names its index gives them, and the index as staged: the
    weight map alone."""
    shards = index_shards(path)
    weight_map = {key: os.path.normpath(str(name)) for key, name in _read_json(path, str(path))["weight_map"].items()}
    return {weight_map[key]: shards[key] for key in shards}, {"weight_map": weight_map}


def stage_target(target: Path, into: Path) -> Path:
    """The target's staged folder: its safetensors files as draftboard reads them (the index's shards,
    else model.safetensors), checked against the classes transformers maps its config to."""
    cfg = model_config(target)
    allowed = architecture_names(cfg)
    files = safetensors_files(target)
    if not files:
        raise DraftboardError(f"target {target}: no safetensors weights; a managed engine is given only the "
                              "safetensors files draftboard checks (re-save it with save_pretrained)")
    if (target / SAFETENSORS_INDEX).is_file():
        weights, index = _index(inside(target, SAFETENSORS_INDEX, "weights index"))
    else:
        weights, index = {SAFETENSORS: files[0]}, None
    return _stage(target, into / "target", weights, index, allowed, "target",
                  f"a {cfg.model_type} model ({', '.join(sorted(allowed)[:4])})")


def stage_drafter(drafter: Path, checked: CheckedDrafter, into: Path) -> Path:
    """The drafter's staged folder: the weight file (or index and shards) `checked` read, under the
    names engines look for, its architectures checked against the family draftboard decided."""
    family = checked.config.family
    read = checked.weights_path
    if read.name.endswith(INDEX_SUFFIX):
        weights, index = _index(read)
    elif read.suffix == ".safetensors":
        weights, index = {SAFETENSORS: read}, None
    else:
        raise DraftboardError(f"drafter {drafter}: {read.name} is a torch pickle; a managed engine is given only "
                              "safetensors weights (the engine's own loader would unpickle it)")
    return _stage(drafter, into / "drafter", weights, index, frozenset({ARCHITECTURES[family]}), "drafter",
                  f"a {family} drafter ({ARCHITECTURES[family]})", ARCHITECTURE_ALIASES)


@dataclass(frozen=True)
class Staged:
    """A managed eval's staged target and drafter folders, and the folders they were staged from (what a
    message names)."""

    target: str
    drafter: str
    target_source: str
    drafter_source: str


_STAGED_NAME = re.compile(r"eval-(\d{1,10})-[\w]{1,32}")
STAGED_MARK = ".draftboard-staged"  # written by `staged` into each folder it makes: what remove_stale may remove


def remove_stale(root: Path) -> list[Path]:
    """Remove the staged folders (`eval-<pid>-*` holding STAGED_MARK: made by `staged`) whose process is gone: one
    SIGKILLed mid-eval never reached its own removal, and its hard links keep a deleted checkpoint's bytes on disk.
    A folder whose pid is alive (its eval, or another process that took the number), or that `staged` did not
    mark, stays."""
    removed = []
    for entry in root.iterdir():
        match = _STAGED_NAME.fullmatch(entry.name)
        mark = entry / STAGED_MARK
        if match is None or entry.is_symlink() or not entry.is_dir() or mark.is_symlink() or not mark.is_file():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        except (PermissionError, OverflowError):  # alive under another user, or no such pid at all: left as it is
            continue
    return removed


@contextlib.contextmanager
def staged(target: str | Path, drafter: str | Path, checked: CheckedDrafter, cache: Path) -> Iterator[Staged]:
    """The target and drafter staged under `cache`/staged for the eval's life; removed after (only the
    folder made here: links and rewritten JSON, never the files they point to)."""
    target, drafter = Path(target).resolve(), Path(drafter).resolve()
    root = cache / "staged"
    root.mkdir(parents=True, exist_ok=True)
    remove_stale(root)
    folder = Path(tempfile.mkdtemp(prefix=f"eval-{os.getpid()}-", dir=root))
    try:
        (folder / STAGED_MARK).write_text(f"{os.getpid()}\n")
        yield Staged(str(stage_target(target, folder)), str(stage_drafter(drafter, checked, folder)), str(target),
                     str(drafter))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
