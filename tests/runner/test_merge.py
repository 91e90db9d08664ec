"""runner/merge.py's low-rank path (the initializer's layout and dtype, in row chunks) against the general merge
(LoraLayer.apply in the checkpoint's layout, one layer after another, float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginefarm.formats.weightmap import Mapped
from enginefarm.runner import merge
from enginefarm.runner.lora import LoraLayer
from enginefarm.weights.lora_layer import LoRA
from tests import models

LINEAR = Mapped("onnx::MatMul_1", True, (700, 300), (300, 700))  # ONNX holds a Linear transposed: [in, out]
CONV = Mapped("conv.weight", False, (96, 64, 3, 3), (96, 64, 3, 3))


def stack(m: Mapped) -> list[tuple[LoraLayer, float]]:
    """Two LoRAs on one weight (ranks 8 and 4, one with alpha), strengths of both signs: one product of rank 12."""
    items = []
    for seed, rank, alpha, strength in ((1, 8, 4.0, 0.7), (2, 4, None, -1.3)):
        up, down = models.lora_pair(m.shape, rank, seed)
        layer = LoRA("m", "unet", "m", {"up": up, "down": down}, alpha)
        items.append((LoraLayer("m.weight", layer, Path("lora.safetensors")), strength))
    return items


def general(m: Mapped, base: np.ndarray, items) -> np.ndarray:
    value = m.from_onnx(base)
    for layer, strength in items:
        value = layer.apply(value, strength)
    return m.to_onnx(value)


@pytest.mark.parametrize("m", [LINEAR, CONV], ids=["linear", "conv3x3"])
def test_the_chunked_low_rank_merge_is_the_general_merge(m):
    items = stack(m)
    assert merge._low_rank(m, items)
    base = np.random.default_rng(0).normal(0, 1, m.onnx_shape).astype(np.float32)
    a, b = merge._factors(m, items)
    rows = a.shape[0]
    assert rows > 2 * max(
        1, merge.SINGLE_THREADED_PRODUCT // (b.shape[1] * a.shape[1])
    )  # several chunks and a remainder
    fast = merge._merge_chunked(base, a, b, None)
    assert fast.dtype == np.float32
    np.testing.assert_allclose(fast.reshape(m.onnx_shape), general(m, base, items), rtol=1e-5, atol=1e-5)
    assert np.abs(fast.reshape(m.onnx_shape) - base).max() > 0.1  # it changed the weight
    # An fp16 weight is read as stored and merged in float32: one rounding, to the stored dtype, at the end.
    half = base.astype(np.float16)
    stored = merge._merge_chunked(half, a, b, None)
    assert stored.dtype == np.float16
    np.testing.assert_array_equal(stored, merge._merge_chunked(half, a, b, np.float32).astype(np.float16))
    np.testing.assert_allclose(
        stored.reshape(m.onnx_shape).astype(np.float32), general(m, half, items), rtol=1e-3, atol=2e-3
    )


def test_overflow_in_the_stored_dtype_is_none():
    items = stack(LINEAR)
    a, b = merge._factors(LINEAR, items)
    base = np.zeros(LINEAR.onnx_shape, np.float16)
    assert merge._merge_chunked(base, a * 1e3, b * 1e3, None) is None  # past 65504 in fp16
    assert np.isfinite(merge._merge_chunked(base, a * 1e3, b * 1e3, np.float32)).all()  # fine in float32
    assert (
        merge._merge_chunked(base, a * 1e25, b * 1e25, np.float32) is None
    )  # past float32: caught by the factors' bound


def test_dora_tucker_and_fused_blocks_take_the_general_path():
    ((layer, strength),) = stack(LINEAR)[:1]
    dora = LoRA("m", "unet", "m", {**layer.layer.t, "dora": np.ones(700, np.float32)}, None)
    assert not merge._low_rank(LINEAR, [(LoraLayer("m.weight", dora, Path("d")), 1.0)])
    assert not merge._low_rank(Mapped("qkv", True, (700, 300), (300, 2100), (1, 0, 700)), [(layer, strength)])
    assert not merge._low_rank(LINEAR, [])
