"""The shape of the code: no import circle among the project's modules, and the rooms
(folders) import each other only along the edges that ``ROOM_EDGES`` lists.

A circle means neither module can be read, tested or changed without the other, and its
import order decides whether it works at all. The walk reads the source (nothing is
imported): every import counts, at module level or inside a function, relative ones
resolved; only ``if TYPE_CHECKING:`` blocks are left out, since they never run.
Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so those count too,
except the importer's own packages: they were imported before it ran, so importing them
again does nothing.

``modules_over`` lists the modules over a line budget, for a test of module size.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as (pyproject.toml's package-dir).
FOLDERS = {
    "bftrainer": "bftrainer",
    "milp": "bftrainer.milp",
    "idle_monitor": "bftrainer.idle_monitor",
    "trainers": "bftrainer.trainers",
}
MAX_MODULE_LINES = 600

# Room -> the rooms its modules may import. A room is a package folder under bftrainer/
# (bftrainer.cli, ...), a top-level folder (milp/ is bftrainer.milp, ...), or
# "bftrainer" for the package itself (its __init__, the version, and __main__). From the
# bottom: the leaf bftrainer.common, which imports nothing of ours and is all that
# trainers/ and idle_monitor/ (they run on compute nodes and in the pool's readers) may
# import of bftrainer/; the allocator (milp) and the store (state); the core loop; the
# policies; what the daemon and the centre share (service); then the daemon, the
# centre, the replay, the report and the command line. A new edge is a design decision:
# add it here, in the change that needs it.
ROOM_EDGES: dict[str, set[str]] = {
    "bftrainer": {"bftrainer.cli"},
    "bftrainer.centre": {
        "bftrainer.idle_monitor",
        "bftrainer.loop",
        "bftrainer.milp",
        "bftrainer.policies",
        "bftrainer.service",
        "bftrainer.state",
    },
    "bftrainer.cli": {
        "bftrainer",
        "bftrainer.centre",
        "bftrainer.common",
        "bftrainer.daemon",
        "bftrainer.holders",
        "bftrainer.hpo",
        "bftrainer.idle_monitor",
        "bftrainer.loop",
        "bftrainer.milp",
        "bftrainer.policies",
        "bftrainer.replay",
        "bftrainer.report",
        "bftrainer.service",
        "bftrainer.state",
        "bftrainer.trainers",
    },
    "bftrainer.common": set(),
    "bftrainer.daemon": {
        "bftrainer.common",
        "bftrainer.holders",
        "bftrainer.idle_monitor",
        "bftrainer.loop",
        "bftrainer.policies",
        "bftrainer.service",
        "bftrainer.state",
        "bftrainer.trainers",
    },
    "bftrainer.holders": {"bftrainer.common", "bftrainer.idle_monitor"},
    "bftrainer.hpo": {"bftrainer.common", "bftrainer.state", "bftrainer.trainers"},
    "bftrainer.idle_monitor": {"bftrainer.common"},
    "bftrainer.loop": {"bftrainer.idle_monitor", "bftrainer.milp"},
    "bftrainer.milp": {"bftrainer.common"},  # MAX_SLOTS: one limit everywhere
    "bftrainer.policies": {"bftrainer.common", "bftrainer.loop", "bftrainer.milp"},
    "bftrainer.replay": {
        "bftrainer.common",
        "bftrainer.idle_monitor",
        "bftrainer.loop",
        "bftrainer.milp",
        "bftrainer.policies",
        "bftrainer.trainers",
    },
    "bftrainer.report": {
        "bftrainer",
        "bftrainer.loop",
        "bftrainer.replay",
        "bftrainer.state",
        "bftrainer.trainers",
    },
    "bftrainer.service": {
        "bftrainer.idle_monitor",
        "bftrainer.loop",
        "bftrainer.state",
        "bftrainer.trainers",
    },
    "bftrainer.state": {"bftrainer.common"},
    "bftrainer.trainers": {"bftrainer.common"},
}
# Folders that hold modules only inside packages: no module may sit loose in them.
NO_LOOSE_MODULES = {"bftrainer": {"__init__.py", "__main__.py"}}


def project_modules() -> dict[str, Path]:
    """Every module of the project, by its dotted name (a package by its __init__.py)."""
    modules = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def modules_over(limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The modules longer than ``limit`` lines, with their line counts."""
    counts = {name: len(path.read_text().splitlines()) for name, path in project_modules().items()}
    return {name: n for name, n in sorted(counts.items()) if n > limit}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` that can run (not under TYPE_CHECKING)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _imports_in(stmt)
            continue
        yield from _imports_in(child)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules that running it imports."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        own = set(_ancestors(name))
        targets: set[str] = set()
        for stmt in _imports(ast.parse(path.read_text(), str(path))):
            for named in _named(stmt, package, modules):
                # `import a.b.c` where c is a name, not a module: the longest module prefix.
                while named and named not in modules:
                    named = named.rpartition(".")[0]
                if named:  # else not the project's
                    targets.add(named)
                    targets.update(a for a in _ancestors(named) if a in modules and a not in own)
        graph[name] = targets - {name}
    return graph


def _named(stmt: ast.Import | ast.ImportFrom, package: str, modules: dict[str, Path]) -> list[str]:
    """What an import statement names: ``from pkg import x`` names the submodule pkg.x
    if there is one, else pkg itself."""
    if isinstance(stmt, ast.Import):
        return [alias.name for alias in stmt.names]
    base = stmt.module or ""
    if stmt.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (stmt.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
        for alias in stmt.names
    ]


def knots(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of modules that each reach one another through imports (the strongly
    connected components of more than one module: Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a path back to its start) in each knot."""
    return [circle_in(graph, group) for group in knots(graph)]


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest circle through the group's first module (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle in {sorted(group)}")


def test_no_import_circle_among_the_projects_modules() -> None:
    graph = import_graph()
    found = [
        " -> ".join(circle_in(graph, knot)) + f" (the knot: {', '.join(sorted(knot))})"
        for knot in knots(graph)
    ]
    assert not found, "import circles:\n" + "\n".join(found)


def room_of(module: str, modules: dict[str, Path]) -> str:
    """The room a module lives in: its package folder one level under the namespace, or
    "bftrainer" for a module loose in bftrainer/ (and for bftrainer itself)."""
    parts = module.split(".")
    folder = ".".join(parts[:2])
    if len(parts) >= 2 and folder in modules and modules[folder].name == "__init__.py":
        return folder
    return parts[0]


def room_edges() -> dict[str, set[str]]:
    """Room -> the other rooms its modules import, as the source stands."""
    modules = project_modules()
    edges: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        here = room_of(module, modules)
        edges.setdefault(here, set())
        edges[here].update(room_of(t, modules) for t in targets)
        edges[here].discard(here)
    return edges


def test_rooms_import_each_other_only_along_the_listed_edges() -> None:
    found = room_edges()
    new = [
        f"{a} -> {b}" for a in sorted(found) for b in sorted(found[a] - ROOM_EDGES.get(a, set()))
    ]
    assert not new, "imports between rooms that ROOM_EDGES does not list:\n" + "\n".join(new)
    # The list stays true: an edge that no import uses any more is taken out of it.
    gone = [
        f"{a} -> {b}"
        for a in sorted(ROOM_EDGES)
        for b in sorted(ROOM_EDGES[a] - found.get(a, set()))
    ]
    assert not gone, "ROOM_EDGES lists edges no import uses:\n" + "\n".join(gone)


def test_no_module_sits_loose_in_bftrainer() -> None:
    """Every module of bftrainer/ is in a room (issue 43): a new one goes into the room
    of the part it belongs to, or into a new package that says what it holds."""
    for folder, allowed in NO_LOOSE_MODULES.items():
        loose = sorted(p.name for p in (ROOT / folder).glob("*.py") if p.name not in allowed)
        assert not loose, f"modules loose in {folder}/: {', '.join(loose)}"


def test_rooms_import_each_other_one_way() -> None:
    """The rooms are layers: no room reaches itself through the others (the package
    itself is left out: its __main__ runs the command line, which reads its version)."""
    edges = {a: b - {"bftrainer"} for a, b in room_edges().items() if a != "bftrainer"}
    found = [" -> ".join(circle_in(edges, knot)) for knot in knots(edges)]
    assert not found, "rooms that import each other:\n" + "\n".join(found)


def test_the_room_walk_tells_a_package_from_a_loose_module() -> None:
    modules = dict.fromkeys(["p", "p.q", "p.q.m", "p.r"], Path("x.py"))
    modules["p.q"] = Path("p/q/__init__.py")
    assert room_of("p.q.m", modules) == "p.q"
    assert room_of("p.q", modules) == "p.q"
    assert room_of("p.r", modules) == "p"
    assert room_of("p", modules) == "p"


def test_no_module_is_over_600_lines() -> None:
    """Small modules that show the architecture (issue 30): split one that grows past it."""
    assert modules_over() == {}


def test_the_walk_sees_every_kind_of_import() -> None:
    """The walk itself: a circle is found and named, a function-level import counts,
    one under TYPE_CHECKING does not, and relative imports resolve."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": set()}
    assert circles(graph) == [["a", "b", "c", "a"]]
    modules = dict.fromkeys(["p", "p.q", "p.q.m", "p.q.n", "p.r"], Path())
    source = "from . import n\nfrom .. import r\nfrom ..r import f\n"
    relative = [s for s in ast.parse(source).body if isinstance(s, ast.ImportFrom)]
    assert [_named(s, "p.q", modules) for s in relative] == [["p.q.n"], ["p.r"], ["p.r"]]
    source = (
        "from typing import TYPE_CHECKING\n"
        "import x\n"
        "if TYPE_CHECKING:\n    import hidden\nelse:\n    import shown\n"
        "def f():\n    from .sibling import name\n"
    )
    found = list(_imports(ast.parse(source)))
    names = [s.module if isinstance(s, ast.ImportFrom) else s.names[0].name for s in found]
    assert names == ["typing", "x", "shown", "sibling"]
    graph = import_graph()
    # A module-level absolute import, a function-level one, and a package's __init__.
    assert "bftrainer.state" in graph["bftrainer.cli.user_commands"]
    assert "bftrainer.daemon" in graph["bftrainer.cli.daemon"]
    assert "bftrainer.holders" in graph["bftrainer.cli.daemon"]
    assert "bftrainer.cli" in graph["bftrainer.cli.daemon"]
