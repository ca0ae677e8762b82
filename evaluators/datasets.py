"""Benchmark prompt sets: the sets z-lab and DDTree report on, loaded into the harness's prompts.

`--prompts` may name
- a JSON-lines file: today's prompt lines (`input_ids` | `prompt` | `messages`, optional `id`,
  `dataset`, `category`), z-lab's benchmark files (`{"turns": [...]}` per line, as z-lab's
  `dflash/benchmark.py` caches them under `cache/<dataset>.jsonl`) or Spec-Bench / FastChat
  `question.jsonl` (`question_id`, `category`, `turns`);
- a folder of such files: each file's stem is its dataset (`question.jsonl` takes its folder's
  name, as in `data/spec_bench/question.jsonl`), and prompt ids become `<dataset>/<id>`;
- `hf:NAME[:CONFIG]:SPLIT`: a dataset read by the `datasets` library (a hub id, a local folder of
  data files, or a `save_to_disk` folder), each row turned into a prompt with z-lab's per-dataset
  column mapping for gsm8k, math500, humaneval, mbpp and mt-bench (others need a `turns` or
  `prompt` column).

A multi-turn row (mt-bench) becomes its first user turn: later turns follow the target's own
answer to the earlier ones, which an offline eval over fixed prompts does not have. z-lab's
sglang/vLLM benchmark paths score the first turn the same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from evaluators import long_context
from evaluators.prompts import Prompt, encode, read_jsonl, token_ids
from tracker import config
from tracker.errors import DraftboardError

HF_PREFIX = config.HF_DATASET_PREFIX
LIMIT_SEED = 0  # z-lab's transformers benchmark seeds `random` with 0 before it samples
_REASON = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class ZlabDataset:
    """One entry of z-lab's benchmark.py DATASETS: where it lives and how a row becomes user turns."""

    hub_id: str
    config: str | None
    split: str
    turns: Callable[[dict], list]


_ZLAB_TURNS = {
    "gsm8k": lambda row: [row["question"] + _REASON],
    "math500": lambda row: [row["problem"] + _REASON],
    "humaneval": lambda row: ["Write a solution to the following problem and make sure that it passes the tests:\n"
                              f"```python\n{row['prompt']}\n```"],
    "mbpp": lambda row: [row["prompt"]],
    "mt-bench": lambda row: list(row["prompt"]),
}
ZLAB_DATASETS = {name: ZlabDataset(*config.ZLAB_BENCHMARKS[name], turns) for name, turns in _ZLAB_TURNS.items()}


def zlab_name(name: str) -> str | None:
    """z-lab's dataset name for a set name, hub id or folder: `gsm8k`, `openai/gsm8k`, `/data/MATH-500`."""
    wanted = name.rstrip("/").lower()
    for key, entry in ZLAB_DATASETS.items():
        hub = entry.hub_id.lower()
        aliases = (key, hub, hub.rsplit("/", 1)[-1])
        if wanted in aliases or wanted.rsplit("/", 1)[-1] in aliases:
            return key
    return None


@dataclass(frozen=True)
class _Row:
    id: str
    dataset: str
    category: str | None
    line: dict  # a prompt line as evaluators.prompts reads it: input_ids | prompt | messages
    where: str  # file:line, for errors
    source: dict | None = None  # a long-context row as read (evaluators.long_context), for --prompt-tokens


# --------------------------------------------------------------------------- rows


def _first_turn(turns: Any, where: str) -> dict:
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
        raise DraftboardError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    return {"messages": [{"role": "user", "content": turns[0]}]}


def _optional_text(row: dict, key: str, where: str) -> str | None:
    value = row.get(key)
    if value is not None and not (isinstance(value, (str, int)) and not isinstance(value, bool) and str(value)):
        raise DraftboardError(f"{where}: {key!r} must be a string")
    return None if value is None else str(value)


def _file_dataset(path: Path) -> str:
    # Spec-Bench and FastChat keep every set in a folder of its own as question.jsonl.
    return path.parent.name if path.stem == "question" and path.parent.name else path.stem


def _file_rows(path: Path, prefix_ids: bool) -> list[_Row]:
    default_dataset = _file_dataset(path)
    rows = []
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        dataset = _optional_text(row, "dataset", where) or default_dataset
        pid = (_optional_text(row, "question_id", where) or _optional_text(row, "id", where)
               or _optional_text(row, "_id", where) or str(lineno))
        long = long_context.kind(row) is not None
        line = (_first_turn(row["turns"], where) if "turns" in row else
                {"messages": long_context.messages(row, dataset, where)} if long else row)
        rows.append(_Row(f"{dataset}/{pid}" if prefix_ids else pid, dataset,
                         _optional_text(row, "category", where), line, where, row if long else None))
    return rows


def _folder_rows(folder: Path) -> list[_Row]:
    files = sorted(p for p in folder.glob("*.jsonl") if p.is_file())
    if not files:
        raise DraftboardError(f"{folder}: no .jsonl files (a prompt folder holds one file per dataset)")
    stems = [_file_dataset(p) for p in files]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise DraftboardError(f"{folder}: two files name the dataset {repeated[0]!r}")
    return [row for path in files for row in _file_rows(path, prefix_ids=True)]


def _parse_hf(spec: str) -> tuple[str, str | None, str]:
    problem = config.local_builder_problem(spec)  # before `datasets` is imported
    if problem:
        raise DraftboardError(problem)
    parts = spec[len(HF_PREFIX):].split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise DraftboardError(f"{spec}: expected hf:NAME[:CONFIG]:SPLIT, e.g. hf:openai/gsm8k:main:test")
    return parts[0], (parts[1] if len(parts) == 3 else None), parts[-1]


def _hf_dataset(name: str, config: str | None, split: str, spec: str):
    import datasets

    folder = Path(name)
    try:
        if folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()):
            loaded = datasets.load_from_disk(str(folder))  # written by save_to_disk
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DraftboardError(f"{spec}: no split {split!r}; the dataset has {', '.join(loaded)}")
                return loaded[split]
            return loaded
        return datasets.load_dataset(name, config, split=split)
    except DraftboardError:
        raise
    except Exception as exc:  # the library raises many types: missing split, no network, bad files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DraftboardError(f"{spec}: cannot load with the datasets library: {first}") from None


def _generic_turns(row: dict) -> list:
    if "turns" in row:
        return row["turns"]
    if isinstance(row.get("prompt"), str):
        return [row["prompt"]]
    raise KeyError("turns")


def _hf_rows(spec: str) -> list[_Row]:
    name, config, split = _parse_hf(spec)
    table = _hf_dataset(name, config, split, spec)
    key = zlab_name(name)
    dataset = key or Path(name.rstrip("/")).name
    to_turns = ZLAB_DATASETS[key].turns if key else _generic_turns
    rows = []
    for index, row in enumerate(table, 1):
        where = f"{spec} row {index}"
        if long_context.kind(row) is not None:  # LongBench's `dataset` column names its set, as in its files
            name = _optional_text(row, "dataset", where) or dataset
            rows.append(_Row(_optional_text(row, "_id", where) or _optional_text(row, "id", where) or str(index), name,
                             None, {"messages": long_context.messages(row, name, where)}, where, row))
            continue
        try:
            turns = to_turns(row)
        except KeyError as exc:
            mapping = f"z-lab's {key} format" if key else "a 'turns' or 'prompt' column"
            raise DraftboardError(f"{where}: no column {exc.args[0]!r} (expected {mapping}); "
                                  f"columns: {', '.join(row)}") from None
        rows.append(_Row(str(index), dataset, _optional_text(row, "category", where), _first_turn(turns, where), where))
    return rows


# --------------------------------------------------------------------------- public

T = TypeVar("T")


def sample_per_dataset(items: Sequence[T], limit: int, dataset: Callable[[T], str], seed: int = LIMIT_SEED) -> list[T]:
    """At most `limit` items of each dataset, drawn as z-lab's `--max-samples` draws them.

    A dataset with more than `limit` items is shuffled with `random.Random(seed)` and its first
    `limit` kept (z-lab's `_limit_dataset`); smaller ones are kept whole, in order.
    """
    if limit < 1:
        raise DraftboardError(f"--limit-per-dataset must be at least 1, got {limit}")
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(dataset(item), []).append(item)
    kept = []
    for group in groups.values():
        if len(group) > limit:
            group = list(group)
            random.Random(seed).shuffle(group)
            group = group[:limit]
        kept.extend(group)
    return kept


def _read_rows(spec: str | Path) -> list[_Row]:
    spec_text = str(spec)
    if spec_text.startswith(HF_PREFIX):
        return _hf_rows(spec_text)
    path = Path(spec_text)
    if path.is_dir():
        return _folder_rows(path)
    return _file_rows(path, prefix_ids=False)


def load_benchmark(spec: str | Path, tokenizer, vocab_size: int, enable_thinking: bool | None = None,
                   limit_per_dataset: int | None = None, prompt_tokens: int | None = None) -> list[Prompt]:
    """The prompts of a file, folder or `hf:` dataset, tokenized, each with its dataset; `prompt_tokens`: a
    long-context set's prompts made that long (evaluators.long_context)."""
    rows = _read_rows(spec)
    if not rows:
        raise DraftboardError(f"{spec}: no prompts")
    if limit_per_dataset is not None:
        rows = sample_per_dataset(rows, limit_per_dataset, lambda r: r.dataset)
    if prompt_tokens is not None:
        plain = next((r for r in rows if r.source is None), None)
        if plain is not None:
            raise DraftboardError(f"{plain.where}: --prompt-tokens makes long-context sets long ("
                                  f"{long_context.LONGBENCH}, {long_context.LONGBENCH_V2}, {long_context.SHAREGPT} "
                                  "rows); this row is none of them")
        if tokenizer is None:
            raise DraftboardError(f"{spec}: --prompt-tokens counts text tokens: the target has no tokenizer")
        filled = long_context.fitted([(r.source, r.dataset, r.where) for r in rows], tokenizer, prompt_tokens)
        rows = [replace(r, line={"messages": m}) for r, m in zip(rows, filled)]
    rows = [replace(r, line=long_context.line(r.line["messages"], tokenizer, r.where)) if r.source else r
            for r in rows]
    prompts, seen = [], set()
    for row in rows:
        if row.id in seen:
            raise DraftboardError(f"{row.where}: duplicate id {row.id!r}")
        seen.add(row.id)
        ids = token_ids(encode(row.line, row.where, tokenizer, enable_thinking), row.where, vocab_size)
        prompts.append(Prompt(row.id, ids, dataset=row.dataset, category=row.category,
                              chat_template="input_ids" not in row.line and "messages" in row.line))
    return prompts
