"""Custom weights and LoRA stacks through TensorRT's refit path, end to end: recipe → build → enginefarm.load with
a stack. The fake SDK (tests/fakes) runs the plan through ONNX Runtime with the engine's current weights, so a
refit really changes the outputs; they are checked against ONNX Runtime on the model merged by numpy."""

from __future__ import annotations

import os

import numpy as np
import pytest

import enginefarm
from enginefarm.errors import EnginefarmError
from tests import models
from tests.conftest import builds
from tests.nvidia_fakes import FAKES, FakeNvidia, forget_fakes
from tests.runner.test_lora import BASE, LAYERS_A, LAYERS_B, X, build_farm, cosine, reference

TARGET = "tensorrt:sm_89"
RECIPE = """
[model]
name = "net"
version = "1"
[defaults]
precisions = ["fp32"]
targets = ["tensorrt:sm_89"]
[components.body]
source = "net.onnx"
checkpoint = "base.safetensors"
precisions = ["fp32", "fp16"]
[components.body.options.tensorrt]
refittable = true
[components.body.profiles.default]
batch = [1, 1, 2]
[components.fixed]
source = "net.onnx"
checkpoint = "base.safetensors"
targets = ["tensorrt:sm_89", "onnxruntime:cpu"]
[components.fixed.profiles.default]
batch = [1, 1, 2]
"""


@pytest.fixture(scope="module")
@builds
def farm(tmp_path_factory):
    """One RTX 4090 (fake SDK) for the whole module: refittable fp32 + fp16 plans of `body`; `fixed` as a plain
    plan and for ONNX Runtime on the CPU."""
    root = tmp_path_factory.mktemp("lora-trt")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(FAKES))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        mp.setenv("FAKE_TRT_LOG", str(root / "fake-nvidia-calls.jsonl"))
        mp.setenv("FAKE_NVML_GPUS", "NVIDIA GeForce RTX 4090:8.9")
        forget_fakes()
        build_farm(root, RECIPE)
        yield root, FakeNvidia(root / "fake-nvidia-calls.jsonl", mp)
    forget_fakes()


@pytest.fixture
def store(farm, monkeypatch):
    root, fake = farm
    monkeypatch.setenv("ENGINEFARM_STORE", str(root / "store"))
    fake.clear()
    return root


def run(component="body", precision="fp32", **stack) -> np.ndarray:
    session = enginefarm.load(f"net/{component}", precision=precision, device="nvidia", target=TARGET, **stack)
    assert session.artifact.target == TARGET
    return session.run({"x": X})["y"]


def test_a_lora_is_refitted_into_the_plan_and_matches_the_numpy_merge(store, farm, tmp_path):
    session = enginefarm.load(
        "net/body", precision="fp32", device="nvidia", target=TARGET, loras=[(store / "a_kohya.safetensors", 0.8)]
    )
    assert "refit in place" in session.explain()
    out = session.run({"x": X})["y"]
    ref = reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.8)]))
    assert cosine(out, ref) >= 0.9999 and np.allclose(out, ref, atol=1e-4)
    assert cosine(out, run()) < 0.999  # it changed something
    assert farm[1].calls("refit_cuda_engine") and not farm[1].calls("build_serialized_network")  # refitted, not rebuilt


def test_custom_checkpoint_and_lora_and_fp16(store, tmp_path):
    custom = models.lora_net_checkpoint(seed=3)
    custom["extra.weight"] = BASE["extra.weight"]
    out = run(weights=store / "custom.safetensors", loras=[(store / "b.safetensors", 0.5)])
    ref = reference(tmp_path, models.merged(custom, [(LAYERS_B, 0.5)]))
    assert cosine(out, ref) >= 0.9999 and np.allclose(out, ref, atol=1e-4)
    half = run(precision="fp16", loras=[(store / "a_kohya.safetensors", 1.0)])
    assert cosine(half, reference(tmp_path, models.merged(BASE, [(LAYERS_A, 1.0)]))) >= 0.999


def test_no_residue_between_stacks(store, tmp_path, monkeypatch):
    """A, then B, then none in one process; each equals the same stack applied in a fresh cache."""
    a = [(store / "a_kohya.safetensors", 0.9)]
    b = [(store / "b.safetensors", 0.7)]
    in_order = [run(loras=a), run(loras=b), run(), run(loras=a)]
    fresh = []
    for i, stack in enumerate((a, b, (), a)):
        monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / f"fresh-{i}"))
        fresh.append(run(loras=stack))
    for got, want in zip(in_order, fresh, strict=True):
        assert np.array_equal(got, want)
    assert np.allclose(in_order[1], reference(tmp_path, models.merged(BASE, [(LAYERS_B, 0.7)])), atol=1e-4)
    assert np.allclose(in_order[2], reference(tmp_path, BASE), atol=1e-4)


def test_strength_zero_is_the_base_exactly(store):
    base = enginefarm.load("net/body", precision="fp32", device="nvidia", target=TARGET)
    zero = enginefarm.load(
        "net/body", precision="fp32", device="nvidia", target=TARGET, loras=[(store / "a_kohya.safetensors", 0.0)]
    )
    assert zero.artifact.build_key == base.artifact.build_key
    assert np.array_equal(zero.run({"x": X})["y"], base.run({"x": X})["y"])


def test_a_plan_not_built_refittable_says_how_to_fix_it_and_caches_nothing(store, farm, tmp_path, cli):
    with pytest.raises(EnginefarmError) as caught:
        run("fixed", loras=[(store / "a_kohya.safetensors", 1.0)])
    message = str(caught.value)
    assert "not built refittable" in message and "\n" not in message
    assert "refittable = true in [components.fixed.options.tensorrt]" in caught.value.hint
    assert not farm[1].calls("refit_cuda_engine")
    # nothing was merged or cached for a stack that cannot be applied
    assert not list((tmp_path / "home").glob("**/refit.safetensors"))
    np.save(tmp_path / "x.npy", X)
    out = cli(
        "run",
        "net/fixed",
        "--input",
        f"x={tmp_path / 'x.npy'}",
        "--target",
        TARGET,
        "--device",
        "nvidia",
        "--lora",
        f"{store / 'a_kohya.safetensors'}:1.0",
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert len(errors) == 2 and "not built refittable" in errors[0] and "refittable = true" in errors[1]


def test_a_stack_skips_a_plan_that_cannot_take_it_for_an_artifact_that_can(store, tmp_path):
    plain = enginefarm.load("net/fixed", precision="fp32")
    assert plain.artifact.target == TARGET  # the GPU plan ranks first without a stack
    session = enginefarm.load("net/fixed", precision="fp32", loras=[(store / "a_kohya.safetensors", 0.8)])
    assert session.artifact.target == "onnxruntime:cpu" and "weights: applied in memory at load" in session.explain()
    ref = reference(tmp_path, models.merged(BASE, [(LAYERS_A, 0.8)]))
    assert np.allclose(session.run({"x": X})["y"], ref, atol=1e-4)
