"""Image filters: the networks an SD app runs beside the diffusion model (upscalers, face restoration and its face
detector, preview decoders, the safety checker, ControlNet preprocessors). They are models like any other: exported
from the files users download (`enginefarm export FILE`), built per target by the farm, published, fetched, verified
and picked on the device. This package is their runtime face: numpy only, no torch.

    up = enginefarm.filters.load("realesrgan-x4plus", store=STORE)
    big = up(image)  # float [H, W, 3] in [0, 1] → [H*4, W*4, 3]
"""

from __future__ import annotations

from .apply import Filtered, apply, control_from
from .base import Filter
from .info import INFO_FILE, KINDS, FilterInfo
from .loading import load

__all__ = ["INFO_FILE", "KINDS", "Filter", "FilterInfo", "Filtered", "apply", "control_from", "load"]
