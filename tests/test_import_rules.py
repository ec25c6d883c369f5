"""Which package of ovbuild may import which (docs/architecture.md says why), and no import cycle among its modules.

Imports are read from the source (module level and inside functions alike: a lazy import is a dependency too); imports
under `if TYPE_CHECKING:` are annotations only and run nothing, so they are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import ovbuild

PACKAGE = Path(ovbuild.__file__).parent

# package (first part of the module path under ovbuild) -> what it may import besides itself. The top (ovbuild's
# __init__, which imports LLM on first use, cli, commands, demo) may import anything.
ALLOWED: dict[str, set[str]] = {
    "version": set(),
    "errors": set(),
    "signals": {"errors"},
    "ir": {"version", "errors"},
    "weights": {"errors", "ir"},
    "graph": {"errors", "ir", "weights"},
    "reference": {"errors", "weights"},
    "runtime": {"errors", "signals", "ir"},
    "families": {"errors", "ir", "weights", "graph", "testing"},
    "targets": {"errors", "ir", "weights", "graph", "testing"},
    "export": {"version", "errors", "signals", "ir", "weights", "graph", "families", "targets"},
    "testing": {"errors", "ir", "weights", "reference", "runtime"},
    "llm": {"errors", "runtime"},
    # signals: the Ray CLI restores its SIGTERM handling; version: GET /version
    "serve": {"version", "errors", "signals", "ir", "runtime"},
}
TOP = {"ovbuild", "cli", "commands", "demo"}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            guarded |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return guarded


def imports_of(source: str, modules: set[str]) -> set[str]:
    """The ovbuild modules a module's source imports: `from a.b import c` is a.b.c where that is a module."""
    tree = ast.parse(source)
    guarded = type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ovbuild"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ovbuild":
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs if subs and len(subs) == len(node.names) else subs | {node.module}
    return found


def module_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {name: imports_of(path.read_text(encoding="utf-8"), set(paths)) for name, path in paths.items()}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ovbuild"


def rule_violations(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for every import the package rules forbid."""
    bad = []
    for module, imported in sorted(graph.items()):
        mine = package_of(module)
        if mine in TOP:
            continue
        allowed = ALLOWED.get(mine)
        for other in sorted(imported):
            theirs = package_of(other)
            if theirs != mine and (allowed is None or theirs not in allowed):
                bad.append(f"{module} -> {other}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), by Tarjan."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_package_imports_only_what_it_may():
    assert rule_violations(module_graph()) == []


def test_no_import_cycle_among_the_modules():
    assert cycles(module_graph()) == []


def test_the_runtime_imports_no_builder_export_testing_or_reference():
    """The rule above, spelled out for the runtime: it reads IRs through ovbuild.ir and nothing built them."""
    graph = module_graph()
    reached = {m for module, imported in graph.items() if package_of(module) == "runtime" for m in imported}
    assert {package_of(m) for m in reached} <= {"runtime", "ir", "errors", "signals"}


def test_the_checks_catch_planted_violations(tmp_path):
    """A synthetic package with a runtime module importing a graph builder, a TYPE_CHECKING import (allowed), and a
    cycle between two weights modules."""
    root = tmp_path / "ovbuild"
    files = {
        "__init__.py": "",
        "graph/__init__.py": "",
        "graph/target.py": "",
        "runtime/__init__.py": "",
        "runtime/paged_model.py": "def f():\n    from ovbuild.graph.target import build\n",
        "runtime/typed.py": "import typing\nif typing.TYPE_CHECKING:\n    from ovbuild.graph import target\n",
        "weights/__init__.py": "",
        "weights/target.py": "from ovbuild.weights import hybrid\n",
        "weights/hybrid.py": "from ovbuild.weights.target import TargetConfig\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = module_graph(root)
    assert rule_violations(graph) == ["ovbuild.runtime.paged_model -> ovbuild.graph.target"]
    assert cycles(graph) == [["ovbuild.weights.hybrid", "ovbuild.weights.target"]]
