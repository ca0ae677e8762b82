"""Facts -> fingerprint fields: one value per field, each with its citations, contradictions named.

Per field, the value of the best-ranked fact wins (a console line, what ran, beats a package list,
what was installed; a statement beats an inference at the same rank); every fact that says otherwise
is named in `contradictions`, so a reader sees that the run's own files disagree.

The linear-attention path per piece uses the names and values a live fingerprint records
(`numerics.linear_attention.functions.<fn>` = `torch`, `numerics.linear_attention_path` from
`linear_attn.path_of`), from:
1. what the console stated (transformers' fallback lines; for transformers 4's one line, the path
   `fallback`, as a live fingerprint of that transformers records it from `is_fast_path_available`);
2. else what a complete package list implies, where the code transformers runs decides by what is
   installed: transformers 5's kernel wrapper uses a package's kernel when it imports and the torch
   reference otherwise, so a kernel package absent from the training Python's freeze (and no `kernels`
   package, whose hub kernels could stand in) means that package's functions ran torch; transformers 4
   falls back whole when any of them is missing. A package that is present says nothing of what ran
   (fla imports without triton and still falls back): those pieces stay unknown.
A kernel package listed as installed while the console states its functions fell back is a
contradiction, resolved toward the console.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracker.environment import linear_attn
from tracker.environment.evidence import Fact
from tracker.environment.evidence.console import FUNCTION_FIELD, PATH_FIELD
from tracker.environment.evidence.packages import FIELDS
from tracker.untrusted.digits import whole_number

MAX_CITATIONS = 3  # per field: the first few that agree with the value kept
TOP_PATH_FIELD = "numerics.linear_attention_path"  # where the env.linear_attn tag reads it


@dataclass(frozen=True)
class Decision:
    known: dict[str, object]  # dotted field -> value, for fingerprint.imported
    evidence: dict[str, list[dict]]  # dotted field -> citations ({file, line, text, rule})
    contradictions: list[str]  # one line each: the field, what was kept, what disagreed


def _choose(field: str, group: list[Fact], contradictions: list[str]) -> Fact:
    chosen = min(group, key=lambda f: (f.rank, not f.stated))
    for other in group:
        if other.value != chosen.value and other.stated:
            contradictions.append(f"{field}: {chosen.value!r} ({chosen.where()}: {chosen.rule}) kept; "
                                  f"{other.where()} says {other.value!r} ({other.rule})")
            break
    return chosen


def _major(version: object) -> int | None:
    return whole_number(str(version or "").split(".")[0], 3)


def _absent(chosen: dict[str, Fact], package: str) -> Fact | None:
    fact = chosen.get(FIELDS[package])
    return fact if fact is not None and fact.value is None else None


def _inferred_functions(chosen: dict[str, Fact]) -> dict[str, Fact]:
    """Functions a complete package list implies ran torch (see the module's docstring)."""
    transformers = _major(chosen["software.transformers"].value) if "software.transformers" in chosen else None
    if transformers is None or _absent(chosen, "kernels") is None:
        return {}
    out = {}
    conv = _absent(chosen, "causal-conv1d")
    fla = _absent(chosen, "flash-linear-attention") and _absent(chosen, "fla-core")
    for name, (package, _) in linear_attn.KERNEL_SOURCES.items():
        missing = conv if package == "causal-conv1d" else fla
        if transformers < 5:
            missing = conv or fla
        if missing is not None:
            out[name] = Fact(FUNCTION_FIELD + name, "torch", missing.file, missing.line, missing.text,
                             f"transformers {transformers}.x without {package}: torch reference", 1, stated=False)
    return out


def decide(facts: list[Fact]) -> Decision:
    groups: dict[str, list[Fact]] = {}
    for fact in facts:
        groups.setdefault(fact.field, []).append(fact)
    contradictions: list[str] = []
    chosen = {field: _choose(field, group, contradictions) for field, group in groups.items()}
    evidence = {field: [f.cite() for f in groups[field] if f.value == fact.value][:MAX_CITATIONS]
                for field, fact in chosen.items()}

    functions = {field.removeprefix(FUNCTION_FIELD): fact for field, fact in chosen.items()
                 if field.startswith(FUNCTION_FIELD)}
    for name, fact in _inferred_functions(chosen).items():
        if name not in functions:
            functions[name] = fact
            evidence[fact.field] = [fact.cite()]
    for package in sorted({linear_attn.KERNEL_SOURCES[name][0] for name in functions}):
        listed = chosen.get(FIELDS[package])
        ran = [(n, f) for n, f in functions.items() if linear_attn.KERNEL_SOURCES[n][0] == package and f.stated]
        if ran and ran[0][1].rank == 0 and listed is not None and listed.value is not None:
            contradictions.append(f"{package} {listed.value} is installed ({listed.where()}), yet {ran[0][1].where()} "
                                  f"states `{ran[0][0]}` ran the torch reference: its kernel did not load there "
                                  "(what ran is kept)")

    known = {field: fact.value for field, fact in chosen.items()
             if not field.startswith(FUNCTION_FIELD) and field != PATH_FIELD and fact.value is not None}
    stated_path = chosen.get(PATH_FIELD)
    if functions or stated_path is not None:
        values = {name: str(fact.value) for name, fact in functions.items()}
        complete = all(name in values for name in linear_attn.LINEAR_ATTN_FUNCTIONS)
        path = linear_attn.path_of(values) if complete else stated_path.value if stated_path else None
        how = "stated" if all(f.rank == 0 for f in functions.values()) else "inferred"
        record = {"functions": values, "linear_attention_path": path, "evidence_kind": how,
                  "reason": "read from the run's own files"
                            + ("" if path is not None else "; pieces no file states leave the path unknown")}
        if values:
            record["summary"] = linear_attn.summary(values)
        known["numerics.linear_attention"] = record
        if path is not None:
            known[TOP_PATH_FIELD] = path
            cites = [f.cite() for f in sorted(functions.values(), key=lambda f: not f.stated)][:MAX_CITATIONS]
            cites = cites or evidence.get(PATH_FIELD, [])
            evidence[PATH_FIELD] = cites
    return Decision(known, evidence, contradictions)
