"""Validation on the first device, for artifacts published unvalidated: golden samples written by the farm
(builder/golden_samples.py), checked once per device by `enginefarm.load` (runner/golden_check.py).

Two ways in: ONNX Runtime and OpenVINO artifacts forced through the path (their backend made to say it cannot run
where it builds, as TensorRT-RTX without a GPU does), and TensorRT-RTX engines from the fake SDK built with no GPU
and loaded on a 'GPU' (the fake runs them through ONNX Runtime; FAKE_TRT_WRONG makes one compute wrong numbers)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import enginefarm
from enginefarm.backends import Feature, get_backend
from enginefarm.builder.build import build
from enginefarm.builder.golden_samples import FILE
from enginefarm.builder.planner import expand
from enginefarm.builder.recipe import load_recipe
from enginefarm.builder.validate import Thresholds
from enginefarm.cache.stores.local import LocalStore
from enginefarm.errors import ArtifactNotFoundError
from enginefarm.formats.safetensors_io import SafeTensors
from tests.conftest import builds

LATENT = np.random.default_rng(5).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)


def force_unvalidated(monkeypatch, backend: str) -> None:
    """The backend says it cannot run what it built here: the build publishes it unvalidated, with golden samples."""
    target = get_backend(backend)
    monkeypatch.setattr(target, "features", target.features | {Feature.OWN_VALIDATION})
    monkeypatch.setattr(target, "validation_session", lambda *_: (None, {"why": "forced by the test"}))


def build_all(recipe, tmp_path, **only):
    store = LocalStore(tmp_path / "store")
    results = []
    for job in expand(load_recipe(recipe), tmp_path / "dl"):
        if all(str(getattr(job, k)) == v for k, v in only.items()):
            result = build(job, store, tmp_path / "work", bench=False)
            assert result.status == "built", result.reason
            results.append(result)
    return results


class Messages(list):
    def __call__(self, text: str) -> None:
        self.append(text)


def test_the_farm_stores_golden_samples_with_an_unvalidated_artifact(tiny_recipe, tiny_sd, monkeypatch, tmp_path):
    force_unvalidated(monkeypatch, "onnxruntime")
    (result,) = build_all(tiny_recipe(precisions=("fp16",)), tmp_path)
    manifest = result.manifest
    golden = manifest.validation["golden"]
    assert manifest.validation["passed"] is None and manifest.validation["executed"] is False
    assert golden["file"] == FILE and golden["cases"] == ["min", "opt", "max"]
    from enginefarm.builder.recipe import ValidateSpec

    assert golden["thresholds"] == vars(
        Thresholds.for_job("fp16", ValidateSpec())
    )  # the farm's gate, as the device applies it
    assert set(golden["scales"]) == {"min", "opt", "max"} and all(s["sample"] > 0 for s in golden["scales"].values())
    (entry,) = [f for f in manifest.files if f.role == "golden"]
    assert entry.path == FILE and entry.stored_sha256 != entry.sha256  # its own blob, compressed, with its own digest
    folder = tmp_path / "unpacked"
    from enginefarm.cache.device_cache import DeviceCache

    cache = DeviceCache(folder)
    cache.fetch(LocalStore(tmp_path / "store"), manifest)
    samples = SafeTensors(cache.verified_dir(manifest.build_key) / FILE)
    assert sorted(samples.names) == sorted(
        f"{c}/{side}/{n}" for c in ("min", "opt", "max") for side, n in (("in", "latent"), ("out", "sample"))
    )
    assert samples.entries["max/in/latent"].shape == (2, 4, 32, 32) and samples.entries["min/out/sample"].dtype == "F32"
    import onnxruntime as ort

    reference = ort.InferenceSession(str(tiny_sd), providers=["CPUExecutionProvider"]).run(
        None, {"latent": np.array(samples.raw("opt/in/latent"))}
    )[0]
    assert np.array_equal(reference, np.array(samples.raw("opt/out/sample")))  # the fp32 reference of the source model


def test_validated_artifacts_carry_no_golden_samples(tiny_recipe, tmp_path):
    (result,) = build_all(tiny_recipe(), tmp_path)
    assert result.manifest.validation["executed"] is True and "golden" not in result.manifest.validation
    assert all(f.role != "golden" for f in result.manifest.files)


def test_the_first_device_checks_once_and_keeps_the_verdict(tiny_recipe, monkeypatch, tmp_path):
    force_unvalidated(monkeypatch, "onnxruntime")
    (result,) = build_all(tiny_recipe(precisions=("fp16",)), tmp_path)
    said = Messages()
    session = enginefarm.load("tiny-sd/decoder", target="onnxruntime:cpu", progress=said)
    assert any(m.startswith("first use of tiny-sd/decoder onnxruntime:cpu") for m in said)
    assert re.search(
        r"first-device check \(cpu-x86_64-v\d[^)]*\): passed on its golden samples, min cosine \d\.\d{6}",
        session.explain(),
    )
    (verdict_file,) = (tmp_path / "home" / "verdicts" / result.key).glob("*.json")
    verdict = json.loads(verdict_file.read_text())
    assert verdict["passed"] is True and len(verdict["checks"]) == 3 and verdict["thresholds"]["min_cosine"] == 0.999
    said.clear()
    again = enginefarm.load("tiny-sd/decoder", target="onnxruntime:cpu", progress=said)
    assert not any(m.startswith("first use") for m in said)  # the verdict is kept: no second check
    assert np.allclose(again.run({"latent": LATENT})["sample"], session.run({"latent": LATENT})["sample"])


def test_an_artifact_that_misses_is_refused_with_the_numbers(write_recipe, tiny_sd, monkeypatch, tmp_path):
    from tests.conftest import TINY_RECIPE

    text = TINY_RECIPE.format(precisions='["fp16"]', targets='["onnxruntime:cpu"]')
    # fp16 cannot meet these: the device check must fail
    text += "min_cosine = 0.99999999\nmax_abs_rel = 1e-9\nnoise_floor = 1e-12\n"
    force_unvalidated(monkeypatch, "onnxruntime")
    (result,) = build_all(write_recipe(text), tmp_path)
    assert result.manifest.validation["golden"]["thresholds"]["min_cosine"] == 0.99999999
    with pytest.raises(
        ArtifactNotFoundError,
        match=r"failed its golden samples on this device \(cpu-[^)]+\): sample@min: (cosine 0\.\d+ < "
        r"0\.99999999|max_abs \S+ > (1e-09 × range|noise floor))",
    ):
        enginefarm.load("tiny-sd/decoder", target="onnxruntime:cpu")
    (verdict_file,) = (tmp_path / "home" / "verdicts" / result.key).glob("*.json")
    assert json.loads(verdict_file.read_text())["passed"] is False
    with pytest.raises(
        ArtifactNotFoundError, match="failed its golden samples"
    ):  # remembered: refused again, without running it
        enginefarm.load("tiny-sd/decoder", target="onnxruntime:cpu")


def test_the_device_needs_neither_onnx_runtime_nor_the_source_model(tiny_recipe, tiny_sd, monkeypatch, tmp_path):
    force_unvalidated(monkeypatch, "openvino")
    (result,) = build_all(tiny_recipe(precisions=("fp32",), targets=("openvino:cpu",)), tmp_path)
    tiny_sd.unlink()
    script = textwrap.dedent("""
        import sys
        sys.modules["onnxruntime"] = None  # import fails: not installed on this device
        sys.modules["onnx"] = None
        import enginefarm
        said = []
        session = enginefarm.load("tiny-sd/decoder", target="openvino:cpu", progress=said.append)
        assert any(m.startswith("first use of") for m in said), said
        print(session.explain())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "first-device check (cpu-" in proc.stdout and "passed on its golden samples" in proc.stdout
    assert list((tmp_path / "home" / "verdicts" / result.key).glob("*.json"))


# TensorRT-RTX: built on a CPU (the fake, told there is no GPU), first loaded on an RTX 4090
# ------------------------------
@pytest.fixture
@builds
def rtx_farm(fake_nvidia, tiny_recipe, tmp_path):
    """An RTX engine built without a GPU (unvalidated, with golden samples) and an ONNX Runtime artifact, in one
    store."""
    fake_nvidia.set(FAKE_NVML_GPUS="")
    built = build_all(tiny_recipe(precisions=("fp32",), targets=("tensorrt-rtx:ampere+", "onnxruntime:cpu")), tmp_path)
    rtx = next(r for r in built if r.manifest.target == "tensorrt-rtx:ampere+")
    assert "golden" in rtx.manifest.validation
    fake_nvidia.set(FAKE_NVML_GPUS="NVIDIA GeForce RTX 4090:8.9")
    fake_nvidia.clear()
    return fake_nvidia, rtx


def test_an_rtx_engine_built_on_a_cpu_is_checked_on_its_first_gpu(rtx_farm):
    fake, rtx = rtx_farm
    session = enginefarm.load("tiny-sd/decoder", device="auto")
    assert session.artifact.target == "tensorrt-rtx:ampere+"
    assert "first-device check (nvidia-sm_89-driver-550.54.14" in session.explain()
    assert len(fake.calls("execute_async_v3")) == 3  # min, opt and max
    fake.clear()
    enginefarm.load("tiny-sd/decoder", device="auto")
    assert not fake.calls("execute_async_v3")  # checked once per device


def test_a_miscompiled_engine_is_refused_and_the_next_candidate_loads(rtx_farm):
    fake, rtx = rtx_farm
    fake.set(FAKE_TRT_WRONG="1")
    session = enginefarm.load("tiny-sd/decoder", device="auto")
    assert session.artifact.target == "onnxruntime:cpu"
    explained = session.explain()
    assert (
        f"[{rtx.key[:12]}]" in explained
        and "failed its golden samples on this device (nvidia-sm_89-driver-550.54.14): sample@min: cosine" in explained
    )
    fake.clear()
    assert enginefarm.load("tiny-sd/decoder", device="auto").artifact.target == "onnxruntime:cpu"
    assert not fake.calls("execute_async_v3")  # the failed verdict is remembered: the engine is not run again
