"""Canny edges in numpy, as OpenCV's `cv2.Canny(image, low, high)` finds them on 8-bit images (what
controlnet-aux's CannyDetector and diffusers' ControlNet examples run on a photo): a 3x3 Sobel gradient with the
border replicated, its L1 (default) or L2 magnitude, non-maximum suppression in four directions with OpenCV's
fixed-point angle test, and hysteresis over 8-connected pixels. A colour image is taken per channel, each pixel
keeping the channel with the largest gradient, as OpenCV does.

    edges = canny(image)  # float [H, W, 3] in [0, 1] → float32 [H, W] of 0 and 1
    control = canny_control(image)  # [H, W, 3], the ControlNet's control image
"""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

# OpenCV's fixed-point tangent of 22.5° (canny.cpp: CANNY_SHIFT 15, TG22 = round(0.4142135623730950488 * 2^15))
_SHIFT = 15
_TG22 = 13573


def canny(image: np.ndarray, low: float = 100, high: float = 200, l2_gradient: bool = False) -> np.ndarray:
    """The edges of `image` (float [H, W, 3] or [H, W] in [0, 1], or uint8) as float32 [H, W] of 0 and 1, equal
    to `cv2.Canny(uint8_image, low, high, L2gradient=l2_gradient) / 255`. A float image becomes 8-bit as a PNG
    writer rounds it."""
    pixels = _uint8(image)
    if low < 0 or high < 0:
        raise ConfigError(f"canny thresholds {low}, {high}: must not be negative", hint="e.g. low=100, high=200")
    if low > high:  # OpenCV swaps them too
        low, high = high, low
    if l2_gradient:  # compared with the squared magnitude, as OpenCV does
        low, high = min(low, 32767.0) ** 2, min(high, 32767.0) ** 2
    low_int, high_int = int(np.floor(low)), int(np.floor(high))
    dx, dy, magnitude = _gradient(pixels, l2_gradient)
    candidate = _local_maxima(dx, dy, magnitude) & (magnitude > low_int)
    strong = candidate & (magnitude > high_int)
    return _hysteresis(candidate, strong).astype(np.float32)


def canny_control(image: np.ndarray, low: float = 100, high: float = 200, l2_gradient: bool = False) -> np.ndarray:
    """The ControlNet control image of `image`'s edges: float32 [H, W, 3] in {0, 1}, white edges on black."""
    edges = canny(image, low, high, l2_gradient)
    return np.repeat(edges[:, :, None], 3, axis=2)


def _uint8(image: np.ndarray) -> np.ndarray:
    """[H, W, C] uint8 (C = 1 or 3) from a float image in [0, 1] or an 8-bit one."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or min(image.shape[:2]) < 1:
        raise ConfigError(
            f"canny: an image of shape {image.shape}", hint="give float [H, W, 3] in [0, 1] or [H, W] grayscale"
        )
    image = image[:, :, :3]
    if image.dtype == np.uint8:
        return image
    return (np.clip(image.astype(np.float32), 0, 1) * 255 + 0.5).astype(np.uint8)


def _gradient(pixels: np.ndarray, l2: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sobel dx, dy and magnitude (int32 [H, W]: |dx| ≤ 1020, so OpenCV's fixed-point products stay below 2^27);
    per pixel the channel with the largest magnitude (the first on a tie)."""
    p = np.pad(pixels.astype(np.int32), ((1, 1), (1, 1), (0, 0)), mode="edge")
    # separable 3x3 Sobel: smooth [1 2 1] across, difference [-1 0 1] along
    rows = p[:-2] + 2 * p[1:-1] + p[2:]  # smoothed vertically: [H, W+2, C]
    cols = p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]  # smoothed horizontally: [H+2, W, C]
    dx = rows[:, 2:] - rows[:, :-2]
    dy = cols[2:] - cols[:-2]
    magnitude = dx * dx + dy * dy if l2 else np.abs(dx) + np.abs(dy)
    if magnitude.shape[2] == 1:
        return dx[:, :, 0], dy[:, :, 0], magnitude[:, :, 0]
    pick = np.argmax(magnitude, axis=2)[:, :, None]  # argmax takes the first of equal values, as OpenCV's scan
    take = lambda a: np.take_along_axis(a, pick, axis=2)[:, :, 0]  # noqa: E731
    return take(dx), take(dy), take(magnitude)


def _local_maxima(dx: np.ndarray, dy: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """OpenCV's non-maximum suppression: each pixel against its two neighbours across the edge (outside the image
    counts 0); strictly above the one before, at least the one after, diagonals strictly above both."""
    m = np.pad(magnitude, 1)
    h, w = magnitude.shape
    at = lambda di, dj: m[1 + di : 1 + di + h, 1 + dj : 1 + dj + w]  # noqa: E731
    x = np.abs(dx)
    y = np.abs(dy) << _SHIFT
    tg22x = x * _TG22
    tg67x = tg22x + (x << (_SHIFT + 1))
    horizontal = y < tg22x
    vertical = ~horizontal & (y > tg67x)
    diagonal = ~horizontal & ~vertical
    same_sign = (dx ^ dy) >= 0  # OpenCV's s = +1: the neighbours up-left and down-right
    keep_h = (magnitude > at(0, -1)) & (magnitude >= at(0, 1))
    keep_v = (magnitude > at(-1, 0)) & (magnitude >= at(1, 0))
    keep_d = np.where(
        same_sign,
        (magnitude > at(-1, -1)) & (magnitude > at(1, 1)),
        (magnitude > at(-1, 1)) & (magnitude > at(1, -1)),
    )
    return (horizontal & keep_h) | (vertical & keep_v) | (diagonal & keep_d)


def _hysteresis(candidate: np.ndarray, strong: np.ndarray) -> np.ndarray:
    """The candidates 8-connected to a strong pixel, grown frontier by frontier over flat indices (each step costs
    the frontier's size, not the image's)."""
    h, w = candidate.shape
    width = w + 2  # a false border so that neighbours of flat indices never wrap a row
    weak = np.pad(candidate, 1).ravel()
    edge = np.pad(strong, 1).ravel()
    steps = np.array([di * width + dj for di in (-1, 0, 1) for dj in (-1, 0, 1) if di or dj])
    frontier = np.flatnonzero(edge)
    while frontier.size:
        near = np.unique((frontier[:, None] + steps).ravel())
        near = near[weak[near] & ~edge[near]]
        edge[near] = True
        frontier = near
    return edge.reshape(h + 2, width)[1:-1, 1:-1]
