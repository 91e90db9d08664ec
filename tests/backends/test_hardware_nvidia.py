"""TensorRT and TensorRT-RTX for real, on an NVIDIA GPU. This CI has none, so these skip with the reason; run them
where one exists, with the SDK installed (pip install '.[tensorrt,tensorrt-rtx]'):

    ENGINEFARM_TEST_HARDWARE=nvidia make test PYTEST_ARGS=tests/backends/test_hardware_nvidia.py
"""

from __future__ import annotations

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.stores.local import LocalStore

pytestmark = pytest.mark.hardware("nvidia")


def gpu_arch() -> str:
    from enginefarm.hardware.device_info import nvidia_gpus

    gpus, why = nvidia_gpus()
    if not gpus:
        pytest.fail(f"ENGINEFARM_TEST_HARDWARE=nvidia, but no NVIDIA GPU is visible: {why}")
    return gpus[0]["arch"]


def reference(model, latent, weights=None):
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    proto = onnx.load(str(model))
    for init in proto.graph.initializer:
        if weights and init.name in weights:
            init.CopyFrom(numpy_helper.from_array(weights[init.name], init.name))
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"latent": latent}
    )[0]


def cosine(a, b) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_builds_validates_and_runs_on_this_gpu(tiny_recipe, tiny_sd, cli, tmp_path, precision):
    target = f"tensorrt:{gpu_arch()}"
    cli("build", str(tiny_recipe(precisions=(precision,), targets=(target,))), check=True)
    session = enginefarm.load("tiny-sd/decoder", precision=precision, device="nvidia", target=target)
    assert (
        session.artifact.validation["passed"]
        and session.artifact.benchmarks[0]["device"]["class"] == f"nvidia-{gpu_arch()}"
    )
    latent = np.random.default_rng(0).uniform(-3, 3, (2, 4, 32, 32)).astype(np.float32)
    assert cosine(session.run({"latent": latent})["sample"], reference(tiny_sd, latent)) > 0.995
    assert LocalStore(tmp_path / "store").list_cache_objects(
        f"tensorrt-timing/{gpu_arch()}"
    )  # the timing cache was kept


def test_tensorrt_ampere_plus_version_compatible_refittable(tiny_recipe, tiny_sd, cli, tmp_path):
    import onnx
    from onnx import numpy_helper

    if int(gpu_arch()[3:-1]) < 8:
        pytest.skip("ampere+ plans need compute capability 8.0 or newer")
    path = tiny_recipe(precisions=("fp32",), targets=("tensorrt:ampere+",))
    path.write_text(
        path.read_text() + "\n[components.decoder.options.tensorrt]\nversion_compatible = true\nrefittable = true\n"
    )
    cli("build", str(path), check=True)
    session = enginefarm.load("tiny-sd/decoder", device="nvidia", target="tensorrt:ampere+")
    from enginefarm.backends import get_backend
    from enginefarm.cache.device_cache import DeviceCache

    manifest = session.artifact
    folder = DeviceCache(tmp_path / "home").verified_dir(manifest.build_key)
    init = onnx.load(str(tiny_sd)).graph.initializer[0]
    changed = {init.name: (numpy_helper.to_array(init) * 1.5).astype(np.float32)}
    latent = np.random.default_rng(1).uniform(-1, 1, (1, 4, 16, 16)).astype(np.float32)
    refitted = get_backend("tensorrt").refit(folder, manifest, changed, "ampere+").run({"latent": latent})["sample"]
    assert cosine(refitted, reference(tiny_sd, latent, changed)) > 0.9999


def test_tensorrt_rtx_builds_runs_and_keeps_its_runtime_cache(tiny_recipe, tiny_sd, cli, tmp_path):
    major = int(gpu_arch()[3:-1])
    family = "blackwell+" if major >= 12 else "ampere+" if major >= 8 else "turing+"
    cli("build", str(tiny_recipe(precisions=("fp16",), targets=(f"tensorrt-rtx:{family}",))), check=True)
    session = enginefarm.load("tiny-sd/decoder", device="nvidia", target=f"tensorrt-rtx:{family}")
    latent = np.random.default_rng(2).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    assert cosine(session.run({"latent": latent})["sample"], reference(tiny_sd, latent)) > 0.995
    assert list((tmp_path / "home" / "tensorrt-rtx-runtime-cache").rglob(f"{session.artifact.build_key}.bin"))


def test_a_streamable_tensorrt_rtx_plan_runs_within_its_weight_budget(tiny_recipe, tiny_sd, cli, tmp_path, monkeypatch):
    """TensorRT-RTX only runs on RTX parts (SM 7.5, 8.6, 8.9, 12.0, 12.1): a datacenter GPU (the H100, SM 9.0)
    cannot."""
    arch = gpu_arch()
    if arch not in ("sm_75", "sm_86", "sm_89", "sm_120", "sm_121"):
        pytest.skip(f"TensorRT-RTX does not run on {arch}")
    target = f"tensorrt-rtx:{arch}"
    path = tiny_recipe(precisions=("fp16",), targets=(target,))
    path.write_text(path.read_text() + "\n[components.decoder.options.tensorrt-rtx]\nweight_streaming = true\n")
    cli("build", str(path), check=True)
    monkeypatch.setenv("ENGINEFARM_WEIGHT_STREAMING_BUDGET", "1K")
    session = enginefarm.load("tiny-sd/decoder", precision="fp16", device="nvidia", target=target)
    assert "streaming weights" in session.explain()
    latent = np.random.default_rng(0).uniform(-3, 3, (1, 4, 16, 16)).astype(np.float32)
    assert cosine(session.run({"latent": latent})["sample"], reference(tiny_sd, latent)) > 0.995
