"""GFPGAN and RetinaFace recognised from their files' keys and built in torch from them: the modules against
spandrel's GFPGAN and facexlib's RetinaFace on the same weights."""

from __future__ import annotations

import pytest

from enginefarm.errors import ConfigError
from enginefarm.export.filters import gfpgan, retinaface
from enginefarm.export.filters.reading import read_filter_source, recognise
from enginefarm.export.filters.registry import Source
from tests.export.filters.face_files import (
    facexlib_retinaface,
    save_codeformer,
    save_gfpgan,
    save_retinaface,
    tiny_codeformer,
    tiny_gfpgan,
)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gfpgan_model():
    return tiny_gfpgan()


def test_gfpgan_file_is_recognised_and_matches_spandrel(gfpgan_model, tmp_path):
    source = read_filter_source(save_gfpgan(gfpgan_model, tmp_path / "GFPGANv1.4.pth"))
    architecture = recognise(source)
    assert architecture.kind == "face_restorer" and architecture.name.startswith("GFPGAN")
    parts = architecture.build(source)
    assert parts.details["uses"] == {"detector": gfpgan.DEFAULT_DETECTOR} and list(parts.parts) == ["restorer"]
    face = torch.rand(1, 3, 512, 512, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        # the file's stored noise: GFPGANer's default draws new noise per call
        want = gfpgan_model(face, return_rgb=False, randomize_noise=False)[0]
        got = parts.parts["restorer"].module(face)
    assert want.std() > 0.1
    assert float((got - want).abs().max() / (want.max() - want.min())) < 1e-5


def test_gfpgan_at_another_face_size_is_refused(tmp_path):
    from spandrel.architectures.GFPGAN import GFPGAN

    small = GFPGAN(out_size=256, num_style_feat=32, narrow=1 / 16)
    source = read_filter_source(save_gfpgan(small, tmp_path / "small.pth"))
    with pytest.raises(ConfigError, match="256² faces"):
        recognise(source).build(source)


def test_gfpgan_with_a_missing_layer_says_so(gfpgan_model):
    state = {k: v for k, v in gfpgan_model.state_dict().items() if not k.startswith("conv_body_up.1.")}
    with pytest.raises(ConfigError, match="looks like GFPGAN"):
        gfpgan.build_module(state)


@pytest.mark.parametrize(("body", "size"), [("mobile0.25", (120, 90)), ("resnet50", (64, 72))])
def test_retinaface_file_is_recognised_and_matches_facexlib(body, size, tmp_path):
    model = facexlib_retinaface(body)
    if body == "resnet50":  # 100 MB: recognised from its keys in memory, not through a file
        source = Source(tmp_path / "detection_Resnet50_Final.pth", model.state_dict())
    else:
        source = read_filter_source(save_retinaface(model, tmp_path / f"detection_{body}_Final.pth"))
    architecture = recognise(source)
    assert architecture.kind == "face_detector"
    parts = architecture.build(source)
    assert parts.details["body"] == body.replace("mobile", "mobilenet")
    image = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(image.flip(1) * 255 - model.mean_tensor)  # what detect_faces feeds: BGR, 0-255, less the mean
        got = parts.parts["detector"].module(image)
    for w, g in zip(want, got, strict=True):
        assert w.shape == g.shape and float((w - g).abs().max()) < 1e-5


def test_retinaface_with_other_anchors_is_refused():
    state = facexlib_retinaface("mobile0.25").state_dict()
    state = {k: (v.repeat(2, *([1] * (v.ndim - 1))) if k.startswith("ClassHead.0.") else v) for k, v in state.items()}
    with pytest.raises(ConfigError, match="anchors"):
        retinaface.build_module(state)


@pytest.mark.slow
def test_codeformer_file_is_recognised_and_matches_spandrel_extra_arches(tmp_path):
    model = tiny_codeformer()
    source = read_filter_source(save_codeformer(model, tmp_path / "codeformer.pth"))
    architecture = recognise(source)
    assert architecture.kind == "face_restorer" and architecture.name == "CodeFormer"
    parts = architecture.build(source)
    assert parts.details["fidelity"] == 0.5 and list(parts.parts["restorer"].inputs) == ["face", "w"]
    assert parts.parts["restorer"].precisions == ("fp32",)  # its codebook lookup does not survive fp16
    face = torch.rand(1, 3, 512, 512, generator=torch.Generator().manual_seed(4)) * 2 - 1
    with torch.no_grad():
        want = model(face, weight=0.7)[0]
        got = parts.parts["restorer"].module(face, torch.tensor([0.7]))
    assert want.std() > 0.1
    assert float((got - want).abs().max() / (want.max() - want.min())) < 1e-5
