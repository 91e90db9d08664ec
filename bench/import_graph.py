"""Import circles in the product package: every module of `enginefarm` read with `ast` (nothing is imported), the
package's own imports as a graph, and its strongly connected components of more than one module.

An import counts wherever it is written: at module level, inside a function, or under `if TYPE_CHECKING:` (the
three are told apart, so a circle can be judged by what it costs: a module-level one fails at import time in some
orders; a function-level one is a knot a reader has to hold in mind). Relative imports are resolved against the
module's package; `from pkg import name` counts as an edge to `pkg.name` when that is a module, else to `pkg`.

    .venv/bin/python bench/import_graph.py [--level module|function|typing] [--edges]

`--level module` counts module-level imports only, `function` adds those inside functions (the default), `typing`
adds those under TYPE_CHECKING too. `--edges` prints each circle's edges with the line they are written on.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEVELS = ("module", "function", "typing")


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """The package's folders by dotted name, from pyproject's package-dir table (top-level folders map to
    `enginefarm.<folder>`); subpackages are found by their __init__.py."""
    import tomllib

    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    dirs = {name: root / folder for name, folder in table.items()}
    for name, folder in list(dirs.items()):
        for init in folder.rglob("__init__.py"):
            sub = init.parent.relative_to(folder)
            if sub.parts:
                dirs.setdefault(".".join((name, *sub.parts)), init.parent)
    return dirs


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its __init__)."""
    found: dict[str, Path] = {}
    for package, folder in package_dirs(root).items():
        for path in folder.glob("*.py"):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    level: str  # module | function | typing


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module):
    """(node, level) for every import statement, the level saying where it is written."""

    def walk(node: ast.AST, level: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, level
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "typing" if level == "typing" else "function")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                yield from walk(ast.Module(body=child.body, type_ignores=[]), "typing")
                yield from walk(ast.Module(body=child.orelse, type_ignores=[]), level)
            else:
                yield from walk(child, level)

    yield from walk(tree, "module")


def edges(root: Path = ROOT) -> list[Edge]:
    mods = modules(root)
    found: list[Edge] = []
    for name, path in mods.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node, level in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base for alias in node.names]
            for target in targets:
                while target and target not in mods:  # `import a.b.c` of a non-module attribute: its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.append(Edge(name, target, node.lineno, level))
    return found


def circles(found: list[Edge], level: str = "function") -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), counting imports up to `level`."""
    counted = LEVELS[: LEVELS.index(level) + 1]
    graph: dict[str, set[str]] = {}
    for e in found:
        if e.level in counted:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the package's ~100 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


# Layers that import only downward, every import counted (TYPE_CHECKING ones too). hardware/ is the machine: it may
# import itself and enginefarm's leaves (errors, settings), nothing else of the package. backends/ and builder/ sit
# below the runner.
ONLY = {
    "enginefarm.hardware": ("enginefarm.hardware", "enginefarm.errors", "enginefarm.settings"),
    # what a warm load opens (runner/warm.py): nothing of the registry, the cache or the resolver
    "enginefarm.sessions": ("enginefarm.sessions", "enginefarm.hardware", "enginefarm.errors"),
    # the file formats every layer reads: above only the cache (atomic writes, manifests) and the errors
    "enginefarm.formats": ("enginefarm.formats", "enginefarm.cache", "enginefarm.errors", "enginefarm.settings"),
    # the store: below everything but the machine
    "enginefarm.cache": ("enginefarm.cache", "enginefarm.hardware", "enginefarm.errors", "enginefarm.settings"),
}
# The runner imports the builder only to compile on the device; nothing else below the runner reaches the builder.
NEVER = {
    "enginefarm.backends": ("enginefarm.runner", "enginefarm.builder"),
    "enginefarm.builder": ("enginefarm.runner",),
    "enginefarm.weights": ("enginefarm.runner", "enginefarm.builder"),
    "enginefarm.diffusion": ("enginefarm.builder",),
    "enginefarm.filters": ("enginefarm.builder",),
}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def upward(
    found: list[Edge], only: dict[str, tuple[str, ...]] = ONLY, never: dict[str, tuple[str, ...]] = NEVER
) -> list[Edge]:
    """The imports that break a layer's rule, at any level."""

    def breaks(e: Edge) -> bool:
        outside = any(
            _within(e.source, layer) and not any(_within(e.target, ok) for ok in allowed)
            for layer, allowed in only.items()
        )
        denied = any(
            _within(e.source, layer) and any(_within(e.target, no) for no in targets)
            for layer, targets in never.items()
        )
        return outside or denied

    return [e for e in found if breaks(e)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--level", choices=LEVELS, default="function")
    p.add_argument("--edges", action="store_true", help="print each circle's edges")
    args = p.parse_args()
    found = edges()
    counted = LEVELS[: LEVELS.index(args.level) + 1]
    print(
        f"{len(modules())} modules, {len({(e.source, e.target) for e in found if e.level in counted})} import edges "
        f"(counting {', '.join(counted)}-level imports)"
    )
    result = circles(found, args.level)
    for members in result:
        print(f"circle of {len(members)}: {' <-> '.join(members)}")
        if args.edges:
            for e in found:
                if e.source in members and e.target in members and e.level in counted:
                    print(f"    {e.source} -> {e.target}  (line {e.line}, {e.level})")
    print(f"{len(result)} circle(s)")
    wrong = upward(found)
    for e in wrong:
        print(f"upward: {e.source} -> {e.target}  (line {e.line}, {e.level})")
    print(
        f"{len(wrong)} upward import(s) (hardware imports nothing above it; backends and builder nothing of the runner)"
    )
    sys.exit(1 if result else 0)


if __name__ == "__main__":
    main()
