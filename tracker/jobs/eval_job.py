"""The eval job: the one declaration of `draftboard eval`'s flags, and what a queued eval may hold.

Each flag is an `EvalField` in EVAL_FIELDS, declared once: its type, default, choices (from
`tracker.config`), help, whether it names a file the eval reads, and whether a queued job may
set it. Everything else is derived from that list:
- `add_eval_arguments(parser)`: the CLI's `draftboard eval` flags (docs/DESIGN.md fixes them);
- `validate(params)`: a job's params, checked (types, choices, budgets <= config.MAX_BUDGET,
  unknown keys refused) and normalized (None dropped: the CLI default applies);
- `cli_args(params)`: the arguments `eval --flag value ...` that the worker appends to its own
  `python -m tracker.cli`. A job row holds params only; no stored argv is ever run;
- `check_paths(params, roots)`: the allowed-roots check, which also walks a target or drafter
  folder for symlinks and shard indexes that lead outside the roots.

Imports only `tracker.config` and `tracker.errors`, so the CLI, the queue, the worker and the
Launch form can all share it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracker import config
from tracker.errors import DraftboardError
from tracker.untrusted.digits import whole_number

KIND = "eval"

# What an EvalField holds: free text, a non-negative integer, a finite non-negative number, integers
# from 1 to the field's `upper` (DDTree budgets, load levels: "4,8,16" on the command line, a sorted
# list in params), a store_true flag, or an on/off switch (--x / --no-x).
TEXT, INT, FLOAT, INTS, FLAG, SWITCH = "text", "int", "float", "ints", "flag", "switch"


@dataclass(frozen=True)
class EvalField:
    name: str  # the param key; the flag is --name-with-dashes
    kind: str
    help: str | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    path: bool = False  # names a file or folder the eval reads: checked against the allowed roots
    job: bool = True  # a queued job may set it (False: the eval would write where the job says)
    metavar: str | None = None  # INTS: an example list
    upper: int = 0  # INTS: the largest item
    lower: int = 1  # INTS: the smallest item
    unit: str = ""  # INTS: what one item is, in messages
    most: int = 0  # INTS: at most this many items (0: no bound)

    @property
    def flag(self) -> str:
        return config.flag(self.name)


EVAL_FIELDS: tuple[EvalField, ...] = (
    EvalField("target", TEXT, "target model directory (transformers format)", required=True, path=True),
    EvalField("drafter", TEXT, "z-lab drafter directory, or a .safetensors/.pt checkpoint", required=True,
              path=True),
    EvalField("prompts", TEXT, "JSON lines ({id, input_ids | prompt | messages}, z-lab or Spec-Bench turns), a "
              "folder of them (one file per dataset), or hf:NAME[:CONFIG]:SPLIT", required=True, path=True),
    EvalField("completions", TEXT, "reuse fixed continuations: JSON lines or a previous results JSON", path=True),
    EvalField("max_new_tokens", INT, default=256),
    EvalField("budgets", INTS, f"DDTree node budgets (each at most {config.MAX_BUDGET})",
              default=config.DEFAULT_BUDGETS, metavar="4,8,16,32", upper=config.MAX_BUDGET, unit="budget",
              most=config.MAX_BUDGETS),
    EvalField("device", TEXT, "default: cuda if available", choices=config.DEVICES),
    EvalField("dtype", TEXT, "the target's dtype (its features), and the drafter's unless --drafter-precision",
              default="fp32", choices=config.EVAL_DTYPES),
    EvalField("drafter_precision", TEXT, "how the drafter computes: bf16 = weights cast to bf16, bf16-autocast = "
              "fp32 weights under bf16 autocast (mixed-precision training); default: cast to --dtype",
              choices=config.DRAFTER_PRECISIONS),
    EvalField("linear_attn", TEXT, "which implementation runs the Gated DeltaNet layers (see docs/DESIGN.md)",
              default="auto", choices=config.LINEAR_ATTN_MODES),
    EvalField("out", TEXT, "write the results JSON here", job=False),
    # The deployment's, never a job's: a queued eval logs to its worker's own store (tracker/config.py).
    EvalField("tracking_uri", TEXT, "the MLflow store (default: MLFLOW_TRACKING_URI, else ./draftboard.db)",
              job=False),
    EvalField("train_run_id", TEXT, "the training run this checkpoint belongs to"),
    EvalField("checkpoint_step", INT, "the training step of this checkpoint"),
    EvalField("reference", TEXT, "log as a reference run with this name (e.g. z-lab's drafter)", metavar="NAME"),
    EvalField("name", TEXT, "run name (default: derived from the drafter path)"),
    EvalField("no_log", FLAG, "do not log to MLflow", default=False),
    EvalField("cache_dir", TEXT, "target continuation/feature cache (default: $DRAFTBOARD_HOME/cache)", job=False),
    EvalField("enable_thinking", SWITCH, "passed to the chat template where it supports it"),
    EvalField("last_block", TEXT, "end of generation: cut (z-lab 07ebd93: no block produces past "
              "--max-new-tokens) or full (z-lab 44947fb: the last block is scored whole)",
              default=config.LAST_BLOCK_RULES[0], choices=config.LAST_BLOCK_RULES),
    EvalField("scoring", TEXT, "offline (teacher-forced, lossless) or online (z-lab's cached loop, batch 1)",
              default=config.EVAL_SCORINGS[0], choices=config.EVAL_SCORINGS),
    EvalField("prompt_tokens", INT, "long-context sets (LongBench, LongBench v2, ShareGPT rows): make each prompt N "
              "tokens of text, the middle cut as LongBench cuts it or filled with the set's own documents, never "
              "padding (docs/DESIGN.md, Acceptance by context length)", metavar="N"),
    EvalField("limit_per_dataset", INT, "at most N prompts per dataset (a fixed-seed sample, as z-lab's "
              "--max-samples)", metavar="N"),
    EvalField("batch_size", INT, "prompts per target batch (continuations and features); default: sized from "
              "the device's free memory", metavar="N"),
    EvalField("anchor_chunk", INT, "anchors the drafter scores per call; default: sized from the device's free "
              "memory (pin both for bitwise repeatability across machines)", metavar="N"),
    EvalField("temperature", FLOAT, "T > 0: sampled acceptance, z-lab's sampled loop in expectation over "
              "--samples continuations per prompt (docs/DESIGN.md, Sampled acceptance); 0: greedy", default=0.0,
              metavar="T"),
    EvalField("top_p", FLOAT, "nucleus cut-off applied to the target and the drafter as z-lab's _sampling_probs",
              default=1.0, metavar="P"),
    EvalField("top_k", INT, "top-k cut-off (0: none), applied as --top-p", default=0, metavar="K"),
    EvalField("samples", INT, f"T > 0: continuations drawn per prompt (at most {config.MAX_DRAWS}); every "
              "checkpoint scored with the same target, prompts, sampling and seed meets the same ones",
              default=1, metavar="N"),
    EvalField("seeds", INT, f"T > 0 with --scoring online: runs of the sampled loop per prompt (at most "
              f"{config.MAX_DRAWS}), the Monte Carlo check of the offline expectation", default=1, metavar="N"),
    EvalField("seed", INT, "the seed every draw derives from (with the prompt's tokens and the draw's index)",
              default=0, metavar="S"),
    EvalField("engine", TEXT, "measure in a serving engine instead of offline: the same prompts and protocol, "
              "the engine's own per-request acceptance (docs/DESIGN.md, Engine evals)", choices=config.ENGINES),
    # The deployment's, never a job's: a worker starts an engine from its own DRAFTBOARD_<ENGINE>_PYTHON.
    EvalField("engine_python", TEXT, "managed mode: the Python of the engine's own venv (default: "
              "DRAFTBOARD_VLLM_PYTHON / DRAFTBOARD_SGLANG_PYTHON)", job=False, metavar="PATH"),
    EvalField("engine_url", TEXT, "attached mode: a running server (a queued job: one of DRAFTBOARD_ENGINE_URLS)",
              metavar="URL"),
    EvalField("engine_port", INT, "managed mode: listen on this loopback port (default: a free one)", job=False),
    EvalField("num_speculative_tokens", INT, "draft tokens per engine step (default: block size - 1)", metavar="N"),
    EvalField("prefix_caching", FLAG, "with a managed --engine vllm: serve with its prefix cache on (a load sweep's "
              "cache dimension: each level's hit rate from vLLM's counters; refused on hybrid targets)", default=False),
    EvalField("context_buckets", INTS, "edges of the context-length buckets of tau_by_context (a block's context: "
              "prompt + completion tokens up to its anchor; default: octaves of the prompts' contexts)",
              metavar="0,512,2048", upper=config.MAX_CONTEXT_EDGE, lower=0, unit="context bucket edge",
              most=config.MAX_CONTEXT_BUCKETS),
    EvalField("concurrency", INTS, "with --engine: a load sweep, the same prompts with this many requests in flight "
              "at each level, drafter on and target alone (docs/DESIGN.md, Load sweeps)", metavar="1,4,8",
              upper=config.MAX_CONCURRENCY, unit="concurrency level", most=config.MAX_CONCURRENCY_LEVELS),
    EvalField("gpus", INT, "GPUs the job holds on a worker that hands them out (`worker --gpus`; default: 1 "
              "on cuda, none with --device cpu); the eval itself sees only those", metavar="N"),
    EvalField("shards", INT, f"split the prompts across N processes, each on its own GPU (the k-th this eval sees) "
              f"or its share of the CPU cores, merged into one eval exactly as one process scores it (offline "
              f"scoring; at most {config.MAX_SHARDS})", metavar="N"),
    EvalField("repeats", INT, f"with --concurrency: rounds per level, the drafter's and the target alone's "
              f"interleaved; the speedup is the ratio of their medians with its interval over rounds (default "
              f"{config.DEFAULT_REPEATS}, at most {config.MAX_REPEATS})", metavar="N"),
)
FIELDS = {f.name: f for f in EVAL_FIELDS}
JOB_FIELDS = tuple(f for f in EVAL_FIELDS if f.job)
PATH_FIELDS = tuple(f for f in JOB_FIELDS if f.path)
# The environment flags `draftboard fingerprint` shares with `draftboard eval`.
ENV_FIELDS = ("device", "dtype", "drafter_precision", "linear_attn")


# --------------------------------------------------------------------------- values


def _checked(field: EvalField, value: Any) -> Any:
    """The value as a job holds it; ValueError (the reason, without the field's name) otherwise."""
    if field.kind in (FLAG, SWITCH):
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value
    if field.kind == INT:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"must be a non-negative integer, got {value!r}")
        return value
    if field.kind == FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"must be a finite number >= 0, got {value!r}")
        return float(value)
    if field.kind == INTS:
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError(f"must be a non-empty list of integers, got {value!r}")
        if field.most and len(value) > field.most:
            raise ValueError(f"at most {field.most} {field.unit}s, got {len(value)}")
        if not all(isinstance(b, int) and not isinstance(b, bool) and field.lower <= b <= field.upper for b in value):
            raise ValueError(f"each {field.unit} must be an integer from {field.lower} to {field.upper}, got "
                             f"{str(list(value))[:80]}")
        return sorted(set(value))
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str) or not text.strip() or "\0" in text:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    if text.startswith("-"):
        # argparse would read it as a flag; "./-name" reaches the same file.
        raise ValueError(f"{text!r} starts with '-'; write it as ./{text}")
    if field.choices is not None and text not in field.choices:
        raise ValueError(f"must be one of {', '.join(field.choices)}, got {text!r}")
    return text


def parse_ints(name: str, text: str) -> list[int]:
    """`4,8,16` -> [4, 8, 16] (sorted, unique) for the INTS field `name`; ValueError saying what is wrong."""
    field = FIELDS[name]
    if field.most and str(text).count(",") >= field.most:  # counted before a list is built
        raise ValueError(f"{name}: at most {field.most} {field.unit}s, got {str(text).count(',') + 1}")
    values = [_signed(part) for part in str(text).replace(" ", "").split(",") if part]
    if None in values:  # ASCII digits only: int() also reads `1_6` and `٣`
        raise ValueError(f"{name} must be comma-separated integers like {field.metavar}, got {str(text)[:40]!r}")
    return _checked(field, values)  # the range, said in the field's words


def _signed(text: str) -> int | None:
    """`-4` -> -4, `16` -> 16 (ASCII digits, bounded: tracker.untrusted.digits); None for anything else."""
    number = whole_number(text.removeprefix("-"))
    return None if number is None else -number if text.startswith("-") else number


def _arg_type(field: EvalField) -> Callable[[str], Any]:
    """The argparse `type` of a flag: the same checks a job's params get."""
    def convert(text: str) -> Any:
        try:
            if field.kind == INTS:
                return tuple(parse_ints(field.name, text))
            number = float if field.kind == FLOAT else int
            try:
                value = number(text)
            except ValueError:
                raise ValueError(f"must be {'a number' if field.kind == FLOAT else 'an integer'}, got {text!r}") from None
            return _checked(field, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = field.name  # argparse names the type in its messages
    return convert


def add_eval_arguments(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """Add the `draftboard eval` flags (or only those called names) to parser."""
    for field in EVAL_FIELDS if names is None else [FIELDS[n] for n in names]:
        kwargs: dict[str, Any] = {"help": field.help}
        if field.kind == FLAG:
            kwargs["action"] = "store_true"
        elif field.kind == SWITCH:
            kwargs.update(action=argparse.BooleanOptionalAction, default=None)
        else:
            kwargs.update(default=field.default, required=field.required)
            if field.kind in (INT, FLOAT, INTS):
                kwargs["type"] = _arg_type(field)
            if field.choices is not None:
                kwargs["choices"] = field.choices
            if field.metavar:
                kwargs["metavar"] = field.metavar
        parser.add_argument(field.flag, **kwargs)


def validate(params: Any) -> dict[str, Any]:
    """A queued eval's params, checked and normalized; DraftboardError names what is wrong."""
    if not isinstance(params, Mapping):
        raise DraftboardError(f"eval job params must be a JSON object, got {type(params).__name__}")
    unknown = sorted(str(k) for k in params if k not in FIELDS or not FIELDS[k].job)
    if unknown:
        known = ", ".join(f.name for f in JOB_FIELDS)
        raise DraftboardError(f"unknown eval param(s) {', '.join(unknown)}; a queued eval may set {known}")
    missing = [f.name for f in JOB_FIELDS if f.required and params.get(f.name) is None]
    if missing:
        raise DraftboardError(f"an eval job needs {', '.join(missing)}")
    url = params.get("engine_url")
    problem = config.engine_url_problem(str(url), job=True) if url is not None else None
    if problem:
        raise DraftboardError(f"eval param engine_url {problem}")
    values = {}
    for field in JOB_FIELDS:
        if params.get(field.name) is not None:
            try:
                values[field.name] = _checked(field, params[field.name])
            except ValueError as exc:
                raise DraftboardError(f"eval param {field.name} {exc}") from None
    sampling = {name: values.get(name, FIELDS[name].default) for name in ("temperature", "top_p", "top_k", "samples",
                                                                          "seeds")}
    problem = config.sampling_problem(**sampling, say=str)  # in the job's own words: its param names
    if problem:  # before it is queued: a job the eval would refuse at once never takes a worker
        raise DraftboardError(f"eval params: {problem}")
    shards = values.get("shards")
    if shards is not None:
        problem = config.shards_problem(shards, values.get("scoring"), values.get("engine"), flag="shards")
        if problem:
            raise DraftboardError(f"eval params: {problem}")
        if shards > 1 and values.get("device") != "cpu" and values.get("gpus") is not None and values["gpus"] < shards:
            raise DraftboardError(f"eval params: shards {shards} on a GPU hold one GPU each; gpus is {values['gpus']}")
    return values


# How each setting that changes what an eval measures reads in a run's name and a job's card,
# where it differs from its default. The environment is names.eval_run_name's; batch_size and
# anchor_chunk change no number, and a path says nothing a reader can compare at a glance.
_WORDS: dict[str, Callable[[Any], str]] = {
    "max_new_tokens": "{} tok".format,
    "limit_per_dataset": "{}/dataset".format,
    "budgets": lambda b: "budgets " + ",".join(map(str, b)),
    "top_p": "top_p {:g}".format,
    "top_k": "top_k {}".format,
    "samples": "{} draws".format,
    "seeds": "{} seeds".format,
    "seed": "seed {}".format,
    "last_block": "last block {}".format,
    "scoring": "{} scoring".format,
    "enable_thinking": lambda on: "thinking on" if on else "thinking off",
    "num_speculative_tokens": "{} draft tokens".format,
    "concurrency": lambda levels: "concurrency " + ",".join(map(str, levels)),
    "repeats": "{} rounds".format,
    "shards": "{} shards".format,
    "completions": lambda _: "fixed continuations",
}


def hub_dataset_name(spec: str) -> str | None:
    """`gsm8k` for z-lab's benchmark sets, the hub id for other `hf:` specs; None for a path."""
    hub_id = config.hf_dataset_name(spec)
    if hub_id is None:
        return None
    return next((name for name, (known, *_) in config.ZLAB_BENCHMARKS.items() if known == hub_id), hub_id)


def setting_words(params: Mapping[str, Any]) -> list[str]:
    """What `params` set away from `draftboard eval`'s defaults, a few words each (`gsm8k`, `64 tok`,
    `16/dataset`, `top_p 0.95`), so two evals that measured differently never read alike.
    TypeError/ValueError on values no job holds (a row written around the queue)."""
    words = [hub_dataset_name(str(params["prompts"]))] if params.get("prompts") else []
    for name, word in _WORDS.items():
        value, default = params.get(name), FIELDS[name].default
        if value is None:
            continue
        if FIELDS[name].kind == INTS:
            value, default = tuple(int(b) for b in value), tuple(default or ())
        if value != default:
            words.append(word(value))
    return [w for w in words if w]


def cli_args(params: Mapping[str, Any]) -> list[str]:
    """`["eval", "--target", T, ...]` for validated params: each value is its own argument, so
    quotes, `;` or `$(...)` in a name stay literal text (nothing runs through a shell)."""
    args = [KIND]
    for name, value in validate(params).items():
        field = FIELDS[name]
        if field.kind == FLAG:
            args += [field.flag] if value else []
        elif field.kind == SWITCH:
            args.append(field.flag if value else "--no-" + field.flag[2:])
        elif field.kind == INTS:
            args += [field.flag, ",".join(map(str, value))]
        else:
            args += [field.flag, str(value)]
    return args


# --------------------------------------------------------------------------- allowed roots


def _escapes(folder: Path, roots: Sequence[Path]) -> Iterator[tuple[Path, Path]]:
    """(what, where it leads) for each thing inside folder that leads outside roots: symlinks
    (followed to their end) and the shard files a `*.index.json` names (`../x` included).
    Plain files inside a folder under the roots are under the roots, so only these can escape."""
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in dirnames + filenames:
            entry = Path(dirpath) / name
            if entry.is_symlink() and not config.within(entry.resolve(), roots):
                yield entry, entry.resolve()
            elif name.endswith(".index.json") and entry.is_file():
                for shard in _index_shards(entry):
                    target = (entry.parent / shard).resolve()
                    if not config.within(target, roots):
                        yield entry, target


def _index_shards(index: Path) -> set[str]:
    """The shard files a safetensors/torch `*.index.json` maps weights to ({} if unreadable)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return set()  # the loader reports an unreadable index; there is nothing to follow here
    return {v for v in weight_map.values() if isinstance(v, str)} if isinstance(weight_map, dict) else set()


def check_path(flag: str, value: str, roots: Sequence[Path]) -> Path | None:
    """The resolved path if it, and everything a folder there leads to, lies under roots;
    DraftboardError otherwise. Paths that do not exist here are checked as written. A dataset
    spec `hf:NAME...` is checked when NAME is a local folder, refused when NAME is one of the
    `datasets` library's local builders (csv, json, ...: `config.local_builder_problem`), and
    passes as a hub id otherwise."""
    if value.startswith(config.HF_DATASET_PREFIX):
        problem = config.local_builder_problem(value)
        if problem:
            raise DraftboardError(f"{flag} {problem}")
        name = config.hf_dataset_name(value)
        if not config.names_local_folder(name):
            return None
        value = name
    path = Path(value).expanduser().resolve()
    shown = ", ".join(str(r) for r in roots)
    if not config.within(path, roots):
        raise DraftboardError(f"{flag} {path} is outside the allowed roots ({shown})")
    if path.is_dir():
        for entry, target in _escapes(path, roots):
            raise DraftboardError(f"{flag} {path}: {entry} leads to {target}, outside the allowed roots ({shown})")
    return path


def check_paths(params: Mapping[str, Any], roots: Sequence[Path],
                trusted: Callable[[str], bool] = lambda drafter: False) -> None:
    """DraftboardError unless every path param lies under roots (see `check_path`). A drafter
    outside them passes if trusted(path) is True (a checkpoint its training run registered)."""
    for field in PATH_FIELDS:
        value = params.get(field.name)
        if value is None:
            continue
        try:
            check_path(field.flag, value, roots)
        except DraftboardError:
            if not (field.name == "drafter" and trusted(value)):  # asked only when needed: it reads the store
                raise
