"""A pipeline's TensorRT engines share one activation buffer (backends/nvidia/activations.py), as TensorRT's
demo/Diffusion does, checked against the fake SDK, whose device-memory ledger (tests/fakes/cuda) counts what the real
one allocates: an engine's weights when it is deserialized, a STATIC context's activations when it is made, and every
cudaMalloc."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from enginefarm.backends.device_memory import peak_bytes
from enginefarm.backends.nvidia.activations import SharedActivations, sharing
from tests.nvidia_fakes import fake_plans, open_fake_session

MB = 1 << 20
SIZES = {"text_encoder": (40 * MB, 8 * MB), "unet": (300 * MB, 96 * MB), "vae_decoder": (20 * MB, 160 * MB)}
LATENT = np.random.default_rng(0).uniform(-1, 1, (1, 4, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("sdk", ["tensorrt", "tensorrt_rtx"])
def test_engines_in_one_pool_hold_their_weights_plus_the_largest_activations(fake_nvidia, tiny_sd, tmp_path, sdk):
    plans = fake_plans(fake_nvidia, tiny_sd, tmp_path / "plans", SIZES, sdk)
    trt = importlib.import_module(sdk)
    from cuda.bindings import runtime as gpu

    weights = sum(w for w, _ in SIZES.values())
    alone = [open_fake_session(trt, plan) for plan in plans.values()]  # outside a pool: each context has its own
    assert gpu.USED[0] == weights + sum(a for _, a in SIZES.values())
    expected = [s.run({"latent": LATENT})["sample"] for s in alone]
    for session in alone:
        session.close()
    del alone, session
    assert gpu.USED[0] == 0  # every engine, context and buffer given back

    pool = SharedActivations()
    with sharing(pool):
        shared = {name: open_fake_session(trt, plan) for name, plan in plans.items()}
    assert gpu.USED[0] == weights  # the contexts took no activation memory of their own
    assert {c["strategy"] for c in fake_nvidia.calls("create_execution_context")[-3:]} == {"USER_MANAGED"}
    gpu.reset_peak()
    outputs = [s.run({"latent": LATENT})["sample"] for s in shared.values()]
    assert all(np.array_equal(a, b) for a, b in zip(outputs, expected, strict=True))  # the same numbers
    largest = max(a for _, a in SIZES.values())
    assert pool.allocated == largest
    reported = [s.device_memory() for s in shared.values()]
    assert all(m is not None and m.shared for m in reported)
    # our accounting is the ledger's, to the byte: weights + the largest activations + our input/output buffers
    assert peak_bytes(reported) == gpu.USED[0] == gpu.PEAK[0] < weights + sum(a for _, a in SIZES.values())
    assert gpu.PEAK[0] - weights - largest == sum(m.io for m in reported) < MB

    shared.pop("vae_decoder").close()  # the largest goes: so does its share of the buffer, now
    assert pool.allocated == 0 and gpu.USED[0] == peak_bytes([s.device_memory() for s in shared.values()]) - 96 * MB
    shared["unet"].run({"latent": LATENT})
    assert pool.allocated == 96 * MB == max(s.device_memory().activations for s in shared.values())
    for session in shared.values():
        session.close()
    shared.clear()
    assert gpu.USED[0] == 0 and pool.allocated == 0


def test_a_context_without_its_buffer_refuses_to_run_and_the_backend_shares_the_pool(fake_nvidia, tiny_sd, tmp_path):
    plans = fake_plans(fake_nvidia, tiny_sd, tmp_path / "plans", {"unet": (3 * MB, 2 * MB)}, "tensorrt_rtx")
    trt = importlib.import_module("tensorrt_rtx")
    from enginefarm.backends.nvidia.activations import new_context

    engine = trt.Runtime(None).deserialize_cuda_engine(plans["unet"])
    with sharing(SharedActivations()):
        context, pool = new_context(trt, engine, engine.create_runtime_config())
    assert pool is not None and not context.execute_async_v3(7)  # USER_MANAGED, no memory given: the SDK refuses
    assert fake_nvidia.calls("execute_without_device_memory")
    context.set_device_memory(0x1, 2 * MB)  # not an allocation of that size: refused, as the real SDK's check does
    assert fake_nvidia.calls("set_device_memory")[-1]["ok"] is False and context.device_memory_bound is None


@pytest.mark.slow  # builds a plan through the farm's build (about 12 s)
def test_the_backends_open_their_engines_into_the_pool_they_are_loaded_in(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    from enginefarm.backends import get_backend
    from tests.backends.test_tensorrt import build_one, jobs_of, recipe, unpacked

    (job,) = jobs_of(recipe(write_recipe, tiny_sd, targets=("tensorrt:sm_89",), precisions=("fp32",)), tmp_path)
    result, store = build_one(job, tmp_path)
    folder = unpacked(tmp_path, store, result.manifest)
    backend, latent = get_backend("tensorrt"), np.zeros((1, 4, 8, 8), np.float32)
    fake_nvidia.clear()
    alone = backend.load(folder, result.manifest, "sm_89")
    pool = SharedActivations()
    with sharing(pool):
        shared = backend.load(folder, result.manifest, "sm_89")
    strategies = [c["strategy"] for c in fake_nvidia.calls("create_execution_context")]
    assert strategies == ["STATIC", "USER_MANAGED"]
    assert np.array_equal(shared.run({"latent": latent})["sample"], alone.run({"latent": latent})["sample"])
    memory = shared.device_memory()
    assert memory.shared and pool.allocated == memory.activations > 0
    assert fake_nvidia.calls("set_device_memory")[-1] == {
        "sdk": "tensorrt",
        "call": "set_device_memory",
        "size": memory.activations,
        "ok": True,
    }
    plan = next(f for f in result.manifest.files if f.role == "engine")
    assert 0 < memory.weights < plan.size  # the SDK's weights figure (TOTAL_WEIGHTS_SIZE), not the plan's size
    shared.close()
    assert pool.allocated == 0 and shared.device_memory() is None
