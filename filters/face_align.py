"""Face alignment in numpy, as GFPGAN's helper (facexlib's FaceRestoreHelper) does it with OpenCV: a similarity
transform from a face's 5 landmarks to the 512² FFHQ template (least squares, what cv2.estimateAffinePartial2D
refines to when every landmark is an inlier, and what skimage's SimilarityTransform estimates), a bilinear warp into
the template, and the way back: the inverse warp, and a square mask eroded and blurred so the seam fades out."""

from __future__ import annotations

import numpy as np

# the 5 landmarks (eyes, nose, mouth corners) of an FFHQ face at 512×512, as facexlib's helper places them
FACE_TEMPLATE_512 = np.array(
    [
        [192.98138, 239.94708],
        [318.90277, 240.1936],
        [256.63416, 314.01935],
        [201.26117, 371.41043],
        [313.08905, 371.15118],
    ]
)
# the gray facexlib fills outside the image when it crops a face near an edge (BGR 135, 133, 132), as RGB in [0, 1]
CROP_BORDER = np.array([132.0, 133.0, 135.0]) / 255.0

# OpenCV's fixed Gaussian kernels for ksize ≤ 7 when sigma is derived from the size (getGaussianKernel)
_SMALL_GAUSSIANS = {
    1: [1.0],
    3: [0.25, 0.5, 0.25],
    5: [0.0625, 0.25, 0.375, 0.25, 0.0625],
    7: [0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125],
}


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2×3 rotation + uniform scale + translation that maps the points `src` [N, 2] closest to `dst` [N, 2] in
    the least-squares sense."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    # x' = a x - b y + tx, y' = b x + a y + ty: linear in (a, b, tx, ty)
    rows = np.zeros((2 * len(src), 4))
    rows[0::2] = np.stack([src[:, 0], -src[:, 1], np.ones(len(src)), np.zeros(len(src))], axis=1)
    rows[1::2] = np.stack([src[:, 1], src[:, 0], np.zeros(len(src)), np.ones(len(src))], axis=1)
    (a, b, tx, ty), *_ = np.linalg.lstsq(rows, dst.reshape(-1), rcond=None)
    return np.array([[a, -b, tx], [b, a, ty]])


def invert_affine(matrix: np.ndarray) -> np.ndarray:
    """The 2×3 affine transform that undoes `matrix` (cv2.invertAffineTransform)."""
    linear = np.linalg.inv(matrix[:, :2])
    return np.concatenate([linear, -linear @ matrix[:, 2:]], axis=1)


def warp_affine(image: np.ndarray, matrix: np.ndarray, size: tuple[int, int], border: float | np.ndarray = 0.0):
    """`image` [H, W] or [H, W, C] moved by the 2×3 `matrix` into an output of `size` (width, height), sampled
    bilinearly; a neighbour outside the image counts as `border` (cv2.warpAffine, INTER_LINEAR, BORDER_CONSTANT)."""
    width, height = size
    back = invert_affine(np.asarray(matrix, np.float64))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    sx = back[0, 0] * xs + back[0, 1] * ys + back[0, 2]
    sy = back[1, 0] * xs + back[1, 1] * ys + back[1, 2]
    x0, y0 = np.floor(sx).astype(np.int64), np.floor(sy).astype(np.int64)
    fx, fy = (sx - x0).astype(np.float32), (sy - y0).astype(np.float32)
    flat = image.reshape(image.shape[0], image.shape[1], -1).astype(np.float32)
    fill = np.broadcast_to(np.asarray(border, np.float32), (flat.shape[2],))
    out = np.zeros((height, width, flat.shape[2]), np.float32)
    for dy, wy in ((0, 1.0 - fy), (1, fy)):
        for dx, wx in ((0, 1.0 - fx), (1, fx)):
            px, py = x0 + dx, y0 + dy
            inside = (px >= 0) & (px < flat.shape[1]) & (py >= 0) & (py < flat.shape[0])
            values = np.where(
                inside[..., None], flat[py.clip(0, flat.shape[0] - 1), px.clip(0, flat.shape[1] - 1)], fill
            )
            out += (wy * wx)[..., None] * values
    return out.reshape((height, width) + image.shape[2:])


def erode(mask: np.ndarray, size: int) -> np.ndarray:
    """The minimum over a size×size square anchored at its centre, the image's outside ignored (cv2.erode with
    np.ones((size, size)); OpenCV reads an empty kernel as 3×3)."""
    size = size or 3
    before = size // 2  # OpenCV's anchor: the window spans [-size//2, size - 1 - size//2]
    out = mask
    for axis in (0, 1):
        padded = np.pad(
            out, [(before, size - 1 - before) if a == axis else (0, 0) for a in range(2)], constant_values=np.inf
        )
        n = out.shape[axis]
        out = np.min([np.take(padded, np.arange(k, k + n), axis=axis) for k in range(size)], axis=0)
    return out


def gaussian_blur(mask: np.ndarray, ksize: int) -> np.ndarray:
    """cv2.GaussianBlur(mask, (ksize, ksize), 0): the sigma OpenCV derives from the size, edges reflected
    (BORDER_REFLECT_101)."""
    if ksize in _SMALL_GAUSSIANS:
        kernel = np.array(_SMALL_GAUSSIANS[ksize])
    else:
        sigma = 0.3 * ((ksize - 1) * 0.5 - 1) + 0.8
        offsets = np.arange(ksize) - (ksize - 1) / 2
        kernel = np.exp(-(offsets**2) / (2 * sigma**2))
        kernel /= kernel.sum()
    radius = ksize // 2
    out = mask.astype(np.float64)
    for axis in (0, 1):
        padded = np.pad(out, [(radius, radius) if a == axis else (0, 0) for a in range(2)], mode="reflect")
        n = out.shape[axis]
        out = sum(w * np.take(padded, np.arange(k, k + n), axis=axis) for k, w in enumerate(kernel))
    return out.astype(np.float32)


def align_face(image: np.ndarray, landmarks: np.ndarray, face_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """The face whose 5 `landmarks` [5, 2] (x, y in `image`'s pixels) are given, cropped to the FFHQ template at
    face_size², and the 2×3 transform that did it."""
    template = FACE_TEMPLATE_512 * (face_size / 512.0)
    matrix = similarity_transform(landmarks, template)
    return warp_affine(image, matrix, (face_size, face_size), CROP_BORDER), matrix


def paste_face(image: np.ndarray, face: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """`image` with the aligned `face` (cropped by `matrix`) put back in place under a square mask, eroded by a
    twentieth of the face's size and blurred as wide, so the face fades into the image (facexlib's helper without
    its face-parsing mask, upscale factor 1). Only the face's footprint is computed."""
    height, width = image.shape[:2]
    face_size = face.shape[0]
    back = invert_affine(matrix)
    # the footprint's box, widened by what erosion and blur reach: outside it the mask is exactly 0
    corners = np.array([[0, 0, 1], [face_size, 0, 1], [0, face_size, 1], [face_size, face_size, 1]]) @ back.T
    reach = int(np.sqrt(abs(np.linalg.det(back[:, :2]))) * face_size / 20) * 3 + 4
    x0, y0 = (np.floor(corners.min(axis=0)) - reach).astype(int).clip(0, [width, height])
    x1, y1 = (np.ceil(corners.max(axis=0)) + reach).astype(int).clip(0, [width, height])
    if x1 <= x0 or y1 <= y0:
        return image
    window = back.copy()
    window[:, 2] -= (x0, y0)
    size = (x1 - x0, y1 - y0)
    restored = warp_affine(face, window, size)
    mask = erode(warp_affine(np.ones((face_size, face_size), np.float32), window, size), 2)
    edge = int(float(mask.sum()) ** 0.5) // 20
    soft = gaussian_blur(erode(mask, edge * 2), edge * 2 + 1)[..., None]
    out = image.copy()
    region = out[y0:y1, x0:x1]
    out[y0:y1, x0:x1] = soft * (mask[..., None] * restored) + (1 - soft) * region
    return out
