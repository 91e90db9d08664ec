"""The Lanczos resize an upscaler uses for another factor than its model's: OpenCV's INTER_LANCZOS4, in numpy."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.filters.lanczos import lanczos4

cv2 = pytest.importorskip("cv2")


@pytest.mark.parametrize(
    ("source", "size"),
    [((40, 52), (20, 26)), ((100, 120), (50, 60)), ((33, 47), (80, 101)), ((17, 9), (8, 4)), ((64, 64), (64, 31))],
)
def test_lanczos4_equals_opencvs(source, size):
    image = np.random.default_rng(sum(source)).random((*source, 3), dtype=np.float32)
    want = cv2.resize(image, (size[1], size[0]), interpolation=cv2.INTER_LANCZOS4)
    got = lanczos4(image, *size)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5


def test_the_same_size_is_the_image():
    image = np.random.default_rng(0).random((12, 14, 3), dtype=np.float32)
    assert np.array_equal(lanczos4(image, 12, 14), image)
