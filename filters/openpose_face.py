"""Openpose's faces (Easy Diffusion's `openpose_face`, `openpose_faceonly`, `openpose_full`): controlnet-aux's
`faceDetect`, `Face.__call__`, `compute_peaks_from_heatmaps` and `draw_facepose` in numpy around the farm-built face
network. Each person's face box is a square around the nose sized by the eyes and ears (CMU's faceDetector); the
8-bit crop is resized to 384x384 (OpenCV's area or fixed-point Lanczos-4, to its 8-bit values) and run; the last
stage's 71 heatmaps are enlarged to the crop (bilinear, corners aligned, as torch's) and each map's largest value
over 0.05 is a landmark. The landmarks are drawn as white dots of radius 3 after each person's body and hands.

    face = enginefarm.filters.load("openpose-face", store=STORE)    # loads the body filter it names too
    control = face(photo)                                           # bodies and faces (openpose_face)
    control = face_control(face, photo, body=False)                 # faces alone (filters/openpose_names.py)
"""

from __future__ import annotations

import numpy as np

from .pose_draw import fill_disc
from .resampling import apply_matrices, smart_resize_8bit

THRESHOLD = 0.05
MIN_BOX = 20
EPS = 0.01
DOT_RADIUS = 3


def face_box(joints: list[tuple[float, float] | None], height: int, width: int) -> tuple[int, int, int] | None:
    """(x, y, side) of a person's face in pixels of the detect size, or None: around the nose, as far either way as
    3 times the farthest eye or 1.5 times the farthest ear (the larger, in the longer of x and y), clipped at the
    image's top-left and (as controlnet-aux does, by half the box) its bottom-right; at least 20 pixels
    (joints: a person's 18 (x, y) in pixels)."""
    nose = joints[0]
    eyes_ears = ((joints[14], 3.0), (joints[15], 3.0), (joints[16], 1.5), (joints[17], 1.5))
    if nose is None or all(point is None for point, _ in eyes_ears):
        return None
    x0, y0 = nose
    half = 0.0
    for point, factor in eyes_ears:
        if point is not None:
            half = max(half, max(abs(x0 - point[0]), abs(y0 - point[1])) * factor)
    x, y = max(x0 - half, 0), max(y0 - half, 0)
    # controlnet-aux tests the half box against the edges, then cuts the whole box there
    side_x = width - x if x + half > width else half * 2
    side_y = height - y if y + half > height else half * 2
    side = min(side_x, side_y)
    return (int(x), int(y), int(side)) if side >= MIN_BOX else None


def face_heatmaps(face, crop: np.ndarray) -> np.ndarray:
    """float32 [h, w, 71] heatmaps of an 8-bit BGR crop [h, w, 3] (float 0..255): the last stage's maps enlarged
    to the crop, corners aligned."""
    height, width = crop.shape[:2]
    x = face_input(crop, int(face.info.details.get("side", 384))) / 256 - 0.5
    session = face.sessions[face.info.components[0]]
    (maps,) = session.run({"image": np.ascontiguousarray(x.transpose(2, 0, 1)[None], np.float32)}).values()
    maps = np.asarray(maps, np.float32)[0].transpose(1, 2, 0)
    return apply_matrices(maps, aligned_matrix(maps.shape[0], height), aligned_matrix(maps.shape[1], width))


def face_input(crop: np.ndarray, side: int = 384) -> np.ndarray:
    """An 8-bit crop [h, w, 3] (float 0..255) as the net's `side` square takes it (controlnet-aux's smart_resize)."""
    return smart_resize_8bit(crop, side)


def aligned_matrix(source: int, size: int) -> np.ndarray:
    """[size, source]: torch's bilinear resize with align_corners=True along one side (the first and last pixels
    kept, the rest spaced evenly between them)."""
    scale = np.float32((source - 1) / (size - 1)) if size > 1 else np.float32(0)
    position = np.arange(size, dtype=np.float32) * scale
    low = np.minimum(np.floor(position).astype(np.int64), source - 1)
    high = np.minimum(low + 1, source - 1)
    fraction = position - low
    matrix = np.zeros((size, source), np.float32)
    np.add.at(matrix, (np.arange(size), low), 1 - fraction)
    np.add.at(matrix, (np.arange(size), high), fraction)
    return matrix


def face_peaks(heatmaps: np.ndarray) -> np.ndarray:
    """int [n, 2] (x, y): per heatmap (all 71, the background's too, as controlnet-aux) whose largest value passes
    0.05, where that value first is in raster order; maps that pass nowhere are left out."""
    found = []
    for index in range(heatmaps.shape[2]):
        values = heatmaps[:, :, index]
        if values.max() > THRESHOLD:
            y, x = np.unravel_index(int(np.argmax(values)), values.shape)
            found.append((x, y))
    return np.array(found, np.int64).reshape(-1, 2)


def detect_face(face, photo8: np.ndarray, joints_px: list[tuple[float, float] | None]) -> np.ndarray | None:
    """One person's face: float32 [n, 2] (x, y) fractions of the image (-1 where a landmark fell on the crop's
    first row or column, as controlnet-aux marks it), or None, as controlnet-aux's detect_face (photo8: the
    detect-size photo, BGR, 8-bit values as float)."""
    height, width = photo8.shape[:2]
    box = face_box(joints_px, height, width)
    if box is None:
        return None
    x, y, side = box
    peaks = face_peaks(face_heatmaps(face, photo8[y : y + side, x : x + side])).astype(np.float32)
    if not len(peaks):
        return None
    px = np.where(peaks[:, 0] < 1e-6, np.float32(-1), peaks[:, 0] + np.float32(x)) / np.float32(width)
    py = np.where(peaks[:, 1] < 1e-6, np.float32(-1), peaks[:, 1] + np.float32(y)) / np.float32(height)
    return np.stack([px, py], 1).astype(np.float32)


def draw_face(canvas: np.ndarray, landmarks: np.ndarray | None) -> None:
    """One face onto `canvas` (uint8 [H, W, 3]) in place: white discs of radius 3; a landmark at or left of /
    above the first pixel is not drawn."""
    if landmarks is None:
        return
    height, width = canvas.shape[:2]
    for fx, fy in landmarks:
        x, y = int(fx * np.float32(width)), int(fy * np.float32(height))
        if x > EPS and y > EPS:
            fill_disc(canvas, (x, y), DOT_RADIUS, (255, 255, 255))
