"""`import enginefarm`, `enginefarm.runner` and `enginefarm.cache` load no vendor SDK, no onnx and no boto3."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["openvino", "onnxruntime", "onnx", "boto3", "botocore", "tensorrt", "tensorrt_rtx", "coremltools", "torch", "migraphx", "onnxsim",
         "tuf", "securesystemslib", "cryptography"]


@pytest.mark.parametrize("module", ["enginefarm", "enginefarm.runner", "enginefarm.cache", "enginefarm.cli", "enginefarm.backends",
                                    "enginefarm.cache.trust", "enginefarm.runner.release", "enginefarm.cli_release", "enginefarm.families",
                                    "enginefarm.export", "enginefarm.cli_export"])
def test_import_loads_no_heavy_module(module):
    code = f"import sys, json, {module}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_check_itself_would_catch_a_heavy_import():
    code = f"import sys, json, enginefarm, onnx; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "onnx" in json.loads(out.stdout)


BUILD_TIME = ("enginefarm.builder", "onnx", "onnxsim")  # what an app that only fetches and runs never needs


def _loaded(code: str, env: dict | None = None) -> list[str]:
    import os

    probe = f"{code}\nimport sys, json; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxsim') or m.startswith('enginefarm.builder'))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["enginefarm", "enginefarm.runner", "enginefarm.runner.load", "enginefarm.runner.resolve",
                                    "enginefarm.runner.measure", "enginefarm.runner.golden", "enginefarm.backends.openvino",
                                    "enginefarm.backends.onnxruntime", "enginefarm.backends.tensorrt_rtx"])
def test_the_runtime_imports_no_builder_module_and_no_onnx(module):
    assert _loaded(f"import {module}") == []


def test_the_guard_would_catch_a_builder_import():
    assert "enginefarm.builder.planner" in _loaded("import enginefarm.runner, enginefarm.builder.planner")


@pytest.mark.parametrize("target", ["openvino:cpu", "onnxruntime:cpu"])
def test_fetching_loading_and_running_an_artifact_needs_no_builder_module(tiny_recipe, cli, tmp_path, target):
    """What an app does (load, run) with the builder out of the picture: a `pip install 'enginefarm[openvino]'` app."""
    store, home = tmp_path / "store", tmp_path / "home"
    cli("build", str(tiny_recipe(targets=(target,))), "--store", str(store), "--no-bench", check=True)
    code = ("import numpy as np, enginefarm\n"
            f"s = enginefarm.load('tiny-sd/decoder', device='cpu', target={target!r})\n"
            "out = s.run({'latent': np.zeros((1, 4, 8, 8), np.float32)})\n"
            "assert all(np.isfinite(v).all() for v in out.values())")
    assert _loaded(code, {"ENGINEFARM_STORE": str(store), "ENGINEFARM_HOME": str(home)}) == []
