"""Face restoration as GFPGAN's helper (facexlib's FaceRestoreHelper) runs it, in numpy around two farm-built
engines: RetinaFace finds the faces and their 5 landmarks (`FaceDetector`), each face is aligned to the 512² FFHQ
template, restored (GFPGAN, `FaceRestorer`), and pasted back under a feathered square mask."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import ClassVar

import numpy as np

from enginefarm.errors import ConfigError

from . import face_align
from .base import Filter

# GFPGANer's choices: faces the detector is this sure of, and whose eyes are this many pixels apart at least
RESTORE_THRESHOLD = 0.97
MIN_EYE_DISTANCE = 5.0


@dataclass(frozen=True)
class Face:
    box: np.ndarray  # [4]: x1, y1, x2, y2 in the image's pixels
    score: float  # the detector's confidence
    landmarks: np.ndarray  # [5, 2]: eyes, nose, mouth corners (x, y)

    def __iter__(self):  # unpacks as (box, score, landmarks)
        return iter((self.box, self.score, self.landmarks))


def _check_image(image) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype.kind != "f":
        raise ConfigError(
            f"a face filter takes a float image [height, width, 3], not {image.dtype} {list(image.shape)}",
            hint="pass the image as the pipeline returns it: numpy float32 in [0, 1]",
        )
    return image.astype(np.float32, copy=False)


class FaceDetector(Filter):
    """RetinaFace: `detector(image)` → the faces in `image` (float [H, W, 3] in [0, 1]), most confident first, as
    facexlib's `detect_faces` finds them (anchors, box and landmark decoding, score threshold, NMS)."""

    kind: ClassVar[str] = "face_detector"

    def __call__(self, image, threshold: float = 0.8, nms_threshold: float = 0.4) -> list[Face]:
        image = _check_image(image)
        details = self.info.details
        height, width = image.shape[:2]
        if min(height, width) < details.get("min_side", 32):
            return []
        scale = max(height, width) / details.get("max_side", 2048)
        if scale > 1:  # larger than the engine takes: detect on a shrunk copy (facexlib's `resize` option)
            size = (max(1, round(width / scale)), max(1, round(height / scale)))
            shrink = np.array([[1 / scale, 0, 0.5 / scale - 0.5], [0, 1 / scale, 0.5 / scale - 0.5]])
            image = face_align.warp_affine(image, shrink, size)
            factor = np.array([width / size[0], height / size[1]])
        else:
            factor = np.ones(2)
        h, w = image.shape[:2]
        out = self.sessions["detector"].run({"image": image.transpose(2, 0, 1)[None]})
        priors = anchors(h, w, details["anchor_sizes"], details["steps"])
        boxes, points = decode(out["loc"][0], out["landmarks"][0], priors, details["variance"])
        boxes = boxes * np.tile([w, h], 2) * np.tile(factor, 2)
        points = points * np.array([w, h]) * factor
        scores = out["conf"][0][:, 1].astype(np.float64)
        keep = np.flatnonzero(scores > threshold)
        keep = keep[np.argsort(-scores[keep], kind="stable")]
        keep = keep[nms(boxes[keep], nms_threshold)]
        return [Face(boxes[i], float(scores[i]), points[i]) for i in keep]


def anchors(height: int, width: int, sizes, steps) -> np.ndarray:
    """RetinaFace's priors [P, 4] (centre x, centre y, width, height as fractions of the image), in the order of the
    network's outputs: level, row, column, anchor size."""
    rows = []
    for level_sizes, step in zip(sizes, steps, strict=True):
        for i, j in product(range(-(-height // step)), range(-(-width // step))):
            for size in level_sizes:
                rows.append(((j + 0.5) * step / width, (i + 0.5) * step / height, size / width, size / height))
    return np.array(rows, np.float64).reshape(-1, 4)


def decode(loc: np.ndarray, landmarks: np.ndarray, priors: np.ndarray, variance) -> tuple[np.ndarray, np.ndarray]:
    """Boxes [P, 4] (x1, y1, x2, y2) and landmarks [P, 5, 2] as fractions of the image, from the network's offsets."""
    centre, size = priors[:, :2], priors[:, 2:]
    loc, landmarks = loc.astype(np.float64), landmarks.astype(np.float64).reshape(-1, 5, 2)
    box_centre = centre + loc[:, :2] * variance[0] * size
    box_size = size * np.exp(loc[:, 2:] * variance[1])
    boxes = np.concatenate([box_centre - box_size / 2, box_centre + box_size / 2], axis=1)
    points = centre[:, None] + landmarks * variance[0] * size[:, None]
    return boxes, points


def nms(boxes: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of `boxes` (sorted most confident first) that no earlier kept box overlaps by IoU > threshold
    (torchvision.ops.nms, which facexlib runs)."""
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    remaining = np.arange(len(boxes))
    kept = []
    while len(remaining):
        i, rest = remaining[0], remaining[1:]
        kept.append(i)
        lo, hi = np.maximum(boxes[i, :2], boxes[rest, :2]), np.minimum(boxes[i, 2:], boxes[rest, 2:])
        inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):  # two empty boxes: 0/0 is no overlap, as in torchvision
            overlaps = inter / (areas[i] + areas[rest] - inter) > threshold
        remaining = rest[~overlaps]
    return np.array(kept, np.int64)


class FaceRestorer(Filter):
    """GFPGAN or CodeFormer: `restorer(image, strength=1.0)` → the image with every face its detector
    (`uses["detector"]`) finds restored and pasted back. strength 0 is the image, 1 the restored faces. CodeFormer
    also takes `fidelity` (its `w`: 0 the most restored, 1 closest to the input; default its export's, 0.5)."""

    kind: ClassVar[str] = "face_restorer"

    def __call__(self, image, strength: float = 1.0, fidelity: float | None = None) -> np.ndarray:
        image = _check_image(image)
        detector = self.uses.get("detector")
        if not isinstance(detector, FaceDetector):
            what = f"a {detector.kind} filter" if detector is not None else "none"
            raise ConfigError(
                f"{self.name} needs a face detector to find faces with; its details.uses.detector is {what}",
                hint="export a RetinaFace file (detection_Resnet50_Final.pth) under the name its filter.json names, "
                "and build it into the same store",
            )
        faces = detector(image, threshold=RESTORE_THRESHOLD)
        eyes = [f.landmarks for f in faces if np.linalg.norm(f.landmarks[0] - f.landmarks[1]) >= MIN_EYE_DISTANCE]
        return self.restore(image, eyes, strength, fidelity)

    def restore(
        self, image, landmarks: list[np.ndarray], strength: float = 1.0, fidelity: float | None = None
    ) -> np.ndarray:
        """`image` with the faces at the given 5-point `landmarks` ([5, 2] each) restored and pasted back in turn."""
        image = _check_image(image)
        if not 0.0 <= strength <= 1.0:
            raise ConfigError(f"strength {strength} is outside [0, 1]", hint="0 keeps the image, 1 the restored faces")
        feeds = self._fidelity_feed(fidelity)
        if not landmarks or strength == 0.0:
            return image.copy()
        size = int(self.info.details.get("face_size", 512))
        out = image
        for points in landmarks:
            face, matrix = face_align.align_face(image, np.asarray(points, np.float64), size)
            restored = self.restore_face(face, feeds)
            out = face_align.paste_face(out, restored, matrix)
        return (strength * out + (1.0 - strength) * image).astype(np.float32)

    def _fidelity_feed(self, fidelity: float | None) -> dict[str, np.ndarray]:
        default = self.info.details.get("fidelity")
        if default is None:
            if fidelity is not None:
                raise ConfigError(
                    f"{self.name} ({self.info.architecture}) has no fidelity setting",
                    hint="fidelity is CodeFormer's; use strength to blend the restored faces with the image",
                )
            return {}
        w = float(default if fidelity is None else fidelity)
        if not 0.0 <= w <= 1.0:
            raise ConfigError(f"fidelity {w} is outside [0, 1]", hint="0: the most restored, 1: closest to the input")
        return {"w": np.array([w], np.float32)}

    def restore_face(self, face: np.ndarray, extra: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One aligned face [size, size, 3] in [0, 1] through the network (which reads [-1, 1]) → the same range.
        extra: the network's other inputs (CodeFormer's `w`)."""
        feed = (face.transpose(2, 0, 1)[None] * 2.0 - 1.0).astype(np.float32)
        restored = self.sessions["restorer"].run({"face": feed, **(extra or {})})["restored"][0]
        return ((np.clip(restored.astype(np.float32), -1.0, 1.0) + 1.0) / 2.0).transpose(1, 2, 0)
