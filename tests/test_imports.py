"""The house stays walkable: imports between the modules of `bub_bot` and `channels` go one way.

Every import statement counts, wherever it stands: at module level, inside a function (a lazy
import is still a dependency, only a hidden one) and under `if TYPE_CHECKING:` (a type names
the module it comes from, and a reader has to go there). Importing `a.b.c` from outside the
package `a.b` also runs `a/b/__init__.py`, so it depends on that package too; a module inside
a package does not depend on its own packages that way (they are imported before it runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bub_bot", "channels")


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's `__init__`) for every module of `packages`."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (see the module docstring)."""
    known = modules(root, packages)

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        here = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*package, *([node.module] if node.module else [])])
                for alias in node.names:
                    # `from pkg import mod` imports the module `pkg.mod`; else a name of `pkg`.
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in known else base)
        edges: set[str] = set()
        for target in targets:
            module = resolve(target)
            if module is None:
                continue  # outside bub_bot and channels
            edges.add(module)
            parts = module.split(".")
            for end in range(1, len(parts)):
                package = ".".join(parts[:end])
                if package in known and not (here == package or here.startswith(package + ".")):
                    edges.add(package)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a circle (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def describe(graph: dict[str, set[str]], group: list[str]) -> str:
    return "; ".join(
        f"{m} imports {', '.join(sorted(graph[m] & set(group)))}" for m in group if graph[m]
    )


def test_no_modules_import_each_other() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 50  # the whole house was read
    found = cycles(graph)
    assert found == [], "imports that go in a circle: " + " | ".join(
        describe(graph, group) for group in found
    )


def test_the_check_sees_lazy_type_only_and_package_imports(tmp_path: Path) -> None:
    def write(name: str, text: str) -> None:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    write("pkg/__init__.py", "")
    # A function-level import one way, a TYPE_CHECKING import the other.
    write("pkg/a.py", "def f():\n    from . import b\n")
    write("pkg/b.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    # Around a circle through a package's __init__: c -> sub (runs sub/__init__) -> d -> c.
    write("pkg/c.py", "from pkg.sub.e import x\n")
    write("pkg/sub/__init__.py", "from .d import y\n")
    write("pkg/sub/d.py", "import pkg.c\n")
    write("pkg/sub/e.py", "x = 1\n")
    # One way only: no circle.
    write("pkg/f.py", "from .sub import e\nimport json\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.f"] == {"pkg.sub", "pkg.sub.e"}
    assert graph["pkg.sub.d"] == {"pkg.c"}  # not its own package
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.sub", "pkg.sub.d"]]
