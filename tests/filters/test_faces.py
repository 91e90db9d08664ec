"""Face restoration's runtime: RetinaFace's anchors, decoding and NMS against facexlib's and torchvision's; then a
narrow GFPGAN and facexlib's MobileNet-0.25 RetinaFace (seeded weights) exported, built for ONNX Runtime and OpenVINO
and loaded with enginefarm.filters.load: the engines against spandrel and facexlib, and a whole restoration against
GFPGAN's helper done with OpenCV and spandrel."""

from __future__ import annotations

import json

import numpy as np
import pytest

import enginefarm
import enginefarm.filters
from enginefarm.errors import ConfigError
from enginefarm.filters import face_align, faces
from enginefarm.filters.info import FilterInfo
from tests.conftest import run_cli
from tests.export.filters.face_files import (
    facexlib_retinaface,
    save_codeformer,
    save_gfpgan,
    save_retinaface,
    tiny_codeformer,
    tiny_gfpgan,
)
from tests.filters.test_face_align import facexlib_paste, known_landmarks, smooth_image

torch = pytest.importorskip("torch")
cv2 = pytest.importorskip("cv2")

# facexlib's RetinaFace configuration (retinaface.py: generate_config), as the export writes it into filter.json
FACEXLIB_CFG = {"min_sizes": [[16, 32], [64, 128], [256, 512]], "steps": [8, 16, 32], "clip": False}


def test_anchors_and_decoding_match_facexlib():
    facexlib_retinaface("mobile0.25")  # makes facexlib's detection modules importable
    from facexlib.detection.retinaface_utils import PriorBox, decode, decode_landm

    height, width = 90, 133  # not multiples of the strides: the maps' sizes round up
    priors = PriorBox(FACEXLIB_CFG, image_size=(height, width)).forward()
    ours = faces.anchors(height, width, FACEXLIB_CFG["min_sizes"], FACEXLIB_CFG["steps"])
    np.testing.assert_allclose(ours, priors.numpy(), atol=1e-6)
    rng = np.random.default_rng(0)
    loc, points = rng.normal(0, 1, (len(ours), 4)), rng.normal(0, 1, (len(ours), 10))
    boxes, landmarks = faces.decode(loc, points, ours, [0.1, 0.2])
    want_boxes = decode(torch.tensor(loc, dtype=torch.float32), priors, [0.1, 0.2]).numpy()
    want_points = decode_landm(torch.tensor(points, dtype=torch.float32), priors, [0.1, 0.2]).numpy()
    np.testing.assert_allclose(boxes, want_boxes, atol=1e-5)
    np.testing.assert_allclose(landmarks.reshape(-1, 10), want_points, atol=1e-5)


def test_nms_matches_torchvision():
    from torchvision.ops import nms

    rng = np.random.default_rng(1)
    corner = rng.uniform(0, 100, (300, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(5, 40, (300, 2))], axis=1)
    order = np.argsort(-rng.random(300))
    boxes = boxes[order]
    for threshold in (0.2, 0.4, 0.7):
        want = nms(torch.tensor(boxes), torch.linspace(1, 0, 300, dtype=torch.float64), threshold).numpy()
        got = faces.nms(boxes, threshold)
        assert 20 < len(got) < 300 and np.array_equal(got, want)


def test_strength_outside_its_range_is_one_line():
    restorer = faces.FaceRestorer(FilterInfo("gfpgan", "face_restorer", "GFPGAN", ("restorer",)), {})
    image = np.zeros((8, 8, 3), np.float32)
    with pytest.raises(ConfigError, match="strength 1.5"):
        restorer.restore(image, [np.zeros((5, 2))], strength=1.5)
    with pytest.raises(ConfigError, match="no fidelity setting"):
        restorer.restore(image, [np.zeros((5, 2))], fidelity=0.3)
    with pytest.raises(ConfigError, match="needs a face detector"):
        restorer(image)
    with pytest.raises(ConfigError, match=r"float image \[height, width, 3\]"):
        restorer.restore(np.zeros((8, 8), np.uint8), [])


@pytest.fixture(scope="module")
def face_store(tmp_path_factory):
    """A narrow GFPGAN and facexlib's MobileNet-0.25 RetinaFace exported and built into one store; the restorer's
    filter.json names this detector (what a user edits to use another than the default retinaface-resnet50)."""
    from enginefarm.export.filters.run import export_filter

    root = tmp_path_factory.mktemp("faces")
    models = {"gfpgan": tiny_gfpgan(), "detector": facexlib_retinaface("mobile0.25")}
    restorer = export_filter(save_gfpgan(models["gfpgan"], root / "GFPGANv1.4.pth"), root / "gfpgan", "gfpgan-tiny")
    detector_file = save_retinaface(models["detector"], root / "detection_mobilenet0.25_Final.pth")
    detector = export_filter(detector_file, root / "retinaface", "retinaface-tiny")
    info_path = restorer.out / "assets" / "filter.json"
    info = json.loads(info_path.read_text())
    info["details"]["uses"]["detector"] = "retinaface-tiny"
    info_path.write_text(json.dumps(info))
    store = root / "store"
    ort, ov = ("--target", "onnxruntime:cpu"), ("--target", "openvino:cpu")
    fp32, fp16 = ("--precision", "fp32"), ("--precision", "fp16")
    for export, choice in ((restorer, ort + fp32 + fp16), (restorer, ov + fp32), (detector, ort + ov + fp32)):
        run_cli("build", str(export.recipe), "--store", str(store), "--no-bench", "-j", "2", *choice, check=True)
    return store, models


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "precision", "limit"),
    [("onnxruntime:cpu", "fp32", 1e-3), ("onnxruntime:cpu", "fp16", 2e-2), ("openvino:cpu", "fp32", 1e-3)],
)
def test_restorer_engine_matches_spandrel(face_store, target, precision, limit):
    store, models = face_store
    face, _ = face_align.align_face(smooth_image(300, 380), known_landmarks(0.5, 0.1, (60.0, 20.0), 1.0))
    feed = np.ascontiguousarray(face.transpose(2, 0, 1)[None] * 2 - 1)
    with torch.no_grad():
        want = models["gfpgan"](torch.from_numpy(feed), return_rgb=False, randomize_noise=False)[0].numpy()
    # the component as enginefarm.filters.load loads it (the detector was built at fp32 only)
    with enginefarm.load("gfpgan-tiny/restorer", store=str(store), target=target, precision=precision) as session:
        got = session.run({"face": feed.astype(np.float32)})["restored"]
    assert float(np.abs(got - want).max() / np.ptp(want)) < limit


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_detector_engine_matches_facexlib_detect_faces(face_store, target):
    store, models = face_store
    image = np.random.default_rng(3).random((160, 200, 3)).astype(np.float32)
    with torch.no_grad():  # facexlib takes the BGR image in 0-255
        want = models["detector"].detect_faces(np.ascontiguousarray(image[:, :, ::-1] * 255), 0.6)
    with enginefarm.filters.load("retinaface-tiny", store=str(store), target=target, precision="fp32") as detector:
        found = detector(image, threshold=0.6)
    assert len(want) > 5 and len(found) == len(want)
    for (box, score, landmarks), row in zip(found, want, strict=True):
        np.testing.assert_allclose(box, row[:4], atol=1e-3)
        np.testing.assert_allclose(landmarks.reshape(-1), row[5:], atol=1e-3)
        assert abs(score - row[4]) < 1e-4


@pytest.mark.slow
def test_whole_restoration_matches_gfpgans_helper(face_store):
    store, models = face_store
    image = smooth_image(300, 380)
    landmarks = known_landmarks(0.45, -0.2, (30.0, 40.0), 1.0)
    with enginefarm.filters.load("gfpgan-tiny", store=str(store), target="onnxruntime:cpu", precision="fp32") as f:
        assert isinstance(f, faces.FaceRestorer) and isinstance(f.uses["detector"], faces.FaceDetector)
        # the seeded detector is never 0.97 sure of anything: no face, the image comes back as it was
        assert f.uses["detector"](image, threshold=faces.RESTORE_THRESHOLD) == []
        np.testing.assert_array_equal(f(image), image)
        restored = f.restore(image, [landmarks])
        half = f.restore(image, [landmarks], strength=0.5)
    with enginefarm.filters.load("gfpgan-tiny", store=str(store), target="onnxruntime:cpu", precision="fp16") as f16:
        # its detector is built at fp32 only: taken at the precision the store has, not refused
        assert f16.sessions["restorer"].artifact.precision == "fp16"
        assert f16.uses["detector"].sessions["detector"].artifact.precision == "fp32"
    # GFPGAN's helper: OpenCV's estimate and warp, the network, clamp to [-1, 1], OpenCV's paste (in float)
    affine = cv2.estimateAffinePartial2D(landmarks, face_align.FACE_TEMPLATE_512, method=cv2.LMEDS)[0]
    border = tuple(face_align.CROP_BORDER.tolist())
    crop = cv2.warpAffine(image, affine, (512, 512), borderMode=cv2.BORDER_CONSTANT, borderValue=border)
    with torch.no_grad():
        feed = torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)[None] * 2 - 1))
        out = models["gfpgan"](feed, return_rgb=False, randomize_noise=False)[0]
    face = ((out.clamp(-1, 1)[0].numpy() + 1) / 2).transpose(1, 2, 0)
    want = facexlib_paste(image, face, affine)
    assert np.abs(want - image).max() > 0.1  # the face changed the image
    assert np.abs(restored - want).max() < 1e-3
    np.testing.assert_allclose(half, (image + restored) / 2, atol=1e-5)


@pytest.fixture(scope="module")
def codeformer_store(face_store, tmp_path_factory):
    """A narrow CodeFormer (the published block layout, seeded) exported from its codeformer.pth and built for ONNX
    Runtime at fp32 into the face store, using the tiny detector built there. (OpenVINO's build of it takes 24 s
    more here; its engine matched spandrel's to 2.5e-6 when checked by hand.)"""
    from enginefarm.export.filters.run import export_filter

    store, _ = face_store
    root = tmp_path_factory.mktemp("codeformer")
    model = tiny_codeformer()
    export = export_filter(save_codeformer(model, root / "codeformer.pth"), root / "codeformer", "codeformer-tiny")
    info_path = export.out / "assets" / "filter.json"
    info = json.loads(info_path.read_text())
    info["details"]["uses"]["detector"] = "retinaface-tiny"
    info_path.write_text(json.dumps(info))
    choice = ("--target", "onnxruntime:cpu", "--precision", "fp32")
    run_cli("build", str(export.recipe), "--store", str(store), "--no-bench", *choice, check=True)
    return store, model


def _codeformer_helper(model, image, landmarks, fidelity):
    """sdkit's CodeFormer filter in float: OpenCV's alignment, `codeformer_net(face, w=fidelity, adain=True)` (here
    spandrel's CodeFormer, whose `weight` is that w, AdaIN always on), clamped to [-1, 1], OpenCV's paste."""
    affine = cv2.estimateAffinePartial2D(landmarks, face_align.FACE_TEMPLATE_512, method=cv2.LMEDS)[0]
    border = tuple(face_align.CROP_BORDER.tolist())
    crop = cv2.warpAffine(image, affine, (512, 512), borderMode=cv2.BORDER_CONSTANT, borderValue=border)
    with torch.no_grad():
        feed = torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)[None] * 2 - 1))
        out = model(feed, weight=fidelity)[0]
    face = ((out.clamp(-1, 1)[0].numpy() + 1) / 2).transpose(1, 2, 0)
    return facexlib_paste(image, face, affine)


@pytest.mark.slow
def test_codeformer_restoration_matches_sdkits_steps(codeformer_store):
    """Through export, build and enginefarm.filters.load, at a fidelity other than the default (each run of the
    512² network costs seconds here, so one): the engine's `w` is the reference's."""
    store, model = codeformer_store
    image = smooth_image(300, 380, seed=2)
    landmarks = known_landmarks(0.5, 0.15, (40.0, 30.0), 1.0)
    with enginefarm.filters.load("codeformer-tiny", store=str(store), target="onnxruntime:cpu", precision="fp32") as f:
        assert isinstance(f, faces.FaceRestorer) and f.info.architecture == "CodeFormer"
        assert f._fidelity_feed(None)["w"].tolist() == [0.5]  # sdkit's codeformer_fidelity default
        restored = f.restore(image, [landmarks], fidelity=0.7)
    want = _codeformer_helper(model, image, landmarks, 0.7)
    assert np.abs(want - image).max() > 0.1  # the face changed the image
    assert np.abs(restored - want).max() < 1e-3
