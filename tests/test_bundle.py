"""`enginefarm bundle`: the folder holds only what running a target's artifacts needs, and the proof really runs one
from it in an isolated interpreter and compares the numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from enginefarm.bundle import SUPPORT, _distribution_files, write_bundle
from enginefarm.bundle_proof import ProofFailed, _compare, prove
from enginefarm.errors import BackendUnavailable

NOT_AN_APPS = (
    "click",
    "rich",
    "pygments",
    "onnx",
    "onnxsim",
)  # top-level packages an app that runs artifacts never imports
NOT_RUNTIME = ("enginefarm/builder/", "enginefarm/cli", "enginefarm/bundle")


def _files(bundle: Path) -> list[str]:
    return sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())


def _check_listing(bundle: Path) -> dict:
    """bundle.json lists every file in the folder (itself aside) with its size, and the sizes add up."""
    listing = json.loads((bundle / "bundle.json").read_text())
    listed = {f["path"]: f["size"] for part in listing["parts"] for f in part["files"]}
    assert sorted(listed) == [f for f in _files(bundle) if f != "bundle.json"]
    assert all((bundle / path).stat().st_size == size for path, size in listed.items())
    assert listing["size"] == sum(listed.values()) == sum(listing["size_by_part"].values())
    assert not [
        f
        for f in listed
        if f.split("/")[0].split("-")[0] in NOT_AN_APPS or f.startswith(NOT_RUNTIME) or "__pycache__" in f
    ]
    assert {
        "enginefarm/runner/load.py",
        "enginefarm/backends/openvino.py",
        "enginefarm/cache/device_cache.py",
        "enginefarm/__init__.py",
    } <= set(listed)
    return listing


@pytest.mark.slow  # writes the bundle (OpenVINO's libraries) and runs it in a child process
def test_an_openvino_cpu_bundle_runs_an_artifact_with_nothing_but_itself_and_the_standard_library(tmp_path):
    bundle = write_bundle("openvino:cpu", tmp_path / "app")
    files = _files(bundle.folder)
    libs = [Path(f).name for f in files if f.startswith("openvino/libs/")]
    assert (
        [n for n in libs if "frontend" in n] == [n for n in libs if "ir_frontend" in n] != []
    )  # IR only: no model frontends
    assert any("intel_cpu_plugin" in n for n in libs)
    assert not [
        n
        for n in libs
        if any(other in n for other in ("gpu_plugin", "npu_plugin", "auto_plugin", "hetero_plugin", "batch_plugin"))
    ]
    assert not [f for f in files if f.startswith(("openvino/tools/", "openvino/frontend/onnx/", "openvino/include/"))]
    assert not [f for f in files if f.startswith("zstandard/") and "cffi" in f] and any("backend_c" in f for f in files)
    assert not [f for f in files if "/tests/" in f or f.startswith("numpy/f2py/")]
    listing = _check_listing(bundle.folder)
    assert {p["name"]: p["part"] for p in listing["parts"]} == {
        "enginefarm": "enginefarm",
        "numpy": "numpy",
        "zstandard": "zstandard",
        "platformdirs": "other",
        "psutil": "other",
        "packaging": "other",
        "openvino": "vendor runtime",
    }
    assert bundle.size < 200e6, bundle.size_by_part()

    proof = prove(bundle.folder, "openvino:cpu")
    assert proof.ran and proof.passed and proof.modules_from_bundle > 50
    assert proof.outputs["y"]["cosine"] > 0.9999 and proof.outputs["y"]["max_abs"] < 1e-4, proof.outputs
    assert "none from site-packages" in proof.line

    # The proof has teeth: without the CPU plugin the bundle cannot run, and the proof says so in one line.
    next(bundle.folder.glob("openvino/libs/*intel_cpu_plugin*")).unlink()
    with pytest.raises(ProofFailed, match="did not load and run bundle-proof/net in a fresh isolated python"):
        prove(bundle.folder, "openvino:cpu")


def test_an_onnxruntime_bundle_proves_itself_with_the_apps_own_artifact_from_a_store(
    cli, tiny_recipe, tmp_path, monkeypatch
):
    store = tmp_path / "store"
    cli("build", str(tiny_recipe(targets=("onnxruntime:cpu",))), "--store", str(store), "--no-bench", check=True)
    monkeypatch.chdir(tmp_path)  # --store relative to here: the proof runs in its own folder (it failed there)
    proc = cli(
        "bundle",
        "--target",
        "onnxruntime:cpu",
        "--out",
        str(tmp_path / "app"),
        "--model",
        "tiny-sd/decoder",
        "--store",
        "store",
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"bundled onnxruntime:cpu into {tmp_path / 'app'}: ") and lines[0].endswith(" MB")
    assert [line.split()[0] for line in lines[1:6]] == ["enginefarm", "numpy", "zstandard", "vendor", "other"]
    assert "onnxruntime 1." in lines[4]
    proof = lines[-1]
    assert proof.startswith("proof (") and "ran tiny-sd/decoder (onnxruntime:cpu fp32" in proof, proof
    assert "matches the same artifact through this environment's full install" in proof and "cosine 1.000000" in proof
    files = _files(tmp_path / "app")
    assert not [
        f
        for f in files
        if f.startswith(("onnxruntime/tools/", "onnxruntime/transformers/", "onnxruntime/quantization/"))
    ]
    assert not [
        f for f in files if Path(f).name.startswith("libonnxruntime.so")
    ]  # the C API: the pybind module does not use it
    assert not [f for f in files if f.startswith("openvino")]
    _check_listing(tmp_path / "app")


def test_an_openvino_gpu_bundle_holds_the_gpu_plugin_and_says_running_was_not_proven(tmp_path):
    bundle = write_bundle("openvino:gpu", tmp_path / "app")
    libs = [Path(f).name for f in _files(bundle.folder) if f.startswith("openvino/libs/")]
    assert any("intel_gpu_plugin" in n for n in libs) and not any("intel_cpu_plugin" in n for n in libs)
    assert bundle.notes and "OpenCL" in bundle.notes
    proof = prove(bundle.folder, "openvino:gpu")
    assert proof.passed and not proof.ran
    assert "GPU plugin" in proof.line and proof.line.endswith(
        "running an artifact on a GPU was not proven here (no such device)"
    )


@pytest.mark.parametrize(
    "target, error",
    [
        ("openvino", "error: --target 'openvino' is not BACKEND:DEVICE"),
        ("nosuch:cpu", "error: unknown backend 'nosuch' in --target nosuch:cpu"),
        (
            "tensorrt-rtx:ampere+",
            "error: tensorrt-rtx:ampere+ cannot be bundled: enginefarm knows no trimmed runtime for that device class",
        ),
        ("onnxruntime:gpu", "error: onnxruntime:gpu cannot be bundled"),
    ],
)
def test_a_target_that_cannot_be_bundled_is_one_line_and_a_hint(cli, tmp_path, target, error):
    proc = cli("bundle", "--target", target, "--out", str(tmp_path / "app"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    first, hint = proc.stderr.splitlines()
    assert first.startswith(error), proc.stderr
    assert hint.startswith("hint: bundlable targets: ") and "openvino:cpu" in hint and "onnxruntime:cpu" in hint
    assert not (tmp_path / "app").exists()


def test_a_folder_that_is_not_a_bundle_is_never_overwritten(cli, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('my app')\n")
    proc = cli("bundle", "--target", "onnxruntime:cpu", "--out", str(tmp_path / "app"))
    assert proc.returncode == 1 and proc.stderr.startswith(
        f"error: --out {tmp_path / 'app'} exists and is not a bundle"
    )
    assert (tmp_path / "app" / "main.py").is_file()


@pytest.mark.parametrize("listing", ["{}", "a listing missing a file", "not JSON"])
def test_a_folder_with_a_bundle_json_it_did_not_write_or_files_it_does_not_list_is_never_deleted(tmp_path, listing):
    """Only an earlier bundle is replaced: a bundle.json this command wrote, and nothing in the folder it does not
    list (an app's src/ beside a `{}` bundle.json was deleted whole)."""
    from enginefarm.errors import ConfigError

    app = tmp_path / "app"
    (app / "src").mkdir(parents=True)
    (app / "src" / "main.py").write_text("print('my app')\n")
    (app / "numpy").mkdir()
    (app / "numpy" / "__init__.py").write_text("")
    written = {
        "format": 1,
        "target": "onnxruntime:cpu",
        "parts": [{"part": "enginefarm", "name": "numpy", "files": [{"path": "numpy/__init__.py", "size": 0}]}],
    }
    text = {"{}": "{}", "not JSON": "{", "a listing missing a file": json.dumps(written)}[listing]
    (app / "bundle.json").write_text(text)
    with pytest.raises(ConfigError, match="exists and is not a bundle") as refused:
        write_bundle("onnxruntime:cpu", app)
    assert refused.value.hint and "\n" not in str(refused.value)
    assert (app / "src" / "main.py").read_text() == "print('my app')\n" and (app / "bundle.json").read_text() == text
    (app / "src" / "main.py").unlink()
    (app / "src").rmdir()
    (app / "numpy" / "__pycache__").mkdir()
    (app / "numpy" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"")  # an app ran from it
    from enginefarm.bundle import earlier_bundle

    assert earlier_bundle(app) is (listing == "a listing missing a file")  # now it lists all there is
    if listing == "{}":  # a bundle this command wrote is replaced by the next
        real = tmp_path / "real"
        write_bundle("onnxruntime:cpu", real)
        assert earlier_bundle(real) and write_bundle("onnxruntime:cpu", real).folder == real


def test_a_runtime_that_is_not_installed_names_its_install():
    spec = SUPPORT["numpy"].__class__(("no-such-runtime-dist",))
    with pytest.raises(BackendUnavailable, match="no-such-runtime-dist is not installed here") as missing:
        _distribution_files("no-such-runtime-dist", spec, "pip install 'enginefarm[openvino]'")
    assert missing.value.hint == "pip install 'enginefarm[openvino]'"


def test_the_comparison_fails_outputs_that_differ():
    want = {"y": np.linspace(0, 1, 64, dtype=np.float32)}
    assert _compare({"y": want["y"] + 1e-7}, want, "fp32")["y"]["ok"]
    assert not _compare({"y": want["y"][::-1].copy()}, want, "fp32")["y"]["ok"]
    assert not _compare({"y": np.full(64, np.nan, np.float32)}, want, "fp32")["y"]["ok"]
    with pytest.raises(ProofFailed, match="outputs"):
        _compare({"z": want["y"]}, want, "fp32")
