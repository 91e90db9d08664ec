"""Our code around the TensorRT-RTX Python API, against the fake SDK in tests/fakes: CPU-only ahead-of-time builds
for compute capabilities, and the JIT runtime cache kept in the device's local cache."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.builder.backends import availability, get_backend
from enginefarm.cache.manifest import Target
from enginefarm.errors import BuildError
from tests.builder.test_tensorrt import build_one, jobs_of, recipe, unpacked


def test_builds_on_a_machine_without_a_gpu(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    fake_nvidia.set(FAKE_NVML_GPUS="")
    avail = availability(Target("tensorrt-rtx", "ampere+"))
    assert avail.can_build and not avail.can_load
    assert "builds here without a GPU" in avail.reason and "cannot run here: NVML did not start" in avail.reason
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",)), tmp_path)
    result, _ = build_one(job, tmp_path)
    assert result.status == "built", result.reason
    (call,) = fake_nvidia.calls("build_serialized_network", sdk="tensorrt_rtx")
    assert call["compute_capabilities"] == []  # the SDK's default: 8.6 and later, future GPUs included
    assert set(call["flags"]) == {"STRIP_PLAN", "REFIT_IDENTICAL"} and call["strongly_typed"]
    (streamed,) = fake_nvidia.calls("plan_streamed", sdk="tensorrt_rtx")
    engine = next(f for f in result.manifest.files if f.role == "engine")
    assert streamed["size"] == engine.size  # written to its file as the SDK streamed it, never whole in memory
    validation = result.manifest.validation
    assert validation["passed"] is None and validation["executed"] is False
    assert validation["why"].startswith("built without the device to run it (") and "NVML did not start" in validation["why"]
    assert set(validation) == {"passed", "executed", "why"}
    assert not fake_nvidia.calls("deserialize_cuda_engine")  # nothing was loaded on the CPU build host
    assert result.manifest.constraints["runtime"] == {"tensorrt-rtx": "==1.2.0.54"}


@pytest.mark.parametrize("device,capabilities", [("sm_75", ["SM75"]), ("sm_86", ["SM86"]), ("turing+", ["SM75", "SM86", "SM89", "SM120"]),
                                                 ("ampere+", []), ("ada+", ["SM89", "SM120"]), ("blackwell+", ["SM120"])])
def test_device_classes_name_compute_capabilities(fake_nvidia, device, capabilities):
    backend = get_backend("tensorrt-rtx")
    import tensorrt_rtx

    assert backend.compute_capabilities(tensorrt_rtx, device) == capabilities


def test_a_named_capability_reaches_the_builder_config(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    fake_nvidia.set(FAKE_NVML_GPUS="")
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:sm_75",)), tmp_path)
    result, _ = build_one(job, tmp_path)
    assert result.status == "built", result.reason
    assert fake_nvidia.calls("build_serialized_network")[0]["compute_capabilities"] == ["SM75"]


def test_an_unknown_compute_capability_is_a_build_error(fake_nvidia):
    import tensorrt_rtx

    with pytest.raises(BuildError, match="cannot target sm_90"):
        get_backend("tensorrt-rtx").compute_capabilities(tensorrt_rtx, "sm_90")


def test_the_runtime_cache_lives_in_the_local_cache_per_gpu_and_driver(fake_nvidia, write_recipe, tiny_sd, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "device-home"))
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:ampere+",), precisions=("fp32",)), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = unpacked(tmp_path, store, result.manifest)
    caches = tmp_path / "device-home" / "tensorrt-rtx-runtime-cache"
    for leftover in caches.rglob("*.bin"):
        leftover.unlink()  # validation at build time ran on this 'device' too
    fake_nvidia.clear()
    backend = get_backend("tensorrt-rtx")
    session = backend.load(folder, result.manifest, "ampere+")
    session.run({"latent": np.zeros((1, 4, 8, 8), np.float32)})
    path = caches / "rtx-1.2.0.54-sm_89-driver-550.54.14" / f"{result.manifest.build_key}.bin"
    assert path.is_file() and b"[1, 4, 8, 8]" in path.read_bytes()
    assert not list(path.parent.glob(".*"))  # written atomically: no temp file left behind
    assert not fake_nvidia.calls("runtime_cache_deserialize")  # nothing to load the first time

    fake_nvidia.clear()
    backend.load(folder, result.manifest, "ampere+").run({"latent": np.zeros((1, 4, 8, 8), np.float32)})
    (loaded,) = fake_nvidia.calls("runtime_cache_deserialize")
    assert loaded["kernels"] == ['{"latent": [1, 4, 8, 8]}']  # the kernels of the first run, reused

    fake_nvidia.set(FAKE_NVML_DRIVER="570.86")
    fake_nvidia.clear()
    backend.load(folder, result.manifest, "ampere+").run({"latent": np.zeros((1, 4, 8, 8), np.float32)})
    assert not fake_nvidia.calls("runtime_cache_deserialize")  # another driver never reads that cache
    assert (caches / "rtx-1.2.0.54-sm_89-driver-570.86" / f"{result.manifest.build_key}.bin").is_file()


def test_loading_needs_a_matching_gpu(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt-rtx:blackwell+",)), tmp_path)
    fake_nvidia.set(FAKE_NVML_GPUS="")
    result, store = build_one(job, tmp_path)
    assert result.status == "built", result.reason
    fake_nvidia.set(FAKE_NVML_GPUS="NVIDIA GeForce RTX 4090:8.9")
    assert not availability(Target("tensorrt-rtx", "blackwell+")).can_load
    from enginefarm.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="blackwell\\+ needs a matching NVIDIA GPU"):
        get_backend("tensorrt-rtx").load(unpacked(tmp_path, store, result.manifest), result.manifest, "blackwell+")
