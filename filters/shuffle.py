"""Content shuffle (the `shuffle` ControlNet's control image) in numpy, as controlnet-aux's ContentShuffleDetector
makes it with OpenCV: two smooth random fields (uniform noise on a coarse grid, enlarged with cv2's bicubic resize)
scaled to the image's width and height say, for each pixel, which pixel of the photo to take (cv2.remap, bilinear).
No network: `enginefarm.filters.control_from(photo, "shuffle", seed=...)`."""

from __future__ import annotations

import numpy as np

FREQUENCY = 256  # controlnet-aux's f: the noise grid's spacing in pixels, at its 512-pixel detect resolution


def content_shuffle(image: np.ndarray, seed: int | None = None, frequency: int = FREQUENCY) -> np.ndarray:
    """A photo float [H, W, 3] in [0, 1] → its shuffled control image float32 [H, W, 3], from `seed`'s noise (a
    new shuffle each call without one)."""
    image = np.asarray(image, np.float32)
    height, width = image.shape[:2]
    rng = np.random.default_rng(seed)
    grid = (height // frequency + 2, width // frequency + 2)
    x = noise_disk(rng.uniform(size=grid), height, width, frequency) * (width - 1)
    y = noise_disk(rng.uniform(size=grid), height, width, frequency) * (height - 1)
    return remap(image, x, y)


def noise_disk(noise: np.ndarray, height: int, width: int, frequency: int) -> np.ndarray:
    """controlnet-aux's make_noise_disk for one channel from its coarse `noise`: enlarged to the image plus a
    `frequency` margin each side (cv2.resize INTER_CUBIC), the margin cropped off, scaled to [0, 1]."""
    big = cubic_resize(noise, (height + 2 * frequency, width + 2 * frequency))
    field = big[frequency : frequency + height, frequency : frequency + width]
    field = field - field.min()
    return field / field.max()


def cubic_resize(values: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """cv2.resize(values, size, interpolation=INTER_CUBIC) of a 2-D array: Keys' cubic (a = -0.75) at half-pixel
    centres, edge pixels repeated, no widening when shrinking."""
    rows = _cubic_weights(values.shape[0], size[0])
    cols = _cubic_weights(values.shape[1], size[1])
    return rows @ np.asarray(values, np.float64) @ cols.T


def _cubic_weights(size_in: int, size_out: int) -> np.ndarray:
    position = (np.arange(size_out) + 0.5) * (size_in / size_out) - 0.5
    start = np.floor(position).astype(np.int64)
    t = position - start
    a = -0.75
    near = lambda d: ((a + 2) * d - (a + 3)) * d * d + 1  # noqa: E731  |d| < 1
    far = lambda d: ((a * d - 5 * a) * d + 8 * a) * d - 4 * a  # noqa: E731  1 <= |d| < 2
    weights = np.zeros((size_out, size_in))
    for offset, weight in ((-1, far(1 + t)), (0, near(t)), (1, near(1 - t)), (2, far(2 - t))):
        np.add.at(weights, (np.arange(size_out), np.clip(start + offset, 0, size_in - 1)), weight)
    return weights


def remap(image: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """cv2.remap(image, (x, y), INTER_LINEAR): each output pixel is `image` at (x, y), bilinear (as OpenCV 5 does;
    OpenCV 4 first rounds the coordinates to 1/32 pixel); the coordinates here always fall inside the image."""
    height, width = image.shape[:2]
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x0 = np.clip(np.floor(x).astype(np.int64), 0, width - 1)
    y0 = np.clip(np.floor(y).astype(np.int64), 0, height - 1)
    tx, ty = (x - x0)[:, :, None], (y - y0)[:, :, None]
    x1, y1 = np.minimum(x0 + 1, width - 1), np.minimum(y0 + 1, height - 1)
    top = image[y0, x0] * (1 - tx) + image[y0, x1] * tx
    bottom = image[y1, x0] * (1 - tx) + image[y1, x1] * tx
    return (top * (1 - ty) + bottom * ty).astype(np.float32)
