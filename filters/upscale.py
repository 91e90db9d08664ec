"""Upscalers (ESRGAN, Real-ESRGAN, the compact SRVGG nets): an image in, the image `scale` times larger out. An
image the engine's profile holds runs whole; a larger one (or any, with `tile=`) runs in overlapping tiles blended
with linear ramps, so memory beside the result stays one tile's. A window-attention net (SwinIR, HAT, DAT) is built for
one fixed tile (`details["tile"]`): it always runs in tiles of exactly that side, the last ones and smaller images
padded by reflection."""

from __future__ import annotations

import math

import numpy as np

from enginefarm.errors import ConfigError

from .base import Filter
from .lanczos import lanczos4

INPUT, OUTPUT = "image", "upscaled"


class Upscaler(Filter):
    """`up(image)` → the image `up.scale` times larger. `image`: float [H, W, 3] in [0, 1] (what a Pipeline returns);
    the result is float32 [H·scale, W·scale, 3], clipped to [0, 1]."""

    kind = "upscaler"

    def __init__(self, info, sessions, uses=None):
        super().__init__(info, sessions, uses)
        self.scale = int(info.details["scale"])
        # what each side must be a multiple of (Real-ESRGAN x2plus packs 2x2 pixels into channels first)
        self.multiple = int(info.details.get("multiple", 1))
        self.session = sessions[info.components[0]]
        bounds = self.session.artifact.profile[INPUT]
        self.smallest = (int(bounds["min"][2]), int(bounds["min"][3]))
        self.largest = (int(bounds["max"][2]), int(bounds["max"][3]))
        # the one side a fixed-size net was traced at (its graph is right at no other), None for a convolutional net
        self.fixed_tile = int(info.details["tile"]) if info.details.get("tile") else None

    def __call__(
        self, image: np.ndarray, tile: int | None = None, overlap: int | None = None, outscale: float | None = None
    ) -> np.ndarray:
        """`image` upscaled. Whole when it fits the engine's profile; else, or with `tile=N`, in N×N tiles
        overlapping by `overlap` pixels (default N/4) and blended, the seams within 2e-2 of the whole image's result.
        Sides the model cannot take (odd ones for x2plus, ones under the profile's minimum) are padded by reflection
        and the padding cropped from the result. `outscale`: the final size as a factor of the input's, when it is
        not the model's (an x4 model asked for 2x): the model's output resized with Lanczos as Real-ESRGAN's helper
        does (`int(side * outscale)` pixels)."""
        if outscale is not None and not (isinstance(outscale, int | float) and 0 < outscale <= 16):
            raise ConfigError(f"outscale {outscale!r} is not a factor", hint="e.g. outscale=2 (0 < outscale <= 16)")
        image = _as_image(image)
        height, width = image.shape[:2]
        padded = _pad(image, *(_ceil(n, self.multiple) for n in (height, width)))
        if tile is None and all(n <= top for n, top in zip(padded.shape[:2], self.largest, strict=True)):
            result = self._run(padded)
        else:
            tile = self._tile_side(tile)
            # a window-attention net's tile edges reach further in (its shifted windows wrap there): half a tile
            overlap = (tile // 2 if self.fixed_tile else tile // 4) if overlap is None else int(overlap)
            if not 0 <= overlap < tile:
                raise ConfigError(f"overlap {overlap} must be at least 0 and less than the tile, {tile}")
            result = self._tiled(padded, tile, overlap)
        result = np.clip(result[: height * self.scale, : width * self.scale], 0.0, 1.0)
        if outscale is not None and outscale != self.scale:  # clipped first, as Real-ESRGAN's helper resizes 8 bits
            result = np.clip(lanczos4(result, int(height * outscale), int(width * outscale)), 0.0, 1.0)
        return result

    def _tile_side(self, tile: int | None) -> int:
        if self.fixed_tile is not None:
            if tile is not None and int(tile) != self.fixed_tile:
                raise ConfigError(
                    f"tile {tile}: {self.name} ({self.info.architecture}) runs in tiles of exactly "
                    f"{self.fixed_tile} pixels, the size it was exported for",
                    hint=f"leave tile unset (or tile={self.fixed_tile}); export it again for another tile",
                )
            return self.fixed_tile
        low, high = max(self.smallest), min(self.largest)
        side = high if tile is None else int(tile)
        if not low <= side <= high or side % self.multiple:
            multiple = f", a multiple of {self.multiple}" if self.multiple > 1 else ""
            raise ConfigError(
                f"tile {side} is outside what {self.name}'s engine takes ({low}..{high} pixels a side{multiple})",
                hint=f"use tile={_ceil(low, self.multiple)}..{high}, or rebuild it with a larger profile",
            )
        return side

    def _run(self, image: np.ndarray) -> np.ndarray:
        """One engine run on `image` (sides multiples of `multiple`), padded up to the profile's minimum; the
        result unclipped, cropped to `image`'s sides × scale."""
        height, width = image.shape[:2]
        padded = _pad(image, max(height, self.smallest[0]), max(width, self.smallest[1]))
        feed = np.ascontiguousarray(padded.transpose(2, 0, 1)[None], dtype=np.float32)
        out = self.session.run({INPUT: feed})[OUTPUT]
        return np.asarray(out[0, :, : height * self.scale, : width * self.scale], dtype=np.float32).transpose(1, 2, 0)

    def _tiled(self, image: np.ndarray, tile: int, overlap: int) -> np.ndarray:
        s = self.scale
        rows = _axis_tiles(image.shape[0], tile, overlap, self.multiple, s)
        columns = _axis_tiles(image.shape[1], tile, overlap, self.multiple, s)
        result = np.zeros((image.shape[0] * s, image.shape[1] * s, 3), np.float32)
        for top, tile_height, row_weight in rows:
            for left, tile_width, column_weight in columns:
                patch = self._run(image[top : top + tile_height, left : left + tile_width])
                weight = row_weight[:, None, None] * column_weight[None, :, None]
                result[top * s : (top + tile_height) * s, left * s : (left + tile_width) * s] += patch * weight
        return result


def _axis_tiles(side: int, tile: int, overlap: int, multiple: int, scale: int) -> list[tuple[int, int, np.ndarray]]:
    """The tiles along one axis: (start, size, blending weight per output pixel). Each tile's weight ramps up across
    its overlap with the one before and down across the next (`_ramp`); the weights are then divided by their sum, so
    along the axis they add up to 1 at every pixel, and their products do over the image."""
    if side <= tile:
        return [(0, side, np.ones(side * scale, np.float32))]
    count = math.ceil((side - overlap) / (tile - overlap))
    # evenly spread starts, on the model's multiple so each tile packs pixels as the whole image would
    starts = sorted(
        {min(side - tile, round(k * (side - tile) / (count - 1) / multiple) * multiple) for k in range(count)}
    )
    total = np.zeros(side * scale, np.float64)
    ramps = []
    for index, start in enumerate(starts):
        position = np.arange(tile * scale) + 0.5
        weight = np.ones(tile * scale)
        if index > 0:
            weight = np.minimum(weight, _ramp(position, (starts[index - 1] + tile - start) * scale))
        if index < len(starts) - 1:
            weight = np.minimum(weight, _ramp(tile * scale - position, (start + tile - starts[index + 1]) * scale))
        total[start * scale : (start + tile) * scale] += weight
        ramps.append(weight)
    return [
        (start, tile, (weight / total[start * scale : (start + tile) * scale]).astype(np.float32))
        for start, weight in zip(starts, ramps, strict=True)
    ]


def _ramp(distance: np.ndarray, overlap: int) -> np.ndarray:
    """A tile's weight at `distance` from its edge inside an overlap of `overlap` pixels: 0 across the outer quarter
    (where the model saw the tile's edge instead of the image around it), rising linearly to 1 across the middle
    half; the neighbouring tile's weight is its mirror image, so the two add up to 1."""
    if overlap <= 0:
        return np.ones_like(distance)
    return np.clip((distance - overlap / 4) / (overlap / 2), 0.0, 1.0)


def _ceil(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """`image` grown to height × width at its bottom and right edges by reflection (repeating the edge where the
    image is too small to reflect)."""
    extra = ((0, height - image.shape[0]), (0, width - image.shape[1]), (0, 0))
    if extra[0][1] == 0 and extra[1][1] == 0:
        return image
    fits = extra[0][1] < image.shape[0] and extra[1][1] < image.shape[1]
    return np.pad(image, extra, mode="reflect" if fits else "symmetric")


def _as_image(image) -> np.ndarray:
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 1:
        raise ConfigError(
            f"an upscaler takes an RGB image [height, width, 3]; this one is {list(array.shape)}",
            hint="pass the float image a Pipeline returns, or np.asarray(PIL_image) / 255",
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ConfigError(
            f"an upscaler takes a float image in [0, 1]; this one is {array.dtype}",
            hint="divide 8-bit pixels by 255: image.astype(np.float32) / 255",
        )
    return array.astype(np.float32, copy=False)
