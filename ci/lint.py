"""`make lint`: ruff check, ruff format --check and mypy, each timed; exits non-zero if any of them finds something.

mypy must see the product as the package users import, `enginefarm.cache` and not `cache`, but the top-level folders
are mapped to `enginefarm.*` by pyproject's [tool.setuptools.package-dir], which mypy cannot read, and the editable
install finds them through an import hook, which mypy does not run. So this script lays a tree of symlinks in
build/mypy (build/enginefarm/cache → cache/, …) from that same table, and mypy reads it through `mypy_path`
([tool.mypy] in pyproject.toml). Its findings are printed with the real paths (cache/codec.py, not the link's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "mypy"


def link_tree() -> Path:
    """build/mypy/enginefarm/… → the folders pyproject maps to each package; laid anew each run, so it never goes stale."""
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    for package, folder in sorted(package_dirs.items()):
        here = TREE.joinpath(*package.split("."))
        source = ROOT / folder
        if "." not in package:  # the root package: a real folder of links, so its subpackages' links can sit in it
            here.mkdir(parents=True)
            for entry in source.iterdir():
                if entry.name != "__pycache__" and not (here / entry.name).exists():
                    (here / entry.name).symlink_to(entry)
        else:
            here.parent.mkdir(parents=True, exist_ok=True)
            here.symlink_to(source, target_is_directory=True)
    return TREE


def real_paths(output: str) -> str:
    """mypy names the files by their link (build/mypy/enginefarm/cache/codec.py); print the file it is (cache/codec.py)."""
    lines = []
    for line in output.splitlines():
        path, sep, rest = line.partition(":")
        if sep and path.endswith(".py") and (ROOT / path).exists():
            path = os.path.relpath((ROOT / path).resolve(), ROOT)
        lines.append(path + sep + rest)
    return "\n".join(lines)


def main() -> int:
    link_tree()
    python = sys.executable
    checks = [
        ("ruff check", [python, "-m", "ruff", "check", "--output-format", "concise", "."]),
        ("ruff format --check", [python, "-m", "ruff", "format", "--check", "--output-format", "concise", "."]),
        ("mypy", [python, "-m", "mypy"]),  # what and how: [tool.mypy] in pyproject.toml
    ]
    failed = []
    for name, command in checks:
        start = time.monotonic()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        output = (proc.stdout + proc.stderr).strip()
        print(real_paths(output) if name == "mypy" else output)
        print(f"{name}: {'ok' if proc.returncode == 0 else 'FAILED'} in {time.monotonic() - start:.1f} s", flush=True)
        if proc.returncode != 0:
            failed.append(name)
    if failed:
        print(f"error: lint failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
