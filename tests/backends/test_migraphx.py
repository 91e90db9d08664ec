"""MIGraphX: our code around the SDK, through the real build path, with a recording fake `migraphx` module and a
fake `rocminfo` (tests/fakes). ROCm and AMD GPUs are not on this machine; the hardware-marked test runs the real
thing where they are."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import models

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@pytest.fixture
def fake_rocm(tmp_path, monkeypatch):
    """Puts the fake SDK on sys.path (and PYTHONPATH, for the build and benchmark subprocesses) and a fake rocminfo
    on PATH. Returns (set_gpus, calls): set_gpus("gfx1100,gfx1030") and the recorded SDK calls."""
    log = tmp_path / "migraphx-calls.jsonl"
    monkeypatch.setenv("FAKE_MIGRAPHX_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAKES), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.syspath_prepend(str(FAKES))

    def set_gpus(gpus: str) -> None:
        monkeypatch.setenv("FAKE_ROCM_GPUS", gpus)

    def calls(name: str | None = None) -> list[dict]:
        found = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [c for c in found if name is None or c["call"] == name]

    yield set_gpus, calls
    sys.modules.pop("migraphx", None)


def _manifests(store: Path) -> dict:
    found = {}
    for path in (store / "manifests").glob("*.json"):
        manifest = json.loads(path.read_text())
        found[(manifest["target"], manifest["precision"])] = manifest
    return found


def test_build_on_a_matching_gpu_passes_profile_bounds_fp16_and_runs_validation(fake_rocm, tiny_recipe, cli, tmp_path):
    set_gpus, calls = fake_rocm
    set_gpus("gfx1030,gfx1100")  # the gfx1100 is HIP device 1
    proc = cli("build", str(tiny_recipe(precisions=("fp32", "fp16"), targets=("migraphx:gfx1100",))), check=True)
    assert "2 built, 0 failed" in proc.stdout

    parses = calls("parse_onnx")
    assert len(parses) == 2
    for parse in parses:  # batch 1..2 (opt 1), 4 fixed, height/width 8..32 (opt 16): every dim, per input
        assert parse["map_dyn_input_dims"] == {"latent": [[1, 2, [1]], [4, 4, [4]], [8, 32, [16]], [8, 32, [16]]]}
        assert parse["map_input_dims"] == {}
        assert parse["pid"] != os.getpid()  # in the build subprocess
    assert len(calls("quantize_fp16")) == 1  # only the fp16 job
    compiles = calls("compile")
    assert {(c["target"], c["gfx"], c["offload_copy"]) for c in compiles} == {("gpu", "gfx1100", True)}
    assert {c["env"]["HIP_VISIBLE_DEVICES"] for c in compiles} == {"1"} and {
        c["env"]["HSA_OVERRIDE_GFX_VERSION"] for c in compiles
    } == {None}
    assert {(Path(c["filename"]).name, c["format"]) for c in calls("save")} == {("model.mxr", "msgpack")}
    assert {c["format"] for c in calls("load")} == {"msgpack"}
    # The session hands every input over as a migraphx.argument of the manifest's dtype, at each profile corner.
    runs = [c["args"]["latent"] for c in calls("run")]
    assert {(kind, dtype) for kind, dtype, _ in runs} == {("argument", "float32")}
    assert {tuple(shape) for _, _, shape in runs} >= {(1, 4, 8, 8), (1, 4, 16, 16), (2, 4, 32, 32)}

    manifests = _manifests(Path(os.environ["ENGINEFARM_STORE"]))
    for precision in ("fp32", "fp16"):
        manifest = manifests[("migraphx:gfx1100", precision)]
        assert [(f["path"], f["role"]) for f in manifest["files"]] == [("model.mxr", "engine")]
        assert manifest["validation"]["passed"] is True and manifest["validation"]["executed"] is True
        assert manifest["constraints"] == {"runtime": {"migraphx": "==2.12.0"}, "arch": "gfx1100", "os": ["linux"]}
        assert manifest["toolchain"]["migraphx"] == "2.12.0"
        assert manifest["benchmarks"] and manifest["benchmarks"][0]["p50_ms"] > 0
        assert "compiled on GPU 1" in manifest["provenance"]["build_notes"]["migraphx"]


def test_cross_compile_for_a_gfx_the_host_lacks(fake_rocm, tiny_recipe, cli):
    set_gpus, calls = fake_rocm
    set_gpus("gfx1030")
    proc = cli("build", str(tiny_recipe(precisions=("fp16",), targets=("migraphx:gfx1100",))), check=True)
    assert "1 built" in proc.stdout
    [compile_call] = calls("compile")
    assert compile_call["env"]["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0" and compile_call["gfx"] == "gfx1100"
    assert calls("run") == []  # nothing here can run a gfx1100 program
    manifest = _manifests(Path(os.environ["ENGINEFARM_STORE"]))[("migraphx:gfx1100", "fp16")]
    golden = manifest["validation"].pop("golden")  # checked on the first gfx1100 that loads it (runner/golden_check.py)
    assert {k: v for k, v in manifest["validation"].items() if k != "settings"} == {
        "passed": None,
        "executed": False,
        "why": "no gfx1100 GPU here (found gfx1030): builds are cross-compiled and not run",
    }
    assert golden["cases"] == ["min", "opt", "max"] and ("golden.safetensors", "golden") in [
        (f["path"], f["role"]) for f in manifest["files"]
    ]
    assert manifest["benchmarks"] == [] and manifest["provenance"]["benchmark"].startswith(
        "skipped: no gfx1100 GPU here"
    )
    assert "cross-compiled for gfx1100 on gfx1030" in manifest["provenance"]["build_notes"]["migraphx"]


def test_a_static_profile_uses_fixed_input_dims(fake_rocm, write_recipe, tmp_path, cli):
    set_gpus, calls = fake_rocm
    set_gpus("gfx90a")
    models.linear(tmp_path / "models" / "linear.onnx", dims=(3, 8))
    recipe = write_recipe("""
        [model]
        name = "lin"
        version = "1"
        [components.linear]
        source = "models/linear.onnx"
        targets = ["migraphx:gfx90a"]
        """)
    cli("build", str(recipe), "--no-bench", check=True)
    [parse] = calls("parse_onnx")
    assert parse["map_input_dims"] == {"x": [3, 8]} and parse["map_dyn_input_dims"] == {}
    assert calls("quantize_fp16") == []


def test_an_sdk_crash_fails_only_its_job(fake_rocm, tiny_recipe, cli, monkeypatch):
    set_gpus, _ = fake_rocm
    set_gpus("gfx1100")
    monkeypatch.setenv("FAKE_MIGRAPHX_CRASH", "parse")
    proc = cli("build", str(tiny_recipe(targets=("migraphx:gfx1100", "onnxruntime:cpu"))), "--no-bench")
    assert proc.returncode == 1
    assert "1 built, 1 failed" in proc.stdout and "MIGraphX build process failed" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "gfx,version",
    [("gfx1100", "11.0.0"), ("gfx1030", "10.3.0"), ("gfx90a", "9.0.10"), ("gfx942", "9.4.2"), ("gfx1201", "12.0.1")],
)
def test_gfx_names_map_to_hsa_override_versions(gfx, version):
    from enginefarm.backends.migraphx import gfx_version

    assert gfx_version(gfx) == version


def test_availability_says_why(fake_rocm, monkeypatch):
    from enginefarm.backends import migraphx

    set_gpus, _ = fake_rocm
    set_gpus("gfx1100")
    assert migraphx.BACKEND.available("gfx1100") == migraphx.Availability(True, True)
    assert (
        migraphx.BACKEND.available("gfx942").reason
        == "no gfx942 GPU here (found gfx1100): builds are cross-compiled and not run"
    )
    set_gpus("")
    assert "no AMD GPU to compile on: rocminfo lists no gfx agent" in migraphx.BACKEND.available("gfx1100").reason


def test_without_the_sdk_doctor_and_plan_point_to_rocm_not_pip(cli, tiny_recipe):
    proc = cli("doctor", check=True)
    text = " ".join(proc.stdout.replace("│", " ").split())  # table cells wrap: compare the words
    assert "migraphx - unavailable: migraphx is not installed" in text
    assert "apt install migraphx, from ROCm's apt repository (the PyPI 'migraphx' is a placeholder)" in text
    from enginefarm.backends import coreml

    here = coreml.BACKEND.available("apple")
    if here.can_build and not here.can_load:
        assert "build only: Core ML runs only on macOS" in text
    rows = json.loads(
        cli("plan", str(tiny_recipe(targets=("migraphx:gfx1100",))), "--format", "json", check=True).stdout
    )
    assert rows[0]["status"].startswith("unavailable here: migraphx is not installed")


@pytest.mark.hardware("amd")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_migraphx_on_an_amd_gpu_end_to_end(tiny_recipe, cli, precision):
    import enginefarm
    from enginefarm.hardware.device_info import amd_gpus

    gfx = amd_gpus()[0][0]["gfx"]
    cli("build", str(tiny_recipe(precisions=(precision,), targets=(f"migraphx:{gfx}",))), check=True)
    session = enginefarm.load("tiny-sd/decoder", precision=precision, device="amd", target=f"migraphx:{gfx}")
    out = session.run({"latent": np.zeros((2, 4, 32, 32), np.float32)})["sample"]
    assert out.shape == (2, 3, 64, 64) and np.isfinite(out).all()
