"""Backends on hardware this CI does not have. Run them where it exists: ENGINEFARM_TEST_HARDWARE=intel-gpu make
test."""

from __future__ import annotations

import numpy as np
import pytest

import enginefarm


@pytest.mark.hardware("intel-gpu")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_openvino_gpu_end_to_end(tiny_recipe, cli, precision):
    cli("build", str(tiny_recipe(precisions=(precision,), targets=("openvino:gpu",))), check=True)
    session = enginefarm.load("tiny-sd/decoder", precision=precision, device="intel", target="openvino:gpu")
    out = session.run({"latent": np.zeros((2, 4, 32, 32), np.float32)})["sample"]
    assert out.shape == (2, 3, 64, 64) and np.isfinite(out).all()


@pytest.mark.hardware("intel-npu")
def test_openvino_npu_end_to_end(tiny_recipe, cli):
    cli("build", str(tiny_recipe(precisions=("fp16",), targets=("openvino:npu",))), check=True)
    session = enginefarm.load("tiny-sd/decoder", device="intel", target="openvino:npu")
    assert session.run({"latent": np.zeros((1, 4, 16, 16), np.float32)})["sample"].shape == (1, 3, 32, 32)
