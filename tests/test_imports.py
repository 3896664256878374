"""The house stays walkable: imports between the modules of `bub_bot` and `channels` go one way.

Every import statement counts, wherever it stands: at module level, inside a function (a lazy
import is still a dependency, only a hidden one) and under `if TYPE_CHECKING:` (a type names
the module it comes from, and a reader has to go there). Importing `a.b.c` from outside the
package `a.b` also runs `a/b/__init__.py`, so it depends on that package too; a module inside
a package does not depend on its own packages that way (they are imported before it runs).
A circle dodged with a lazy import is still a circle: this check names it.

Two walls besides (DESIGN.md, "Imports point one way"): the core knows nothing about Slack,
Telegram or the web page (of `channels` it imports only the contract, `channels.base`, and
no platform library; only the wiring, `server`, `__main__` and `cli`, imports the channels
themselves), and the channels know nothing about SQL (no database driver: they reach the
tape through the store interface).
"""

from __future__ import annotations

import ast
from collections.abc import Collection
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


def imported(path: Path, here: str, known: Collection[str] = ()) -> set[str]:
    """The absolute dotted names a file imports anywhere in it (`here`: its package, for
    relative imports; `known`: modules, so `from pkg import mod` counts as `pkg.mod`)."""
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
    return targets


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
        targets = imported(path, here, known)
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


WIRING = {"bub_bot.server", "bub_bot.__main__", "bub_bot.cli"}
"""The core modules that put the channels together with the runtime."""
CONTRACT = "channels.base"
"""What the core and the channels agree on (Channel, Inbound, deliveries)."""
PLATFORM_LIBRARIES = ("slack_bolt", "slack_sdk", "aiogram")
DATABASE_DRIVERS = ("sqlite3", "aiosqlite", "asyncpg", "psycopg", "psycopg2")


def all_imports(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> every name it imports (absolute, dotted), for the modules of `packages`."""
    known = modules(root, packages)
    return {
        name: imported(path, name if is_package else name.rpartition(".")[0], known)
        for name, (path, is_package) in known.items()
    }


def within(name: str, roots: tuple[str, ...]) -> bool:
    """Whether `name` is one of `roots` or inside one."""
    return any(name == root or name.startswith(root + ".") for root in roots)


def platform_imports(imports: dict[str, set[str]]) -> dict[str, list[str]]:
    """Core modules -> what they import of a platform (a channel or a platform library)."""
    wrong = {
        module: sorted(
            name
            for name in names
            if within(name, PLATFORM_LIBRARIES)
            or (module not in WIRING and within(name, ("channels",)) and name != CONTRACT)
        )
        for module, names in imports.items()
        if within(module, ("bub_bot",))
    }
    return {module: names for module, names in wrong.items() if names}


def sql_imports(imports: dict[str, set[str]]) -> dict[str, list[str]]:
    """Channel modules -> the database drivers they import."""
    wrong = {
        module: sorted(name for name in names if within(name, DATABASE_DRIVERS))
        for module, names in imports.items()
        if within(module, ("channels",))
    }
    return {module: names for module, names in wrong.items() if names}


def test_the_core_knows_nothing_about_the_platforms() -> None:
    imports = all_imports(ROOT, ("bub_bot",))
    assert len(imports) > 50  # the core was read
    wrong = platform_imports(imports)
    assert wrong == {}, f"core modules that import a platform: {wrong}"


def test_the_channels_know_nothing_about_sql() -> None:
    imports = all_imports(ROOT, ("channels",))
    assert len(imports) > 20  # the channels were read
    wrong = sql_imports(imports)
    assert wrong == {}, f"channel modules that import a database driver: {wrong}"


def test_the_walls_see_lazy_imports(tmp_path: Path) -> None:
    def write(name: str, text: str) -> None:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    for package in ("bub_bot", "channels", "channels/web"):
        write(f"{package}/__init__.py", "")
    write("channels/base.py", "")
    write("channels/slack.py", "def f():\n    import asyncpg.pool\n")
    write("channels/web/history.py", "from sqlite3 import connect\nfrom bub_bot import tape\n")
    write("bub_bot/tape.py", "")
    write("bub_bot/runtime.py", "from channels.base import Channel\nfrom channels import base\n")
    write("bub_bot/turns.py", "def f():\n    from channels.web import history\n")
    write("bub_bot/slacky.py", "import slack_sdk.web\n")
    write("bub_bot/server.py", "from channels.slack import f\n")  # wiring may
    imports = all_imports(tmp_path, ("bub_bot", "channels"))
    assert platform_imports(imports) == {
        "bub_bot.turns": ["channels.web.history"],
        "bub_bot.slacky": ["slack_sdk.web"],
    }
    assert sql_imports(imports) == {
        "channels.slack": ["asyncpg.pool"],
        "channels.web.history": ["sqlite3"],
    }


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
