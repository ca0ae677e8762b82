"""How a number was measured: the eval protocol record, and whether two protocols are comparable.

The environment (tracker.environment.fingerprint) says what ran; the protocol says what was asked of it:
which prompts, how long, thinking on or off, which end-of-generation rule, scored offline or
online. Both move tau, so two numbers are comparable only when both agree. The record lives in
the results JSON as `protocol` and in MLflow as `protocol.<field>` tags (docs/DESIGN.md,
"Protocol and uncertainty", fixed names); a field nobody knows reads `unknown`, and a run from
before protocols existed reads `unknown` everywhere. `diff` has the shape and severities of
`tracker.environment.fingerprint.diff`, so callers show both sections with one table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracker import config
from tracker.errors import DraftboardError
from tracker.environment.fingerprint import SEVERITY_ORDER, DiffRow
from tracker.store import names

RESULTS_KEY = "protocol"
UNKNOWN = "unknown"
GENERATED = "generated"  # `completions`: the target generated them; else the completions file's digest
LAST_BLOCK_RULES = config.LAST_BLOCK_RULES  # z-lab 07ebd93 (the default) | z-lab 44947fb
SCORINGS = (*config.EVAL_SCORINGS, config.ENGINE_SCORING, "published", "imported")  # the last two: not measured here
DIGEST_HEX = 16


@dataclass(frozen=True)
class Protocol:
    datasets: dict[str, int | str] | str = UNKNOWN  # {dataset name: prompts (or unknown)}
    prompt_digest: str = UNKNOWN  # prompt_digest() of the prompts' token ids
    prompt_lengths: dict[str, int] | str = UNKNOWN  # lengths() of the prompts' token ids: their distribution
    completions: str = UNKNOWN  # GENERATED, or file_digest() of a --completions file
    max_new_tokens: int | str = UNKNOWN
    enable_thinking: bool | str = UNKNOWN
    chat_template_digest: str = UNKNOWN  # text_digest() of the chat template the prompts went through
    block_size: int | str = UNKNOWN
    temperature: float | str = UNKNOWN
    top_p: float | str = UNKNOWN  # z-lab's sampling cut-offs (T > 0); a greedy eval records the flags' values
    top_k: int | str = UNKNOWN  # 0: no top-k
    samples: int | str = UNKNOWN  # draws per prompt behind tau: continuations offline, runs online
    seed: int | str = UNKNOWN  # the draws' seed (evaluators.sampling.draw_seed)
    stop_token_ids: list[int] | str = UNKNOWN
    last_block: str = UNKNOWN  # LAST_BLOCK_RULES
    scoring: str = UNKNOWN  # SCORINGS
    target_digest: str = UNKNOWN

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != UNKNOWN:
                _CHECKS[field.name](value)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Protocol:
        """From a results JSON's `protocol` section; missing or null fields read `unknown`."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise DraftboardError(f"protocol must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise DraftboardError(f"protocol has unknown field(s) {', '.join(extra)}; known: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in data.items() if v is not None})

    @classmethod
    def from_results(cls, results: Mapping[str, Any]) -> Protocol:
        return cls.from_dict(results.get(RESULTS_KEY))

    def to_tags(self) -> dict[str, str]:
        """`protocol.<field>` MLflow tags: JSON for datasets and stop tokens, true/false for flags."""
        return {names.protocol_tag(field): _tag_text(value) for field, value in self.to_dict().items()}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Protocol:
        """From a run's tags; a run without `protocol.*` tags reads `unknown` everywhere."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for tag, text in tags.items():
            field = names.parse_protocol_tag(tag)
            if field in fields and text != UNKNOWN:
                values[field] = _parse_tag(field, text, tag)
        return cls(**values)


# --------------------------------------------------------------------------- validation


def _fail(field: str, expected: str, value: Any) -> None:
    raise DraftboardError(f"protocol.{field} must be {expected} or {UNKNOWN!r}, got {value!r}")


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_datasets(value):
    # A publication names its sets without their sizes: a count may read `unknown`.
    if not isinstance(value, dict) or not value or not all(
            isinstance(k, str) and k and (_count(n) or n == UNKNOWN) for k, n in value.items()):
        _fail("datasets", "a non-empty {name: number of prompts} object", value)


def _check_text(field: str):
    def check(value):
        if not isinstance(value, str) or not value:
            _fail(field, "a non-empty string", value)
    return check


def _check_positive(field: str):
    def check(value):
        if not _count(value) or value == 0:
            _fail(field, "a positive integer", value)
    return check


def _check_choice(field: str, choices: tuple[str, ...]):
    def check(value):
        if value not in choices:
            _fail(field, " | ".join(choices), value)
    return check


def _check_thinking(value):
    if not isinstance(value, bool):
        _fail("enable_thinking", "true or false", value)


def _check_temperature(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        _fail("temperature", "a number >= 0", value)


def _check_top_p(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        _fail("top_p", "a number in (0, 1]", value)


def _check_count(field: str):
    def check(value):
        if not _count(value):
            _fail(field, "an integer >= 0", value)
    return check


def _check_lengths(value):
    if not isinstance(value, dict) or set(value) != set(LENGTH_KEYS) or not all(_count(v) for v in value.values()):
        _fail("prompt_lengths", "a {" + ", ".join(LENGTH_KEYS) + "} object of token counts", value)


def _check_stop_tokens(value):
    if not isinstance(value, list) or not all(_count(t) for t in value):
        _fail("stop_token_ids", "a list of token ids", value)


_CHECKS = {
    "datasets": _check_datasets,
    "prompt_digest": _check_text("prompt_digest"),
    "prompt_lengths": _check_lengths,
    "completions": _check_text("completions"),
    "max_new_tokens": _check_positive("max_new_tokens"),
    "enable_thinking": _check_thinking,
    "chat_template_digest": _check_text("chat_template_digest"),
    "block_size": _check_positive("block_size"),
    "temperature": _check_temperature,
    "top_p": _check_top_p,
    "top_k": _check_count("top_k"),
    "samples": _check_positive("samples"),
    "seed": _check_count("seed"),
    "stop_token_ids": _check_stop_tokens,
    "last_block": _check_choice("last_block", LAST_BLOCK_RULES),
    "scoring": _check_choice("scoring", SCORINGS),
    "target_digest": _check_text("target_digest"),
}


# --------------------------------------------------------------------------- tags


def _tag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


_JSON_FIELDS = ("datasets", "stop_token_ids", "prompt_lengths")
_INT_FIELDS = ("max_new_tokens", "block_size", "top_k", "samples", "seed")
_FLOAT_FIELDS = ("temperature", "top_p")


def _parse_tag(field: str, text: str, tag: str) -> Any:
    try:
        if field in _JSON_FIELDS:
            return json.loads(text)
        if field in _INT_FIELDS:
            return int(text)
        if field in _FLOAT_FIELDS:
            return float(text)
    except ValueError:
        raise DraftboardError(f"tag {tag}={text!r} is not a valid {field}") from None
    if field == "enable_thinking":
        if text not in ("true", "false"):
            raise DraftboardError(f"tag {tag}={text!r} must be true, false or {UNKNOWN}")
        return text == "true"
    return text


# --------------------------------------------------------------------------- digests


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def prompt_digest(token_ids: Iterable[Sequence[int]]) -> str:
    """The prompt set's digest: independent of prompt order and ids, sensitive to every token.

    Canonical form: each prompt's ids as decimal numbers joined by ",", the lines sorted, joined
    by "\\n", UTF-8; the first 16 hex digits of its sha256.
    """
    lines = sorted(",".join(str(int(t)) for t in ids) for ids in token_ids)
    return _digest("\n".join(lines).encode())


LENGTH_KEYS = ("min", "median", "max")


def lengths(token_ids: Iterable[Sequence[int]]) -> dict[str, int]:
    """The prompts' length distribution in tokens: shortest, median (the lower middle one), longest."""
    sizes = sorted(len(ids) for ids in token_ids)
    if not sizes:
        raise DraftboardError("no prompts: no length distribution")
    return dict(zip(LENGTH_KEYS, (sizes[0], sizes[(len(sizes) - 1) // 2], sizes[-1])))


def text_digest(text: str) -> str:
    """Digest of a text such as a chat template."""
    return _digest(text.encode())


def file_digest(path: str | Path) -> str:
    """Digest of a file's bytes (`completions` when they come from a file)."""
    try:
        return _digest(Path(path).read_bytes())
    except OSError as exc:
        raise DraftboardError(f"{path}: cannot read: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------- diff

# A series is one protocol (DESIGN.md, "Evidence, shards and series"): the fields that change what tau means. Evals
# that differ in any are never one line on a chart (tracker.dashboard.lineage.series_key), never compared (`draftboard
# compare`, Compare's tables, the report, the regression alerts: each asks `diff`, where they are critical). Prompts:
# another set, or other prompt lengths, moves acceptance with context (issue 50); max new tokens and the last-block
# rule too (a 32-token and a 512-token eval of one checkpoint read 2.5 and 3.8, issue 65 H1); thinking on or off,
# greedy vs sampled or other cut-offs, the block size; the scoring: offline, online, an engine's.
SERIES_FIELDS = ("datasets", "prompt_digest", "max_new_tokens", "last_block", "enable_thinking", "temperature", "top_p",
                 "top_k", "block_size", "scoring")
CRITICAL_FIELDS = (*SERIES_FIELDS, "prompt_lengths")
# Warning fields can shift the numbers; more draws or another seed estimate the same expectation with other noise.
WARNING_FIELDS = ("chat_template_digest", "completions", "stop_token_ids", "target_digest")
# Scorings that say where a number came from, not how it was measured: against one, the scoring proves nothing.
NOT_MEASURED_HERE = ("published", "imported")
# What only a sampled eval has: at T = 0 on both sides nothing was drawn, so these say nothing.
SAMPLING_FIELDS = ("top_p", "top_k", "samples", "seed")


def series_words(p: Protocol) -> tuple[str, ...]:
    """The SERIES_FIELDS of `p`, each worded as a label shows it (`gsm8k`, `prompts 3fa2c1`, `256 tok`, `last block
    full`, `thinking on`, `T=1 top_p=0.95 top_k=20`, `block 8`, `online`): two evals with other words are two series."""
    datasets = ",".join(p.datasets) if isinstance(p.datasets, dict) else "datasets unknown"
    thinking = {True: "thinking on", False: "thinking off"}.get(p.enable_thinking, "thinking unknown")
    return (datasets, f"prompts {str(p.prompt_digest)[:6]}", f"{p.max_new_tokens} tok", f"last block {p.last_block}",
            thinking, sampling_text(p, draws=False), f"block {p.block_size}", str(p.scoring))


def is_greedy(p: Protocol) -> bool:
    return p.temperature == 0


def sampling_text(p: Protocol, draws: bool = True) -> str:
    """How tokens were drawn, in the words the dashboard and CLI print: `T=0`, or `T=1 top_p=0.95
    top_k=20 x16` (x: draws per prompt, left out with draws=False); `T=?` when unknown."""
    if p.temperature == UNKNOWN:
        return "T=?"
    if is_greedy(p):
        return "T=0"
    parts = [f"T={p.temperature:g}"]
    if p.top_p not in (UNKNOWN, 1, 1.0):
        parts.append(f"top_p={p.top_p:g}")
    if p.top_k not in (UNKNOWN, 0):
        parts.append(f"top_k={p.top_k}")
    if draws and p.samples != UNKNOWN:
        parts.append(f"x{p.samples}")
    return " ".join(parts)


def _severity(field: str, a: Any, b: Any) -> str:
    if UNKNOWN in (a, b) or (field == "scoring" and {a, b} & set(NOT_MEASURED_HERE)):
        return "warning"  # an unknown value proves neither a mismatch nor comparability
    if field in CRITICAL_FIELDS:
        return "critical"
    if field in WARNING_FIELDS:
        return "warning"
    return "info"


def diff(a: Protocol, b: Protocol) -> list[DiffRow]:
    """Rows (`protocol.<field>`, a, b, severity) for every differing field, most severe first; the
    sampling fields only where a side sampled."""
    rows = []
    both_greedy = is_greedy(a) and is_greedy(b)
    for field, x in a.to_dict().items():
        y = getattr(b, field)
        if both_greedy and field in SAMPLING_FIELDS:
            continue
        if x != y:
            rows.append(DiffRow(names.protocol_tag(field), x, y, _severity(field, x, y)))
    rows.sort(key=lambda r: (SEVERITY_ORDER[r.severity], r.field))
    return rows
