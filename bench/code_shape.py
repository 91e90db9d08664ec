"""The product's function shapes, read with `ast` (nothing is imported): how many functions take many parameters, and
which are the longest. The folders are pyproject's package-dir table (bench/import_graph.py reads it).

    .venv/bin/python bench/code_shape.py [--params 8] [--top 10]

A parameter is every name a caller can pass (positional, keyword-only, *args and **kwargs), `self` and `cls` left out.
A function's length is its lines from `def` (or its first decorator) to its last statement; its code lines leave the
signature and the docstring out.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import ROOT, modules


@dataclass(frozen=True)
class Shape:
    where: str  # path:line
    name: str  # Class.method or function
    params: int
    lines: int
    code: int  # lines after the signature and the docstring


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return len([n for n in names if n not in ("self", "cls")])


def shapes(root: Path = ROOT) -> list[Shape]:
    """Every function and method in the product, nested ones included."""
    found: list[Shape] = []
    for path in sorted(set(modules(root).values())):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, prefix: str, path: Path = path) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.", path)
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    where = f"{path.relative_to(root)}:{child.lineno}"
                    end = child.end_lineno or child.lineno
                    first = child.body[0]
                    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    body_start = (first.end_lineno or first.lineno) + 1 if docstring else first.lineno
                    code = end - body_start + 1
                    found.append(Shape(where, prefix + child.name, _params(child), end - start + 1, code))
                    visit(child, f"{prefix}{child.name}.", path)
                else:
                    visit(child, prefix, path)

        visit(tree, "")
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=int, default=8, help="count functions taking at least this many parameters")
    p.add_argument("--top", type=int, default=10, help="list this many of the longest and the widest")
    args = p.parse_args()
    found = shapes()
    wide = sorted((s for s in found if s.params >= args.params), key=lambda s: -s.params)
    print(f"{len(found)} functions; {len(wide)} take {args.params} or more parameters")
    for s in wide[: args.top]:
        print(f"  {s.params:3d} params  {s.name}  ({s.where})")
    print(f"the {args.top} longest:")
    for s in sorted(found, key=lambda s: -s.lines)[: args.top]:
        print(f"  {s.lines:3d} lines ({s.code:3d} of code)  {s.name}  ({s.where})")


if __name__ == "__main__":
    main()
