"""Every benchmark keeps the contract docs/DESIGN.md fixes for its last line: one JSON object with
exactly `benchmark`, `ratios`, `targets` and `ok` (absolute seconds go in the lines above it)."""

import ast
from pathlib import Path

import pytest

BENCHMARKS = sorted(p for p in (Path(__file__).resolve().parent.parent / "benchmarks").rglob("*.py")
                    if not p.name.startswith("_"))


def _result_lines(path: Path) -> list[set[str]]:
    """The keys of each `json.dumps({"benchmark": ...})` the script prints."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dumps"
                and node.args and isinstance(node.args[0], ast.Dict)):
            keys = {k.value for k in node.args[0].keys if isinstance(k, ast.Constant)}
            if "benchmark" in keys:
                found.append(keys | {"**" for k in node.args[0].keys if k is None})
    return found


def _runs_another(path: Path) -> bool:
    """The script is another benchmark's `main` with other arguments (gpu/engine_hybrid.py)."""
    return any(isinstance(n, ast.ImportFrom) and any(a.name == "main" for a in n.names)
               and (path.parent.parent / f"{n.module}.py").is_file() for n in ast.walk(ast.parse(path.read_text())))


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: str(p.relative_to(p.parent.parent)))
def test_the_last_line_is_ratios_targets_ok(path):
    lines = _result_lines(path)
    assert lines or _runs_another(path), f"{path.name} prints no {{\"benchmark\": ...}} line"
    for keys in lines:
        assert keys == {"benchmark", "ratios", "targets", "ok"}, (path.name, sorted(keys))
