"""ControlNet preprocessors: a photo → the control image a ControlNet was trained on (depth today; lines and poses
are the same shape of filter). The network is a farm-built model; what surrounds it is numpy, as controlnet-aux and
diffusers' ControlNet examples do it in torch: resize to the detect resolution, normalise, run, resize back to the
photo's size, min-max to [0, 1], three channels.

    depth = enginefarm.filters.load("depth-anything-v2-small", store=STORE)
    control = depth(photo)  # float [H, W, 3] in [0, 1] → float32 [H, W, 3] in [0, 1], white is near
    image = pipe(prompt, control_image=control)

Canny needs no network: `enginefarm.filters.canny.canny_control(photo)`.
"""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from . import softedge
from .base import Filter
from .resampling import resize


class Preprocessor(Filter):
    """`f(image, detect_resolution=None, *, safe=False, scribble=False)` → control image (the modes: soft edges
    only). `task`: what it finds ("depth", "softedge", "lineart", "openpose")."""

    kind = "preprocessor"

    @property
    def task(self) -> str:
        return str(self.info.details.get("task", "depth"))

    def detect_size(self, height: int, width: int, detect_resolution: int | None = None) -> tuple[int, int]:
        """The size the network sees: the short side at `detect_resolution` (default the model's), each side
        rounded to the model's multiple, the long side shrunk to the engine's largest when it would pass it."""
        details = self.info.details
        resolution = int(detect_resolution or details.get("resolution", 512))
        multiple = int(details.get("multiple", 1))
        largest = int(details.get("max_side", 1 << 30))
        if not self.task.startswith("openpose"):  # openpose's network sees the photo shrunk to a 184-pixel height
            largest = min(largest, self._engine_largest())
        if resolution < multiple:
            raise ConfigError(
                f"{self.name}: detect resolution {resolution} is below its {multiple}-pixel step",
                hint=f"give detect_resolution={details.get('resolution', 512)} (its default) or more",
            )
        scale = resolution / min(height, width)
        scale = min(scale, largest / max(height, width))
        rounded = (max(multiple, int(round(side * scale / multiple)) * multiple) for side in (height, width))
        return next(rounded), next(rounded)

    def _engine_largest(self) -> int:
        """The longest side the built engine's profile takes (its recipe may narrow the export's)."""
        try:
            session = self.sessions[self.info.components[0]]
            return int(min(session.artifact.profile["image"]["max"][2:]))
        except (KeyError, IndexError, TypeError, AttributeError):
            return 1 << 30

    def __call__(
        self, image: np.ndarray, detect_resolution: int | None = None, *, safe: bool = False, scribble: bool = False
    ) -> np.ndarray:
        """A photo float [H, W, 3] in [0, 1] → its control image float32 [H, W, 3] in [0, 1]. Soft edges take
        controlnet-aux's modes (filters/softedge.py): `safe` quantises the edge map at the detect size, `scribble`
        makes it binary strokes at the photo's size."""
        if (safe or scribble) and self.task != "softedge":
            raise ConfigError(
                f"{self.name} makes {self.task} control images: safe and scribble are soft-edge modes",
                hint="give them to a soft-edge preprocessor (HED, PiDiNet)",
            )
        image = np.asarray(image, dtype=np.float32)
        if image.ndim != 3 or image.shape[2] not in (3, 4):
            raise ConfigError(
                f"{self.name} takes an image [H, W, 3], got shape {list(image.shape)}", hint="give an RGB image"
            )
        if self.task in ("openpose", "openpose_hand", "openpose_face"):  # people decoded and drawn: openpose.py
            from .openpose import pose_control

            if self.task == "openpose_hand":  # the hand net runs on boxes its body filter finds
                return pose_control(self.uses["body"], image, detect_resolution, hand=self)
            if self.task == "openpose_face":  # as the face net (openpose_face; filters/openpose_face.py for the rest)
                return pose_control(self.uses["body"], image, detect_resolution, face=self)
            return pose_control(self, image, detect_resolution)
        height, width = image.shape[:2]
        details = self.info.details
        size = self.detect_size(height, width, detect_resolution)
        x = resize(image[:, :, :3], size, details.get("resample", "bicubic"))
        x = (x - np.asarray(details["mean"], np.float32)) / np.asarray(details["std"], np.float32)
        (output,) = self.sessions[self.info.components[0]].run({"image": x.transpose(2, 0, 1)[None]}).values()
        found = np.asarray(output, np.float32).reshape(size)
        if safe:
            found = np.minimum(softedge.safe_step(found), 1)  # controlnet-aux clips it to 8 bits here
        found = resize(found[:, :, None], (height, width), "bilinear")[:, :, 0]
        # depth is relative: scaled by its own range; edges and lines are probabilities already (line art's
        # control image is white lines on black: the inverse of its network's dark lines on white)
        output = details.get("output", "min_max")
        found = min_max(found) if output == "min_max" else np.clip(found, 0, 1)
        if output == "inverted":
            found = 1 - found
        if scribble:
            found = softedge.scribble(found)
        return np.repeat(found[:, :, None], 3, axis=2)


def min_max(values: np.ndarray) -> np.ndarray:
    """Values scaled to [0, 1] by their own minimum and maximum (all 0 when they are one value)."""
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return np.zeros_like(values, dtype=np.float32)
    return ((values - low) / (high - low)).astype(np.float32)
