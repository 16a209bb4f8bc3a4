"""No import loop between the service's packages (issue 39).

The units are the service's subpackages (`service/store/`, `service/conversations/`, …, each with all its
modules) and its top-level modules (`service/commands.py`, …). An edge A -> B is any `import` in A of
something in B, wherever it stands (a function-level or `TYPE_CHECKING` import is a dependency too: it is
how a loop hides). The graph is read from the source with `ast`, so nothing is imported to build it.

The loops that were there when this test came are listed in KNOWN_LOOPS, each to be broken by its own step;
a loop may only shrink: one that grows, or a new one, fails, and one that is gone must leave the list.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[1] / "service"

# Loops still there, and which step of issue 39 (or later work) breaks them. Never add one here.
KNOWN_LOOPS: list[frozenset[str]] = [
]


def _unit(module: str) -> str | None:
    """The unit a `service…` module belongs to: its subpackage, or itself at the top level."""
    parts = module.split(".")
    if parts[0] != "service":
        return None
    if len(parts) == 1:
        return "service"
    return f"service.{parts[1]}"


def _module_name(path: Path) -> str:
    relative = path.relative_to(SERVICE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules one import statement names (`service.X` for `from service import X`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []  # relative imports stay inside their package
    if node.module == "service":
        return [f"service.{alias.name}" for alias in node.names]
    return [node.module]


def import_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> {imported unit: ["path:line" of each import that makes the edge]}."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(SERVICE.rglob("*.py")):
        source = _unit(_module_name(path))
        assert source is not None
        edges = graph.setdefault(source, defaultdict(list))  # a unit that imports nothing is a node too
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for module in _imported(node):
                    target = _unit(module)
                    if target is not None and target not in (source, "service"):
                        edges[target].append(f"{path.relative_to(SERVICE.parent)}:{node.lineno}")
    return graph


def strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[frozenset[str]]:
    """Tarjan's components with more than one unit: the import loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[frozenset[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        on_stack.add(unit)
        for target in graph.get(unit, {}):
            if target not in index:
                visit(target)
                low[unit] = min(low[unit], low[target])
            elif target in on_stack:
                low[unit] = min(low[unit], index[target])
        if low[unit] == index[unit]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == unit:
                    break
            if len(component) > 1:
                loops.append(frozenset(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return loops


def _describe(loop: frozenset[str], graph: dict[str, dict[str, list[str]]]) -> str:
    edges = [
        f"  {source} -> {target} ({', '.join(graph[source][target][:3])})"
        for source in sorted(loop)
        for target in sorted(graph[source])
        if target in loop
    ]
    return "\n".join([", ".join(sorted(loop)), *edges])


def test_the_packages_import_each_other_one_way_only() -> None:
    graph = import_graph()
    loops = strongly_connected(graph)
    new = [loop for loop in loops if not any(loop <= known for known in KNOWN_LOOPS)]
    assert not new, "import loops between packages:\n" + "\n".join(_describe(loop, graph) for loop in new)
    gone = [known for known in KNOWN_LOOPS if not any(loop & known for loop in loops)]
    assert not gone, f"these loops are broken: remove them from KNOWN_LOOPS: {[sorted(k) for k in gone]}"


def test_the_store_does_not_import_conversations() -> None:
    """The loop this test came with (issue 39): conversations use the store, never the reverse."""
    graph = import_graph()
    assert "service.store" in graph["service.conversations"]
    assert "service.conversations" not in graph["service.store"], graph["service.store"]["service.conversations"]


def test_the_loop_finder_finds_a_loop_and_its_edges() -> None:
    """The check itself: a small graph with one loop of three and a one-way edge."""
    graph: dict[str, dict[str, list[str]]] = {
        "a": {"b": ["a.py:1"]},
        "b": {"c": ["b.py:2"]},
        "c": {"a": ["c.py:3"], "d": ["c.py:4"]},
        "d": {},
    }
    assert strongly_connected(graph) == [frozenset({"a", "b", "c"})]
    assert "c -> a (c.py:3)" in _describe(frozenset({"a", "b", "c"}), graph)
    del graph["c"]["a"]
    assert strongly_connected(graph) == []
