"""PiDiNet soft edges (table5_pidinet.pth): recognised from the checkpoint's keys, its pixel-difference convolutions
made plain, built, and its control images (soft edges, safe, scribble) against controlnet-aux's PidiNetDetector
steps re-created around the unconverted network (tests/export/filters/pidinet_files.py; equal to controlnet-aux's
own pidi/model.py at these weights)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from ...conftest import run_cli
from ...filters.scenes import scene
from ...filters.test_softedge import aux_safe_step, aux_scribble
from .pidinet_files import CARV4, pdc, pidinet_edges, to_photo_size, write_pidinet_file

torch = pytest.importorskip("torch")
cv2 = pytest.importorskip("cv2")


@pytest.mark.parametrize("kind", sorted(set(CARV4)))
def test_each_pixel_difference_convolution_is_a_plain_one(kind):
    from torch.nn import functional

    from enginefarm.export.filters.pidinet import plain_kernel

    torch.manual_seed(1)
    weight, x = torch.randn(5, 1, 3, 3), torch.randn(1, 5, 17, 23)
    kernel = plain_kernel(weight, kind)
    plain = functional.conv2d(x, kernel, padding=kernel.shape[-1] // 2, groups=5)
    assert torch.allclose(plain, pdc(kind, x, weight, groups=5), atol=1e-5)


def test_pidinet_is_recognised_and_equals_the_checkpoints_network(tmp_path):
    from enginefarm.export.filters.pidinet import build_pidinet
    from enginefarm.export.filters.reading import read_filter_source, recognise

    network = write_pidinet_file(tmp_path / "table5_pidinet.pth")
    source = read_filter_source(tmp_path / "table5_pidinet.pth")  # state_dict, module. prefixes unwrapped
    parts = recognise(source).build(source)
    assert parts.architecture == "PiDiNet" and parts.details["task"] == "softedge"
    assert (parts.details["width"], parts.details["dilation"], parts.details["attention"]) == (6, 4, True)
    rgb = torch.rand(1, 3, 64, 128)
    with torch.no_grad():
        expected = network(rgb.flip(1))[-1][:, 0]  # controlnet-aux feeds BGR; the graph takes RGB
        assert torch.allclose(parts.parts["edges"].module(rgb), expected, atol=1e-6)
    state = dict(source.state)
    state["block1_3.conv1.weight"] = torch.zeros(6, 1, 5, 5)
    with pytest.raises(ConfigError, match="looks converted already"):
        build_pidinet(type(source)(source.path, state))
    state.pop("block1_3.conv1.weight")
    with pytest.raises(ConfigError, match="not the layout of table5_pidinet.pth"):
        build_pidinet(type(source)(source.path, state))


@pytest.mark.slow
def test_pidinet_built_matches_controlnet_aux_steps_with_its_modes(tmp_path):
    import enginefarm.filters
    from enginefarm.export.filters.run import export_filter

    network = write_pidinet_file(tmp_path / "table5_pidinet.pth")
    out = tmp_path / "pidinet"
    export_filter(
        tmp_path / "table5_pidinet.pth",
        out,
        name="pidinet",
        targets=("onnxruntime:cpu", "openvino:cpu"),
        profile={"height": (64, 128, 256), "width": (64, 128, 256)},
    )
    store = str(tmp_path / "store")
    run_cli("build", str(out / "recipe.toml"), "--store", store, "--no-bench", "-j", "2", check=True)

    photo = scene(12, height=96, width=128)
    edges = pidinet_edges(network, photo, (128, 192))  # the short side at 128, sides multiples of 64
    expected = to_photo_size(edges, 96, 128)
    assert expected.std() > 0.02
    measured = {}
    cases = [("onnxruntime:cpu", "fp32", 1e-3), ("onnxruntime:cpu", "fp16", 2e-2), ("openvino:cpu", "fp32", 1e-3)]
    for target, precision, tolerance in cases:
        with enginefarm.filters.load("pidinet", store=store, precision=precision, target=target) as preprocessor:
            assert preprocessor.task == "softedge"
            control = preprocessor(photo, detect_resolution=128)
            safe = preprocessor(photo, detect_resolution=128, safe=True)
        assert control.shape == (96, 128, 3)
        measured[target, precision] = float(np.abs(control - expected).max())
        assert measured[target, precision] < tolerance, measured
        # safe: quantised at the detect size, where a level boundary may fall between engine and torch
        safe_expected = to_photo_size(np.minimum(aux_safe_step(edges), 1), 96, 128)
        assert np.abs(safe - safe_expected).mean() < 2 * tolerance

    # scribble through the app-facing name: controlnet-aux's cv2 steps on the same soft edges
    options = dict(store=store, precision="fp32", target="onnxruntime:cpu", detect_resolution=128)
    strokes = enginefarm.filters.control_from(photo, "scribble_pidinet", **options)
    aux = aux_scribble(np.clip(expected[:, :, 0] * 255, 0, 255))
    assert 0.01 < aux.mean() / 255 < 0.9 and set(np.unique(strokes)) <= {0.0, 1.0}
    measured["scribble differing pixels"] = float((strokes[:, :, 0] * 255 != aux).mean())
    assert measured["scribble differing pixels"] < 1e-3
    print(json.dumps({" ".join(k) if isinstance(k, tuple) else k: f"{d:.1e}" for k, d in measured.items()}))
