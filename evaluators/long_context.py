"""Long-context prompt sets: rows of published long-context datasets in their own formats, each prompt made a
chosen number of tokens long by the set's own text (docs/DESIGN.md, "Acceptance by context length, as built").

Formats, told apart by their columns:
- LongBench (THUDM/LongBench `data/<dataset>.jsonl`, the hub's `THUDM/LongBench`): `input`, `context`, `dataset`,
  `_id`. Long-document QA: the prompt is LongBench's own template for its dataset (`config/dataset2prompt.json`
  @ 8ae23fd), the English long-document QA sets below; a row of another LongBench dataset is refused.
- LongBench v2 (THUDM/LongBench-v2): `question`, `choice_A`..`choice_D`, `context`, `_id`: its `prompts/0shot.txt`.
- ShareGPT (`conversations`: [{from: human | gpt | system, value}], the file vLLM's serving benchmark reads):
  multi-turn; the prompt is the conversation up to its last human turn, the recorded answers as the assistant's.

`--prompt-tokens N` makes every prompt N tokens of text long (its messages' text tokenized without the chat
template, as LongBench's `max_len` counts; the template adds a few tokens per turn on top):
- longer: LongBench's own rule (pred.py): the first N/2 and the last N - N/2 tokens kept, the middle cut, so the
  instructions and the question at the two ends survive. A conversation first drops its oldest exchanges (a
  chat server's history window), and cuts the middle of what is left only if its last question alone is longer.
- shorter: the set's other documents go before the row's own, those just before it in the file (cyclically)
  nearest: QA, other rows' contexts before its context (cut from their start so the text is N tokens); a
  conversation, other conversations' exchanges as earlier turns, whole exchanges only (so it ends up to one
  exchange short of N). Never padding: a set whose other documents together are too short is refused.
"""

from __future__ import annotations

import re

from collections.abc import Iterable, Sequence

from tracker.errors import DraftboardError

LONGBENCH, LONGBENCH_V2, SHAREGPT = "LongBench", "LongBench v2", "ShareGPT"

# THUDM/LongBench config/dataset2prompt.json @ 8ae23fd: its English long-document QA sets, word for word.
_ANSWER = "Only give me the answer and do not output any other words."
LONGBENCH_TEMPLATES = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
                   "question as concisely as you can, using a single phrase if possible. Do not provide any "
                   "explanation.\n\nStory: {context}\n\nNow, answer the question based on the story as concisely as "
                   "you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: "
                   "{input}\n\nAnswer:",
    "qasper": "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
              "single phrase or sentence if possible. If the question cannot be answered based on the information in "
              "the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
              "\"unanswerable\". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based "
              "on the above article as concisely as you can, using a single phrase or sentence if possible. If the "
              "question cannot be answered based on the information in the article, write \"unanswerable\". If the "
              "question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any "
              "explanation.\n\nQuestion: {input}\n\nAnswer:",
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question "
                       "based on the above text, only give me the answer and do not output any other words.\n\n"
                       "Question: {input}\nAnswer:",
    **{name: f"Answer the question based on the given passages. {_ANSWER}\n\nThe following are given passages.\n"
             f"{{context}}\n\nAnswer the question based on the given passages. {_ANSWER}\n\nQuestion: {{input}}\n"
             "Answer:" for name in ("hotpotqa", "2wikimqa", "musique")},
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
             "one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting "
             "transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",
}
# THUDM/LongBench prompts/0shot.txt (LongBench v2), word for word.
LONGBENCH_V2_TEMPLATE = ("Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
                         "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n"
                         "(D) $C_D$\n\nFormat your response as follows: \"The correct answer is (insert answer here)\".")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
                  "system": "system"}


def kind(row: dict) -> str | None:
    """Which long-context format a row is in, by its columns (None: none of them)."""
    if "conversations" in row:
        return SHAREGPT
    if "context" in row and "question" in row and "choice_A" in row:
        return LONGBENCH_V2
    if "context" in row and "input" in row:
        return LONGBENCH
    return None


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise DraftboardError(f"{where}: {key!r} must be a string")
    return value


def _document(row: dict, where: str) -> str:
    """The row's long document: a QA row's context as its set's script reads it (LongBench v2's pred.py strips it,
    LongBench's formats it as it is)."""
    context = _text(row, "context", where)
    return context.strip() if kind(row) == LONGBENCH_V2 else context


_V2_PLACES = re.compile(r"\$(DOC|Q|C_[ABCD])\$")
_V1_PLACES = re.compile(r"\{(context|input)\}")
MAX_ROW_CHARS = 64 << 20  # a row's fields together; LongBench v2's longest document is a few million characters


def _filled(template: str, places: re.Pattern, values: dict[str, str], where: str) -> str:
    """The template's own placeholders filled in one pass: a field is pasted once and never read again, so a field
    holding another placeholder (`$C_A$` in a question) stays text, and the result is as long as its parts."""
    size = sum(map(len, values.values()))
    if size > MAX_ROW_CHARS:
        raise DraftboardError(f"{where}: the row's fields hold {size} characters (at most {MAX_ROW_CHARS})")
    return places.sub(lambda m: values[m.group(1)], template)


def _qa_text(row: dict, dataset: str, where: str, document: str) -> str:
    """A QA row's user text around `document` (its own context, filled or cut)."""
    if kind(row) == LONGBENCH_V2:
        values = {"DOC": document, "Q": _text(row, "question", where).strip(),
                  **{f"C_{letter}": _text(row, f"choice_{letter}", where).strip() for letter in "ABCD"}}
        return _filled(LONGBENCH_V2_TEMPLATE, _V2_PLACES, values, where)
    name = row.get("dataset") if isinstance(row.get("dataset"), str) else dataset
    if name not in LONGBENCH_TEMPLATES:
        raise DraftboardError(f"{where}: LongBench dataset {name!r} is not a long-document QA set draftboard "
                              f"builds prompts for ({', '.join(LONGBENCH_TEMPLATES)})")
    # LongBench fills the template with str.format; its documents' braces are text, so fill, never format.
    return _filled(LONGBENCH_TEMPLATES[name], _V1_PLACES, {"context": document, "input": _text(row, "input", where)},
                   where)


def _turns(row: dict, where: str) -> list[dict]:
    """A ShareGPT conversation up to and including its last human turn, as chat messages."""
    turns = row.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise DraftboardError(f"{where}: 'conversations' must be a list of {{from, value}} objects")
    messages = []
    for t in turns:
        role = SHAREGPT_ROLES.get(t.get("from"))
        if role is None:
            raise DraftboardError(f"{where}: turn from {str(t.get('from'))[:20]!r} (ShareGPT names "
                                  f"{', '.join(SHAREGPT_ROLES)})")
        messages.append({"role": role, "content": _text(t, "value", where)})
    last = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last is None:
        raise DraftboardError(f"{where}: the conversation has no human turn to answer")
    return messages[:last + 1]


def messages(row: dict, dataset: str, where: str) -> list[dict]:
    """The row as chat messages at its own length."""
    if kind(row) == SHAREGPT:
        return _turns(row, where)
    return [{"role": "user", "content": _qa_text(row, dataset, where, _document(row, where))}]


def line(messages: list[dict], tokenizer, where: str) -> dict:
    """A prompt line (evaluators.prompts) of the messages: chat messages where the target has a chat template; a
    base model's, one question as its plain text (LongBench's prompt for models without a chat format)."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None):
        return {"messages": messages}
    if len(messages) == 1 and messages[0]["role"] == "user":
        return {"prompt": messages[0]["content"]}
    raise DraftboardError(f"{where}: a conversation of {len(messages)} turns needs a chat template; the target's "
                          "tokenizer has none")


# --------------------------------------------------------------------------- made N tokens long


def _middle_cut(ids: list[int], n: int) -> list[int]:
    """LongBench's rule (pred.py): input_ids[:n//2] + input_ids[-n//2:] when longer than n."""
    return ids if len(ids) <= n else ids[:n // 2] + ids[len(ids) - (n - n // 2):]


def fitted(rows: Sequence[tuple[dict, str, str]], tokenizer, n_tokens: int) -> list[list[dict]]:
    """Each (row, dataset, where) as chat messages of `n_tokens` tokens of text, by the rules above. What fills a
    row comes from the rows of its dataset before it in the file (cyclically), the nearest next to its own text;
    each document is tokenized once, and only as many are read as the filling needs."""
    cache: dict[int, list[int]] = {}

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def doc_ids(j: int) -> list[int]:
        if j not in cache:
            cache[j] = ids(_document(rows[j][0], rows[j][2]) + "\n\n")
        return cache[j]

    def before(i: int):  # the rows of row i's set and format before it, nearest first, read only as far as needed
        dataset, form = rows[i][1], kind(rows[i][0])
        for j in (*range(i - 1, -1, -1), *range(len(rows) - 1, i, -1)):
            if rows[j][1] == dataset and kind(rows[j][0]) == form:
                yield j

    out = []
    for i, (row, dataset, where) in enumerate(rows):
        if kind(row) == SHAREGPT:
            out.append(_conversation(row, (rows[j][0] for j in before(i)), ids, tokenizer.decode, n_tokens, where))
            continue
        own = _document(row, where)
        room = n_tokens - len(ids(_qa_text(row, dataset, where, ""))) - len(ids(own))
        if room <= 0:
            prompt = tokenizer.decode(_middle_cut(ids(_qa_text(row, dataset, where, own)), n_tokens))
        else:
            filler: list[int] = []
            for j in before(i):
                if len(filler) >= room:
                    break
                filler = doc_ids(j) + filler
            if len(filler) < room:
                raise DraftboardError(f"{where}: {n_tokens} prompt tokens need {room} more of the set's own "
                                      f"documents; its other {dataset!r} documents have {len(filler)}: never padded")
            prompt = _qa_text(row, dataset, where, tokenizer.decode(filler[len(filler) - room:]) + own)
        out.append([{"role": "user", "content": prompt}])
    return out


def _conversation(row: dict, others: Iterable[dict], ids, decode, n_tokens: int, where: str) -> list[dict]:
    """A conversation of at most `n_tokens` tokens of text: its own history, then other conversations' exchanges
    before it while whole ones fit; its last question's middle cut when that alone is longer."""
    own = _turns(row, where)
    *history, last = own
    size = len(ids(last["content"]))
    if size >= n_tokens:
        return [{"role": "user", "content": decode(_middle_cut(ids(last["content"]), n_tokens))}]

    def pairs():  # whole exchanges (user, assistant), newest first: its own, then the conversations before it
        for messages in [history, *(_turns(r, where) for r in others)]:
            ex = _exchanges(messages)
            for start in range(len(ex) - 2, -1, -2):
                yield ex[start:start + 2]

    kept: list[dict] = []
    for pair in pairs():
        cost = sum(len(ids(m["content"])) for m in pair)
        if size + cost > n_tokens:
            return [*kept, last]
        kept, size = pair + kept, size + cost
    raise DraftboardError(f"{where}: {n_tokens} prompt tokens need more than the set's own conversations hold "
                          f"({size} with every exchange): never padded")


def _exchanges(messages: list[dict]) -> list[dict]:
    """The (user, assistant) pairs of a conversation's messages, in order (system turns and unanswered ones left)."""
    out = []
    for a, b in zip(messages, messages[1:]):
        if a["role"] == "user" and b["role"] == "assistant":
            out += [a, b]
    return out
