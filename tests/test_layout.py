"""The shape of the code (pure Python, reading the source): no import circles, the library never
imports the command line, the command line uses only public names, and no module is too long.

An import is counted where Python runs it: importing ``a.b.c`` runs the packages ``a`` and
``a.b`` first. Imports under ``if TYPE_CHECKING:`` never run and are not counted.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from pathlib import Path

from testkit import REPO_ROOT


def parse(source: str) -> ast.Module:
    """``ast.parse``, once more on a fresh thread when CPython 3.11 raises "AST constructor
    recursion depth mismatch": its per-thread recursion count can be left off by earlier work in
    the same process (a pytest-xdist worker runs many tests), and a new thread starts clean."""
    try:
        return ast.parse(source)
    except SystemError:
        parsed: list[ast.Module] = []
        thread = threading.Thread(target=lambda: parsed.append(ast.parse(source)))
        thread.start()
        thread.join()
        return parsed[0]


PACKAGES = ("waltz_engine", "waltz_cli", "spark")
LIBRARY = ("waltz_engine", "spark")
MAX_MODULE_LINES = 650
# waltz_engine's tools layer, above everything else (the simulator runs the operators' tools
# among its faults, as an operator would: issue 32).
TOOLS = ("ops", "bench", "smoke", "sim")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def imports_of(name: str) -> Iterator[tuple[str, ast.ImportFrom | ast.Import]]:
    """(imported module, the import statement) for every import that runs in module ``name``."""
    path = MODULES[name]
    tree = parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                yield (f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base), node


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for target, _ in imports_of(name):
            pieces = target.split(".")
            for end in range(1, len(pieces) + 1):
                runs = ".".join(pieces[:end])
                if runs in MODULES and runs != name and not name.startswith(runs + "."):
                    graph[name].add(runs)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
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
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_tree_is_read() -> None:
    assert len(MODULES) > 150
    assert "waltz_engine.storage.node.node" in MODULES


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_never_imports_the_command_line() -> None:
    offenders = [
        f"{name} imports {target}"
        for name in MODULES
        if name.startswith(LIBRARY)
        for target, _ in imports_of(name)
        if target.split(".")[0] == "waltz_cli"
    ]
    assert offenders == []


def test_the_core_never_imports_the_tools() -> None:
    """Storage, server, client, wire, ZooKeeper code never lean on the operators' library."""
    offenders = [
        f"{name} imports {target}"
        for name in MODULES
        if name.startswith("waltz_engine.") and name.split(".")[1] not in TOOLS
        for target, _ in imports_of(name)
        if target.startswith("waltz_engine.") and target.split(".")[1] in TOOLS
    ]
    assert offenders == []


def test_the_command_line_uses_only_public_library_names() -> None:
    offenders = []
    for name in MODULES:
        if not name.startswith("waltz_cli"):
            continue
        for target, node in imports_of(name):
            if target.split(".")[0] in LIBRARY and isinstance(node, ast.ImportFrom):
                private = [
                    a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                ]
                if private or any(part.startswith("_") for part in target.split(".")):
                    offenders.append(f"{name}: from {target} import {private}")
    assert offenders == []


def test_no_module_is_too_long() -> None:
    long = {
        str(path.relative_to(REPO_ROOT)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these (at most {MAX_MODULE_LINES} lines): {long}"


def test_every_package_says_what_it_holds() -> None:
    bare = [
        str(path.relative_to(REPO_ROOT))
        for name, path in MODULES.items()
        if path.name == "__init__.py"
        and name.startswith("waltz_engine")
        and not ast.get_docstring(parse(path.read_text()))
    ]
    assert bare == []


def test_the_suites_measured_file_costs_name_existing_files() -> None:
    """The scheduling table in conftest.py names files that exist: a renamed file would lose its
    place at the head of the run silently."""
    from conftest import MEASURED_FILE_COST_S

    missing = [name for name in MEASURED_FILE_COST_S if not (REPO_ROOT / "tests" / name).is_file()]
    assert missing == []
