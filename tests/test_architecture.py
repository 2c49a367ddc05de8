"""The package's structure, read from its source: imports point down, no module imports a
command, and there is no import cycle (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGES = ("harness", "envs")
COMMAND_LAYER = ("harness.cli", "harness.__main__", "harness.commands")
"""The command layer: what parses a command line. Nothing below it may import it."""


def module_files(root: Path) -> dict[str, Path]:
    """Every module of :data:`PACKAGES` under ``root``, by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def import_graph(root: Path) -> dict[str, set[str]]:
    """``module -> modules it imports`` for the project's own modules, from every ``import``
    and ``from ... import`` anywhere in the source (inside functions too).

    Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so those count as
    imports too, except a module's own enclosing packages (which are already being imported
    when the module runs)."""
    modules = module_files(root)

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in modules:
                return ".".join(parts[:k])
        return None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (resolve(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:  # `from a import b` imports module a.b when b is one
                    found = resolve(f"{source}.{alias.name}")
                    targets.add(found if found is not None else resolve(source))
        targets.discard(None)
        own = set(_ancestors(name)) | {name}
        edges = set()
        for target in targets:
            edges.update(a for a in [*_ancestors(target), target] if a in modules and a not in own)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
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
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def is_command(name: str) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in COMMAND_LAYER)


def layering_problems(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle, and every library module that imports the command layer."""
    problems = [f"import cycle: {' -> '.join(component)}" for component in cycles(graph)]
    for name, targets in sorted(graph.items()):
        if is_command(name):
            continue
        problems += [f"{name} imports the command {target}" for target in sorted(targets) if is_command(target)]
    return problems


def test_the_import_graph_has_no_cycle_and_no_library_module_imports_a_command():
    graph = import_graph(ROOT)
    assert {"harness.training.step", "harness.commands.train", "envs.cartpole"} <= set(graph)
    assert layering_problems(graph) == []


def test_commands_import_no_other_command_but_their_common_module():
    graph = import_graph(ROOT)
    for name, targets in graph.items():
        if name.startswith("harness.commands.") and name != "harness.commands.common":
            others = {t for t in targets if t.startswith("harness.commands.") and t != "harness.commands.common"}
            assert not others, f"{name} imports {sorted(others)}"


def test_the_checker_finds_a_cycle_through_a_function_level_import_and_a_command_import(tmp_path):
    """The checks themselves, on a small package written here: a cycle closed by an import
    inside a function, and a library module that imports a command."""
    (tmp_path / "envs").mkdir()
    package = tmp_path / "harness"
    (package / "commands").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "commands" / "__init__.py").write_text("")
    (package / "commands" / "train.py").write_text("from harness import low\n")
    (package / "low.py").write_text("def f():\n    from harness.high import g\n")
    (package / "high.py").write_text("from . import low\n")
    (package / "bad.py").write_text("import harness.commands.train\n")
    graph = import_graph(tmp_path)
    assert graph["harness.low"] == {"harness.high"}  # the function-level import is an edge
    assert graph["harness.high"] == {"harness.low"}  # a relative import is resolved
    problems = layering_problems(graph)
    assert "import cycle: harness.high -> harness.low" in problems
    assert "harness.bad imports the command harness.commands" in problems
    assert "harness.bad imports the command harness.commands.train" in problems
    assert not any(p.startswith("harness.commands.train imports") for p in problems)
