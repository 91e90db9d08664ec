"""`import enginefarm`, `enginefarm.runner` and `enginefarm.cache` load no vendor SDK, no onnx and no boto3."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ["openvino", "onnxruntime", "onnx", "boto3", "botocore", "tensorrt", "tensorrt_rtx", "coremltools", "torch", "migraphx", "onnxsim",
         "tuf", "securesystemslib", "cryptography"]


@pytest.mark.parametrize("module", ["enginefarm", "enginefarm.runner", "enginefarm.cache", "enginefarm.cli", "enginefarm.builder.backends",
                                    "enginefarm.cache.trust", "enginefarm.runner.release", "enginefarm.cli_release"])
def test_import_loads_no_heavy_module(module):
    code = f"import sys, json, {module}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_check_itself_would_catch_a_heavy_import():
    code = f"import sys, json, enginefarm, onnx; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "onnx" in json.loads(out.stdout)
