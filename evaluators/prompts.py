"""Prompt lines and completion files: JSON lines in, token ids out, every error naming file:line.

Whole prompt sets (files, folders, `hf:` datasets) are read by `evaluators.datasets.load_benchmark`,
which turns each row into a `Prompt` with `encode` and `token_ids`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tracker.errors import DraftboardError
from tracker.jsonlines import json_object


@dataclass
class Prompt:
    id: str
    input_ids: list[int]
    completion_ids: list[int] | None = None  # fixed continuation to reuse instead of generating
    dataset: str | None = None  # the benchmark set it belongs to (evaluators.datasets names it)
    category: str | None = None  # a finer label inside the set (Spec-Bench's `category`)
    chat_template: bool = False  # its ids came through the tokenizer's chat template


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DraftboardError(f"{path}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DraftboardError(f"{path}: not UTF-8 text (byte {exc.start}); expected JSON lines") from None
    except OSError as exc:
        raise DraftboardError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_jsonl(path: Path, text: str | None = None) -> list[tuple[int, dict]]:
    text = _read_text(path) if text is None else text
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json_object(line)))
        except DraftboardError as exc:
            raise DraftboardError(f"{path}:{lineno}: {exc}") from None
    if not rows:
        raise DraftboardError(f"{path}: no prompts (the file is empty)")
    return rows


def token_ids(value, where: str, vocab_size: int) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise DraftboardError(f"{where}: token ids must be a non-empty list of integers")
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise DraftboardError(f"{where}: token id {bad[0]} outside the target's vocabulary of {vocab_size}")
    return value


def encode(row: dict, where: str, tokenizer, enable_thinking: bool | None) -> list[int]:
    if "input_ids" in row:
        return row["input_ids"]
    if tokenizer is None:
        raise DraftboardError(f"{where}: text prompts need a tokenizer, and the target directory has none; "
                              "give token ids as input_ids")
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DraftboardError(f"{where}: 'prompt' must be a non-empty string")
        return tokenizer(row["prompt"], add_special_tokens=True)["input_ids"]
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise DraftboardError(f"{where}: 'messages' must be a list of {{role, content}} objects")
        if not getattr(tokenizer, "chat_template", None):
            raise DraftboardError(f"{where}: chat messages need a chat template; the target's tokenizer has none")
        kwargs = {}
        # Qwen3.5 drafters were trained on thinking-mode outputs; pass the switch where the
        # template knows it, so the target produces what the drafter saw.
        if enable_thinking is not None and "enable_thinking" in tokenizer.chat_template:
            kwargs["enable_thinking"] = enable_thinking
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    raise DraftboardError(f"{where}: each line needs one of input_ids, prompt or messages")


def attach_completions(prompts: list[Prompt], path: str | Path, vocab_size: int) -> list[Prompt]:
    """Fixed continuations from JSON lines {id, input_ids, completion_ids} or a results JSON."""
    path = Path(path)
    text = _read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "prompts" in doc:  # a previous `draftboard eval --out`
        if not isinstance(doc["prompts"], list):
            raise DraftboardError(f"{path}: 'prompts' must be a list of {{id, completion_ids}} objects")
        rows = [(i + 1, r) for i, r in enumerate(doc["prompts"])]
    else:
        rows = read_jsonl(path, text)
    by_id = {}
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        if not isinstance(row, dict) or "id" not in row or "completion_ids" not in row:
            raise DraftboardError(f"{where}: a completion needs 'id' and 'completion_ids'")
        by_id[str(row["id"])] = (where, row)
    out = []
    for p in prompts:
        if p.id not in by_id:
            raise DraftboardError(f"{path}: no completion for prompt id {p.id!r}")
        where, row = by_id[p.id]
        if "input_ids" in row and row["input_ids"] != p.input_ids:
            raise DraftboardError(f"{where}: input_ids differ from the prompt with id {p.id!r}")
        out.append(Prompt(p.id, p.input_ids, token_ids(row["completion_ids"], where, vocab_size), p.dataset, p.category, p.chat_template))
    return out
