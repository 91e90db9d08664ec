"""Depth Anything as a ControlNet preprocessor: a transformers folder exported, built for ONNX Runtime and OpenVINO,
and its control image (numpy resize, normalise, engine, resize back, min-max) against the same steps in torch around
transformers' own model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from ...conftest import run_cli
from ...filters.scenes import scene
from .depth_files import tiny_depth_anything

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DETECT = 112  # a small detect resolution keeps the test engines small: a 96x128 photo is seen at 112x154


@pytest.fixture(scope="module")
def depth_folder(tmp_path_factory):
    return tiny_depth_anything(tmp_path_factory.mktemp("depth-anything") / "depth-anything-tiny")


def reference(folder, image: np.ndarray, detect: int) -> np.ndarray:
    """diffusers' depth ControlNet recipe in torch: resize (antialiased bicubic) so the short side is `detect`, each
    side a multiple of 14, ImageNet normalisation, transformers' DepthAnythingForDepthEstimation, bilinear back to
    the photo's size, min-max, three channels."""
    functional = torch.nn.functional
    model = transformers.DepthAnythingForDepthEstimation.from_pretrained(str(folder)).eval()
    height, width = image.shape[:2]
    size = [max(14, round(side * detect / min(height, width) / 14) * 14) for side in (height, width)]
    x = torch.from_numpy(image).permute(2, 0, 1)[None]
    x = functional.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False)
    x = (x - torch.tensor([0.485, 0.456, 0.406])[:, None, None]) / torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    with torch.no_grad():
        depth = model(pixel_values=x).predicted_depth[:, None]
    depth = functional.interpolate(depth, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    depth = (depth - depth.min()) / (depth.max() - depth.min())
    return depth[0, 0, :, :, None].repeat(1, 1, 3).numpy()


def test_depth_anything_is_recognised_with_its_processing(depth_folder):
    from enginefarm.export.filters.reading import read_filter_source, recognise

    source = read_filter_source(depth_folder)
    architecture = recognise(source)
    assert architecture.kind == "preprocessor"
    parts = architecture.build(source)
    details = parts.details
    assert details["task"] == "depth" and details["resolution"] == 518 and details["multiple"] == 14
    assert details["mean"] == pytest.approx([0.485, 0.456, 0.406])
    graph = parts.parts["depth"].module
    x = torch.randn(1, 3, 126, 70)  # 9 x 5 patches: odd counts take the neck's resize-to-fit branch
    model = transformers.DepthAnythingForDepthEstimation.from_pretrained(str(depth_folder)).eval()
    with torch.no_grad():
        assert torch.equal(graph(x), model(pixel_values=x).predicted_depth)


def test_depth_anything_needs_its_folder(depth_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    from enginefarm.export.filters.depth import build_depth_anything
    from enginefarm.export.filters.reading import read_filter_source

    single = tmp_path / "depth.safetensors"
    save_file(load_file(str(depth_folder / "model.safetensors")), str(single))
    source = read_filter_source(depth_folder)
    with pytest.raises(ConfigError, match="transformers folder"):
        build_depth_anything(type(source)(single, source.state, source.config))


@pytest.mark.slow
def test_depth_preprocessor_built_matches_torch(depth_folder, tmp_path):
    import enginefarm.filters
    from enginefarm.export.filters.run import export_filter

    out = tmp_path / "export"
    done = export_filter(depth_folder, out, name="depth-tiny", targets=("onnxruntime:cpu", "openvino:cpu"))
    assert done.kind == "preprocessor" and max(done.parts[0].deviations.values()) < 1e-4
    # the engines need only the small detect sizes this test runs at
    recipe = (out / "recipe.toml").read_text()
    recipe = recipe.replace("[56, 518, 1036]", "[56, 112, 224]")
    assert recipe.count("[56, 112, 224]") == 2
    (out / "recipe.toml").write_text(recipe)
    store = tmp_path / "store"
    run_cli("build", str(out / "recipe.toml"), "--store", str(store), "--no-bench", "-j", "2", check=True)

    photo = scene(7, height=96, width=128)
    expected = reference(depth_folder, photo, DETECT)
    assert expected.std() > 0.1  # a depth map with structure, not a constant
    measured = {}
    for target in ("onnxruntime:cpu", "openvino:cpu"):
        for precision, tolerance in (("fp32", 1e-3), ("fp16", 2e-2)):
            with enginefarm.filters.load(
                "depth-tiny", store=str(store), precision=precision, target=target, assets=out / "assets"
            ) as depth:
                assert depth.kind == "preprocessor" and depth.task == "depth"
                assert depth.detect_size(96, 128, DETECT) == (112, 154)
                control = depth(photo, detect_resolution=DETECT)
            assert control.shape == (96, 128, 3) and control.dtype == np.float32
            assert control.min() == 0 and control.max() == 1
            measured[target, precision] = float(np.abs(control - expected).max())
            assert measured[target, precision] < tolerance, measured
    print(json.dumps({f"{t} {p}": f"{d:.1e}" for (t, p), d in measured.items()}))

    # the app-facing helpers load it by name from the same store; a wrong kind or a missing name is one line
    options = dict(store=str(store), precision="fp32", target="onnxruntime:cpu")
    control = enginefarm.filters.control_from(photo, "depth-tiny", detect_resolution=DETECT, **options)
    assert np.abs(control - expected).max() < 1e-3
    with pytest.raises(ConfigError, match="--upscale depth-tiny: a preprocessor, not an upscaler"):
        enginefarm.filters.apply(photo, upscale="depth-tiny", **options)
    with pytest.raises(ConfigError, match="--safety nsfw: nsfw is not in the store"):
        enginefarm.filters.apply(photo, safety="nsfw", **options)
