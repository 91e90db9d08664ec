"""The soft-edge modes in numpy (filters/softedge.py) against OpenCV and controlnet-aux's util steps re-created with
it: the Gaussian blurs (float, and 8-bit bit-exact), nms, the scribble strokes, safe_step; and the names
`--control-from` takes."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.filters import softedge

from .scenes import scene

cv2 = pytest.importorskip("cv2")


def aux_nms(x: np.ndarray, threshold: float, sigma: float) -> np.ndarray:
    """controlnet-aux's util.nms: blurred, kept where cv2.dilate along a 3-pixel line leaves it unchanged."""
    x = cv2.GaussianBlur(x.astype(np.float32), (0, 0), sigma)
    lines = ([[0, 0, 0], [1, 1, 1], [0, 0, 0]], [[0, 1, 0], [0, 1, 0], [0, 1, 0]])
    diagonals = ([[1, 0, 0], [0, 1, 0], [0, 0, 1]], [[0, 0, 1], [0, 1, 0], [1, 0, 0]])
    kept = np.zeros_like(x)
    for line in (*lines, *diagonals):
        np.putmask(kept, cv2.dilate(x, kernel=np.array(line, np.uint8)) == x, x)
    return np.where(kept > threshold, 255, 0).astype(np.uint8)


def aux_scribble(detected: np.ndarray) -> np.ndarray:
    """HEDdetector/PidiNetDetector(scribble=True) after the 8-bit map is at the image's size."""
    strokes = cv2.GaussianBlur(aux_nms(detected, 127, 3.0), (0, 0), 3.0)
    return np.where(strokes > 4, 255, 0).astype(np.uint8)


def aux_safe_step(x: np.ndarray, step: int = 2) -> np.ndarray:
    return (x.astype(np.float32) * float(step + 1)).astype(np.int32).astype(np.float32) / float(step)


def soft_edges(seed: int, height: int = 150, width: int = 230) -> np.ndarray:
    """An 8-bit soft edge map: Canny's edges of a scene, blurred and scaled to reach 255."""
    photo = (scene(seed, height, width)[:, :, 1] * 255).astype(np.uint8)
    edges = cv2.GaussianBlur(cv2.Canny(photo, 50, 120).astype(np.float32), (0, 0), 1.5)
    return np.clip(edges * (255 / edges.max()) * 1.3, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("sigma", [0.8, 3.0])
def test_gaussian_blur_is_opencvs(sigma):
    values = soft_edges(1)
    blurred = softedge.gaussian_blur(values.astype(np.float32), sigma)
    assert np.abs(blurred - cv2.GaussianBlur(values.astype(np.float32), (0, 0), sigma)).max() < 2e-4
    # 8-bit: OpenCV's fixed-point kernel, reproduced exactly
    strokes = np.where(np.random.default_rng(0).random(values.shape) > 0.97, 255, 0).astype(np.uint8)
    for image in (values, strokes):
        eight_bit = softedge.gaussian_blur(image.astype(np.float32), sigma, eight_bit=True)
        assert np.array_equal(eight_bit, cv2.GaussianBlur(image, (0, 0), sigma).astype(np.float32))


def test_nms_and_scribble_match_controlnet_aux_steps():
    """nms keeps a pixel its neighbour ties with: where OpenCV's float blur and numpy's differ in the last bit
    (6e-5 of 255), a tie can break; a handful of the ~35,000 pixels, never a stroke more or less."""
    flips = []
    for seed in (2, 3, 5):
        detected = soft_edges(seed)
        thin = softedge.nms(detected.astype(np.float32), 127, 3.0)
        expected = aux_nms(detected, 127, 3.0)
        assert 0.002 < expected.mean() / 255 < 0.2  # thin lines, some of them
        flips.append(int((thin * 255 != expected).sum()))
        strokes = softedge.scribble(detected.astype(np.float32) / 255)
        assert set(np.unique(strokes)) == {0.0, 1.0}
        assert (strokes * 255 != aux_scribble(detected)).mean() < 1e-3
    assert max(flips) <= 2 and sum(flips) < 4, flips


def test_safe_step_equals_controlnet_aux():
    edge = np.concatenate([np.linspace(0, 1, 1001, dtype=np.float32), scene(4)[:, :, 0].ravel()])
    assert np.array_equal(softedge.safe_step(edge), aux_safe_step(edge))
    assert set(np.unique(softedge.safe_step(edge))) == {0.0, 0.5, 1.0, 1.5}


def test_control_source_names():
    assert softedge.control_source("softedge_pidsafe") == ("pidinet", True, False)
    assert softedge.control_source("scribble_pidinet") == ("pidinet", False, True)
    assert softedge.control_source("scribble_hedsafe") == ("hed", True, True)
    assert softedge.control_source("softedge_hed") == ("hed", False, False)
    assert softedge.control_source("my-edges:scribble, safe") == ("my-edges", True, True)
    assert softedge.control_source("depth-anything") == ("depth-anything", False, False)
    for bad, said in (("hed:thin", "thin is not a soft-edge mode"), ("hed:", "no mode is not")):
        with pytest.raises(ConfigError, match=said):
            softedge.control_source(bad)


def test_a_mode_on_a_preprocessor_that_is_not_soft_edges_is_one_line():
    from enginefarm.filters.info import FilterInfo
    from enginefarm.filters.preprocess import Preprocessor

    depth = Preprocessor(FilterInfo("depth-small", "preprocessor", "DepthAnything", ("depth",), {"task": "depth"}), {})
    for mode in ("safe", "scribble"):
        with pytest.raises(ConfigError, match="depth-small makes depth control images: safe and scribble are soft"):
            depth(scene(1, 64, 64), **{mode: True})
