"""The rooms of autom/, read from the source with ``ast`` (nothing is imported or run).

- psycopg only inside ``autom/db/``: every other room gets autom's errors and the
  bridge's types (``autom.db.bridge`` translates psycopg's errors into ``QueryError``
  and ``DatabaseUnavailable``).
- The import graph of ``autom/`` has no cycle. Every import counts as an edge,
  also one inside a function (a lazy import is still a dependency), except those
  under ``if TYPE_CHECKING:``: they are annotations only and never run, so they are
  not edges. ``from autom.x import y`` is an edge to ``autom.x.y`` when that is a
  module, else to ``autom.x``; importing ``autom.x.y`` is not an edge to the package
  ``autom.x`` (Python runs its ``__init__`` first, but that is not a dependency the
  code chose).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autom"


def module_name(path: Path) -> str:
    """``autom/db/bridge.py`` → ``autom.db.bridge``; a package's ``__init__.py`` → the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of autom/, by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` that can run: all but those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the else branch runs
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_names(name: str, path: Path) -> Iterator[str]:
    """The dotted names module ``name`` imports at run time (absolute, relative ones resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module → the autom modules it imports at run time."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges = set()
        for target in imported_names(name, path):
            if target in known and target != name:
                edges.add(target)
        graph[name] = edges
    # ``from autom.x import y`` yields both autom.x and autom.x.y: keep only the module when y is one
    for name, path in known.items():
        for node in runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                if all(n in known for n in names) and node.module in graph[name]:
                    graph[name].discard(node.module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_psycopg_is_imported_only_inside_autom_db() -> None:
    offenders = []
    for name, path in modules().items():
        if name == "autom.db" or name.startswith("autom.db."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):  # TYPE_CHECKING imports included: the rooms above use the bridge's types
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {t}"
                          for t in targets if t.split(".")[0] == "psycopg"]
    assert offenders == []


def test_the_import_graph_of_autom_has_no_cycle() -> None:
    graph = import_graph()
    assert "autom.db.bridge" in graph["autom.events.batcher"]  # the walk sees imports at all
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("graph", "has_cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
        ({"a": {"b"}, "b": {"a"}}, True),
        ({"a": {"b", "c"}, "b": {"c"}, "c": {"a"}}, True),
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, False),  # a diamond is no cycle
    ],
)
def test_find_cycle(graph: dict[str, set[str]], has_cycle: bool) -> None:
    assert (find_cycle(graph) is not None) is has_cycle


def test_imports_under_type_checking_are_not_edges() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import autom.a\n"
        "if TYPE_CHECKING:\n    import autom.b\nelse:\n    import autom.c\n"
        "def f():\n    import autom.d\n"
    )
    names = sorted(alias.name for node in runtime_imports(tree) for alias in node.names)
    assert names == ["TYPE_CHECKING", "autom.a", "autom.c", "autom.d"]
