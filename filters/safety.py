"""The safety checker: diffusers' `StableDiffusionSafetyChecker` (CompVis/stable-diffusion-safety-checker), as a
diffusers pipeline runs it after decoding.

    checker = enginefarm.filters.load("sd-safety-checker", store=STORE)
    flagged, scores = checker(image)  # float [H, W, 3] in [0, 1]

The engine (`export/filters/safety.py`) computes CLIP's image embedding and its cosine similarity with each concept
embedding; the decision is made here in numpy as diffusers' `forward` makes it: a special-care concept whose score
(cosine - its threshold, rounded to 3 decimals) is above 0 raises every later score by 0.01, and the image is
flagged when any concept's score is above 0. The image reaches CLIP as the pipeline hands it over: 8-bit
(`numpy_to_pil`), its shortest side resized to 224 with antialiased bicubic weights, centre-cropped, normalised with
CLIP's mean and std (transformers' `CLIPImageProcessor`)."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import Filter

# transformers' OPENAI_CLIP_MEAN / OPENAI_CLIP_STD: what CLIPImageProcessor uses when its config says nothing
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# diffusers' bump of every later score once a special-care concept matched (StableDiffusionSafetyChecker.forward)
SPECIAL_CARE_ADJUSTMENT = 0.01
# Pillow's fixed-point resampling of 8-bit images (libImaging/Resample.c: 32 - 8 - 2 bits)
PRECISION_BITS = 22


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic with a = -0.5: PIL's and torch's antialiased bicubic filter."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def resize_weights(size_in: int, size_out: int) -> np.ndarray:
    """[size_out, size_in] fixed-point weights (integers, PRECISION_BITS fractional bits) of an antialiased bicubic
    resize along one axis, as Pillow's 8-bit resampling computes them (and torchvision's uint8 resize, which
    transformers' CLIPImageProcessor runs): the filter is stretched by the scale when shrinking, each output pixel's
    window is rounded to whole input pixels, its weights sum to 1 and are then rounded half away from zero."""
    scale = size_in / size_out
    stretch = max(scale, 1.0)
    support = 2.0 * stretch
    weights = np.zeros((size_out, size_in))
    for i in range(size_out):
        center = (i + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), size_in)
        taps = _bicubic((np.arange(low, high) - center + 0.5) / stretch)
        total = taps.sum()
        weights[i, low:high] = taps / total if total != 0 else taps
    return np.trunc(weights * (1 << PRECISION_BITS) + np.where(weights < 0, -0.5, 0.5))


def _resample(weights: np.ndarray, pixels: np.ndarray, axis: int) -> np.ndarray:
    """One 8-bit pass along `axis` (0: rows, 1: columns) of pixels [H, W, C] holding integers 0..255: Pillow's
    fixed-point sum (exact in float64: every term and sum is an integer below 2^53), rounded and clipped to 8 bits."""
    summed = np.tensordot(weights, pixels, axes=([1], [axis]))  # the resampled axis comes first
    summed = np.moveaxis(summed, 0, axis)
    return np.clip(np.floor((summed + (1 << (PRECISION_BITS - 1))) / (1 << PRECISION_BITS)), 0, 255)


def clip_pixels(
    image: np.ndarray,
    shortest_edge: int = 224,
    crop: int = 224,
    mean: tuple[float, ...] = CLIP_MEAN,
    std: tuple[float, ...] = CLIP_STD,
) -> np.ndarray:
    """An image float [H, W, 3] in [0, 1] (or uint8) → CLIP's pixel_values float32 [3, crop, crop], as a diffusers
    pipeline's feature extractor makes them: 8-bit, shortest side resized to `shortest_edge` (the other side
    truncated to keep the aspect), centre-cropped, rescaled by 1/255 and normalised."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ConfigError(f"the safety checker takes an image [H, W, 3], got {list(image.shape)}", hint="RGB only")
    if image.dtype != np.uint8:  # diffusers' numpy_to_pil
        image = (np.clip(image.astype(np.float32), 0.0, 1.0) * 255).round().astype(np.uint8)
    height, width = image.shape[:2]
    short, long = min(height, width), max(height, width)
    new_long = int(shortest_edge * long / short)
    new_height, new_width = (shortest_edge, new_long) if height <= width else (new_long, shortest_edge)
    pixels = image.astype(np.float64)
    if (new_height, new_width) != (height, width):
        # columns first, then rows, each pass back to 8 bits (Pillow's order)
        if new_width != width:
            pixels = _resample(resize_weights(width, new_width), pixels, 1)
        if new_height != height:
            pixels = _resample(resize_weights(height, new_height), pixels, 0)
    top, left = max((new_height - crop) // 2, 0), max((new_width - crop) // 2, 0)
    pixels = pixels[top : top + crop, left : left + crop]
    if pixels.shape[:2] != (crop, crop):
        raise ConfigError(
            f"the image is {width}×{height}: too small to crop {crop}×{crop} after resizing",
            hint=f"give an image of at least {crop} pixels on each side",
        )
    scale = np.float32(255.0)
    normalized = (pixels.astype(np.float32) - np.asarray(mean, np.float32) * scale) / (
        np.asarray(std, np.float32) * scale
    )
    return np.ascontiguousarray(normalized.transpose(2, 0, 1), dtype=np.float32)


def decide(
    special_cos: np.ndarray, concept_cos: np.ndarray, special_thresholds, concept_thresholds, adjustment: float = 0.0
) -> tuple[bool, dict]:
    """One image's verdict from its cosine similarities, as diffusers' StableDiffusionSafetyChecker.forward decides:
    (flagged, {"special_scores": {i: score}, "special_care": [i], "concept_scores": {i: score},
    "bad_concepts": [i]}), each score rounded to 3 decimals as diffusers rounds it."""
    result: dict = {"special_scores": {}, "special_care": [], "concept_scores": {}, "bad_concepts": []}
    special_cos, concept_cos = np.asarray(special_cos, np.float32), np.asarray(concept_cos, np.float32)
    for index, threshold in enumerate(special_thresholds):
        # float32 arithmetic and numpy's rounding, as diffusers computes it on the checker's float32 numpy output
        score = float(np.round(special_cos[index] - np.float32(threshold) + np.float32(adjustment), 3))
        result["special_scores"][index] = score
        if score > 0:
            result["special_care"].append(index)
            adjustment = SPECIAL_CARE_ADJUSTMENT
    for index, threshold in enumerate(concept_thresholds):
        score = float(np.round(concept_cos[index] - np.float32(threshold) + np.float32(adjustment), 3))
        result["concept_scores"][index] = score
        if score > 0:
            result["bad_concepts"].append(index)
    return bool(result["bad_concepts"]), result


class SafetyChecker(Filter):
    """`f(image)` → (flagged, scores); `f.check(images)` → one (flagged, scores) per image of a batch."""

    kind = "safety_checker"

    def _detail(self, key: str):
        try:
            return self.info.details[key]
        except KeyError:
            raise ConfigError(
                f"{self.name}: its filter.json lacks {key!r}", hint="re-export the safety checker with enginefarm"
            ) from None

    def pixels(self, image: np.ndarray) -> np.ndarray:
        """CLIP's input [3, S, S] for one image, with this checker's preprocessing settings."""
        crop = int(self._detail("crop_size"))
        return clip_pixels(
            image,
            int(self.info.details.get("shortest_edge", crop)),
            crop,
            tuple(self.info.details.get("image_mean", CLIP_MEAN)),
            tuple(self.info.details.get("image_std", CLIP_STD)),
        )

    def similarities(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(special-care cosines [N, 3], concept cosines [N, 17]) of CLIP pixel_values [N, 3, S, S] (`pixels`), one
        engine run per image."""
        session = self.sessions["checker"]
        special, concept = [], []
        for one in np.asarray(pixels, np.float32):
            out = session.run({"pixel_values": one[None]})
            special.append(out["special_cos"][0])
            concept.append(out["concept_cos"][0])
        return np.asarray(special, np.float32), np.asarray(concept, np.float32)

    def check(self, images) -> list[tuple[bool, dict]]:
        """(flagged, scores) for each image of images [N, H, W, 3] (or a list of [H, W, 3])."""
        special, concept = self.similarities(np.stack([self.pixels(image) for image in images]))
        special_thresholds = self._detail("special_thresholds")
        concept_thresholds = self._detail("concept_thresholds")
        return [decide(s, c, special_thresholds, concept_thresholds) for s, c in zip(special, concept, strict=True)]

    def __call__(self, image: np.ndarray) -> tuple[bool, dict]:
        """One image float [H, W, 3] in [0, 1] → (flagged, scores) as diffusers' checker decides; scores:
        {"special_scores", "special_care", "concept_scores", "bad_concepts"} as in its result."""
        image = np.asarray(image)
        if image.ndim == 4:
            raise ConfigError("f(image) takes one image [H, W, 3]", hint="use f.check(images) for a batch")
        return self.check([image])[0]
