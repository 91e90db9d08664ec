"""Resampling in numpy for the preprocessors: torch's/PIL's antialiased resize (`resize`), OpenCV's INTER_AREA and
Lanczos-4 along one side as matrices (`resize_matrix`, `back_matrix`, applied with `apply_matrices`), and scipy's
Gaussian smoothing (`gaussian_filter`): what controlnet-aux's steps do with torch, OpenCV and scipy, none of which
the runtime has."""

from __future__ import annotations

import numpy as np

from .lanczos import _taps


def resize(image: np.ndarray, size: tuple[int, int], mode: str = "bicubic") -> np.ndarray:
    """[H, W, C] → [h, w, C] as `torch.nn.functional.interpolate(mode, antialias=True, align_corners=False)`
    (and PIL) resample: a separable filter widened by the shrink factor, its weights normalised over the taps
    inside the image."""
    height, width = size
    rows = _weights(image.shape[0], height, mode)
    cols = _weights(image.shape[1], width, mode)
    out = np.einsum("hy,yxc->hxc", rows, image.astype(np.float64), optimize=True)
    return np.einsum("wx,hxc->hwc", cols, out, optimize=True).astype(np.float32)


def _cubic(x: np.ndarray) -> np.ndarray:
    a = -0.5  # the antialiased (PIL) Keys kernel; plain bicubic in torch uses -0.75
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def _linear(x: np.ndarray) -> np.ndarray:
    return np.clip(1 - np.abs(x), 0, None)


_KERNELS = {"bicubic": (_cubic, 2.0), "bilinear": (_linear, 1.0)}


def _weights(size_in: int, size_out: int, mode: str) -> np.ndarray:
    """[size_out, size_in]: row i holds output pixel i's weights over the input pixels."""
    kernel, reach = _KERNELS[mode]
    scale = size_in / size_out
    stretch = max(scale, 1.0)
    centers = scale * (np.arange(size_out) + 0.5)
    first = np.maximum((centers - reach * stretch + 0.5).astype(np.int64), 0)  # torch truncates toward zero
    last = np.minimum((centers + reach * stretch + 0.5).astype(np.int64), size_in)
    taps = np.arange(size_in)
    weights = kernel((taps[None, :] - centers[:, None] + 0.5) / stretch)
    weights *= (taps[None, :] >= first[:, None]) & (taps[None, :] < last[:, None])
    return weights / weights.sum(axis=1, keepdims=True)


def apply_matrices(image: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    out = np.einsum("hy,yxc->hxc", rows, image.astype(np.float32), optimize=True)
    return np.einsum("wx,hxc->hwc", cols, out, optimize=True).astype(np.float32)


def back_matrix(side: int, stride: int, cropped: int, target: int, area: bool) -> np.ndarray:
    """[target, side]: a map's side enlarged by the stride (Lanczos-4), cropped to the unpadded image's side, then
    resized to the photo's side (INTER_AREA where `area`), as one matrix."""
    enlarged = resize_matrix(side, side * stride, area=False)[:cropped]
    return resize_matrix(cropped, target, area) @ enlarged


def resize_matrix(source: int, size: int, area: bool) -> np.ndarray:
    """[size, source]: cv2.resize's weights along one side, INTER_AREA (`area`) or INTER_LANCZOS4."""
    if size == source:
        return np.eye(size, dtype=np.float32)
    if area:
        return area_matrix(source, size)
    index, weights = _taps(source, size)
    matrix = np.zeros((size, source), np.float64)
    np.add.at(matrix, (np.repeat(np.arange(size), index.shape[1]), index.ravel()), weights.ravel())
    return matrix.astype(np.float32)


def area_matrix(source: int, size: int) -> np.ndarray:
    """INTER_AREA's weights: each output pixel the mean of the source span it covers, partial pixels by their share."""
    scale = source / size
    starts = np.arange(size) * scale
    edges = np.arange(source + 1, dtype=np.float64)
    low = np.maximum(edges[None, :-1], starts[:, None])
    high = np.minimum(edges[None, 1:], starts[:, None] + scale)
    matrix = np.clip(high - low, 0, None)
    return (matrix / matrix.sum(axis=1, keepdims=True)).astype(np.float32)


def gaussian_filter(values: np.ndarray, sigma: float = 3.0, truncate: float = 4.0) -> np.ndarray:
    """scipy.ndimage.gaussian_filter of a 2-D float64 map: a separable Gaussian out to `truncate` sigmas, the
    edges mirrored (scipy's "reflect": the edge pixel repeated)."""
    radius = int(truncate * sigma + 0.5)
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    taps /= taps.sum()
    out = np.asarray(values, np.float64)
    for axis in (0, 1):
        pad = [(0, 0), (0, 0)]
        pad[axis] = (radius, radius)
        padded = np.pad(out, pad, mode="symmetric")
        length = out.shape[axis]
        out = sum(taps[k] * np.take(padded, range(k, k + length), axis=axis) for k in range(len(taps)))
    return out


def smart_resize_8bit(image: np.ndarray, side: int) -> np.ndarray:
    """An 8-bit image [h, w, C] (float 0..255) resized to a `side` square as controlnet-aux's smart_resize does with
    OpenCV, to the same 8-bit values: INTER_AREA when the sides' sum shrinks, else Lanczos-4 (its fixed-point 8-bit
    arithmetic)."""
    height, width = image.shape[:2]
    if 2 * side >= height + width:
        return lanczos_8bit(image, side, side)
    resized = apply_matrices(image, resize_matrix(height, side, True), resize_matrix(width, side, True))
    return np.clip(np.floor(resized + 0.5), 0, 255)  # OpenCV rounds to 8 bits


def lanczos_8bit(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """cv2.resize(uint8 image, INTER_LANCZOS4) exactly: OpenCV's float32 Lanczos-4 weights turned into 11-bit
    integers, summed in integers along the rows then the columns, rounded back by 22 bits ([h, w, C] of 0..255
    values → float32 [height, width, C] of 0..255 integers)."""
    rows, row_weights = _fixed_lanczos(image.shape[0], height)
    cols, col_weights = _fixed_lanczos(image.shape[1], width)
    values = np.asarray(image).astype(np.int64)
    across = np.einsum("wk,hwkc->hwc", col_weights, values[:, cols, :])
    both = np.einsum("hk,hkwc->hwc", row_weights, across[rows])
    return np.clip((both + (1 << 21)) >> 22, 0, 255).astype(np.float32)


def _fixed_lanczos(source: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """[size, 8] source indices (clamped) and int weights (x 2048, rounded) as OpenCV's interpolateLanczos4 computes
    them: the position in float32, the taps from its sine identities in double, normalised in float32."""
    s45 = 0.70710678118654752440084436210485
    cs = np.array([(1, 0), (-s45, -s45), (0, 1), (s45, -s45), (-1, 0), (s45, s45), (0, -1), (-s45, s45)])
    position = ((np.arange(size) + 0.5) * (source / size) - 0.5).astype(np.float32)
    start = np.floor(position)
    fraction = (position - start.astype(np.float32)).astype(np.float32)
    y0 = -(fraction.astype(np.float64) + 3) * np.pi * 0.25
    y = -(fraction[:, None] + np.arange(3, -5, -1, dtype=np.float32)).astype(np.float64) * np.pi * 0.25
    with np.errstate(divide="ignore", invalid="ignore"):
        taps = ((cs[:, 0] * np.sin(y0)[:, None] + cs[:, 1] * np.cos(y0)[:, None]) / (y * y)).astype(np.float32)
    taps[fraction < np.finfo(np.float32).eps] = np.eye(8, dtype=np.float32)[3]  # on a source pixel: that pixel
    total = np.zeros(size, np.float32)
    for k in range(8):  # summed in order in float32, as OpenCV
        total = (total + taps[:, k]).astype(np.float32)
    taps = (taps * (np.float32(1) / total)[:, None]).astype(np.float32)
    weights = np.rint(taps * np.float32(2048)).astype(np.int64)
    index = np.clip(start.astype(np.int64)[:, None] + np.arange(-3, 5)[None, :], 0, source - 1)
    return index, weights
