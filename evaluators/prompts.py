"""Prompt lines and completion files: JSON lines in, token ids out, every error naming file:line.

Whole prompt sets (files, folders, `hf:` datasets) are read by `evaluators.datasets.load_benchmark`,
which turns each row into a `Prompt` with `encode` and `token_ids`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tracker import config
from tracker.errors import DraftboardError
from tracker.untrusted import textlines
from tracker.untrusted.jsonlines import json_object


@dataclass
class Prompt:
    id: str
    input_ids: list[int]
    completion_ids: list[int] | None = None  # fixed continuation to reuse instead of generating
    dataset: str | None = None  # the benchmark set it belongs to (evaluators.datasets names it)
    category: str | None = None  # a finer label inside the set (Spec-Bench's `category`)
    chat_template: bool = False  # its ids came through the tokenizer's chat template


def read_text(path: Path) -> str:
    """The file's text, read through one descriptor. Where the deployment sets allowed roots
    (a worker's eval: `tracker.config.allowed_roots`), the file that descriptor opened must lie
    under them. The worker checked the path before the eval started; this read is the one that
    counts, so a symlink swapped in since then is refused, not followed."""
    # The one rule for a file someone named (tracker.untrusted.textlines): a regular file, opened without blocking
    # (a FIFO planted here must not hang the eval); the worker's first look (tracker/jobs/inputs.py) opens it so too.
    with textlines.open_regular(path) as f:
        fd = f.fileno()
        if config.roots_configured():
            roots = config.allowed_roots()
            opened = _opened_path(fd, path)
            if not config.within(opened, roots):
                raise DraftboardError(f"{path} leads to {opened}, outside the allowed roots "
                                      f"({', '.join(str(r) for r in roots)})")
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DraftboardError(f"{path}: not UTF-8 text (byte {exc.start}); expected JSON lines") from None


def _opened_path(fd: int, path: Path) -> Path:
    """Where the file open on fd lies now: Linux names it in /proc; elsewhere the path resolved
    here must still be that same file."""
    proc = Path(f"/proc/self/fd/{fd}")
    if proc.is_symlink():
        return Path(os.readlink(proc))
    resolved = path.resolve()
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(resolved))
    except OSError:
        same = False
    if not same:
        raise DraftboardError(f"{path}: changed while being read")
    return resolved


def read_jsonl(path: Path, text: str | None = None) -> list[tuple[int, dict]]:
    text = read_text(path) if text is None else text
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


_PROBE_CONVERSATION = [{"role": "user", "content": "What is 1 + 1?"}]


def template_thinking(tokenizer, enable_thinking: bool | None = None) -> bool | None:
    """Whether the chat template rendered thinking on, as `encode` applies it: the rendering with
    `enable_thinking` (None: the template's default) compared with the renderings asked on and off.
    None when the template has no such switch (both renderings equal) or the rendering is neither."""
    if not getattr(tokenizer, "chat_template", None):
        return None

    def render(**kwargs) -> str:
        return tokenizer.apply_chat_template(_PROBE_CONVERSATION, add_generation_prompt=True, tokenize=False, **kwargs)

    on, off = render(enable_thinking=True), render(enable_thinking=False)
    if on == off:
        return None
    used = render() if enable_thinking is None else (on if enable_thinking else off)
    return True if used == on else False if used == off else None


def attach_completions(prompts: list[Prompt], path: str | Path, vocab_size: int) -> list[Prompt]:
    """Fixed continuations from JSON lines {id, input_ids, completion_ids} or a results JSON."""
    path = Path(path)
    text = read_text(path)
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
