"""Openpose (body_pose_model.pth) as a ControlNet preprocessor: recognised from its keys, its graph equal to
controlnet-aux's bodypose_model, the numpy decoder (peaks, limbs, people) and drawing against controlnet-aux's
Body.__call__ and draw_bodypose re-created (openpose_files.py), on synthetic people and on a seeded net's maps; one
build on ONNX Runtime and OpenVINO checked against the torch net."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from ...conftest import run_cli
from ...filters.scenes import scene
from .openpose_face_files import write_face_file
from .openpose_files import (
    PERSON,
    reference_decode,
    reference_draw,
    reference_draw_hand,
    reference_hand,
    reference_hand_boxes,
    reference_maps,
    synthetic_maps,
    write_body_file,
    write_hand_file,
)

torch = pytest.importorskip("torch")
cv2 = pytest.importorskip("cv2")
pytest.importorskip("scipy")


def _two_people():
    """Two people side by side, the first without its right ear, the second without its right wrist."""
    second = [(x + 76, y + 8) for x, y in PERSON]
    return synthetic_maps([PERSON, second], missing={(0, 16), (1, 4)})


def test_openpose_body_is_recognised_and_is_controlnet_aux_network(tmp_path):
    from enginefarm.export.filters.openpose import build_openpose_body
    from enginefarm.export.filters.reading import read_filter_source, recognise

    network = write_body_file(tmp_path / "body_pose_model.pth")
    source = read_filter_source(tmp_path / "body_pose_model.pth")
    architecture = recognise(source)
    parts = architecture.build(source)
    assert architecture.kind == "preprocessor" and parts.details["task"] == "openpose"
    assert parts.details["widths"] == [4, 8, 8, 8] and parts.details["stages"] == 6
    x = torch.rand(1, 3, 184, 248) - 0.5
    with torch.no_grad():
        pafs, heatmaps = parts.parts["body"].module(x)
        expected = network(x)
    assert torch.equal(pafs, expected[0]) and torch.equal(heatmaps, expected[1])
    assert heatmaps.shape == (1, 19, 23, 31) and float(heatmaps.min()) == 0  # the ReLU controlnet-aux leaves on
    state = dict(source.state)
    state.pop("Mconv3_stage4_L2.weight")
    with pytest.raises(ConfigError, match="not the layout of body_pose_model.pth"):
        build_openpose_body(type(source)(source.path, state))


def test_gaussian_is_scipys():
    from scipy.ndimage import gaussian_filter  # type: ignore[import-untyped]

    from enginefarm.filters.openpose import gaussian_filter as ours

    values = np.random.default_rng(0).random((37, 52))
    assert np.abs(ours(values) - gaussian_filter(values, sigma=3)).max() < 1e-12


def test_decoder_finds_the_reference_people_and_draws_them():
    from enginefarm.filters.openpose import Poses, decode
    from enginefarm.filters.pose_draw import draw_bodies

    heatmaps, pafs = _two_people()
    candidate, subset = decode(heatmaps, pafs)
    expected_candidate, expected_subset = reference_decode(heatmaps, pafs)
    assert np.array_equal(candidate, expected_candidate) and np.array_equal(subset, expected_subset)
    people = Poses(candidate, subset, 256, 192).people()
    assert len(people) == 2 and sum(j is None for j in people[0]) == 1 and sum(j is None for j in people[1]) == 1
    first = next(p for p in people if p[16] is None)  # the person without its right ear
    assert first[0] == pytest.approx((64 / 192, 40 / 256))
    canvas = draw_bodies(256, 192, people)
    expected = reference_draw(expected_candidate, expected_subset, 256, 192)
    assert np.any(expected > 0, axis=2).mean() > 0.1
    assert np.array_equal(canvas, expected)  # OpenCV's polygon, scan fill and 8-connected outline, pixel for pixel


def test_drawing_is_opencvs_on_random_poses():
    from enginefarm.filters.openpose import Poses
    from enginefarm.filters.pose_draw import draw_bodies

    rng = np.random.default_rng(0)
    height, width = 256, 320
    candidate = np.concatenate([rng.uniform(0, [width - 1, height - 1], (54, 2)).round(), np.ones((54, 2))], 1)
    subset = -np.ones((3, 20))
    subset[:, :18] = np.where(rng.random((3, 18)) < 0.2, -1, np.arange(54).reshape(3, 18))
    canvas = draw_bodies(height, width, Poses(candidate, subset, height, width).people())
    expected = reference_draw(candidate, subset, height, width)
    equal = np.all(canvas == expected, axis=2)[np.any(expected > 0, axis=2)]
    assert equal.mean() > 0.999, equal.mean()  # long sticks at every angle: a rare edge pixel may differ


def test_decoder_matches_on_a_seeded_nets_maps(tmp_path):
    """A random net's maps are meaningless but busy (hundreds of candidates, dozens of 'people'): every merge and
    tie-break of the assembly runs."""
    from enginefarm.filters.openpose import decode
    from enginefarm.filters.preprocess import resize

    network = write_body_file(tmp_path / "body_pose_model.pth")
    photo = resize(scene(11, height=96, width=128), (128, 192), "bicubic")
    heatmaps, pafs = reference_maps(network, photo[:, :, ::-1] * 255)
    candidate, subset = decode(heatmaps, pafs)
    expected_candidate, expected_subset = reference_decode(heatmaps, pafs)
    assert len(expected_candidate) > 50 and len(expected_subset) > 2
    assert np.array_equal(candidate, expected_candidate) and np.array_equal(subset, expected_subset)


def test_openpose_hand_is_recognised_and_is_controlnet_aux_network(tmp_path):
    from enginefarm.export.filters.reading import read_filter_source, recognise

    network = write_hand_file(tmp_path / "hand_pose_model.pth")
    source = read_filter_source(tmp_path / "hand_pose_model.pth")
    parts = recognise(source).build(source)
    assert parts.details["task"] == "openpose_hand" and parts.details["uses"] == {"body": "openpose"}
    x = torch.rand(1, 3, 184, 184) - 0.5
    with torch.no_grad():
        assert torch.equal(parts.parts["hand"].module(x), network(x))


def test_hand_boxes_regions_and_drawing_are_controlnet_auxs():
    from scipy.ndimage import label

    from enginefarm.filters.openpose_hand import _largest_region, draw_hand, hand_boxes

    rng = np.random.default_rng(0)
    for _ in range(20):  # the largest-scoring 8-connected region, as skimage's label (here scipy's) finds them
        mask, values = rng.random((40, 40)) < 0.45, rng.random((40, 40))
        labels, count = label(mask, structure=np.ones((3, 3)))
        best = 1 + int(np.argmax([values[labels == i].sum() for i in range(1, count + 1)]))
        assert np.array_equal(_largest_region(mask, values), labels == best)
    for shift in (0, 60, 130):  # whole boxes, boxes cut at the right edge, a hand too small
        joints = [(x + shift, y) for x, y in PERSON]
        joints[3] = None if shift == 130 else joints[3]
        assert hand_boxes(joints, 256, 192) == reference_hand_boxes(joints, 256, 192)
    equal = []
    for _ in range(10):
        joints = rng.uniform(0.05, 0.95, (21, 2)).astype(np.float32)
        joints[rng.random(21) < 0.1] = -1
        ours, expected = np.zeros((128, 128, 3), np.uint8), np.zeros((128, 128, 3), np.uint8)
        draw_hand(ours, joints)
        reference_draw_hand(expected, joints)
        drawn = np.any((ours > 0) | (expected > 0), axis=2)
        equal.append(np.all(ours == expected, axis=2)[drawn].mean())
    # the joints' discs are OpenCV's exactly; its two-pixel lines place their corners to 1/65536 of a pixel
    assert np.mean(equal) > 0.9, np.mean(equal)


@pytest.mark.slow
def test_openpose_built_matches_torch_and_controlnet_aux_steps(tmp_path):
    import enginefarm.filters
    from enginefarm.export.filters.run import export_filter
    from enginefarm.filters.openpose import body_maps, detect_poses
    from enginefarm.filters.openpose_hand import hand_joints
    from enginefarm.filters.preprocess import resize

    network = write_body_file(tmp_path / "body_pose_model.pth")
    hand_network = write_hand_file(tmp_path / "hand_pose_model.pth")
    face_network = write_face_file(tmp_path / "facenet.pth")
    out, hand_out, face_out = tmp_path / "openpose", tmp_path / "openpose-hand", tmp_path / "openpose-face"
    export_filter(tmp_path / "body_pose_model.pth", out, name="openpose", targets=("onnxruntime:cpu", "openvino:cpu"))
    hand_targets = dict(targets=("onnxruntime:cpu",), precisions=("fp32",))
    export_filter(tmp_path / "hand_pose_model.pth", hand_out, name="openpose-hand", **hand_targets)
    export_filter(tmp_path / "facenet.pth", face_out, name="openpose-face", **hand_targets)
    recipe = (out / "recipe.toml").read_text().replace("[48, 184, 736]", "[48, 184, 288]")
    assert recipe.count("[48, 184, 288]") == 2
    (out / "recipe.toml").write_text(recipe)
    store = tmp_path / "store"
    recipes = (str(out / "recipe.toml"), str(hand_out / "recipe.toml"), str(face_out / "recipe.toml"))
    run_cli("build", *recipes, "--store", str(store), "--no-bench", "-j", "2", check=True)

    photo = scene(11, height=96, width=128)
    detected = resize(photo, (128, 192), "bicubic")  # the detect size at resolution 128: short side 128, sides x64
    heatmaps, pafs = reference_maps(network, detected[:, :, ::-1] * 255)
    candidate, subset = reference_decode(heatmaps, pafs)
    scale = max(np.abs(heatmaps).max(), np.abs(pafs).max())
    expected = resize(reference_draw(candidate, subset, 128, 192).astype(np.float32) / 255, (96, 128), "bilinear")
    measured, controls = {}, {}
    for target, precision, tolerance in (
        ("onnxruntime:cpu", "fp32", 1e-3),
        ("onnxruntime:cpu", "fp16", 2e-2),
        ("openvino:cpu", "fp32", 1e-3),
        ("openvino:cpu", "fp16", 2e-2),
    ):
        with enginefarm.filters.load("openpose", store=str(store), precision=precision, target=target) as pose:
            assert pose.task == "openpose" and pose.detect_size(96, 128, 128) == (128, 192)
            assert pose.detect_size(96, 384, 128) == (128, 512)  # the detect size is not the engine's (up to 288)
            ours = body_maps(pose, detected)
            control = controls[target, precision] = pose(photo, detect_resolution=128)
            found = detect_poses(pose, photo, detect_resolution=128)
        deviation = max(np.abs(ours[0] - heatmaps).max(), np.abs(ours[1] - pafs).max()) / scale
        measured[f"{target} {precision}"] = f"{deviation:.1e}"
        assert deviation < tolerance, measured
        assert control.shape == (96, 128, 3) and control.dtype == np.float32 and control.max() > 0.3
        if precision == "fp32":  # the same people from the engine's maps as from the torch net's
            assert np.array_equal(found.subset[:, :18], subset[:, :18])
            assert np.array_equal(found.candidate[:, [0, 1, 3]], candidate[:, [0, 1, 3]])
            # the control image: the same drawing, resized alike
            assert np.abs(control - expected).max() < 1e-6, np.abs(control - expected).max()
    print(json.dumps(measured))

    # by name, as `generate --control-from openpose` makes it
    options = dict(store=str(store), precision="fp32", target="onnxruntime:cpu")
    by_name = enginefarm.filters.control_from(photo, "openpose", detect_resolution=128, **options)
    assert np.array_equal(by_name, controls["onnxruntime:cpu", "fp32"])
    with pytest.raises(ConfigError, match="pixels wide for its network, which takes up to 288"):
        enginefarm.filters.control_from(scene(3, height=48, width=256), "openpose", detect_resolution=128, **options)

    # hands (openpose_hand): the hand filter loads its body filter; its joints on a crop against Hand.__call__
    with enginefarm.filters.load("openpose-hand", **options) as hand:
        assert hand.task == "openpose_hand" and hand.uses["body"].task == "openpose"
        crop = np.floor(scene(5, height=72, width=72)[:, :, ::-1] * 255 + 0.5)
        ours, expected_joints = hand_joints(hand, crop), reference_hand(hand_network, crop.astype(np.uint8))
        assert np.array_equal(ours, expected_joints)  # OpenCV's fixed-point 8-bit blur and Lanczos, value for value
        control_hands = hand(photo, detect_resolution=128)
    assert control_hands.shape == (96, 128, 3)
    assert not np.array_equal(control_hands, controls["onnxruntime:cpu", "fp32"])  # the hands drawn over the bodies

    # faces (openpose_face, _faceonly, _full): the face filter loads its body filter; its maps against Face.__call__
    from enginefarm.filters.openpose_face import face_heatmaps, face_input

    from .openpose_face_files import reference_face_heatmaps

    with enginefarm.filters.load("openpose-face", **options) as face:
        assert face.task == "openpose_face" and face.uses["body"].task == "openpose"
        for side in (40, 400):  # Lanczos-4 up and area down to the engine's 384 square
            crop = np.floor(scene(7, height=side, width=side + 4)[:, :, ::-1] * 255 + 0.5)
            resized = face_input(crop)
            mode = cv2.INTER_AREA if side > 384 else cv2.INTER_LANCZOS4
            opencv = cv2.resize(crop.astype(np.uint8), (384, 384), interpolation=mode)
            assert np.array_equal(resized, opencv)  # OpenCV's fixed-point 8-bit Lanczos and its area resize
            with torch.no_grad():  # the engine against the torch net on the same input
                x = torch.from_numpy(np.float32(resized.transpose(2, 0, 1)[None] / 256 - 0.5))
                maps = face_network(x)[-1]
                maps = torch.nn.functional.interpolate(maps, (side, side + 4), mode="bilinear", align_corners=True)
            ours = face_heatmaps(face, crop)
            deviation = np.abs(ours - maps[0].numpy().transpose(1, 2, 0)).max() / float(maps.abs().max())
            expected_maps = reference_face_heatmaps(face_network, crop.astype(np.uint8)).transpose(1, 2, 0)
            from_opencv = np.abs(ours - expected_maps).max() / np.abs(expected_maps).max()
            print(f"face maps {side}px: engine {deviation:.1e}, against Face.__call__ {from_opencv:.1e}")
            assert deviation < 1e-3 and from_opencv < 1e-3
        control_face = face(photo, detect_resolution=128)
    named = {
        name: enginefarm.filters.control_from(photo, name, detect_resolution=128, **options)
        for name in ("openpose_face", "openpose_faceonly", "openpose_full")
    }
    assert np.array_equal(named["openpose_face"], control_face)
    only = named["openpose_faceonly"]
    # the seeded nets find faces (dozens of "people"): white dots alone, no body colours
    assert only.max() > 0.3 and np.array_equal(only[:, :, 0], only[:, :, 2])
    assert not np.array_equal(named["openpose_full"], control_face)  # the hands drawn too
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="openpose-face"):  # one line naming the filter the store lacks
        enginefarm.filters.control_from(photo, "openpose_full", **{**options, "store": str(tmp_path / "empty")})


def test_openpose_face_is_recognised_and_is_controlnet_aux_network(tmp_path):
    from enginefarm.export.filters.reading import read_filter_source, recognise

    from .openpose_face_files import write_face_file

    network = write_face_file(tmp_path / "facenet.pth")
    source = read_filter_source(tmp_path / "facenet.pth")
    architecture = recognise(source)
    parts = architecture.build(source)
    assert architecture.name.startswith("Openpose face") and parts.details["task"] == "openpose_face"
    assert parts.details["uses"] == {"body": "openpose"} and parts.details["side"] == 384
    x = torch.rand(1, 3, 96, 96) - 0.5  # any side: the engine's is 384
    with torch.no_grad():
        heatmaps = parts.parts["face"].module(x)
        assert heatmaps.shape == (1, 71, 12, 12) and torch.equal(heatmaps, network(x)[-1])
    write_hand_file(tmp_path / "hand_pose_model.pth")  # the same layer names, 22 heatmaps: still the hand net
    assert recognise(read_filter_source(tmp_path / "hand_pose_model.pth")).name.startswith("Openpose hands")


def test_face_boxes_peaks_and_drawing_are_controlnet_auxs():
    from torch.nn import functional

    from enginefarm.filters.openpose_face import aligned_matrix, draw_face, face_box, face_peaks
    from enginefarm.filters.resampling import apply_matrices, lanczos_8bit

    from .openpose_face_files import reference_draw_face, reference_face_box, reference_face_peaks

    cases = []
    for shift_x, shift_y in ((0, 0), (120, 0), (-50, -20), (0, 200)):  # whole, cut right, at the top-left, bottom
        cases.append([(x + shift_x, y + shift_y) for x, y in PERSON])
    cases.append([None if i in (14, 15) else joint for i, joint in enumerate(PERSON)])  # ears alone
    cases.append([None if i in (15, 16, 17) else joint for i, joint in enumerate(PERSON)])  # one eye
    cases.append([None if i == 0 else joint for i, joint in enumerate(PERSON)])  # no nose: no face
    cases.append([(x * 0.4, y * 0.4) for x, y in PERSON])  # a face under 20 pixels
    boxes = [face_box(joints, 256, 192) for joints in cases]
    assert boxes == [reference_face_box(joints, 256, 192) for joints in cases]
    assert boxes[0] == (46, 22, 36) and boxes[-2] is None and boxes[-1] is None

    rng = np.random.default_rng(0)
    for height, width, size in ((40, 44, 384), (128, 96, 384), (61, 383, 384), (200, 300, 736)):  # x3: on pixels too
        crop = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        expected_crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_LANCZOS4)
        assert np.array_equal(lanczos_8bit(crop, size, size), expected_crop)  # OpenCV's fixed-point 8-bit Lanczos
    maps = rng.standard_normal((71, 48, 48)).astype(np.float32)
    expected = functional.interpolate(torch.from_numpy(maps)[None], (37, 52), mode="bilinear", align_corners=True)
    ours = apply_matrices(maps.transpose(1, 2, 0), aligned_matrix(48, 37), aligned_matrix(48, 52))
    assert np.abs(ours - expected[0].numpy().transpose(1, 2, 0)).max() < 1e-5

    yy, xx = np.mgrid[:60, :50]
    heatmaps = np.zeros((60, 50, 71), np.float32)
    for index in range(71):  # blobs, some too faint, one map with a tie (the first in raster order wins)
        x, y, peak = rng.integers(0, 50), rng.integers(0, 60), rng.choice([0.04, 0.3, 0.9])
        heatmaps[:, :, index] = peak * np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / 18)
    heatmaps[5, 7, 3] = heatmaps[40, 2, 3] = 2.0
    found = face_peaks(heatmaps)
    assert 0 < len(found) < 71 and np.array_equal(found, reference_face_peaks(heatmaps.transpose(2, 0, 1)))

    for _ in range(5):
        landmarks = rng.uniform(-0.02, 1.0, (70, 2)).astype(np.float32)
        landmarks[rng.random(70) < 0.1] = -1
        ours_canvas, expected_canvas = np.zeros((96, 128, 3), np.uint8), np.zeros((96, 128, 3), np.uint8)
        draw_face(ours_canvas, landmarks)
        reference_draw_face(expected_canvas, landmarks)
        assert expected_canvas.any() and np.array_equal(ours_canvas, expected_canvas)
