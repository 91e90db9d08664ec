"""The openpose control image: limbs as filled ellipses and joints as dots on black, in the colours ControlNet's
openpose models were trained on, drawn in numpy as controlnet-aux's `draw_bodypose` draws them with OpenCV
(`ellipse2Poly` + `fillConvexPoly` for a limb, `circle` for a joint): the same polygons and pixel rules, so most
pixels are equal; a pixel on an ellipse's edge can differ by OpenCV's scan conversion."""

from __future__ import annotations

import math

import numpy as np

# joint pairs (1-based joints, as openpose numbers them) drawn as limbs, in drawing order
LIMBS = (
    (2, 3), (2, 6), (3, 4), (4, 5), (6, 7), (7, 8), (2, 9), (9, 10), (10, 11),
    (2, 12), (12, 13), (13, 14), (2, 1), (1, 15), (15, 17), (1, 16), (16, 18),
)  # fmt: skip
COLORS = (
    (255, 0, 0), (255, 85, 0), (255, 170, 0), (255, 255, 0), (170, 255, 0), (85, 255, 0), (0, 255, 0),
    (0, 255, 85), (0, 255, 170), (0, 255, 255), (0, 170, 255), (0, 85, 255), (0, 0, 255), (85, 0, 255),
    (170, 0, 255), (255, 0, 255), (255, 0, 170), (255, 0, 85),
)  # fmt: skip
STICK_WIDTH = 4
JOINT_RADIUS = 4


def draw_bodies(height: int, width: int, people: list[list[tuple[float, float] | None]]) -> np.ndarray:
    """uint8 [height, width, 3] RGB: each person's 18 joints (x, y as fractions of the width and height, None where
    not found) drawn in turn, limbs at 0.6 of their colour first, then the joints."""
    canvas = np.zeros((height, width, 3), np.uint8)
    for joints in people:
        draw_body(canvas, joints)
    return canvas


def draw_body(canvas: np.ndarray, joints: list[tuple[float, float] | None]) -> None:
    """One person onto `canvas` (uint8 [H, W, 3]), in place."""
    height, width = canvas.shape[:2]
    for (first, second), color in zip(LIMBS, COLORS, strict=False):
        a, b = joints[first - 1], joints[second - 1]
        if a is None or b is None:
            continue
        # the same float steps as controlnet-aux, so the truncations to pixels land alike
        ys = np.array([a[0], b[0]]) * float(width)
        xs = np.array([a[1], b[1]]) * float(height)
        length = ((xs[0] - xs[1]) ** 2 + (ys[0] - ys[1]) ** 2) ** 0.5
        angle = math.degrees(math.atan2(xs[0] - xs[1], ys[0] - ys[1]))
        center = (int(np.mean(ys)), int(np.mean(xs)))
        polygon = ellipse_polygon(center, (int(length / 2), STICK_WIDTH), int(angle))
        fill_convex(canvas, polygon, tuple(int(float(c) * 0.6) for c in color))
    for joint, color in zip(joints, COLORS, strict=True):
        if joint is not None:
            fill_disc(canvas, (int(joint[0] * width), int(joint[1] * height)), JOINT_RADIUS, color)


def ellipse_polygon(center: tuple[int, int], axes: tuple[int, int], angle: int) -> np.ndarray:
    """int [N, 2] (x, y): the outline of an ellipse rotated by `angle` degrees, one point per degree, rounded to
    pixels, repeats dropped (cv2.ellipse2Poly with delta 1)."""
    angle %= 360
    # OpenCV's sine table holds float32 values per degree; its cosine is the sine 90 degrees on
    table = np.sin(np.radians(np.arange(451))).astype(np.float32).astype(np.float64)
    alpha, beta = table[450 - angle], table[angle]
    degrees = np.arange(0, 361)
    x = axes[0] * table[450 - degrees]
    y = axes[1] * table[degrees]
    points = np.stack([np.rint(center[0] + x * alpha - y * beta), np.rint(center[1] + x * beta + y * alpha)], 1)
    points = points.astype(np.int64)
    keep = np.ones(len(points), bool)
    keep[1:] = np.any(points[1:] != points[:-1], axis=1)
    return points[keep]


def fill_convex(canvas: np.ndarray, polygon: np.ndarray, color: tuple[int, ...]) -> None:
    """Fill a convex polygon of pixel vertices, its outline included: per row, from the leftmost to the rightmost
    crossing of its edges, rounded to pixels."""
    height, width = canvas.shape[:2]
    ends = np.roll(polygon, -1, axis=0)
    top, bottom = max(int(polygon[:, 1].min()), 0), min(int(polygon[:, 1].max()), height - 1)
    if top > bottom:
        return
    rows = np.arange(top, bottom + 1, dtype=np.float64)[:, None]
    y0, y1 = polygon[None, :, 1].astype(np.float64), ends[None, :, 1].astype(np.float64)
    x0, x1 = polygon[None, :, 0].astype(np.float64), ends[None, :, 0].astype(np.float64)
    crosses = (np.minimum(y0, y1) <= rows) & (rows <= np.maximum(y0, y1))
    flat = y0 == y1
    t = np.where(flat, 0.0, (rows - y0) / np.where(flat, 1.0, y1 - y0))
    at = x0 + t * (x1 - x0)
    left = np.where(crosses, np.where(flat, np.minimum(x0, x1), at), np.inf).min(axis=1)
    right = np.where(crosses, np.where(flat, np.maximum(x0, x1), at), -np.inf).max(axis=1)
    columns = np.arange(width)[None, :]
    mask = (columns >= np.floor(left + 0.5)[:, None]) & (columns <= np.floor(right + 0.5)[:, None])
    canvas[top : bottom + 1][mask] = color
    # the outline too, as OpenCV draws it: a near-horizontal edge covers more of a row than its crossing there
    xs, ys = _outline(polygon, ends)
    inside = (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height)
    canvas[ys[inside], xs[inside]] = color


def _outline(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pixels of each edge from `starts` to `ends` as OpenCV's 8-connected line draws them: walked left to
    right, one pixel per step of the longer axis, the shorter axis stepping where Bresenham's error goes negative."""
    swap = ends[:, 0] < starts[:, 0]
    first = np.where(swap[:, None], ends, starts)
    last = np.where(swap[:, None], starts, ends)
    dx, dy = last[:, 0] - first[:, 0], last[:, 1] - first[:, 1]
    sy = np.where(dy < 0, -1, 1)
    steep = np.abs(dy) > dx
    major, minor = np.where(steep, np.abs(dy), dx), np.where(steep, dx, np.abs(dy))
    edge = np.repeat(np.arange(len(first)), major + 1)
    k = np.arange(len(edge)) - np.repeat(np.cumsum(major + 1) - (major + 1), major + 1)
    big, small = major[edge], minor[edge]
    m = np.where(big > 0, (2 * small * k + big - 1) // np.maximum(2 * big, 1), 0)
    xs = first[edge, 0] + np.where(steep[edge], m, k)
    ys = first[edge, 1] + sy[edge] * np.where(steep[edge], k, m)
    return xs, ys


def fill_disc(canvas: np.ndarray, center: tuple[int, int], radius: int, color: tuple[int, ...]) -> None:
    """A filled circle: the pixels within `radius` of `center` (cv2.circle with thickness -1)."""
    height, width = canvas.shape[:2]
    cx, cy = center
    top, bottom = max(cy - radius, 0), min(cy + radius, height - 1)
    left, right = max(cx - radius, 0), min(cx + radius, width - 1)
    if top > bottom or left > right:
        return
    yy, xx = np.mgrid[top : bottom + 1, left : right + 1]
    inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius * radius
    canvas[top : bottom + 1, left : right + 1][inside] = color
