"""No import circle in nomadtf/: every `import` and `from ... import` statement, at module
level or inside a function (a deferred import is still an arrow), read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name imported from a package that is
    one of its modules counts as that module)."""
    paths = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_nomadtf_has_no_import_circle():
    graph = import_graph(REPO, "nomadtf")
    assert "nomadtf.devstack.plugin_builder" in graph["nomadtf.devstack.gpu_plugin"]  # the graph is read
    assert cycles(graph) == []


def test_a_circle_through_a_deferred_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg.a import thing\n")
    assert cycles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b", "pkg.c"]]


# The layers of docs/design/layout.md, top to bottom: a package imports only from its own
# layer's packages' modules below it, never one above (siblings in a layer may share).
LAYERS = [
    {"nomadtf.cli"},
    {"nomadtf.client", "nomadtf.admission", "nomadtf.devstack", "nomadtf.runtime"},
    {"nomadtf.servers"},
    {"nomadtf.job", "nomadtf.usercode"},
]


def layer_of(module: str) -> int | None:
    for depth, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return depth
    return None  # the modules at the top of the package: shared by every layer


def test_no_import_goes_up_a_layer():
    graph = import_graph(REPO, "nomadtf")
    upward = sorted(
        (name, target) for name, targets in graph.items() for target in targets
        if layer_of(name) is not None and layer_of(target) is not None and layer_of(target) < layer_of(name)
    )
    assert upward == []
    # and the shared modules at the top import no layer at all
    shared = sorted((name, target) for name, targets in graph.items() if layer_of(name) is None and name not in ("nomadtf", "nomadtf.__main__")
                    for target in targets if layer_of(target) is not None and layer_of(target) < 3)
    assert shared == []
