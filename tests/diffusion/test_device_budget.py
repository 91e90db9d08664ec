"""A memory budget on a GPU counts the GPU's memory: SDXL's TensorRT engines on a fake GPU of 8 GB, with real-size
numbers (the published parameter counts in fp16, the VAE in fp32 as the family builds it, and activation sizes) on
tiny graphs that really run. The fake SDK's ledger (tests/fakes/cuda) counts what the real one would allocate."""

from __future__ import annotations

import importlib

import numpy as np

from enginefarm.backends.nvidia.activations import SharedActivations, sharing
from enginefarm.builder.catalog_plan import PARAMETERS, VAE_CHANNELS
from enginefarm.builder.memory import image_activation_bytes
from enginefarm.diffusion.budget import Residency, parse_budget
from tests.nvidia_fakes import fake_plans, open_fake_session

GPU = 8 * 10**9  # "8 GB"
SDXL = PARAMETERS["sdxl-base-1.0"]
MIB = 1 << 20
# (weights, activations) bytes. Activations cannot be read without a GPU (the real SDK deserializes nothing here): the
# VAE's are the farm's own figure at 1024 px (builder/memory.py), the others stand-ins of a plausible size.
SIZES = {
    "text_encoder": (SDXL["text_encoder"] * 2, 64 * MIB),
    "text_encoder_2": (SDXL["text_encoder_2"] * 2, 128 * MIB),
    "unet": (SDXL["unet"] * 2, 1280 * MIB),
    "vae_decoder": (SDXL["vae_decoder"] * 4, image_activation_bytes(VAE_CHANNELS, 1024 * 1024 / 1e6)),
}
STAGES = [("text_encoder", "text_encoder_2"), ("unet",), ("vae_decoder",)]
LATENT = np.random.default_rng(0).uniform(-1, 1, (1, 4, 16, 16)).astype(np.float32)


def _generate(sessions: dict, stage_ready, gpu, residency=None) -> list:
    """Two images' stages as the pipeline runs them (the UNet twice: two steps); checks the budget's accounting
    against the ledger after every stage."""
    outputs = []
    for _ in range(2):
        for stage in STAGES:
            stage_ready(stage)
            for component in stage:
                for _ in range(2 if component == "unet" else 1):
                    outputs.append(sessions[component].run({"latent": LATENT})["sample"])
            if residency is not None:
                assert residency.peak(list(sessions)) == gpu.USED[0]  # what it counts is what the GPU holds
    return outputs


def test_a_budget_keeps_sdxl_within_an_8_gb_gpu_where_loading_everything_does_not(fake_nvidia, tiny_sd, tmp_path):
    plans = fake_plans(fake_nvidia, tiny_sd, tmp_path / "plans", SIZES, "tensorrt_rtx")
    trt = importlib.import_module("tensorrt_rtx")
    from cuda.bindings import runtime as gpu

    pool = SharedActivations()

    def load(component: str):
        with sharing(pool):
            return open_fake_session(trt, plans[component])

    def unbudgeted(opener) -> tuple[list, int]:
        """No budget: everything loaded up front, as `Pipeline.load` does without one."""
        everything = {component: opener(component) for component in SIZES}
        gpu.reset_peak()
        outputs = _generate(everything, lambda stage: None, gpu)
        for session in everything.values():
            session.close()
        everything.clear()
        assert gpu.USED[0] == 0  # all given back
        return outputs, gpu.PEAK[0]

    _, unshared = unbudgeted(lambda component: open_fake_session(trt, plans[component]))  # each its own activations
    reference, shared = unbudgeted(load)
    weights = sum(w for w, _ in SIZES.values())
    largest = max(a for _, a in SIZES.values())
    # one shared activation buffer: the weights plus the largest activations (and our few input/output bytes)
    assert weights + largest < shared < weights + largest + MIB
    assert unshared > weights + sum(a for _, a in SIZES.values()) > shared > GPU

    fake_nvidia.monkeypatch.setenv("FAKE_CUDA_MEMORY", str(GPU))  # the GPU has 8 GB: past it, allocations fail
    gpu.reset_peak()
    sessions: dict = {}
    # before its first load a component's plan is all it knows of it: 1.5x its files (`artifact_bytes`)
    residency = Residency(GPU, load, sessions, lambda component: int(1.5 * SIZES[component][0]))
    budgeted = _generate(sessions, residency.need, gpu, residency)
    assert gpu.PEAK[0] <= GPU
    assert all(np.array_equal(a, b) for a, b in zip(budgeted, reference, strict=True))
    assert residency.loads > len(SIZES)  # the price: reloads (the second image loads some components again)
    for session in sessions.values():
        session.close()
    sessions.clear()
    peak = gpu.PEAK[0]

    gpu.reset_peak()  # "auto": 90% of the host's memory until the first engine says how much the GPU has free
    auto = Residency(parse_budget("auto"), load, sessions, lambda component: int(1.5 * SIZES[component][0]), True)
    outputs = _generate(sessions, auto.need, gpu, auto)
    assert all(np.array_equal(a, b) for a, b in zip(outputs, reference, strict=True))
    assert auto.budget == int(0.9 * GPU) and gpu.PEAK[0] <= auto.budget
    print(
        f"SDXL on TensorRT-RTX, fake 8 GB GPU: peak {shared / 1e9:.2f} GB without a budget "
        f"({unshared / 1e9:.2f} GB without the shared activation buffer), "
        f"{peak / 1e9:.2f} GB with one ({residency.loads} loads for 2 images), {gpu.PEAK[0] / 1e9:.2f} GB with auto "
        f"({auto.loads} loads)"
    )
