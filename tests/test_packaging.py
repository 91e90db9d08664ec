"""The wheel holds one top-level package, `enginefarm`, with the layers mapped in by package-dir."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # builds the wheel
def test_wheel_contains_only_the_enginefarm_package(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("enginefarm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"enginefarm"}
    for module in (
        "enginefarm/builder/planner.py",
        "enginefarm/cache/manifest.py",
        "enginefarm/runner/load.py",
        "enginefarm/backends/openvino.py",
        "enginefarm/backends/nvidia/build_process.py",
        "enginefarm/diffusion/tokenizer.py",
        "enginefarm/diffusion/schedulers/dpmsolver.py",
    ):
        assert module in names
    assert not any(n.startswith(("tests/", "recipes/", "bench/")) for n in names)


def test_core_dependencies_stay_lean():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    for heavy in ("onnx", "openvino", "onnxruntime", "torch", "boto3", "tensorrt", "coremltools"):
        assert heavy not in core
    assert {"openvino", "onnxruntime", "s3", "coreml", "tensorrt", "tensorrt-rtx", "test", "all"} <= set(
        project["optional-dependencies"]
    )


def test_installed_layers_resolve_to_the_repository_folders():
    import enginefarm.builder
    import enginefarm.cache
    import enginefarm.diffusion
    import enginefarm.runner

    assert Path(enginefarm.builder.__file__).parent.name == "builder"
    assert Path(enginefarm.cache.__file__).parent.name == "cache"
    assert Path(enginefarm.runner.__file__).parent.name == "runner"
    assert Path(enginefarm.diffusion.__file__).parent.name == "diffusion"
