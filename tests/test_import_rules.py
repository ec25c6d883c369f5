"""Which package of ovbuild may import which, and which part of the runtime which other part (docs/architecture.md
says why), and no import cycle among its modules.

Imports are read from the source (module level and inside functions alike: a lazy import is a dependency too). Imports
under `if TYPE_CHECKING:` are annotations only and run nothing, so the rules leave them out; the cycle check counts
them: an annotation still ties two modules together, and a circle hidden behind one is a circle all the same."""

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
    "targets": {"errors", "ir", "weights", "graph", "testing", "families"},  # families: the one family lookup
    "export": {"version", "errors", "signals", "ir", "weights", "graph", "families", "targets"},
    "testing": {"errors", "ir", "weights", "reference", "runtime"},
    "llm": {"errors", "runtime", "processor"},  # processor: images=[paths] are processed before the runtime
    # signals: the Ray CLI restores its SIGTERM handling; version: GET /version
    # llm, processor: chat images go through the same ImagePrompter as LLM.generate(images=...)
    "serve": {"version", "errors", "signals", "ir", "runtime", "llm", "processor"},
    "processor": {"errors"},  # no OpenVINO: ovbuild.ir would bring it in, so it reads its JSON files itself
}
TOP = {"ovbuild", "cli", "commands", "demo"}

# part of the runtime (a subpackage, or "runtime" for the modules directly in it) -> the other parts it may import.
# The layers point one way: caches and decoding know nothing above them, the compiled model sits on the caches,
# speculation on the model, and the requests, the scheduler and the pipeline on top of everything.
RUNTIME_ALLOWED: dict[str, set[str]] = {
    "runtime.cache": set(),
    "runtime.decode": set(),
    "runtime.model": {"runtime.cache"},
    "runtime.speculation": {"runtime.cache", "runtime.decode", "runtime.model"},
    "runtime.structured": {"runtime.decode", "runtime.speculation"},
    "runtime.vision": {"runtime.model"},  # the device check; nothing of the requests or the scheduler
    "runtime": {
        "runtime.cache",
        "runtime.decode",
        "runtime.model",
        "runtime.speculation",
        "runtime.structured",
        "runtime.vision",
    },
}


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


def imports_of(source: str, modules: set[str], annotations: bool = False) -> set[str]:
    """The ovbuild modules a module's source imports: `from a.b import c` is a.b.c where that is a module.
    annotations: count the imports under `if TYPE_CHECKING:` too."""
    tree = ast.parse(source)
    guarded = set() if annotations else type_checking_only(tree)
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


def module_graph(root: Path = PACKAGE, annotations: bool = False) -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports (annotations: with TYPE_CHECKING's)."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {name: imports_of(path.read_text(encoding="utf-8"), set(paths), annotations) for name, path in paths.items()}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ovbuild"


def runtime_part(module: str) -> str | None:
    """The part of the runtime a module belongs to ("runtime.cache", ..., or "runtime"); None outside the runtime."""
    parts = module.split(".")
    if package_of(module) != "runtime":
        return None
    if len(parts) > 3 and f"runtime.{parts[2]}" in RUNTIME_ALLOWED:
        return f"runtime.{parts[2]}"
    return "runtime"


def runtime_violations(graph: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for every import between parts of the runtime that RUNTIME_ALLOWED forbids."""
    bad = []
    for module, imported in sorted(graph.items()):
        mine = runtime_part(module)
        if mine is None:
            continue
        for other in sorted(imported):
            theirs = runtime_part(other)
            if theirs is not None and theirs != mine and theirs not in RUNTIME_ALLOWED[mine]:
                bad.append(f"{module} -> {other}")
    return bad


def collapsed(graph: dict[str, set[str]], part) -> dict[str, set[str]]:
    """The graph between parts (`part(module)`, None = left out): an edge wherever one of a part's modules imports
    another part's."""
    parts: dict[str, set[str]] = {}
    for module, imported in graph.items():
        mine = part(module)
        if mine is not None:
            theirs = {part(m) for m in imported} - {mine, None}
            parts.setdefault(mine, set()).update(theirs)
    return parts


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


def test_every_part_of_the_runtime_imports_only_what_it_may():
    assert runtime_violations(module_graph()) == []


def test_no_import_cycle_among_the_modules():
    """Annotation-only imports included: a circle behind `if TYPE_CHECKING:` is a circle too."""
    assert cycles(module_graph(annotations=True)) == []


def test_no_import_cycle_among_the_packages_or_the_parts_of_the_runtime():
    """Neither in the imports as they are nor in the rule tables themselves (which must point one way)."""
    graph = module_graph(annotations=True)
    assert cycles(collapsed(graph, package_of)) == []
    assert cycles(collapsed(graph, runtime_part)) == []
    assert cycles(ALLOWED) == []
    assert cycles(RUNTIME_ALLOWED) == []


def test_the_runtime_imports_no_builder_export_testing_or_reference():
    """The rule above, spelled out for the runtime: it reads IRs through ovbuild.ir and nothing built them."""
    graph = module_graph()
    reached = {m for module, imported in graph.items() if package_of(module) == "runtime" for m in imported}
    assert {package_of(m) for m in reached} <= {"runtime", "ir", "errors", "signals"}


def test_the_checks_catch_planted_violations(tmp_path):
    """A synthetic package with a runtime module importing a graph builder, a TYPE_CHECKING import (allowed), a cycle
    between two weights modules, the cache importing the model (a part of the runtime above it), a circle inside one
    part of the runtime through a lazy import, and one hidden behind TYPE_CHECKING."""
    root = tmp_path / "ovbuild"
    files = {
        "__init__.py": "",
        "graph/__init__.py": "",
        "graph/target.py": "",
        "runtime/__init__.py": "",
        "runtime/request.py": "from ovbuild.runtime.cache.prefix import chain_hashes\n",
        "runtime/cache/__init__.py": "",
        "runtime/cache/blocks.py": "from ovbuild.runtime.model import executors\n",
        "runtime/cache/prefix.py": "import typing\nif typing.TYPE_CHECKING:\n    from ovbuild.runtime import request\n",
        "runtime/decode/__init__.py": "",
        "runtime/decode/sampling.py": "def f():\n    from ovbuild.runtime.decode.verify import g\n",
        "runtime/decode/verify.py": "from ovbuild.runtime.decode import sampling\n",
        "runtime/model/__init__.py": "",
        "runtime/model/executors.py": "",
        "runtime/model/paged_model.py": "def f():\n    from ovbuild.graph.target import build\n",
        "runtime/typed.py": "import typing\nif typing.TYPE_CHECKING:\n    from ovbuild.graph import target\n",
        "weights/__init__.py": "",
        "weights/target.py": "from ovbuild.weights import hybrid\n",
        "weights/hybrid.py": "from ovbuild.weights.target import TargetConfig\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = module_graph(root)
    assert rule_violations(graph) == ["ovbuild.runtime.model.paged_model -> ovbuild.graph.target"]
    assert runtime_violations(graph) == ["ovbuild.runtime.cache.blocks -> ovbuild.runtime.model.executors"]
    assert cycles(graph) == [
        ["ovbuild.runtime.decode.sampling", "ovbuild.runtime.decode.verify"],
        ["ovbuild.weights.hybrid", "ovbuild.weights.target"],
    ]
    assert cycles(module_graph(root, annotations=True)) == [
        ["ovbuild.runtime.cache.prefix", "ovbuild.runtime.request"],
        ["ovbuild.runtime.decode.sampling", "ovbuild.runtime.decode.verify"],
        ["ovbuild.weights.hybrid", "ovbuild.weights.target"],
    ]
    assert cycles(collapsed(module_graph(root, annotations=True), runtime_part)) == [
        ["runtime", "runtime.cache"],
    ]
