"""Seeded photo-like test images for the filters."""

from __future__ import annotations

import numpy as np


def scene(seed: int, height: int = 192, width: int = 256, noise: float = 0.03) -> np.ndarray:
    """A photo-like float image [H, W, 3] in [0, 1]: a shaded background, discs and rotated boxes, sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width].astype(np.float32)
    image = rng.uniform(0, 1, 3) + (xx / width)[:, :, None] * rng.uniform(-0.3, 0.3, 3)
    for _ in range(12):
        colour, cy, cx = rng.uniform(0, 1, 3), rng.uniform(0, height), rng.uniform(0, width)
        if rng.random() < 0.5:
            inside = (yy - cy) ** 2 + (xx - cx) ** 2 < rng.uniform(10, 60) ** 2
        else:
            angle = rng.uniform(0, np.pi)
            u = (xx - cx) * np.cos(angle) + (yy - cy) * np.sin(angle)
            v = (yy - cy) * np.cos(angle) - (xx - cx) * np.sin(angle)
            inside = (abs(u) < rng.uniform(10, 60)) & (abs(v) < rng.uniform(10, 60))
        image[inside] = image[inside] * 0.3 + colour * 0.7
    image += rng.normal(0, noise, image.shape)
    return np.clip(image, 0, 1).astype(np.float32)
