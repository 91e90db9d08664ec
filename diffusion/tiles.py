"""Tiled VAE: decode (or encode) a large image as overlapping tiles blended linearly, so memory follows the tile,
not the image. The grid and the blend are diffusers' `enable_vae_tiling()` (tiles of the VAE config's
`sample_size` pixels, a quarter overlapping), so a tiled image matches diffusers' tiled one.

One difference: an artifact runs only the sizes its profile covers, and the last tile of a row or column is smaller
than the others (diffusers decodes whatever is left). A remainder below the profile's minimum is decoded from a
tile reaching back into its neighbour, of the minimum size, and cropped to the remainder: the pixels it keeps saw
a little more context than diffusers' small tile gave them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from enginefarm.errors import ConfigError

Run = Callable[[np.ndarray], np.ndarray]  # one NCHW tile in → its NCHW result


@dataclass(frozen=True)
class Tiling:
    """Tile sides in image pixels and in latent pixels (image / the VAE's scale factor), and the overlap."""

    sample: int
    latent: int
    overlap: float = 0.25

    @classmethod
    def from_vae(cls, vae_config: dict, scale_factor: int, tile_pixels: int | None, overlap: float) -> Tiling:
        size = tile_pixels or vae_config.get("sample_size") or 512
        size = int(size[0] if isinstance(size, (list, tuple)) else size)
        if size % scale_factor or size < 2 * scale_factor:
            raise ConfigError(
                f"VAE tiles of {size} pixels: not a multiple of {scale_factor} of at least {2 * scale_factor}",
                hint="tile_pixels=512 suits most VAEs (their training size)",
            )
        if not 0 <= overlap < 1:
            raise ConfigError(
                f"tile overlap {overlap}: not a fraction in [0, 1)", hint="overlap=0.25 is diffusers' default"
            )
        return cls(size, size // scale_factor, overlap)


def decode(run: Run, latent: np.ndarray, tiling: Tiling, min_tile: int = 1) -> np.ndarray:
    """Image from latent [N, C, h, w], tile by tile; `min_tile`: the smallest latent side `run` accepts."""
    return _tiled(run, latent, tiling.latent, tiling.sample, tiling.overlap, min_tile)


def encode(run: Run, image: np.ndarray, tiling: Tiling, min_tile: int = 1) -> np.ndarray:
    """The encoder's output (the latent distribution's parameters) from image [N, 3, H, W], tile by tile."""
    return _tiled(run, image, tiling.sample, tiling.latent, tiling.overlap, min_tile)


def needed(shape: tuple[int, ...], tile: int) -> bool:
    """diffusers tiles only what is larger than one tile."""
    return shape[-1] > tile or shape[-2] > tile


def _tiled(run: Run, x: np.ndarray, tile: int, out_tile: int, overlap: float, min_tile: int) -> np.ndarray:
    stride = int(tile * (1 - overlap))
    blend = int(out_tile * overlap)
    keep = out_tile - blend
    scale = out_tile / tile
    height, width = x.shape[2:]
    rows = [
        [_one(run, x, i, j, tile, min_tile, scale) for j in range(0, width, stride)] for i in range(0, height, stride)
    ]
    for i, row in enumerate(rows):
        for j, current in enumerate(row):
            if i > 0:
                _blend(rows[i - 1][j], current, blend, axis=2)
            if j > 0:
                _blend(row[j - 1], current, blend, axis=3)
    return np.concatenate([np.concatenate([t[:, :, :keep, :keep] for t in row], axis=3) for row in rows], axis=2)


def _one(run: Run, x: np.ndarray, top: int, left: int, tile: int, min_tile: int, scale: float) -> np.ndarray:
    """The result for x[top:top+tile, left:left+tile]; a side below `min_tile` is run from further back, then
    cropped."""
    height, width = x.shape[2:]
    bottom, right = min(top + tile, height), min(left + tile, width)
    start_h = min(top, max(0, bottom - min_tile))
    start_w = min(left, max(0, right - min_tile))
    out = run(np.ascontiguousarray(x[:, :, start_h:bottom, start_w:right]))
    skip_h, skip_w = round((top - start_h) * scale), round((left - start_w) * scale)
    return np.array(out[:, :, skip_h:, skip_w:], dtype=np.float32)


def _blend(a: np.ndarray, b: np.ndarray, extent: int, axis: int) -> None:
    """Fade `b`'s first `extent` rows (axis 2) or columns (axis 3) in from `a`'s last ones, in place."""
    extent = min(a.shape[axis], b.shape[axis], extent)
    if extent == 0:
        return
    weight = (np.arange(extent, dtype=np.float32) / np.float32(extent)).reshape((-1, 1) if axis == 2 else (1, -1))
    if axis == 2:
        b[:, :, :extent, :] = a[:, :, -extent:, :] * (1 - weight) + b[:, :, :extent, :] * weight
    else:
        b[:, :, :, :extent] = a[:, :, :, -extent:] * (1 - weight) + b[:, :, :, :extent] * weight
