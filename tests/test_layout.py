"""The boundaries between draftboard's rooms (docs/ARCHITECTURE.md), checked on the source.

Every import of a project module is read from the syntax tree, function-level imports included
(a lazy import is still a dependency), and each rule below says why it exists. The checker runs on
the real tree, and once on a small synthetic tree to show that it does catch a forbidden import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tracker", "evaluators", "demo")


@dataclass(frozen=True)
class Import:
    source: str  # importing module, e.g. "pages.runs" or "tracker.jobs.worker"
    target: str  # imported project module, resolved to a file that exists
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_files(root: Path) -> list[Path]:
    files = [p for pkg in (*PACKAGES, "pages") for p in sorted((root / pkg).rglob("*.py"))]
    files = [p for p in files if "migrations" not in p.parts]  # alembic revisions run standalone
    return files + [root / "app.py"]


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of a dotted name that is a project module."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def imports(root: Path) -> list[Import]:
    files = source_files(root)
    modules = {module_name(p, root) for p in files}
    found = []
    for path in files:
        source = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from tracker.store import names` imports the submodule when there is one.
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                top = name.split(".")[0]
                target = _resolve(name, modules) if top in (*PACKAGES, "pages") else name
                if target and target != source:
                    found.append(Import(source, target, node.lineno))
    return found


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# (rule name, who it applies to, what it may not import, why)
RULES = [
    ("pages render only", lambda m: _under(m, "pages"),
     lambda t: _under(t, *PACKAGES) and not _under(t, "tracker.dashboard"),
     "pages only render; every read of the store, queue or config goes through tracker.dashboard"),
    ("app.py is the router", lambda m: m == "app",
     lambda t: _under(t, *PACKAGES) and not _under(t, "tracker.dashboard"),
     "the entry point wires pages to tracker.dashboard's shared setup, nothing else"),
    ("only the CLI runs evals and builds the demo", lambda m: _under(m, "tracker") and m != "tracker.cli",
     lambda t: _under(t, "evaluators", "demo"),
     "tracker/ is the store, the jobs and the dashboard: they run evals through `draftboard eval` processes"),
    ("the harness knows no UI or queue", lambda m: _under(m, "evaluators"),
     lambda t: _under(t, "tracker.dashboard", "tracker.jobs", "streamlit"),
     "an eval must run on a GPU box with neither the dashboard nor the job queue installed"),
    ("the job system knows no UI", lambda m: _under(m, "tracker.jobs"),
     lambda t: _under(t, "tracker.dashboard", "streamlit"),
     "workers run headless; the dashboard submits jobs, never the other way round"),
    ("one module talks to Streamlit", lambda m: m not in ("tracker.dashboard.ui", "tracker.serve", "app")
     and not _under(m, "pages"),
     lambda t: _under(t, "streamlit"),
     "dashboard logic stays testable without a Streamlit runtime: tracker.dashboard.ui holds every st call "
     "shared by pages, tracker.serve only starts the server"),
]


def violations(root: Path) -> list[str]:
    found = []
    for imp in imports(root):
        for name, applies, forbidden, why in RULES:
            if applies(imp.source) and forbidden(imp.target):
                found.append(f"{imp.source}:{imp.line} imports {imp.target} ({name}: {why})")
    return found


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in imports(root):
        if _under(imp.target, *PACKAGES, "pages"):
            graph.setdefault(imp.source, set()).add(imp.target)
    # A package's __init__ is imported with each of its submodules; an edge from a package to
    # its own submodules (lazy re-exports) is not a cycle between rooms.
    for src, targets in graph.items():
        graph[src] = {t for t in targets if not t.startswith(src + ".")}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_crosses_a_boundary():
    assert violations(ROOT) == []


def test_no_import_cycles():
    assert cycles(ROOT) == []


def test_fixed_names_stay_importable():
    # docs/DESIGN.md "Python API (fixed names)".
    from evaluators.ddtree import ddtree_acceptance  # noqa: F401
    from tracker import Tracker, fingerprint

    assert callable(fingerprint.capture) and callable(fingerprint.diff)
    assert hasattr(Tracker, "training_run")


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel in ("tracker/__init__.py", "tracker/dashboard/__init__.py", "tracker/jobs/__init__.py",
                "evaluators/__init__.py", "demo/__init__.py", "app.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).touch()
    (tmp_path / "pages").mkdir(exist_ok=True)
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("rel, text, rule", [
    ("pages/runs.py", "from tracker.jobs.queue import JobQueue\n", "pages render only"),
    ("evaluators/harness.py", "def f():\n    import streamlit as st\n", "the harness knows no UI or queue"),
    ("tracker/jobs/worker.py", "from tracker.dashboard import ui\n", "the job system knows no UI"),
    ("tracker/store/runs.py", "from evaluators import harness\n", "only the CLI runs evals"),
])
def test_the_checker_catches_a_forbidden_import(tmp_path, rel, text, rule):
    root = _tree(tmp_path, {
        "tracker/jobs/queue.py": "", "tracker/dashboard/ui.py": "", "evaluators/harness.py": "",
        "tracker/store/__init__.py": "", "tracker/store/runs.py": "", "tracker/jobs/worker.py": "",
        rel: text,
    })
    found = violations(root)
    assert found and any(rule in line for line in found)
    assert all(line.startswith(module_name(root / rel, root) + ":") for line in found)


def test_the_checker_catches_a_cycle(tmp_path):
    root = _tree(tmp_path, {"tracker/cli.py": "def f():\n    from tracker.jobs import worker\n",
                            "tracker/jobs/worker.py": "from tracker.cli import build_parser\n"})
    assert cycles(root) == [["tracker.cli", "tracker.jobs.worker"]]
