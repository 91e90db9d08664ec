"""The numpy canny against OpenCV's cv2.Canny (the function controlnet-aux's CannyDetector and diffusers' ControlNet
examples run), on seeded photo-like scenes: shapes, shading and noise, in colour and grayscale."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.filters.canny import canny, canny_control

from .scenes import scene

cv2 = pytest.importorskip("cv2")


def to_uint8(image: np.ndarray) -> np.ndarray:
    return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("colour", [True, False], ids=["rgb", "gray"])
@pytest.mark.parametrize(("low", "high", "l2"), [(100, 200, False), (50, 150, True), (20.7, 60.2, False)])
def test_canny_equals_opencv(seed, colour, low, high, l2):
    image = scene(seed, noise=0.03 if low >= 50 else 0.06)
    pixels = to_uint8(image)
    if not colour:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
    reference = cv2.Canny(pixels, low, high, L2gradient=l2) / 255.0
    assert reference.sum() > 500  # the scene has edges to find
    ours = canny(pixels, low, high, l2_gradient=l2)
    assert ours.dtype == np.float32 and ours.shape == reference.shape
    assert int((ours != reference).sum()) == 0
    if colour:  # the float image is made 8-bit as a PNG writer rounds it
        assert np.array_equal(canny(image, low, high, l2_gradient=l2), ours)


def test_canny_on_small_and_flat_images():
    rng = np.random.default_rng(5)
    for shape in [(1, 1), (2, 7), (9, 3), (33, 17)]:
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        assert np.array_equal(canny(pixels, 30, 90), cv2.Canny(pixels, 30, 90) / 255.0)
    assert canny(np.full((16, 16, 3), 0.5, np.float32)).sum() == 0


def test_canny_control_image_and_thresholds():
    image = scene(3)
    control = canny_control(image, 200, 100)  # swapped thresholds are taken as OpenCV takes them
    assert control.shape == (*image.shape[:2], 3) and set(np.unique(control)) == {0.0, 1.0}
    assert np.array_equal(control[:, :, 2], cv2.Canny(to_uint8(image), 100, 200) / 255.0)
    with pytest.raises(ConfigError):
        canny(image, -1, 10)
    with pytest.raises(ConfigError):
        canny(np.zeros((4, 4, 2)))
