"""The soft-edge preprocessors' modes, in numpy as controlnet-aux computes them with OpenCV: "safe" (the edge map
quantised to a few levels, so a ControlNet sees fewer faint lines) and "scribble" (thin maxima of the edges,
thresholded and thickened into the binary strokes the scribble ControlNet was trained on). Easy Diffusion names a
soft-edge preprocessor and its modes together (`scribble_pidsafe`); `control_source` reads such a name.

    edges = enginefarm.filters.load("pidinet", store=STORE)
    control = edges(photo, safe=True)            # softedge_pidsafe
    control = edges(photo, scribble=True)        # scribble_pidinet
"""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

# Easy Diffusion's (and controlnet-aux's Processor's) soft-edge names → (the filter's usual name, safe, scribble)
EASY_DIFFUSION_NAMES = {
    "softedge_hed": ("hed", False, False),
    "softedge_hedsafe": ("hed", True, False),
    "scribble_hed": ("hed", False, True),
    "scribble_hedsafe": ("hed", True, True),
    "softedge_pidinet": ("pidinet", False, False),
    "softedge_pidsafe": ("pidinet", True, False),
    "scribble_pidinet": ("pidinet", False, True),
    "scribble_pidsafe": ("pidinet", True, True),
    # openpose's (the catalog's filter names; control_from draws the face ones as filters/openpose_face.py says)
    "openpose_hand": ("openpose-hand", False, False),
    "openpose_face": ("openpose-face", False, False),
    "openpose_faceonly": ("openpose-face", False, False),
    "openpose_full": ("openpose-face", False, False),
}
MODES = ("safe", "scribble")
SCRIBBLE_THRESHOLD = 127  # controlnet-aux's nms(map, 127, 3.0) on the 8-bit map
SCRIBBLE_SIGMA = 3.0


def control_source(source: str) -> tuple[str, bool, bool]:
    """A `--control-from` value → (filter name, safe, scribble): Easy Diffusion's soft-edge names
    (`softedge_pidinet`, `softedge_pidsafe`, `scribble_pidinet`, `scribble_pidsafe`, the same with `hed`/`hedsafe`)
    name the filters `pidinet` and `hed`; any filter takes modes after a colon: `my-hed:scribble,safe`."""
    if source in EASY_DIFFUSION_NAMES:
        return EASY_DIFFUSION_NAMES[source]
    name, colon, modes = source.partition(":")
    chosen = {mode.strip() for mode in modes.split(",") if mode.strip()} if colon else set()
    unknown = chosen.difference(MODES)
    if not name or unknown or (colon and not chosen):
        raise ConfigError(
            f"--control-from {source}: {', '.join(sorted(unknown)) or 'no mode'} is not a soft-edge mode",
            hint="give NAME, NAME:safe, NAME:scribble or NAME:scribble,safe (or Easy Diffusion's scribble_pidsafe…)",
        )
    return name, "safe" in chosen, "scribble" in chosen


def safe_step(edge: np.ndarray, step: int = 2) -> np.ndarray:
    """controlnet-aux's safe_step: an edge map in [0, 1] quantised to `step` + 1 levels (0, 1/step, …, 1; a
    value of 1 itself goes to 1 + 1/step, which the 8-bit map clips to 1)."""
    levels = np.floor(np.asarray(edge, np.float32) * np.float32(step + 1))  # int32 truncation; edges are >= 0
    return (levels / np.float32(step)).astype(np.float32)


def scribble(edge: np.ndarray) -> np.ndarray:
    """An edge map [H, W] in [0, 1] → binary strokes [H, W] of 0 and 1, as controlnet-aux's scribble option:
    the edges' non-maximum suppression (blur σ=3, kept where they peak along a line direction, above 127/255),
    then blurred again (σ=3, on 8 bits) and kept wherever any stroke reaches 5/255."""
    thin = nms(np.asarray(edge, np.float32) * 255, SCRIBBLE_THRESHOLD, SCRIBBLE_SIGMA)
    spread = gaussian_blur(thin * np.float32(255), SCRIBBLE_SIGMA, eight_bit=True)
    return (spread > 4).astype(np.float32)


def nms(values: np.ndarray, threshold: float, sigma: float) -> np.ndarray:
    """controlnet-aux's nms: `values` [H, W] (0..255) blurred, kept where it is the largest of its 3-pixel line in
    any of four directions, and 1 where that kept value passes `threshold` (else 0)."""
    blurred = gaussian_blur(np.asarray(values, np.float32), sigma)
    padded = np.pad(blurred, 1, constant_values=-np.inf)  # cv2.dilate's border never wins
    height, width = blurred.shape

    def at(dy: int, dx: int) -> np.ndarray:
        return padded[1 + dy : 1 + dy + height, 1 + dx : 1 + dx + width]

    peak = np.zeros(blurred.shape, bool)
    for (ay, ax), (by, bx) in (((0, -1), (0, 1)), ((-1, 0), (1, 0)), ((-1, -1), (1, 1)), ((-1, 1), (1, -1))):
        peak |= (blurred >= at(ay, ax)) & (blurred >= at(by, bx))
    return (peak & (blurred > threshold)).astype(np.float32)


def gaussian_kernel(sigma: float, eight_bit: bool = False) -> np.ndarray:
    """cv2.GaussianBlur's kernel for ksize (0, 0): 2·round(4σ) + 1 taps of exp(-x²/2σ²) normalised, or on 8-bit
    images 2·round(3σ) + 1 taps in 1/256ths, rounded from the centre outwards with each rounding's error carried to
    the next tap and the centre taking what is left (OpenCV's bit-exact fixed-point kernel)."""
    size = int(np.floor(sigma * (3 if eight_bit else 4) * 2 + 1 + 0.5)) | 1
    offsets = np.arange(size, dtype=np.float64) - (size - 1) / 2
    kernel = np.exp(-(offsets**2) / (2 * sigma * sigma))
    kernel /= kernel.sum()
    if not eight_bit:
        return kernel
    fixed, carried, half = np.zeros(size), 0.0, size // 2
    for i in range(half):
        wanted = kernel[i] * 256 + carried
        fixed[i] = fixed[size - 1 - i] = np.round(wanted)
        carried = wanted - fixed[i]
    fixed[half] = 256 - 2 * fixed[:half].sum()
    return fixed / 256


def gaussian_blur(image: np.ndarray, sigma: float, eight_bit: bool = False) -> np.ndarray:
    """cv2.GaussianBlur(image, (0, 0), sigma) of a 2-D image: separable, borders mirrored without repeating the
    edge pixel (BORDER_REFLECT_101). Each output pixel sums its taps in the same order, so a flat region stays
    exactly flat (nms compares neighbours for equality). `eight_bit`: `image` holds 0..255 integers and the result
    is OpenCV's 8-bit one exactly (its fixed-point kernel, rounded to integers)."""
    kernel = gaussian_kernel(sigma, eight_bit)
    out: np.ndarray = np.asarray(image, np.float64 if eight_bit else np.float32)
    for axis in (0, 1):
        out = _filter_axis(out, kernel.astype(out.dtype), axis)
    return np.floor(out + 0.5).astype(np.float32) if eight_bit else out


def _filter_axis(image: np.ndarray, kernel: np.ndarray, axis: int) -> np.ndarray:
    reach = len(kernel) // 2
    size = image.shape[axis]
    period = max(2 * (size - 1), 1)  # reflect-101, repeated for images narrower than the kernel
    index = np.abs(np.arange(-reach, size + reach)) % period
    index = np.where(index >= size, period - index, index)
    padded = np.take(image, index, axis=axis)
    out = np.zeros_like(image)
    for tap, weight in enumerate(kernel):
        out += weight * np.take(padded, np.arange(tap, tap + size), axis=axis)
    return out
