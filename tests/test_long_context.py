"""evaluators/long_context.py: long-context prompt sets in their published formats (LongBench, LongBench v2,
ShareGPT), rows written as those sets write them from local text (the stdlib's own files), made N tokens long by
LongBench's middle cut or the set's own documents; through `load_benchmark` and a real eval."""

from __future__ import annotations

import json

import pytest

from demo import bytetok
from demo.target import split_files
from evaluators import long_context
from evaluators.datasets import load_benchmark
from tracker.errors import DraftboardError

QUESTION = "Which function does this module define first?"


def _documents(n: int, least: int) -> list[str]:
    """n stdlib files of at least `least` bytes, ASCII only (the byte tokenizer: one token per character)."""
    texts = [t for f in split_files("eval") if len(t := f.read_text(errors="ignore")) >= least and t.isascii()]
    assert len(texts) >= n
    return texts[:n]


def longbench_row(i: int, context: str, dataset: str = "narrativeqa") -> dict:
    """A row of THUDM/LongBench `data/<dataset>.jsonl`, every column it has."""
    return {"input": QUESTION, "context": context, "answers": ["main"], "length": len(context.split()),
            "dataset": dataset, "language": "en", "all_classes": None, "_id": f"lb{i:04d}"}


def sharegpt_row(i: int, exchanges: list[tuple[str, str]], question: str) -> dict:
    turns = [t for q, a in exchanges for t in ({"from": "human", "value": q}, {"from": "gpt", "value": a})]
    return {"id": f"sg{i}", "conversations": [*turns, {"from": "human", "value": question}]}


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    return bytetok.hf_tokenizer()


@pytest.fixture(scope="module")
def chat_tokenizer():
    tok = bytetok.hf_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return tok


def _text(line: dict) -> str:
    return line["prompt"] if "prompt" in line else line["messages"][-1]["content"]


def test_a_longbench_row_is_its_template_and_longer_ones_lose_their_middle_as_longbench_cuts(tmp_path, tokenizer):
    """A 6,000-token story at --prompt-tokens 4096: the first 2048 and the last 2048 tokens of LongBench's prompt
    (its instructions and the question survive); at its own length, the whole template around the whole story."""
    (doc,) = _documents(1, 6000)
    path = write(tmp_path / "narrativeqa.jsonl", [longbench_row(0, doc)])
    template = long_context.LONGBENCH_TEMPLATES["narrativeqa"]
    (whole,) = load_benchmark(path, tokenizer, bytetok.VOCAB_SIZE)
    full = template.replace("{context}", doc).replace("{input}", QUESTION)
    assert bytetok.decode(whole.input_ids) == full and whole.id == "lb0000" and whole.dataset == "narrativeqa"
    (cut,) = load_benchmark(path, tokenizer, bytetok.VOCAB_SIZE, prompt_tokens=4096)
    assert bytetok.decode(cut.input_ids) == full[:2048] + full[-2048:]
    assert not cut.chat_template  # the demo's byte tokenizer has no chat template: LongBench's plain prompt


def test_a_short_document_is_filled_with_the_sets_documents_before_it_never_padded(tmp_path, tokenizer):
    docs = _documents(3, 1500)
    rows = [longbench_row(i, d[:1500], dataset="hotpotqa") for i, d in enumerate(docs)]
    path = write(tmp_path / "hotpotqa.jsonl", rows)
    prompts = load_benchmark(path, tokenizer, bytetok.VOCAB_SIZE, prompt_tokens=4000)
    assert [len(p.input_ids) for p in prompts] == [4000] * 3
    text = bytetok.decode(prompts[1].input_ids)  # row 1: row 0's document (and row 2's, cyclically) before its own
    head, tail = long_context.LONGBENCH_TEMPLATES["hotpotqa"].split("{context}")
    assert text.startswith(head) and text.endswith(tail.replace("{input}", QUESTION))
    assert (docs[0][:1500] + "\n\n" + docs[1][:1500]) in text  # the nearest document whole, then its own
    filler = text[len(head):text.index(docs[0][:1500])]
    assert (docs[2][:1500] + "\n\n").endswith(filler)  # the farther one cut from its start to fit
    with pytest.raises(DraftboardError, match="need .* more of the set's own documents; .* never padded"):
        load_benchmark(path, tokenizer, bytetok.VOCAB_SIZE, prompt_tokens=20000)


def test_longbench_v2_uses_its_0shot_prompt(tmp_path, tokenizer):
    (doc,) = _documents(1, 800)
    row = {"_id": "v2a", "domain": "Code", "sub_domain": "repo", "difficulty": "easy", "length": "short",
           "question": QUESTION, "choice_A": "a", "choice_B": "b", "choice_C": "c", "choice_D": "d", "answer": "A",
           "context": doc}
    (p,) = load_benchmark(write(tmp_path / "v2.jsonl", [row]), tokenizer, bytetok.VOCAB_SIZE)
    assert bytetok.decode(p.input_ids) == (
        f"Please read the following text and answer the question below.\n\n<text>\n{doc.strip()}\n</text>\n\nWhat "
        f"is the correct answer to this question: {QUESTION}\nChoices:\n(A) a\n(B) b\n(C) c\n(D) d\n\nFormat your "
        "response as follows: \"The correct answer is (insert answer here)\".")


def test_a_row_s_fields_are_pasted_once_never_into_each_other():
    """Issue 64, F3: chained replaces pasted each field into the copies of the placeholders the fields before it
    held: an 80 KB row built a 500 MB string. Filled in one pass, a field's `$C_A$` stays text and the prompt is
    as long as its parts."""
    from evaluators import long_context

    choice = "x" * 10_000
    row = {"question": "$C_A$" * 2_000, "choice_A": choice, "choice_B": "$Q$", "choice_C": "$DOC$", "choice_D": "d",
           "context": "$Q$ {input} $C_A$"}
    (message,) = long_context.messages(row, "longbench-v2", "row 1")
    text = message["content"]
    parts = len(row["question"]) + len(choice) + 3 + 5 + 1 + len(row["context"])
    assert len(text) == len(long_context.LONGBENCH_V2_TEMPLATE) - len("$DOC$$Q$$C_A$$C_B$$C_C$$C_D$") + parts
    assert "(B) $Q$\n(C) $DOC$\n" in text and text.count(choice) == 1
    v1 = {"context": "{input}" * 1_000, "input": "y" * 10_000, "dataset": "narrativeqa"}
    assert long_context.messages(v1, "longbench", "row 2")[0]["content"].count("y" * 10_000) == 1
    huge = dict(row, context="z" * (long_context.MAX_ROW_CHARS + 1))
    with pytest.raises(DraftboardError, match="characters \\(at most"):
        long_context.messages(huge, "longbench-v2", "row 3")


def test_a_sharegpt_conversation_keeps_its_newest_exchanges_and_borrows_earlier_ones(tmp_path, chat_tokenizer):
    """Conversation sg1 asks a last question after two exchanges of 1,000-character turns. At 3,500 tokens its
    own two exchanges (4,000) do not both fit: the newer one is kept whole, the older dropped. At 7,000 they fit
    and sg0's newest exchange comes before them; its older one would not fit. Every exchange together (8,006) is
    short of 50,000: refused, never padded."""
    docs = _documents(2, 3000)
    a, b = docs[0][:1000], docs[1][:1000]
    rows = [sharegpt_row(0, [(a, b), (b, a)], "first?"), sharegpt_row(1, [(a[:900] + "x" * 100, b), (b, a)], "now?")]
    path = write(tmp_path / "sharegpt.jsonl", rows)
    own = load_benchmark(path, chat_tokenizer, bytetok.VOCAB_SIZE)
    assert own[1].chat_template and "<|assistant|>" in bytetok.decode(own[1].input_ids)
    filled = long_context.fitted([(r, "sharegpt", "x") for r in rows], chat_tokenizer, 3500)
    assert [m["content"] for m in filled[1]] == [b, a, "now?"]
    more = long_context.fitted([(r, "sharegpt", "x") for r in rows], chat_tokenizer, 7000)[1]
    assert [m["role"] for m in more] == ["user", "assistant"] * 3 + ["user"]
    assert more[0]["content"] == b and more[2]["content"].endswith("x" * 100)  # sg0's newest, then sg1's own
    assert sum(len(m["content"]) for m in more) == 6004 <= 7000  # sg0's older exchange would pass 7,000
    with pytest.raises(DraftboardError, match="never padded"):
        long_context.fitted([(r, "sharegpt", "x") for r in rows], chat_tokenizer, 50000)
    with pytest.raises(DraftboardError, match="needs a chat template"):
        load_benchmark(path, bytetok.hf_tokenizer(), bytetok.VOCAB_SIZE)


@pytest.mark.parametrize("row, flags, message", [
    (longbench_row(0, "text", dataset="lcc"), {}, "LongBench dataset 'lcc' is not a long-document QA set"),
    ({"id": 1, "prompt": "hello"}, {"prompt_tokens": 64}, "--prompt-tokens makes long-context sets long"),
    ({"conversations": [{"from": "gpt", "value": "hi"}]}, {}, "the conversation has no human turn"),
    ({"conversations": [{"from": "robot", "value": "hi"}]}, {}, "turn from 'robot'"),
    ({"context": 5, "input": "q", "dataset": "qasper"}, {}, "'context' must be a string"),
])
def test_rows_it_cannot_read_right_are_refused_in_one_line(tmp_path, tokenizer, row, flags, message):
    with pytest.raises(DraftboardError, match=message):
        load_benchmark(write(tmp_path / "p.jsonl", [row]), tokenizer, bytetok.VOCAB_SIZE, **flags)


def test_a_long_document_set_evaluates_end_to_end_with_its_curve_by_context(serving_pair, tmp_path, capsys):
    """Issue 50: LongBench rows at --prompt-tokens 4096 on the tiny Qwen3 target (its context 8,192): the eval runs,
    its protocol records the lengths, and its curve has blocks past 4,096 tokens of context."""
    from tracker.cli import main

    docs = _documents(3, 2000)
    path = write(tmp_path / "narrativeqa.jsonl", [longbench_row(i, d) for i, d in enumerate(docs)])
    out = tmp_path / "results.json"
    assert main(["eval", "--target", str(serving_pair / "target"), "--drafter", str(serving_pair / "drafter"),
                 "--prompts", path, "--prompt-tokens", "4096", "--max-new-tokens", "32", "--context-buckets",
                 "0,2048,4096", "--cache-dir", str(serving_pair / "cache"), "--no-log", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    lengths = results["protocol"]["prompt_lengths"]
    assert 4096 <= lengths["min"] <= lengths["max"] <= 4096 + 2  # the tokenizer's BOS on top of the text's 4,096
    rows = results["tau_by_context"]
    assert [r["from"] for r in rows] == [0, 2048, 4096] and rows[0]["blocks"] == rows[1]["blocks"] == 0
    assert rows[2]["blocks"] == results["n_blocks"] and rows[2]["tau"] == pytest.approx(results["tau_pooled"])
