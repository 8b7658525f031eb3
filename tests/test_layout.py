"""The package's shape: no import cycle, the layers point one way, a small top level.

The import graph is read from the source with ``ast`` (every ``import`` and ``from ... import``, also those
inside functions), so nothing is executed. Layers: ``cli`` on top; ``families`` (one folder per benchmark
family) may import the core; the core (``run``, ``data``, ``scoring``, ``backends``, ``decoding``,
``mitigations``, ``judges``, ``labelers``, ``radiology``, ``report``, ``publish``) never imports a family: a
family that needs its own protocol declares it in its dataset unit and the runner finds it by name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "medheval"
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "errors.py", "versions.py"}  # __main__: `python -m medheval`
ABOVE_FAMILIES = {"cli", "families"}  # the only sub-packages that may import medheval.families


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The medheval module an imported dotted name lands in (its longest known prefix)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the medheval modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target.split(".")[0] != "medheval":
                    continue
                found = _resolve(target, modules)
                if found and found != name:
                    graph[name].add(found)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_core_imports_no_family():
    bad = sorted(f"{module} imports {target}" for module, targets in import_graph().items() for target in targets
                 if target.startswith("medheval.families")
                 and module.split(".")[1:2] not in ([layer] for layer in ABOVE_FAMILIES))
    assert not bad, "the core must not import a family (declare a protocol in the dataset unit instead): " + "; ".join(bad)


def test_a_small_top_level():
    files = {path.name for path in PACKAGE.glob("*.py")}
    assert files == TOP_LEVEL_MODULES
    families = {path.name for path in (PACKAGE / "families").iterdir() if (path / "__init__.py").is_file()}
    assert families == {"medheval", "med_hallmark", "clinhallu", "stepbench"}


def test_the_checks_see_a_cycle_and_a_layer_break(tmp_path, monkeypatch):
    """The graph reader finds what it must find: a two-module cycle, relative imports, imports in functions."""
    package = tmp_path / "medheval"
    (package / "run").mkdir(parents=True)
    (package / "families").mkdir()
    (package / "__init__.py").write_text("")
    (package / "run" / "__init__.py").write_text("")
    (package / "families" / "__init__.py").write_text("")
    (package / "run" / "a.py").write_text("from . import b\n")
    (package / "run" / "b.py").write_text("def f():\n    from medheval.run.a import x\n    import medheval.families.x\n")
    (package / "families" / "x.py").write_text("from medheval.run import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    graph = import_graph()
    assert graph["medheval.run.a"] == {"medheval.run.b"}
    assert graph["medheval.run.b"] == {"medheval.run.a", "medheval.families.x"}
    assert _cycles(graph) == [["medheval.families.x", "medheval.run.a", "medheval.run.b"]]
    with pytest.raises(AssertionError, match="medheval.run.b imports medheval.families.x"):
        test_the_core_imports_no_family()
