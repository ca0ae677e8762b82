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
