"""tracker/measurement/protocol.py: the record, its JSON and MLflow tag forms, digests, and the severity diff."""

from __future__ import annotations

import hashlib
import json

import pytest

from tracker.environment import fingerprint
from tracker.errors import DraftboardError
from tracker.measurement.protocol import (CRITICAL_FIELDS, SERIES_FIELDS, UNKNOWN, Protocol, diff, file_digest, lengths,
                                         prompt_digest, text_digest)

FULL = Protocol(
    datasets={"gsm8k": 80, "mbpp": 40}, prompt_digest=prompt_digest([[1, 2, 3], [4, 5]]),
    prompt_lengths=lengths([[1, 2, 3], [4, 5]]), completions="generated",
    max_new_tokens=256, enable_thinking=True, chat_template_digest=text_digest("{{ messages }}"), block_size=16,
    temperature=0, top_p=1.0, top_k=0, samples=1, seed=0, stop_token_ids=[151645, 151643], last_block="cut",
    scoring="offline", target_digest="ab12cd34ef56ab12",
)
SAMPLED = Protocol(**{**FULL.to_dict(), "temperature": 1.0, "top_p": 0.95, "top_k": 20, "samples": 16, "seed": 3})


def test_json_round_trip_and_unknown_defaults():
    assert Protocol.from_dict(json.loads(json.dumps(FULL.to_dict()))) == FULL
    assert Protocol.from_results({"tau": 3.0}) == Protocol()  # an eval from before protocols
    assert set(Protocol().to_dict().values()) == {UNKNOWN}
    partial = Protocol.from_dict({"scoring": "published", "datasets": {"gsm8k": 1319}, "block_size": None})
    assert (partial.scoring, partial.block_size, partial.enable_thinking) == ("published", UNKNOWN, UNKNOWN)


def test_tag_round_trip():
    tags = FULL.to_tags()
    assert tags["protocol.datasets"] == '{"gsm8k":80,"mbpp":40}'
    assert tags["protocol.enable_thinking"] == "true" and tags["protocol.block_size"] == "16"
    assert tags["protocol.stop_token_ids"] == "[151645,151643]"
    assert tags["protocol.prompt_lengths"] == '{"max":3,"median":2,"min":2}'
    assert len(tags) == 17 and all(isinstance(v, str) for v in tags.values())
    assert Protocol.from_tags(SAMPLED.to_tags()) == SAMPLED
    assert Protocol.from_tags({**tags, "env.hash": "x", "draftboard.kind": "eval"}) == FULL
    assert Protocol.from_tags({"draftboard.kind": "eval"}) == Protocol()
    assert Protocol.from_tags(Protocol(scoring="imported").to_tags()) == Protocol(scoring="imported")


@pytest.mark.parametrize("data, message", [
    ({"last_block": "half"}, "last_block must be cut | full"),
    ({"scoring": "vibes"}, "scoring must be offline | online | published | imported"),
    ({"block_size": 0}, "block_size must be a positive integer"),
    ({"max_new_tokens": True}, "max_new_tokens must be a positive integer"),
    ({"datasets": {"gsm8k": -1}}, "datasets must be a non-empty"),
    ({"temperature": -0.5}, "temperature must be a number >= 0"),
    ({"enable_thinking": "yes"}, "enable_thinking must be true or false"),
    ({"stop_token_ids": ["eos"]}, "stop_token_ids must be a list of token ids"),
    ({"thinking": True}, "unknown field.s. thinking"),
])
def test_bad_records_are_refused(data, message):
    with pytest.raises(DraftboardError, match=message):
        Protocol.from_dict(data)


def test_bad_tags_are_refused():
    with pytest.raises(DraftboardError, match="protocol.block_size='sixteen' is not a valid block_size"):
        Protocol.from_tags({"protocol.block_size": "sixteen"})
    with pytest.raises(DraftboardError, match="must be true, false or unknown"):
        Protocol.from_tags({"protocol.enable_thinking": "maybe"})


def test_prompt_digest_is_canonical():
    prompts = [[10, 2, 3], [4], [1, 23]]
    assert prompt_digest(prompts) == prompt_digest(list(reversed(prompts)))  # order does not matter
    # the canonical form, spelled out: sorted decimal lines
    assert prompt_digest(prompts) == hashlib.sha256(b"1,23\n10,2,3\n4").hexdigest()[:16]
    assert prompt_digest([[1, 2, 3]]) != prompt_digest([[12, 3]]) != prompt_digest([[1, 23]])
    assert prompt_digest(prompts) != prompt_digest(prompts[:2])


def test_file_and_text_digests(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": 1}\n')
    assert file_digest(path) == hashlib.sha256(b'{"id": 1}\n').hexdigest()[:16]
    assert text_digest("a") != text_digest("b")
    with pytest.raises(DraftboardError, match="cannot read"):
        file_digest(tmp_path / "missing.jsonl")


def _fields(rows):
    return {r.field: r.severity for r in rows}


def test_diff_severities():
    assert diff(FULL, FULL) == []
    changed = Protocol(**{**FULL.to_dict(), "datasets": {"gsm8k": 80}, "prompt_digest": prompt_digest([[9]]),
                          "enable_thinking": False, "temperature": 0.7, "block_size": 8, "max_new_tokens": 512,
                          "chat_template_digest": text_digest("other"), "last_block": "full", "scoring": "online"})
    rows = diff(FULL, changed)
    assert _fields(rows) == {
        "protocol.datasets": "critical", "protocol.prompt_digest": "critical", "protocol.enable_thinking": "critical",
        "protocol.temperature": "critical", "protocol.block_size": "critical",
        # issue 65 H1: a series is one protocol: generation length, last-block rule and scoring change what tau means
        "protocol.max_new_tokens": "critical", "protocol.chat_template_digest": "warning",
        "protocol.last_block": "critical", "protocol.scoring": "critical",
    }
    # A published or imported number says where it came from, not how it was scored: a warning, as unknown is.
    published = Protocol(**{**FULL.to_dict(), "scoring": "published"})
    assert _fields(diff(FULL, published)) == {"protocol.scoring": "warning"}
    assert set(SERIES_FIELDS) <= set(CRITICAL_FIELDS)
    assert [r.severity for r in rows] == sorted((r.severity for r in rows), key=fingerprint.SEVERITY_ORDER.get)
    assert fingerprint.has_critical(rows)
    thinking = next(r for r in rows if r.field == "protocol.enable_thinking")
    assert (thinking.a_value, thinking.b_value) == (True, False)


def test_sampling_fields_are_critical_where_a_side_sampled_and_silent_when_both_are_greedy():
    assert _fields(diff(FULL, SAMPLED)) == {"protocol.temperature": "critical", "protocol.top_p": "critical",
                                            "protocol.top_k": "critical", "protocol.samples": "info",
                                            "protocol.seed": "info"}
    other_cut = Protocol(**{**SAMPLED.to_dict(), "top_k": 0})
    assert _fields(diff(SAMPLED, other_cut)) == {"protocol.top_k": "critical"}
    more_draws = Protocol(**{**SAMPLED.to_dict(), "samples": 64, "seed": 0})
    assert _fields(diff(SAMPLED, more_draws)) == {"protocol.samples": "info", "protocol.seed": "info"}
    # Two greedy evals: what they would have drawn with says nothing (an older run has no such fields)
    old_greedy = Protocol(**{k: v for k, v in FULL.to_dict().items() if k not in ("top_p", "top_k", "samples", "seed")})
    assert diff(FULL, old_greedy) == [] and diff(FULL, Protocol(**{**FULL.to_dict(), "top_p": 0.5})) == []


def test_sampling_text():
    from tracker.measurement.protocol import sampling_text

    assert sampling_text(FULL) == "T=0" and sampling_text(Protocol()) == "T=?"
    assert sampling_text(SAMPLED) == "T=1 top_p=0.95 top_k=20 x16"
    assert sampling_text(Protocol(temperature=0.6)) == "T=0.6"


def test_bad_sampling_fields_are_refused():
    for field, bad in (("top_p", 0), ("top_p", 1.5), ("top_k", -1), ("samples", 0), ("seed", -3), ("top_k", 2.5)):
        with pytest.raises(DraftboardError, match=f"protocol.{field}"):
            Protocol(**{field: bad})


def test_unknown_on_one_side_is_a_warning():
    published = Protocol(datasets={"gsm8k": 80}, scoring="published", block_size=16)
    rows = diff(FULL, published)
    severities = _fields(rows)
    assert severities["protocol.datasets"] == "critical"  # both known, different
    assert severities["protocol.enable_thinking"] == "warning"  # unknown on one side
    assert severities["protocol.prompt_digest"] == "warning"
    assert "protocol.block_size" not in severities
    assert not fingerprint.has_critical(diff(FULL, Protocol()))  # an old run: all warnings


def test_prompt_lengths_are_the_distribution_and_a_different_one_is_critical():
    """Issue 50: acceptance moves with context, so two evals whose prompt lengths differ are not one number."""
    assert lengths([[1] * 5, [1] * 100, [1] * 7, [1] * 9]) == {"min": 5, "median": 7, "max": 100}
    long = Protocol(prompt_lengths={"min": 4096, "median": 4097, "max": 4098})
    (row,) = diff(Protocol(prompt_lengths=lengths([[1] * 40])), long)
    assert (row.field, row.severity) == ("protocol.prompt_lengths", "critical")
    with pytest.raises(DraftboardError, match="prompt_lengths must be"):
        Protocol(prompt_lengths={"min": 1})
