"""The numpy face alignment against what facexlib's FaceRestoreHelper does with OpenCV (upscale 1, square mask)."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.filters import face_align

cv2 = pytest.importorskip("cv2")


def smooth_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A photo-like image: smooth colour waves."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width] / max(height, width)
    phases = rng.uniform(0, 2 * np.pi, size=(3, 2))
    channels = [0.5 + 0.4 * np.sin(7 * xs + p) * np.cos(5 * ys + q) for p, q in phases]
    return np.stack(channels, axis=-1).astype(np.float32)


def known_landmarks(scale: float, angle: float, shift: tuple[float, float], noise: float, seed: int = 0):
    """The template's landmarks carried into an image by a known similarity, jittered as a detector's are."""
    c, s = np.cos(angle), np.sin(angle)
    to_image = np.array([[c * scale, -s * scale, shift[0]], [s * scale, c * scale, shift[1]]])
    points = face_align.FACE_TEMPLATE_512 @ to_image[:, :2].T + to_image[:, 2]
    return points + np.random.default_rng(seed).normal(0, noise, points.shape)


def facexlib_paste(image, face, affine):
    """facexlib's paste_faces_to_input_image, use_parse=False, upscale_factor=1, in OpenCV (float images)."""
    h, w = image.shape[:2]
    inverse = cv2.invertAffineTransform(affine)
    inv_restored = cv2.warpAffine(face, inverse, (w, h))
    inv_mask = cv2.warpAffine(np.ones((512, 512), np.float32), inverse, (w, h))
    inv_mask_erosion = cv2.erode(inv_mask, np.ones((2, 2), np.uint8))
    pasted = inv_mask_erosion[:, :, None] * inv_restored
    w_edge = int(np.sum(inv_mask_erosion) ** 0.5) // 20
    inv_mask_center = cv2.erode(inv_mask_erosion, np.ones((w_edge * 2, w_edge * 2), np.uint8))
    soft = cv2.GaussianBlur(inv_mask_center, (w_edge * 2 + 1, w_edge * 2 + 1), 0)[:, :, None]
    return soft * pasted + (1 - soft) * image


@pytest.mark.parametrize("noise", [0.0, 1.5])
def test_similarity_matches_opencv_lmeds(noise):
    landmarks = known_landmarks(0.4, 0.3, (60.0, 25.0), noise)
    ours = face_align.similarity_transform(landmarks, face_align.FACE_TEMPLATE_512)
    theirs = cv2.estimateAffinePartial2D(landmarks, face_align.FACE_TEMPLATE_512, method=cv2.LMEDS)[0]
    # every landmark is an inlier: LMEDS refines to the least-squares fit
    np.testing.assert_allclose(ours, theirs, atol=1e-4 * np.abs(theirs).max())
    np.testing.assert_allclose(face_align.invert_affine(ours), cv2.invertAffineTransform(ours), atol=1e-9)


def test_crop_and_paste_match_opencv():
    image = smooth_image(300, 380)
    landmarks = known_landmarks(0.45, -0.2, (10.0, 40.0), 1.0)  # the face runs over the left edge: the gray border
    face, affine = face_align.align_face(image, landmarks)
    expected = cv2.warpAffine(
        image, affine, (512, 512), borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(face_align.CROP_BORDER.tolist())
    )
    assert face.shape == (512, 512, 3) and (face == face_align.CROP_BORDER.astype(np.float32)).all(-1).any()
    assert np.abs(face - expected).max() < 1e-5

    restored = smooth_image(512, 512, seed=1)
    ours = face_align.paste_face(image, restored, affine)
    theirs = facexlib_paste(image, restored, affine)
    assert np.abs(ours - theirs).max() < 1e-5
    changed = np.abs(theirs - image).max(-1) > 0.05
    assert changed.mean() > 0.05 and np.abs(ours - image)[changed].mean() > 0.05  # the face went in


@pytest.mark.parametrize("size", [0, 2, 7])
def test_erode_and_blur_match_opencv(size):
    mask = (np.random.default_rng(size).random((40, 50)) > 0.3).astype(np.float32)
    np.testing.assert_array_equal(face_align.erode(mask, size), cv2.erode(mask, np.ones((size, size), np.uint8)))
    ksize = 2 * size + 1
    np.testing.assert_allclose(
        face_align.gaussian_blur(mask, ksize), cv2.GaussianBlur(mask, (ksize, ksize), 0), atol=1e-6
    )
