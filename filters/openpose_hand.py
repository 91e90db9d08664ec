"""Openpose's hands (Easy Diffusion's `openpose_hand`): controlnet-aux's `Hand.__call__` and `draw_handpose` in numpy
around the farm-built hand network. Each person's hand box comes from the body's shoulder, elbow and wrist (CMU's
handDetector); the 8-bit crop is blurred (sigma 0.8), run at four square sides (184 to 736), its 22 heatmaps brought
to 128x128 and averaged; per joint the smoothed map's largest region over 0.05 holds the joint, at its raw maximum.
The hands are drawn over the body: the 20 bones in a rainbow, two pixels wide, and the joints as blue dots.

    hands = enginefarm.filters.load("openpose-hand", store=STORE)   # loads the body filter it names too
    control = hands(photo)                                          # body and hands
"""

from __future__ import annotations

import colorsys
import math

import numpy as np

from .pose_draw import fill_convex, fill_disc
from .resampling import apply_matrices, back_matrix, gaussian_filter, smart_resize_8bit
from .softedge import gaussian_blur

GRID = 128  # the heatmaps' common size before the peaks are found
THRESHOLD = 0.05
MIN_BOX = 20
BONES = (
    (0, 1), (1, 2), (2, 3), (3, 4), (0, 5), (5, 6), (6, 7), (7, 8), (0, 9), (9, 10),
    (10, 11), (11, 12), (0, 13), (13, 14), (14, 15), (15, 16), (0, 17), (17, 18), (18, 19), (19, 20),
)  # fmt: skip
EPS = 0.01


def hand_boxes(joints: list[tuple[float, float] | None], height: int, width: int) -> list[tuple[int, int, int, bool]]:
    """(x, y, side, is_left) of each hand whose shoulder, elbow and wrist were found, in pixels of the detect size:
    centred a third of the forearm past the wrist, 1.5 times the longer of the forearm and 0.9 of the upper arm, cut
    at the image's edges, at least 20 pixels (joints: a person's 18 (x, y) in pixels)."""
    boxes = []
    for shoulder, elbow, wrist, is_left in ((5, 6, 7, True), (2, 3, 4, False)):
        if joints[shoulder] is None or joints[elbow] is None or joints[wrist] is None:
            continue
        (x1, y1), (x2, y2), (x3, y3) = joints[shoulder], joints[elbow], joints[wrist]  # type: ignore[misc]
        x, y = x3 + 0.33 * (x3 - x2), y3 + 0.33 * (y3 - y2)
        side = 1.5 * max(math.sqrt((x3 - x2) ** 2 + (y3 - y2) ** 2), 0.9 * math.sqrt((x2 - x1) ** 2 + (y2 - y1) ** 2))
        x, y = max(x - side / 2, 0), max(y - side / 2, 0)
        side = min(width - x if x + side > width else side, height - y if y + side > height else side)
        if side >= MIN_BOX:
            boxes.append((int(x), int(y), int(side), is_left))
    return boxes


def hand_joints(hand, crop: np.ndarray) -> np.ndarray:
    """int [21, 2] (x, y) of the hand's joints in the crop's pixels ([0, 0] where none) of an 8-bit BGR crop [s, s, 3]
    (float 0..255)."""
    details = hand.info.details
    stride, box = int(details.get("stride", 8)), float(details.get("box", 368))
    blurred = np.stack([gaussian_blur(crop[:, :, c], 0.8, eight_bit=True) for c in range(3)], 2)
    side_in = crop.shape[0]
    session = hand.sessions[hand.info.components[0]]
    total = np.zeros((GRID, GRID, 22))
    scales = details.get("scales", [0.5, 1.0, 1.5, 2.0])
    for scale in scales:
        side = int(scale * box)
        x = smart_resize_8bit(blurred, side)  # area down, OpenCV's fixed-point 8-bit Lanczos up, value for value
        padded = -(-side // stride) * stride
        image = np.zeros((padded, padded, 3), np.float32)
        image[:side, :side] = x / 256 - 0.5
        (maps,) = session.run({"image": np.ascontiguousarray(image.transpose(2, 0, 1)[None])}).values()
        back = back_matrix(padded // stride, stride, side, GRID, GRID < side)
        total += apply_matrices(np.asarray(maps, np.float32)[0].transpose(1, 2, 0), back, back) / len(scales)
    found = np.zeros((21, 2), np.int64)
    for joint in range(21):
        raw = total[:, :, joint].copy()
        region = _largest_region(gaussian_filter(raw) > THRESHOLD, raw)
        if region is None:
            continue
        raw[~region] = 0
        row, col = np.unravel_index(np.argmax(raw), raw.shape)
        found[joint] = int(float(col) * float(side_in) / GRID), int(float(row) * float(side_in) / GRID)
    return found


def _largest_region(mask: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """The 8-connected region of `mask` whose `values` sum highest (the first in raster order on a tie)."""
    if not mask.any():
        return None
    labels = np.where(mask, np.arange(mask.size).reshape(mask.shape), mask.size)
    while True:  # each region takes its smallest raster index, spread one step a round
        padded = np.pad(labels, 1, constant_values=mask.size)
        spread = labels
        for dy in (0, 1, 2):
            for dx in (0, 1, 2):
                spread = np.minimum(spread, padded[dy : dy + mask.shape[0], dx : dx + mask.shape[1]])
        spread = np.where(mask, spread, mask.size)
        if np.array_equal(spread, labels):
            break
        labels = spread
    ids, inverse = np.unique(labels[mask], return_inverse=True)
    sums = np.bincount(inverse, weights=values[mask])
    return labels == ids[int(np.argmax(sums))]


def detect_hands(hand, photo8: np.ndarray, joints_px: list[tuple[float, float] | None]):
    """(left, right) hands of one person: 21 (x, y) fractions of the image each (negative where not found), or None,
    as controlnet-aux's detect_hands (photo8: the detect-size photo, BGR, 8-bit values as float)."""
    height, width = photo8.shape[:2]
    left = right = None
    for x, y, side, is_left in hand_boxes(joints_px, height, width):
        peaks = hand_joints(hand, photo8[y : y + side, x : x + side]).astype(np.float32)
        px = np.where(peaks[:, 0] < 1e-6, np.float32(-1), peaks[:, 0] + np.float32(x)) / np.float32(width)
        py = np.where(peaks[:, 1] < 1e-6, np.float32(-1), peaks[:, 1] + np.float32(y)) / np.float32(height)
        found = np.stack([px, py], 1).astype(np.float32)
        if is_left:
            left = found
        else:
            right = found
    return left, right


def draw_hand(canvas: np.ndarray, joints: np.ndarray | None) -> None:
    """One hand onto `canvas` (uint8 [H, W, 3]) in place: bones two pixels wide in hues around the wheel, joints as
    blue discs of radius 4; a joint at or left of / above the first pixel is not drawn."""
    if joints is None or not len(joints):
        return
    height, width = canvas.shape[:2]
    points = [(int(x * np.float32(width)), int(y * np.float32(height))) for x, y in joints]
    for index, (a, b) in enumerate(BONES):
        (x1, y1), (x2, y2) = points[a], points[b]
        if min(x1, y1, x2, y2) > EPS:
            color = tuple(int(round(c * 255)) for c in colorsys.hsv_to_rgb(index / len(BONES), 1.0, 1.0))
            _thick_line(canvas, (x1, y1), (x2, y2), color)
    for x, y in points:
        if x > EPS and y > EPS:
            fill_disc(canvas, (x, y), 4, (0, 0, 255))


def _thick_line(canvas: np.ndarray, start: tuple[int, int], end: tuple[int, int], color: tuple[int, ...]) -> None:
    """A line two pixels wide as OpenCV draws one: the quadrilateral one pixel either side of the segment, filled
    with its outline, and a disc of radius 1 at each end (OpenCV places the corners to 1/65536 of a pixel; here they
    are rounded to pixels, so an edge pixel can differ)."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    length = max(math.hypot(dx, dy), 1e-9)
    nx, ny = -dy / length, dx / length
    ends = np.array([start, end, end, start], np.float64)
    corners = ends + np.array([[nx, ny], [nx, ny], [-nx, -ny], [-nx, -ny]])
    fill_convex(canvas, np.floor(corners + 0.5).astype(np.int64), color)
    fill_disc(canvas, start, 1, color)
    fill_disc(canvas, end, 1, color)
