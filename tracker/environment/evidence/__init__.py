"""Evidence: the environment a run really ran in, read from the files it left behind.

A run recorded elsewhere (W&B, SwanLab, TensorBoard, a console log) still says what ran: its
console holds the lines transformers prints when a Gated DeltaNet piece falls back to torch, its
package list what the training Python had installed, its tracker's metadata the GPUs. Each reader
here turns one kind of source into `Fact`s, every one with its provenance (file, line or record,
the text quoted, the rule that read it); `decide.decide` turns the facts into fingerprint fields with
the same names and values a live fingerprint records, and the evidence map `fingerprint.evidence`
cites. Nothing is guessed: a field no fact states stays unknown.

- `console.py`: console text, line by line (transformers' fallback warnings of every released form,
  version banners, `nvidia-smi`, `collect_env`, NCCL's banner, a `pip freeze` block).
- `packages.py`: package lists (pip freeze, requirements.txt, conda's environment.yml).
- `decide.py`: facts -> fingerprint fields, the linear-attention path per piece (stated, or inferred
  from a package list), contradictions resolved toward what ran and named.

Readers are pure and bounded: lines through `tracker.untrusted.textlines`, linear-time patterns
anchored at a line's start (after a bounded log prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_QUOTE = 300  # characters of a line kept as the citation's text


@dataclass(frozen=True)
class Fact:
    """One field of a fingerprint as one source states it.

    `rank` orders sources when they disagree: 0 what ran said (a console line), 1 what was installed
    (a package list, a tracker's metadata).
    `stated` is False for an inference (e.g. a package absent from a complete list)."""

    field: str  # dotted fingerprint field: software.torch, numerics.linear_attention.functions.causal_conv1d_fn
    value: object
    file: str
    line: int | str | None  # line number, or a record's label ("record 12")
    text: str
    rule: str
    rank: int = 0
    stated: bool = True

    def cite(self) -> dict:
        return {"file": self.file, "line": self.line, "text": self.text[:MAX_QUOTE], "rule": self.rule}

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def to_dict(self) -> dict:
        return {"field": self.field, "value": self.value, "file": self.file, "line": self.line,
                "text": self.text[:MAX_QUOTE], "rule": self.rule, "rank": self.rank, "stated": self.stated}

    @classmethod
    def from_dict(cls, data: object) -> "Fact | None":
        """A fact stored by `to_dict` (in a store any writer can change): None unless every field has its type."""
        if not isinstance(data, dict):
            return None
        text_fields = ("field", "file", "text", "rule")
        if not all(isinstance(data.get(k), str) for k in text_fields):
            return None
        value, line = data.get("value"), data.get("line")
        if not (value is None or isinstance(value, (str, int))) or not (line is None or isinstance(line, (str, int))):
            return None
        if not isinstance(data.get("rank"), int) or not isinstance(data.get("stated"), bool):
            return None
        return cls(data["field"], value, data["file"], line, data["text"][:MAX_QUOTE], data["rule"], data["rank"],
                   data["stated"])
