"""Package lists -> facts: which versions of the packages that change the numbers were installed.

Three forms, read line by line (never as YAML or by pip: a list is untrusted text):
- `pip freeze` and W&B's / SwanLab's `files/requirements.txt`: `name==version`;
- a requirements.txt that is a spec (`torch>=2.6`) states no installed version: only `==` pins count;
- conda's `environment.yml`: `- pytorch=2.13.0=py3.11_cuda13.0_...` and its `pip:` list.

A list whose every requirement line is an exact pin is a freeze: complete, so a kernel package absent
from it was not installed (`absent`, an inference, which `decide` uses for the kernel path).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tracker.environment.evidence import Fact

# Distribution (normalised, PEP 503) -> fingerprint field: what fingerprint.PACKAGES records, plus engines.
FIELDS = {
    "torch": "software.torch", "pytorch": "software.torch", "transformers": "software.transformers",
    "flash-linear-attention": "software.flash-linear-attention", "fla-core": "software.fla-core",
    "causal-conv1d": "software.causal-conv1d", "triton": "software.triton", "kernels": "software.kernels",
    "flash-attn": "software.flash-attn", "vllm": "software.vllm", "sglang": "software.sglang",
}
# Kernel packages whose absence from a complete list means their kernels could not run.
KERNEL_PACKAGES = ("causal-conv1d", "flash-linear-attention", "fla-core", "kernels", "triton")
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,100})\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]{0,60})\s*(?:;.*)?")
_CONDA = re.compile(r"-\s+(?:[\w.-]+::)?([A-Za-z0-9][A-Za-z0-9._-]{0,100})=([A-Za-z0-9][A-Za-z0-9.+_-]{0,60})(?:=\S*)?")
_CUDA_TAG = re.compile(r"\+cu(\d{2,3})(\d)$")  # torch's local version: +cu130 -> CUDA 13.0


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_facts(name: str, version: str, file: str, line: int, text: str, rule: str, rank: int) -> list[Fact]:
    """The facts one pinned distribution states: its version, and for torch the CUDA its build tag names."""
    field = FIELDS.get(normalise(name))
    if field is None:
        return []
    facts = [Fact(field, version, file, line, text, rule, rank)]
    if field == "software.torch" and (cuda := _CUDA_TAG.search(version)):
        facts.append(Fact("software.cuda", f"{int(cuda.group(1))}.{cuda.group(2)}", file, line, text,
                          "torch's build tag", rank, stated=False))
    return facts


def read(lines: Iterable[tuple[int, str, bool]], file: str) -> list[Fact]:
    """Facts from a package list's lines ((number, text, cut), as textlines.lines gives them)."""
    facts: list[Fact] = []
    conda = file.endswith((".yml", ".yaml"))
    pins = specs = 0
    seen: set[str] = set()
    for number, raw, cut in lines:
        text = raw.strip()
        if cut or not text or text.startswith("#"):
            continue
        if conda:
            match = _CONDA.fullmatch(text) or _PIN.fullmatch(text.lstrip("- "))
            if match is None:
                continue
        elif (match := _PIN.fullmatch(text)) is None:
            specs += not text.startswith("-")  # `-e .`, `--index-url`: options, not requirements
            continue
        pins += 1
        name = normalise(match.group(1))
        seen.add(name)
        facts += version_facts(name, match.group(2), file, number, text, "conda environment" if conda else "pip pin", 1)
    if pins and not specs and not conda:
        for name in KERNEL_PACKAGES:
            if name not in seen:
                facts.append(Fact(FIELDS[name], None, file, None, f"{name} is not among its {pins} pinned distributions",
                                  "absent from a complete list", 1, stated=False))
    return facts
