"""Custom weights and LoRAs on TensorRT-RTX engines built on a CPU farm (never refittable): compiled on the device
from the component's ONNX Runtime artifact (runner/recompile.py).

Without a GPU (this machine), the real SDK does the build half end to end: the stack is merged into the ONNX, a real
engine is compiled and cached under the stack's key; only running it needs the GPU this machine lacks. With a GPU
(the fake SDK), the base engine is compiled refittable once and every stack is a refit of it."""

from __future__ import annotations

import hashlib
import shutil
import sys

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.progress import Progress
from enginefarm.errors import ArtifactNotFoundError
from enginefarm.runner.custom import Stack, stack_key
from tests import models
from tests.nvidia_fakes import FAKES
from tests.runner.test_lora import BASE, LAYERS_A, LAYERS_B, X, build_farm, cosine, reference

RECIPE = """
[model]
name = "net"
version = "1"
[defaults]
precisions = ["fp32"]
targets = ["tensorrt-rtx:ampere+", "onnxruntime:cpu"]
[components.body]
source = "net.onnx"
checkpoint = "base.safetensors"
[components.body.profiles.default]
batch = [1, 1, 2]
"""


class Recorder(Progress):
    def __init__(self) -> None:
        self.messages, self.work_done = [], []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def work(self, name: str, done: int, total: int) -> None:
        self.work_done.append((name, done, total))


@pytest.fixture
def nvml_only(tmp_path, monkeypatch):
    """Call it, and from then on NVML reports an RTX 4090, so resolution tries the RTX engine; the TensorRT-RTX SDK
    and the CUDA bindings stay the real ones, which find no GPU here."""

    def activate() -> None:
        folder = tmp_path / "nvml-only"
        folder.mkdir()
        shutil.copyfile(FAKES / "pynvml.py", folder / "pynvml.py")
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA GeForce RTX 4090:8.9")
        sys.modules.pop("pynvml", None)

    yield activate
    sys.modules.pop("pynvml", None)  # the next test imports the real one again


def test_without_a_gpu_the_stack_is_merged_and_a_real_engine_compiled_and_cached(
    real_rtx, tmp_path, monkeypatch, nvml_only
):
    build_farm(tmp_path, RECIPE)  # the farm: the real SDK builds the engine on this CPU, ONNX Runtime the fallback
    nvml_only()
    monkeypatch.setenv("ENGINEFARM_STORE", str(tmp_path / "store"))
    lora = [(tmp_path / "a_kohya.safetensors", 0.8)]
    said = Recorder()
    session = enginefarm.load("net/body", loras=lora, progress=said)

    # The RTX engine was compiled and cached; it cannot run without a GPU, so ONNX Runtime took the stack.
    assert session.artifact.target == "onnxruntime:cpu"
    assert "tensorrt-rtx:ampere+" in session.explain() and "the plan is not valid on this system" in session.explain()
    cache = DeviceCache(tmp_path / "home")
    base = next(
        e.manifest
        for e in cache.entries()
        if e.manifest.target == "tensorrt-rtx:ampere+" and "stack" not in e.manifest.options
    )
    key = stack_key(base.build_key, Stack.parse(None, lora))
    compiled = cache.manifest(key)
    assert compiled is not None and compiled.target == "tensorrt-rtx:ampere+"
    assert [(f.path, f.role) for f in compiled.files] == [("model.plan", "engine")]
    assert compiled.options["stack"]["base"] == base.build_key and compiled.options["refittable"] is False
    assert compiled.provenance["built_on_device"] is True and compiled.provenance["stack_seconds"] > 0
    assert any(
        "merged into the ONNX; compiling a tensorrt-rtx:ampere+ engine on this device" in m for m in said.messages
    )
    name, done, total = said.work_done[-1]
    assert (
        name == "compiling tensorrt-rtx:ampere+ engine" and done == total > 0
    )  # the engine build's own phases, as a bar

    # It is the real SDK's engine of the merged weights: the same bytes as building the merged ONNX directly.
    plan = (cache.verified_dir(key) / "model.plan").read_bytes()
    merged_onnx = (
        next(
            cache.verified_dir(e.manifest.build_key)
            for e in cache.entries()
            if e.manifest.target == "onnxruntime:cpu" and "stack" in e.manifest.options
        )
        / "model.onnx"
    )
    from enginefarm.backends.nvidia.build import BuildSpec
    from enginefarm.backends.nvidia.build_process import build_plan
    from enginefarm.backends.nvidia.sdk import capturing_logger

    build_plan(
        real_rtx,
        BuildSpec(
            sdk="tensorrt_rtx",
            onnx=str(merged_onnx),
            plan=str(tmp_path / "direct.plan"),
            profile=base.profile,
            precision="fp32",
            strip_weights=False,
            refittable=False,
        ),
        capturing_logger(real_rtx),
    )
    assert hashlib.sha256(plan).digest() == hashlib.sha256((tmp_path / "direct.plan").read_bytes()).digest()
    base_plan = (cache.verified_dir(base.build_key) / "model.plan").read_bytes()
    assert plan != base_plan

    # The same stack again: nothing is compiled.
    again = Recorder()
    enginefarm.load("net/body", loras=lora, progress=again)
    assert not again.work_done and not any("compiling" in m for m in again.messages)


def test_with_a_gpu_the_engine_is_compiled_refittable_once_and_stacks_are_refits(fake_nvidia, tmp_path, monkeypatch):
    fake_nvidia.set(FAKE_NVML_GPUS="")  # the farm: a CPU runner (fake SDK), so the engine is not refittable
    build_farm(tmp_path, RECIPE)
    fake_nvidia.set(FAKE_NVML_GPUS="NVIDIA GeForce RTX 4090:8.9")
    fake_nvidia.clear()
    monkeypatch.setenv("ENGINEFARM_STORE", str(tmp_path / "store"))

    said = Recorder()
    session = enginefarm.load("net/body", loras=[(tmp_path / "a_peft.safetensors", 0.8)], progress=said)
    assert session.artifact.target == "tensorrt-rtx:ampere+"
    assert "refit in place (engine compiled refittable on this device from onnxruntime:cpu fp32" in session.explain()
    (built,) = fake_nvidia.calls("build_serialized_network", sdk="tensorrt_rtx")
    assert set(built["flags"]) == {"STRIP_PLAN", "REFIT"}
    assert said.work_done and said.work_done[-1][1] == said.work_done[-1][2]
    out = session.run({"x": X})["y"]
    expected = reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.8)]))
    assert cosine(out, expected) >= 0.9999 and np.allclose(out, expected, atol=1e-4)

    fake_nvidia.clear()
    other = enginefarm.load("net/body", loras=[(tmp_path / "b.safetensors", -0.5)])
    assert "engine compiled refittable on this device earlier" in other.explain()
    assert not fake_nvidia.calls("build_serialized_network") and fake_nvidia.calls(
        "refit_cuda_engine"
    )  # a refit, not a rebuild
    expected = reference(tmp_path, models.merged(BASE, [(LAYERS_B, -0.5)]))
    assert cosine(other.run({"x": X})["y"], expected) >= 0.9999

    plain = enginefarm.load("net/body")  # the compiled twin is reached only through a stack
    assert "stack" not in plain.artifact.options and plain.artifact.options["refittable"] is False


def test_without_the_components_onnx_the_error_says_what_to_build(fake_nvidia, tmp_path, monkeypatch):
    fake_nvidia.set(FAKE_NVML_GPUS="")
    build_farm(tmp_path, RECIPE.replace('"tensorrt-rtx:ampere+", "onnxruntime:cpu"', '"tensorrt-rtx:ampere+"'))
    fake_nvidia.set(FAKE_NVML_GPUS="NVIDIA GeForce RTX 4090:8.9")
    monkeypatch.setenv("ENGINEFARM_STORE", str(tmp_path / "store"))
    with pytest.raises(
        ArtifactNotFoundError, match=r"is not refittable, and no onnxruntime:cpu fp32 artifact of the same source model"
    ) as caught:
        enginefarm.load("net/body", loras=[(tmp_path / "b.safetensors", 1.0)], device="nvidia")
    assert caught.value.hint.startswith("add onnxruntime:cpu to the component's targets")
