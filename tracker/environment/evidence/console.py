"""Console text -> facts: what a training process printed about the code it ran.

Each rule is a pattern read from the tool's own source, matched at the start of a line once a bounded
log prefix is taken off (ANSI colours, `[transformers]`, `[rank0]:`, a timestamp and level, `file.py
L427:`, NCCL's `host:pid:tid [0] NCCL INFO`); a terminal's carriage returns split a line, as the
screen showed it. Every pattern is linear in the line, and lines come bounded (textlines).

The rules and their sources:
- transformers 5.x, `integrations/hub_kernels.py` (`use_kernel_func_from_hub_with_fallback`, 5.24.0):
  "`<func>` is falling back to its reference PyTorch implementation because `<dist>` is not installed."
  once per piece; "`<func>` can't keep packed sequences apart without `<dist>`" (raised instead).
  `<func>` is the kernel's own name (`causal_conv1d_fn`, `chunk_gated_delta_rule`, ...), `<dist>` the
  package it wanted (`causal_conv1d`, `flash-linear-attention`).
- transformers 4.x (Qwen3-Next / Qwen3.5 modeling files): "The fast path is not available because one
  of the required library is not installed. Falling back to torch implementation."
- `python -m torch.utils.collect_env` (torch 2.13): `PyTorch version: `, `CUDA used to build PyTorch: `,
  `Python version: `, `GPU models and configuration: ` then `GPU <i>: <name>`, `Nvidia driver version: `,
  `[pip3] name==version`.
- `nvidia-smi`: its header row (`NVIDIA-SMI <v>  Driver Version: <v>  CUDA Version: <v>`) and one row
  per GPU (`|   0  NVIDIA H100 80GB HBM3  On  |`); `nvidia-smi -L`: `GPU <i>: <name> (UUID: ...)`.
- NCCL's `NCCL INFO NCCL version 2.27.3+cuda12.9`.
- A start-up banner naming torch: `torch 2.13.0+cu130`, `PyTorch version: ...`, `torch==...`, and on
  that line a GPU count such as `8 x H100`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tracker.environment import linear_attn
from tracker.environment.evidence import Fact, packages

# The name a kernel wrapper prints -> the fingerprint's function name (linear_attn.LINEAR_ATTN_FUNCTIONS).
PRINTED = {"causal_conv1d_fn": "causal_conv1d_fn", "causal_conv1d_update": "causal_conv1d_update",
           "chunk_gated_delta_rule": "torch_chunk_gated_delta_rule",
           "fused_recurrent_gated_delta_rule": "torch_recurrent_gated_delta_rule"}
FUNCTION_FIELD = "numerics.linear_attention.functions."
PATH_FIELD = "numerics.linear_attention.linear_attention_path"

_ANSI = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]")
# Every rule's line holds one of these words: one search in C skips the ordinary lines (a step's loss, a progress
# bar) before any prefix is taken off, so a long training console reads at the speed of a scan.
_ANY = re.compile(r"falling back|packed sequences|fast path|[Tt]orch|CUDA used|Python version|driver version|NVIDIA"
                  r"|Tesla|Quadro|GPU \d|NCCL version|==")
_PREFIX = re.compile(
    r"(?:\[[^\]\n]{0,80}\]:?"  # [transformers], [rank0]:, [pip3], [2026-12-07 10:00:00]
    r"|\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d:\d\d[\d.,:+Z]{0,16})?"  # a date, maybe with a time
    r"|\d\d:\d\d:\d\d[\d.,]{0,10}"  # a time
    r"|[WIEF]\d{4}"  # glog's level+date
    r"|(?:WARNING|WARN|INFO|ERROR|DEBUG)\b:?|NCCL (?:INFO|WARN)\b"
    r"|[\w.]{0,60}(?:Error|Exception):"  # a traceback's last line: `ValueError: ...`
    r"|[\w.-]{1,80}\.py(?::\d{1,7}| L\d{1,7})?\]?:?"  # file.py:12, file.py L427:
    r"|[\w.-]{1,64}:\d{1,9}:\d{1,9}"  # NCCL's host:pid:tid
    r"|-)\s*")
_MAX_PREFIX_TOKENS = 8

_TF5 = re.compile(r"`(\w{1,64})` is falling back to its reference PyTorch implementation because `([\w.-]{1,64})` "
                  r"is not installed")
_TF5_PACKED = re.compile(r"`(\w{1,64})` can't keep packed sequences apart without `([\w.-]{1,64})`")
_TF4 = re.compile(r"The fast path is not available because one of the required library is not installed")
_PYTORCH = re.compile(r"(?:PyTorch|torch)(?: version)?(?::\s*|\s+v?|==)(\d{1,3}\.\d{1,4}(?:\.\d{1,4})?(?:\+\w{1,16})?)\b")
_GPUS_ON_BANNER = re.compile(r"\b(\d{1,4}) ?[x×] ?((?:NVIDIA )?[A-Z][A-Za-z]{0,3}\d{2,4}[\w-]{0,16})")
_CUDA_BUILD = re.compile(r"CUDA used to build PyTorch: (\d{1,3}\.\d{1,3})")
_PYTHON = re.compile(r"Python version: (\d{1,2}\.\d{1,3}\.\d{1,3})")
_DRIVER = re.compile(r"Nvidia driver version: (\S{1,32})")
_GPU_LINE = re.compile(r"GPU (\d{1,4}): ([^()\n]{1,120}?)(?: \(UUID: [^)]{0,80}\))?\s*$")
_SMI_HEADER = re.compile(r"\|?\s*NVIDIA-SMI (\S{1,32})\s+Driver Version: (\S{1,32})")
_SMI_ROW = re.compile(r"\|\s{1,8}(\d{1,4})\s{1,8}((?:NVIDIA|Tesla|Quadro) [^|]{1,80}?)\s{2,}(?:On|Off)\s{0,8}\|")
_NCCL = re.compile(r"NCCL version (\d{1,3}\.\d{1,3}\.\d{1,3})")
_PIP3 = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,100})==([A-Za-z0-9][A-Za-z0-9.+!_-]{0,60})\s*$")


def _body(segment: str) -> str:
    """The segment without its log prefix: at most _MAX_PREFIX_TOKENS tokens, each bounded."""
    pos = 0
    for _ in range(_MAX_PREFIX_TOKENS):
        match = _PREFIX.match(segment, pos)
        if match is None or match.end() == pos:
            break
        pos = match.end()
    return segment[pos:]


class Reader:
    """Reads one console's lines; GPU rows are counted across lines, so it keeps what it has seen."""

    def __init__(self, file: str):
        self.file = file
        self.facts: list[Fact] = []
        self.gpus: dict[str, tuple[str, int, str, str]] = {}  # index -> (name, line, text, rule)

    def line(self, number: int | str, raw: str) -> None:
        if not _ANY.search(raw):
            return
        for segment in _ANSI.sub("", raw).split("\r"):
            body = _body(segment.strip())
            if body:
                self._body(number, segment.strip(), body)

    def _fact(self, field, value, number, text, rule, rank=0, stated=True) -> None:
        self.facts.append(Fact(field, value, self.file, number, text, rule, rank, stated))

    def _body(self, number, text: str, body: str) -> None:
        if match := _TF5.match(body) or _TF5_PACKED.match(body):
            rule = "transformers 5 kernel fallback" if match.re is _TF5 else "transformers 5 packed-sequence error"
            function = PRINTED.get(match.group(1))
            if function is not None:
                self._fact(FUNCTION_FIELD + function, "torch", number, text, rule)
                # The wrapper picks per package: every other function that package provides fell back too.
                for sibling in _provided_by(match.group(2)):
                    if sibling != function:
                        self._fact(FUNCTION_FIELD + sibling, "torch", number, text,
                                   f"{rule}: the same package ({match.group(2)}) provides it", stated=False)
            return
        if _TF4.match(body):
            self._fact(PATH_FIELD, "fallback", number, text, "transformers 4 fast path unavailable")
            return
        for pattern, field, rule in ((_CUDA_BUILD, "software.cuda", "collect_env"),
                                     (_PYTHON, "software.python", "collect_env"),
                                     (_DRIVER, "hardware.driver", "collect_env"),
                                     (_NCCL, "software.nccl", "NCCL banner")):
            if match := pattern.match(body):
                self._fact(field, match.group(1), number, text, rule)
                return
        if match := _SMI_HEADER.match(body) or _SMI_HEADER.match(text):
            self._fact("hardware.driver", match.group(2), number, text, "nvidia-smi")
            return
        if match := _SMI_ROW.match(text):
            self.gpus.setdefault(match.group(1), (match.group(2).strip(), number, text, "nvidia-smi"))
            return
        if match := _GPU_LINE.match(body):
            self.gpus.setdefault(match.group(1), (match.group(2).strip(), number, text, "GPU list"))
            return
        if match := _PYTORCH.match(body):
            self._fact("software.torch", match.group(1), number, text, "torch banner")
            if gpus := _GPUS_ON_BANNER.search(body):
                self._fact("hardware.gpu_count", int(gpus.group(1)), number, text, "torch banner")
                self._fact("hardware.gpu_name", gpus.group(2), number, text, "torch banner")
            return
        if match := _PIP3.match(body):  # a pip freeze block, or collect_env's [pip3] lines
            self.facts += packages.version_facts(match.group(1), match.group(2), self.file, number, text,
                                                 "pip freeze in the console", 1)

    def finish(self) -> list[Fact]:
        """The facts, GPU rows folded into a name and a count (one fact citing the first row)."""
        facts = list(self.facts)
        if self.gpus:
            names = {name for name, *_ in self.gpus.values()}
            first = self.gpus[min(self.gpus, key=int)]
            _name, number, text, rule = first
            facts.append(Fact("hardware.gpu_count", len(self.gpus), self.file, number, text, rule))
            if len(names) == 1:
                facts.append(Fact("hardware.gpu_name", names.pop(), self.file, number, text, rule))
        return facts


def read(lines: Iterable[tuple[int | str, str, bool]], file: str) -> list[Fact]:
    """Facts from console lines ((number or record label, text, cut), as textlines.lines gives them)."""
    reader = Reader(file)
    for number, text, _cut in lines:
        reader.line(number, text)
    return reader.finish()



def _provided_by(distribution: str) -> tuple[str, ...]:
    """The GDN functions whose kernel comes from `distribution`, as a fallback line names it."""
    wanted = packages.normalise(distribution)
    return tuple(name for name, (package, _) in linear_attn.KERNEL_SOURCES.items() if packages.normalise(package) == wanted)
