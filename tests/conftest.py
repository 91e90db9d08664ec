from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import models

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Every test gets its own cache and store; nothing touches the user's real ones."""
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGINEFARM_STORE", str(tmp_path / "store"))
    monkeypatch.delenv("ENGINEFARM_OFFLINE", raising=False)
    monkeypatch.delenv("ENGINEFARM_CACHE_QUOTA", raising=False)
    monkeypatch.delenv("ENGINEFARM_RECIPE_PATH", raising=False)


@pytest.fixture
def tiny_sd(tmp_path) -> Path:
    return models.tiny_sd(tmp_path / "models" / "tiny_sd.onnx")


TINY_RECIPE = """
[model]
name = "tiny-sd"
version = "1"

[defaults]
precisions = {precisions}
targets = {targets}

[components.decoder]
source = "models/tiny_sd.onnx"

[components.decoder.profiles.default]
batch = [1, 1, 2]
height = [8, 16, 32]
width = [8, 16, 32]

[components.decoder.validate]
inputs = {{ latent = {{ low = -3.0, high = 3.0 }} }}
"""


@pytest.fixture
def write_recipe(tmp_path):
    def write(text: str, name: str = "recipe.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def tiny_recipe(tiny_sd, write_recipe):
    def make(precisions=("fp32",), targets=("onnxruntime:cpu",), name="recipe.toml") -> Path:
        as_toml = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
        return write_recipe(TINY_RECIPE.format(precisions=as_toml(precisions), targets=as_toml(targets)), name)

    return make


def run_cli(*args: str, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """The real `enginefarm` command in a subprocess, as a user runs it."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "enginefarm.cli", *args], capture_output=True, text=True, env=full_env, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"enginefarm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli


def pytest_collection_modifyitems(config, items):
    """Tests marked `hardware(kind)` run only where ENGINEFARM_TEST_HARDWARE lists that kind."""
    enabled = {k.strip() for k in os.environ.get("ENGINEFARM_TEST_HARDWARE", "").split(",") if k.strip()}
    for item in items:
        marker = item.get_closest_marker("hardware")
        if marker and marker.args[0] not in enabled:
            kind = marker.args[0]
            item.add_marker(pytest.mark.skip(reason=f"needs {kind} hardware: run with ENGINEFARM_TEST_HARDWARE={kind} on a machine that has it"))
