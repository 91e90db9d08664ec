"""Content shuffle in numpy (filters/shuffle.py) against controlnet-aux's ContentShuffleDetector steps with OpenCV
on the same coarse noise: cv2.resize INTER_CUBIC for the noise fields, cv2.remap INTER_LINEAR for the shuffle."""

from __future__ import annotations

import numpy as np
import pytest

import enginefarm.filters
from enginefarm.filters import shuffle

from .scenes import scene

cv2 = pytest.importorskip("cv2")


def aux_noise_disk(noise: np.ndarray, height: int, width: int, frequency: int) -> np.ndarray:
    """controlnet-aux's util.make_noise_disk after its np.random draw (one channel)."""
    size = (width + 2 * frequency, height + 2 * frequency)
    field = cv2.resize(noise, size, interpolation=cv2.INTER_CUBIC)[frequency:-frequency, frequency:-frequency]
    field = field - field.min()
    return field / field.max()


@pytest.mark.parametrize(("height", "width", "frequency"), [(192, 256, 256), (200, 130, 48)])
def test_content_shuffle_matches_controlnet_aux_with_opencv(height, width, frequency):
    rng = np.random.default_rng(height)
    grid = (height // frequency + 2, width // frequency + 2)
    noises = rng.uniform(size=grid), rng.uniform(size=grid)
    fields = [aux_noise_disk(n, height, width, frequency) for n in noises]
    mine = [shuffle.noise_disk(n, height, width, frequency) for n in noises]
    assert max(np.abs(a - b).max() for a, b in zip(fields, mine, strict=True)) < 1e-5
    assert all(f.min() == 0 and f.max() == 1 and f.std() > 0.1 for f in mine)

    photo8 = np.round(scene(5, height, width) * 255).astype(np.uint8)
    flow = np.stack([fields[0] * (width - 1), fields[1] * (height - 1)], axis=2).astype(np.float32)
    expected = cv2.remap(photo8, flow, None, cv2.INTER_LINEAR)
    shuffled = shuffle.remap(photo8 / np.float32(255), mine[0] * (width - 1), mine[1] * (height - 1))
    # OpenCV rounds to 8 bits; a coordinate 1e-5 pixel off moves a value by that much of a neighbour's difference
    assert np.abs(shuffled * 255 - expected).max() < 1.0
    assert np.abs(shuffled * 255 - expected).mean() < 0.3


def test_shuffle_through_control_from_is_seeded():
    photo = scene(6, 96, 128)
    first = enginefarm.filters.control_from(photo, "shuffle", seed=3)
    assert first.shape == (96, 128, 3) and first.dtype == np.float32
    assert np.array_equal(first, enginefarm.filters.control_from(photo, "shuffle", seed=3))
    assert np.abs(first - enginefarm.filters.control_from(photo, "shuffle", seed=4)).mean() > 0.01
    # every value is a blend of the photo's own: within its range per channel
    assert np.all(first >= photo.min(axis=(0, 1)) - 1e-6) and np.all(first <= photo.max(axis=(0, 1)) + 1e-6)
