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


# What the environment and measurement rooms may read of the project besides themselves.
_CORE = ("tracker.errors", "tracker.config", "tracker.redact", "tracker.untrusted", "tracker.store.names")
_ENVIRONMENT_READS = (*_CORE, "tracker.environment", "tracker.store.checkpoints")
_MEASUREMENT_READS = (*_CORE, "tracker.environment", "tracker.measurement")

# (rule name, who it applies to, what it may not import, why)
RULES = [
    ("pages render only", lambda m: _under(m, "pages"),
     lambda t: _under(t, *PACKAGES) and not _under(t, "tracker.dashboard"),
     "pages only render; every read of the store, queue or config goes through tracker.dashboard"),
    ("app.py is the router", lambda m: m == "app",
     lambda t: _under(t, *PACKAGES) and not _under(t, "tracker.dashboard"),
     "the entry point wires pages to tracker.dashboard's shared setup, nothing else"),
    ("only the CLI runs evals and builds the demo", lambda m: _under(m, "tracker") and not _under(m, "tracker.cli"),
     lambda t: _under(t, "evaluators", "demo"),
     "tracker/ is the store, the jobs and the dashboard: they run evals through `draftboard eval` processes"),
    ("the harness knows no UI or queue", lambda m: _under(m, "evaluators"),
     lambda t: _under(t, "tracker.dashboard", "tracker.jobs", "streamlit"),
     "an eval must run on a GPU box with neither the dashboard nor the job queue installed"),
    ("the job system knows no UI", lambda m: _under(m, "tracker.jobs"),
     lambda t: _under(t, "tracker.dashboard", "streamlit"),
     "workers run headless; the dashboard submits jobs, never the other way round"),
    ("the environment is what ran, nothing more", lambda m: _under(m, "tracker.environment"),
     lambda t: _under(t, *PACKAGES, "streamlit", "mlflow") and not _under(t, *_ENVIRONMENT_READS),
     "a fingerprint is captured on a training box with nothing but the tracker's core: it reads no store, queue, "
     "dashboard or measurement, and only names and checkpoint digests from tracker.store"),
    ("measurement is pure", lambda m: _under(m, "tracker.measurement"),
     lambda t: _under(t, *PACKAGES, "streamlit", "mlflow") and not _under(t, *_MEASUREMENT_READS),
     "protocol, uncertainty, reconcile, regression and engine metric names are shared by the harness, the CLI and "
     "the dashboard: they read the environment and names, never a store, queue or UI"),
    ("untrusted text is handled at the bottom", lambda m: _under(m, "tracker.untrusted"),
     lambda t: _under(t, *PACKAGES) and not _under(t, "tracker.errors", "tracker.config", "tracker.untrusted"),
     "reading, fetching and escaping outside text is used by every room, so it depends on none"),
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


MAX_LINES = 700
SHELL_MAX = 9  # tracker/*.py at the top level, __init__ included


def long_modules(root: Path) -> list[str]:
    """Modules of tracker/, evaluators/ and demo/ over MAX_LINES: past the size one reads whole."""
    return [f"{p.relative_to(root)}: {n} lines" for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]


def shell_problems(root: Path) -> list[str]:
    """tracker/'s top level is the shell: at most SHELL_MAX modules, each named in the shell row of
    docs/ARCHITECTURE.md (the row whose first cell is `tracker/` (the shell))."""
    modules = sorted(p.name for p in (root / "tracker").glob("*.py"))
    rows = [line for line in (root / "docs" / "ARCHITECTURE.md").read_text().splitlines()
            if line.startswith("| `tracker/` (the shell)")]
    problems = [f"tracker/ holds {len(modules)} top-level modules (at most {SHELL_MAX}): {', '.join(modules)}"
                ] if len(modules) > SHELL_MAX else []
    if len(rows) != 1:
        return [*problems, "docs/ARCHITECTURE.md has no single `tracker/` (the shell) row"]
    return [*problems, *(f"tracker/{m} is not named in ARCHITECTURE.md's shell row" for m in modules
                         if f"`{m}`" not in rows[0])]


def test_no_module_is_over_700_lines():
    assert long_modules(ROOT) == []


def test_trackers_top_level_is_the_shell():
    assert shell_problems(ROOT) == []


def test_the_size_and_shell_checks_catch_what_they_guard(tmp_path):
    root = _tree(tmp_path, {"evaluators/big.py": "x = 1\n" * (MAX_LINES + 1), "evaluators/fine.py": "x = 1\n" * MAX_LINES,
                            "docs/ARCHITECTURE.md": "| `tracker/` (the shell) | `__init__.py`, `cli.py` |\n",
                            **{f"tracker/m{i}.py": "" for i in range(SHELL_MAX)}})
    assert long_modules(root) == [f"evaluators/big.py: {MAX_LINES + 1} lines"]
    found = shell_problems(root)
    assert found[0].startswith(f"tracker/ holds {SHELL_MAX + 1} top-level modules")
    assert "tracker/m0.py is not named in ARCHITECTURE.md's shell row" in found
    assert not any("__init__.py" in line and "not named" in line for line in found)


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
    ("tracker/environment/fingerprint.py", "from tracker.store import tracker\n", "the environment is what ran"),
    ("tracker/environment/fingerprint.py", "def f():\n    from tracker.measurement import protocol\n",
     "the environment is what ran"),
    ("tracker/measurement/protocol.py", "from tracker.jobs import queue\n", "measurement is pure"),
    ("tracker/measurement/protocol.py", "import mlflow\n", "measurement is pure"),
    ("tracker/untrusted/escape.py", "from tracker.store import names\n", "untrusted text is handled at the bottom"),
])
def test_the_checker_catches_a_forbidden_import(tmp_path, rel, text, rule):
    root = _tree(tmp_path, {
        "tracker/jobs/queue.py": "", "tracker/dashboard/ui.py": "", "evaluators/harness.py": "",
        "tracker/store/__init__.py": "", "tracker/store/runs.py": "", "tracker/jobs/worker.py": "",
        "tracker/store/tracker.py": "", "tracker/store/names.py": "", "tracker/measurement/__init__.py": "",
        "tracker/measurement/protocol.py": "", "tracker/environment/__init__.py": "",
        "tracker/environment/fingerprint.py": "", "tracker/untrusted/__init__.py": "", "tracker/untrusted/escape.py": "",
        rel: text,
    })
    found = violations(root)
    assert found and any(rule in line for line in found)
    assert all(line.startswith(module_name(root / rel, root) + ":") for line in found)


def test_the_checker_catches_a_cycle(tmp_path):
    root = _tree(tmp_path, {"tracker/cli.py": "def f():\n    from tracker.jobs import worker\n",
                            "tracker/jobs/worker.py": "from tracker.cli import build_parser\n"})
    assert cycles(root) == [["tracker.cli", "tracker.jobs.worker"]]
