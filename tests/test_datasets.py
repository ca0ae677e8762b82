"""evaluators/datasets.py: z-lab benchmark files, Spec-Bench questions, folders, hf: datasets, sampling.

The hf: cases read datasets written by the `datasets` library itself (save_to_disk, JSON lines and
parquet folders): this machine has no hub access.
"""

from __future__ import annotations

import json
import random

import pytest

from demo import bytetok
from evaluators.datasets import ZLAB_DATASETS, load_benchmark, sample_per_dataset, zlab_name
from evaluators.prompts import Prompt
from tracker.errors import DraftboardError

datasets = pytest.importorskip("datasets")

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
# z-lab dflash/benchmark.py's formats, spelled as it spells them
ZLAB_GSM8K = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
ZLAB_HUMANEVAL = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{prompt}\n```"


@pytest.fixture(scope="module")
def tok():
    tokenizer = bytetok.hf_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def load(spec, tok, **kw):
    return load_benchmark(spec, tok, len(tok), **kw)


def text(prompt: Prompt) -> str:
    return bytetok.decode(prompt.input_ids)


def user(content: str) -> str:
    return f"<user>{content}\n<assistant>"


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_zlab_benchmark_file(tmp_path, tok):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [{"turns": ["What is 2+2?"]}, {"turns": ["Name a prime."]}])
    got = load(path, tok)
    assert [(p.id, p.dataset, p.category) for p in got] == [("1", "gsm8k", None), ("2", "gsm8k", None)]
    assert text(got[0]) == user("What is 2+2?")
    assert isinstance(got[0], Prompt) and got[0].completion_ids is None


def test_spec_bench_questions_take_their_folder_name(tmp_path, tok):
    path = write_jsonl(tmp_path / "spec_bench" / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]},
        {"question_id": 82, "category": "translation", "turns": ["Translate: bonjour"]},
    ])
    got = load(path, tok)
    assert [(p.id, p.dataset, p.category) for p in got] == [("81", "spec_bench", "writing"),
                                                            ("82", "spec_bench", "translation")]
    assert text(got[0]) == user("Compose a travel blog post.")  # the first turn: later ones follow the answer


def test_todays_prompt_lines_keep_their_ids_and_may_carry_labels(tmp_path, tok):
    path = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": "a", "input_ids": [5, 6, 7], "dataset": "gsm8k", "category": "math"},
        {"id": "b", "prompt": "hello"},
        {"messages": [{"role": "user", "content": "hi"}]},
    ])
    got = load(path, tok)
    assert [(p.id, p.dataset, p.category) for p in got] == [("a", "gsm8k", "math"), ("b", "prompts", None),
                                                            ("3", "prompts", None)]
    assert got[0].input_ids == [5, 6, 7] and text(got[1]) == "hello" and text(got[2]) == user("hi")


def test_a_folder_holds_one_file_per_dataset(tmp_path, tok):
    write_jsonl(tmp_path / "sets" / "gsm8k.jsonl", [{"turns": ["q1"]}, {"turns": ["q2"]}])
    write_jsonl(tmp_path / "sets" / "mt-bench.jsonl", [{"turns": ["first", "second"]}])
    write_jsonl(tmp_path / "sets" / "mine.jsonl", [{"id": "x", "input_ids": [1, 2]}])
    (tmp_path / "sets" / "notes.txt").write_text("not a prompt file")
    got = load(tmp_path / "sets", tok)
    assert [(p.id, p.dataset) for p in got] == [("gsm8k/1", "gsm8k"), ("gsm8k/2", "gsm8k"), ("mine/x", "mine"),
                                                ("mt-bench/1", "mt-bench")]
    assert text(got[-1]) == user("first")
    with pytest.raises(DraftboardError, match="no .jsonl files"):
        load(tmp_path / "sets" / "..", tok)


def test_hf_save_to_disk_uses_zlabs_gsm8k_format(tmp_path, tok):
    rows = {"question": ["Tom has 3 apples. How many?", "What is 7*6?"], "answer": ["3", "42"]}
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "gsm8k"))
    got = load(f"hf:{tmp_path / 'gsm8k'}:main:test", tok)
    assert [(p.id, p.dataset) for p in got] == [("1", "gsm8k"), ("2", "gsm8k")]
    assert text(got[1]) == user(ZLAB_GSM8K.format(question="What is 7*6?", answer="42"))
    with pytest.raises(DraftboardError, match="no split 'train'; the dataset has test"):
        load(f"hf:{tmp_path / 'gsm8k'}:train", tok)


def test_hf_parquet_folder_uses_zlabs_humaneval_format(tmp_path, tok):
    folder = tmp_path / "openai_humaneval"
    folder.mkdir()
    rows = {"task_id": ["HumanEval/0"], "prompt": ["def add(a, b):\n"], "entry_point": ["add"]}
    datasets.Dataset.from_dict(rows).to_parquet(str(folder / "test.parquet"))
    (got,) = load(f"hf:{folder}:test", tok)
    assert got.dataset == "humaneval"
    assert text(got) == user(ZLAB_HUMANEVAL.format(prompt="def add(a, b):\n"))


def test_hf_json_folder_multi_turn_and_categories(tmp_path, tok):
    folder = tmp_path / "mt_bench_prompts"
    folder.mkdir()
    rows = {"prompt": [["Write a poem.", "Now shorter."], ["Explain tides."]], "category": ["writing", "stem"]}
    datasets.Dataset.from_dict(rows).to_json(str(folder / "train.jsonl"))
    got = load(f"hf:{folder}:train", tok)
    assert [(p.id, p.dataset, p.category) for p in got] == [("1", "mt-bench", "writing"), ("2", "mt-bench", "stem")]
    assert text(got[0]) == user("Write a poem.")


def test_hf_columns_that_fit_no_mapping_are_named(tmp_path, tok):
    datasets.Dataset.from_dict({"text": ["a"]}).save_to_disk(str(tmp_path / "gsm8k"))
    with pytest.raises(DraftboardError, match=r"row 1: no column 'question' \(expected z-lab's gsm8k format\); columns: text"):
        load(f"hf:{tmp_path / 'gsm8k'}:test", tok)
    datasets.Dataset.from_dict({"text": ["a"]}).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(DraftboardError, match="expected a 'turns' or 'prompt' column"):
        load(f"hf:{tmp_path / 'other'}:test", tok)
    datasets.Dataset.from_dict({"prompt": ["free text"]}).save_to_disk(str(tmp_path / "alpaca"))
    (got,) = load(f"hf:{tmp_path / 'alpaca'}:train", tok)
    assert (got.dataset, text(got)) == ("alpaca", user("free text"))


@pytest.mark.parametrize("spec, message", [
    ("hf:gsm8k", "expected hf:NAME"),
    ("hf:a:b:c:d", "expected hf:NAME"),
    ("hf::test", "expected hf:NAME"),
])
def test_bad_hf_specs(spec, message, tok):
    with pytest.raises(DraftboardError, match=message):
        load(spec, tok)


def test_hf_missing_local_data_is_one_line(tmp_path, tok):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftboardError, match="cannot load with the datasets library") as info:
        load(f"hf:{tmp_path / 'empty'}:test", tok)
    assert "\n" not in str(info.value)


def test_bad_rows_are_refused(tmp_path, tok):
    with pytest.raises(DraftboardError, match=r"b.jsonl:2: 'turns' must be a non-empty list"):
        load(write_jsonl(tmp_path / "b.jsonl", [{"turns": ["ok"]}, {"turns": []}]), tok)
    with pytest.raises(DraftboardError, match="duplicate id '7'"):
        load(write_jsonl(tmp_path / "d.jsonl", [{"question_id": 7, "turns": ["a"]}, {"question_id": 7, "turns": ["b"]}]),
             tok)


def test_limit_per_dataset_draws_as_zlab_does(tmp_path, tok):
    write_jsonl(tmp_path / "sets" / "gsm8k.jsonl", [{"turns": [f"g{i}"]} for i in range(30)])
    write_jsonl(tmp_path / "sets" / "mbpp.jsonl", [{"turns": [f"m{i}"]} for i in range(3)])
    got = load(tmp_path / "sets", tok, limit_per_dataset=5)
    # z-lab's _limit_dataset after its transformers backend seeds `random` with 0
    zlab = [{"turns": [f"g{i}"]} for i in range(30)]
    random.seed(0)
    random.shuffle(zlab)
    expected = [user(row["turns"][0]) for row in zlab[:5]] + [user(f"m{i}") for i in range(3)]
    assert [text(p) for p in got] == expected
    assert [p.id for p in got] == [p.id for p in load(tmp_path / "sets", tok, limit_per_dataset=5)]
    with pytest.raises(DraftboardError, match="at least 1"):
        sample_per_dataset(got, 0, lambda p: p.dataset)


def test_zlab_names():
    assert zlab_name("openai/gsm8k") == "gsm8k" and zlab_name("/data/MATH-500/") == "math500"
    assert zlab_name("google-research-datasets/mbpp") == "mbpp" and zlab_name("mt-bench") == "mt-bench"
    assert zlab_name("tatsu-lab/alpaca") is None
    assert set(ZLAB_DATASETS) == {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench"}


# The generation tails of Qwen3.5 / 3.6's template (thinking on unless asked off: the prompt ends in an
# open <think>) and of Qwen3's (on by default without a tag; off adds an empty think block).
QWEN36_TAIL = ("{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
               "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
               "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}")
QWEN3_TAIL = ("{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
              "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
              "{%- endif %}{%- endif %}")


@pytest.mark.parametrize("tail, default", [(QWEN36_TAIL, True), (QWEN3_TAIL, True), ("{% if add_generation_prompt %}"
                                                                                    "<assistant>{% endif %}", None)])
def test_thinking_is_what_the_template_rendered(tmp_path, tail, default):
    """Without a flag the protocol records what the template's default rendered; with one, what the flag
    rendered; a template without the switch leaves it unknown (None)."""
    from evaluators.prompts import template_thinking

    tokenizer = bytetok.hf_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" + tail
    assert template_thinking(tokenizer) is default
    assert template_thinking(tokenizer, False) is (None if default is None else False)
    assert template_thinking(tokenizer, True) is default
    prompts = load(write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "messages": [{"role": "user", "content": "hi"}]}]),
                   tokenizer)
    if tail == QWEN36_TAIL:  # the default opens a think block, as Qwen3.6's prompts end
        assert bytetok.decode(prompts[0].input_ids).endswith("<think>\n")
