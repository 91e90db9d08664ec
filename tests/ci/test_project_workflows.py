"""enginefarm's own CI: the workflows are valid, CI installs exactly the pinned toolchain, and the runtime stays free
of Linux-only calls outside guarded fallbacks (its tests run on Windows and macOS in ci/github/project.yml)."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from enginefarm.toolchain import CONSTRAINTS, normalise, pinned

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = [
    ROOT / "ci" / "github" / name for name in ("project.yml", "upstream.yml", "farm.yml", "release-refresh.yml")
]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_matches_githubs_schema(workflow):
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(workflow)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_installed_toolchain_is_the_pinned_one():
    """`make test` installs from enginefarm/constraints.txt: what this suite tests is what the file says."""
    pins = pinned()
    assert {"numpy", "onnx", "onnxruntime", "openvino", "torch", "diffusers", "transformers", "tensorrt-rtx"} <= set(
        pins
    )
    installed = {normalise(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    differ = {name: (version, installed.get(name)) for name, version in pins.items() if installed.get(name) != version}
    assert not differ, (
        f"installed versions differ from {CONSTRAINTS} (pinned, installed): {differ}; run `make test` or `make "
        "constraints`"
    )


def test_every_dependency_of_the_test_extra_is_pinned():
    """A dependency added to pyproject.toml without `make constraints` would install unpinned."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    names = {normalise(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}
    names = {
        n for n in names if n != "enginefarm" and not n.startswith(("tensorrt-cu", "cuda-python"))
    }  # GPU-only stubs
    assert names - set(pinned()) == set()


def test_the_project_workflow_runs_both_readme_commands_and_the_runtime_on_windows_and_macos():
    jobs = yaml.safe_load((ROOT / "ci" / "github" / "project.yml").read_text())["jobs"]
    assert any("bash .ci/run" in step.get("run", "") for step in jobs["linux"]["steps"])
    assert set(jobs["runtime"]["strategy"]["matrix"]["os"]) == {"windows-latest", "macos-latest"}
    run = ROOT / ".ci" / "run"
    text = run.read_text()
    assert text.index("make demo") < text.index("make test")
    for path in ("tests/cache", "tests/runner", "tests/hardware"):
        assert (ROOT / path).is_dir() and path in " ".join(step.get("run", "") for step in jobs["runtime"]["steps"])


RUNTIME = ["enginefarm", "runner", "cache", "backends", "hardware"]


def _guarded(tree: ast.AST) -> dict[ast.AST, bool]:
    """Each node → whether it sits in a fallback: a try that catches ImportError/OSError, a branch on the platform,
    or a function named for one platform (`_linux_…`)."""
    guarded: dict[ast.AST, bool] = {}

    def visit(node: ast.AST, inside: bool) -> None:
        guarded[node] = inside
        here = inside
        if isinstance(node, ast.Try):
            caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            here = inside or any(
                word in text for text in caught for word in ("ImportError", "OSError", "AttributeError")
            )
        elif isinstance(node, ast.If) and "platform" in ast.unparse(node.test):
            here = True
        elif isinstance(node, ast.FunctionDef) and node.name.startswith(("_linux", "linux_")):
            here = True
        for child in ast.iter_child_nodes(node):
            visit(child, here)

    visit(tree, False)
    return guarded


def test_the_runtime_makes_no_linux_only_call_outside_a_guarded_fallback():
    found = []
    for folder in RUNTIME:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            guarded = _guarded(tree)
            for node in ast.walk(tree):
                linux_only = (
                    isinstance(node, (ast.Import, ast.ImportFrom))
                    and any(a.name in ("fcntl", "resource", "termios") for a in node.names)
                    or isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.startswith(("/proc/", "/sys/"))
                )
                if linux_only and not guarded[node]:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"Linux-only calls outside a guarded fallback: {found}"


def test_ci_lints_before_it_tests_and_lint_runs_all_three_checks():
    """`make lint` cannot drop out of CI unnoticed: .ci/run (set -e) runs it before `make test`, and it runs ruff check,
    ruff format --check and mypy, each failing the run."""
    text = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in text
    assert text.index("make lint") < text.index("make test")
    makefile = (ROOT / "Makefile").read_text()
    assert "\nlint: " in makefile and "ci/lint.py" in makefile.split("\nlint: ", 1)[1].split("\n\n", 1)[0]
    lint = (ROOT / "ci" / "lint.py").read_text()
    for check in ('"ruff", "check"', '"ruff", "format", "--check"', '"mypy"'):
        assert check in lint


def test_mypy_sees_every_package_under_its_installed_name(tmp_path, monkeypatch):
    """ci/lint.py links build/mypy/enginefarm/… from [tool.setuptools.package-dir]: every package pyproject ships is
    there as enginefarm.X, so mypy checks what users import."""
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("lint", ROOT / "ci" / "lint.py")
    lint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lint)
    monkeypatch.setattr(lint, "TREE", tmp_path / "mypy")
    tree = lint.link_tree()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in packages:
        init = tree.joinpath(*package.split("."), "__init__.py")
        assert init.is_file(), package
    assert (tree / "enginefarm" / "cache" / "weight_codec.py").resolve() == ROOT / "cache" / "weight_codec.py"
    assert (
        lint.real_paths(f"{tree / 'enginefarm' / 'cache' / 'weight_codec.py'}:3: error: x")
        == "cache/weight_codec.py:3: error: x"
    )
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["mypy_path"] == "build/mypy" and mypy["packages"] == ["enginefarm"]
