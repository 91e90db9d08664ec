"""mkdocs hook: lets mkdocstrings' Python handler (griffe) find enginefarm's layers.

The wheel maps top-level folders into the package (`[tool.setuptools.package-dir]` in pyproject.toml: runner/ is
`enginefarm.runner`, cache/ is `enginefarm.cache`, ...). griffe reads the source without importing it and looks for
a package's submodules in the package's own folder, so from the repository it would see `enginefarm/` without its
layers (an editable install does not help: griffe reads only the top-level entries of setuptools' editable MAPPING).
This hook copies the Python files into a temporary folder laid out as the wheel lays them out, from the same table
the wheel is built from, and puts that folder first in the handler's `paths`. Nothing is imported. It also points the
snippets extension at the repository root, so `mkdocs build -f PATH/mkdocs.yml` works from any folder.
"""

from __future__ import annotations

import shutil
import tempfile
import tomllib
from pathlib import Path

from mkdocs.plugins import event_priority

_made: list[Path] = []


def wheel_layout(root: Path, out: Path) -> Path:
    """Copy the package's .py files under `out` as the wheel installs them; returns `out`."""
    package_dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.c", "*.txt")
    for package, folder in sorted(package_dirs.items()):  # "enginefarm" first, then its layers inside it
        shutil.copytree(root / folder, out.joinpath(*package.split(".")), ignore=skip, dirs_exist_ok=True)
    return out


@event_priority(100)  # before mkdocstrings' on_config, which creates the handler with its paths
def on_config(config):
    root = Path(config.config_file_path).resolve().parent
    out = wheel_layout(root, Path(tempfile.mkdtemp(prefix="enginefarm-docs-")))
    _made.append(out)
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [str(out), *python.get("paths", [])]
    # Snippets (ARCHITECTURE.md) are read from the repository root wherever mkdocs is started from.
    config.mdx_configs.setdefault("pymdownx.snippets", {})["base_path"] = [str(root)]
    return config


def on_shutdown():
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)
