"""Validation inputs that look like the data: seeded, reproducible, inside the range the recipe declares.

Uniform noise is a poor stand-in for an image: a text detector answers it with a probability map of ~1e-8
everywhere, where nothing can be told apart. A 4-D float input with 1 or 3 channels (NCHW or NHWC) therefore
gets an image-like field by default: smooth shading, a few flat regions with sharp edges, thin dark strokes
(text, outlines) and a little grain. Everything else gets uniform noise, integers or booleans.
"""

from __future__ import annotations

import numpy as np

IMAGE_CHANNELS = (1, 3)


def image_layout(shape: list[int] | tuple[int, ...], dtype: str) -> str | None:
    """ "nchw" or "nhwc" when the input reads as a batch of 1- or 3-channel images, else None."""
    if len(shape) != 4 or not dtype.startswith(("float", "bfloat")):
        return None
    if shape[1] in IMAGE_CHANNELS and min(shape[2], shape[3]) >= 8:
        return "nchw"
    if shape[3] in IMAGE_CHANNELS and min(shape[1], shape[2]) >= 8:
        return "nhwc"
    return None


def image_like(shape: list[int], layout: str, low: float, high: float, rng: np.random.Generator) -> np.ndarray:
    """A batch of synthetic images in [low, high], laid out as `layout` ("nchw" or "nhwc")."""
    batch, channels, height, width = (
        (shape[0], shape[1], shape[2], shape[3]) if layout == "nchw" else (shape[0], shape[3], shape[1], shape[2])
    )
    images = np.stack([_one_image(channels, height, width, rng) for _ in range(batch)])  # N, C, H, W in [0, 1]
    if layout == "nhwc":
        images = images.transpose(0, 2, 3, 1)
    return (low + (high - low) * images).astype(np.float32)


def _one_image(channels: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    y = np.linspace(0.0, 1.0, height)[:, None]
    x = np.linspace(0.0, 1.0, width)[None, :]
    light = np.zeros((height, width))
    for _ in range(4):  # smooth shading: a few low-frequency waves
        fy, fx = rng.uniform(0.3, 2.5, size=2)
        light += rng.uniform(0.5, 1.0) * np.cos(2 * np.pi * (fy * y + fx * x) + rng.uniform(0, 2 * np.pi))
    light = 0.35 + 0.3 * (light - light.min()) / max(float(np.ptp(light)), 1e-9)
    tint = rng.uniform(0.7, 1.0, size=channels) if channels > 1 else np.ones(1)
    image = np.repeat(light[None], channels, axis=0) * tint[:, None, None]
    for _ in range(int(rng.integers(2, 6))):  # flat objects with sharp edges
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        tall, wide = (
            int(rng.integers(height // 8 + 1, height // 2 + 2)),
            int(rng.integers(width // 8 + 1, width // 2 + 2)),
        )
        image[:, top : top + tall, left : left + wide] = rng.uniform(0.0, 1.0, size=(channels, 1, 1))
    stroke = max(1, min(height, width) // 40)
    for _ in range(int(rng.integers(3, 9))):  # thin dark strokes: lines of text, outlines
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        if rng.random() < 0.7:
            image[:, top : top + stroke, left : left + int(rng.integers(width // 6 + 1, width // 2 + 2))] = rng.uniform(
                0.0, 0.15
            )
        else:
            image[:, top : top + int(rng.integers(height // 6 + 1, height // 2 + 2)), left : left + stroke] = (
                rng.uniform(0.0, 0.15)
            )
    image += rng.normal(0.0, 0.02, size=image.shape)  # sensor grain
    return np.clip(image, 0.0, 1.0)


def noise(shape: list[int], dtype: str, low: float, high: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform values in [low, high] (integers inclusive), or random booleans."""
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def fit(array: np.ndarray, shape: list[int], dtype: str) -> np.ndarray:
    """Tile or crop a real sample to the profile corner's shape."""
    array = np.asarray(array)
    if list(array.shape) == list(shape):
        return array.astype(dtype)
    if array.ndim != len(shape):
        raise ValueError(f"sample of shape {array.shape} has the wrong rank for {shape}")
    reps = [-(-want // have) for want, have in zip(shape, array.shape, strict=True)]
    tiled = np.tile(array, reps)
    return tiled[tuple(slice(0, n) for n in shape)].astype(dtype)
