"""`make lint`: ruff check, ruff format --check and mypy, each timed; exits non-zero if any of them finds something.

mypy must see the product as the package users import, `enginefarm.cache` and not `cache`, but the top-level folders
are mapped to `enginefarm.*` by pyproject's [tool.setuptools.package-dir], which mypy cannot read, and the editable
install finds them through an import hook, which mypy does not run. So this script lays a tree of symlinks in
build/mypy (build/mypy/enginefarm/cache → cache/, …) from that same table, and mypy reads it through `mypy_path`
([tool.mypy] in pyproject.toml). Its findings are printed with the real paths (cache/weight_codec.py, not the link's).

mypy's findings that predate it were listed in ci/mypy_baseline.txt (file and message, no line number, so editing
around them does not churn it); all are fixed and the file holds only its header. A finding not listed fails, and so
does a listed one that is gone, so the list only shrinks. `python ci/lint.py --update-mypy-baseline` rewrites it
after a fix (review the diff: it must only lose lines).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / "build" / "mypy"
BASELINE = ROOT / "ci" / "mypy_baseline.txt"


def link_tree() -> Path:
    """build/mypy/enginefarm/… → the folders pyproject maps to each package; laid anew each run, so it never goes
    stale."""
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
    """mypy names the files by their link (build/mypy/enginefarm/cache/weight_codec.py); print the file it is
    (cache/weight_codec.py)."""
    lines = []
    for line in output.splitlines():
        path, sep, rest = line.partition(":")
        if sep and path.endswith(".py") and (ROOT / path).exists():
            path = os.path.relpath((ROOT / path).resolve(), ROOT)
        lines.append(path + sep + rest)
    return "\n".join(lines)


def mypy_findings(output: str) -> Counter[str]:
    """Each error as `path: message  [code]`, its line number dropped, counted (one message can repeat in a file)."""
    found: Counter[str] = Counter()
    for line in output.splitlines():
        match = re.match(r"^(?P<path>[^:]+\.pyi?):\d+: error: (?P<message>.*)$", line)
        if match:
            found[f"{match['path']}: {match['message']}"] += 1
    return found


def read_baseline() -> Counter[str]:
    if not BASELINE.exists():
        return Counter()
    lines = BASELINE.read_text().splitlines()
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


def check_mypy(output: str, update: bool) -> bool:
    """Whether mypy found exactly the baseline's errors; prints what differs."""
    found, known = mypy_findings(output), read_baseline()
    if update:
        header = "# mypy errors that predate `make lint`, fixed one by one (ci/lint.py). Only ever remove lines.\n"
        BASELINE.write_text(header + "".join(f"{line}\n" for line in sorted(found.elements())))
        print(f"{BASELINE.relative_to(ROOT)}: {sum(found.values())} errors")
        return True
    new, gone = found - known, known - found
    for line in sorted(new.elements()):
        print(f"new: {line}")
    for line in sorted(gone.elements()):
        print(f"fixed (remove it from {BASELINE.relative_to(ROOT)}): {line}")
    print(
        f"mypy: {sum(found.values())} errors, all {sum(known.values())} in the baseline"
        if not new and not gone
        else f"mypy: {sum(new.values())} new, {sum(gone.values())} fixed but still in the baseline"
    )
    return not new and not gone


def main(argv: list[str]) -> int:
    update = "--update-mypy-baseline" in argv
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
        if name == "mypy":
            crashed = proc.returncode not in (0, 1) or not output
            ok = not crashed and check_mypy(real_paths(output), update)
            if crashed:
                print(output)
        else:
            ok = proc.returncode == 0
            print(output)
        print(f"{name}: {'ok' if ok else 'FAILED'} in {time.monotonic() - start:.1f} s", flush=True)
        if not ok:
            failed.append(name)
    if failed:
        print(f"error: lint failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
