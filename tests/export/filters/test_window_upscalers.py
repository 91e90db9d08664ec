"""Recognising the window-attention upscalers (SwinIR, HAT, DAT) and the ESRGAN variants (ESRGAN+, the old layout's
×3) from their keys, their torch modules against spandrel's, the fixed tile and the variants refused in one line.
Narrow nets with seeded weights in the published files' key layouts; no engine is built here (see
tests/filters/test_window_upscalers.py)."""

from __future__ import annotations

import pytest
import torch

from enginefarm.errors import ConfigError
from enginefarm.export.filters.reading import read_filter_source, recognise
from enginefarm.export.filters.run import export_filter, with_profile
from tests.export.filters.upscaler_files import (
    dat_state,
    esrgan_plus_state,
    hat_state,
    old_esrgan_state,
    save,
    spandrel_model,
    swinir_state,
)

# name → (state, nesting, the published file it stands for, architecture, scale, tile)
LAYOUTS = {
    "swinir-real": (
        lambda: swinir_state(seed=1),
        "params_ema",
        "003_realSR_BSRGAN_DFOWMFC_s64w8_SwinIR-L_x4_GAN.pth",
        "SwinIR",
        4,
        64,
    ),
    "swinir-classical": (
        lambda: swinir_state(upsampler="pixelshuffle", scale=2, seed=2),
        "params",
        "001_classicalSR_DF2K_s64w8_SwinIR-M_x2.pth",
        "SwinIR",
        2,
        64,
    ),
    "swinir-lightweight": (
        lambda: swinir_state(upsampler="pixelshuffledirect", scale=3, seed=3),
        "params",
        "002_lightweightSR_DIV2K_s64w8_SwinIR-S_x3.pth",
        "SwinIR",
        3,
        64,
    ),
    "hat": (lambda: hat_state(seed=4), "params_ema", "Real_HAT_GAN_SRx4.pth", "HAT", 4, 64),
    "dat": (lambda: dat_state(seed=5), "params", "4xNomos8kDAT.pth", "DAT", 4, 64),
}


def _file(tmp_path, name: str):
    make, nesting, file_name, *_ = LAYOUTS[name]
    return save(make(), tmp_path / file_name, nesting)


def _parts(path):
    source = read_filter_source(path)
    return recognise(source), recognise(source).build(source)


@pytest.mark.parametrize("name", LAYOUTS)
def test_each_layout_is_recognised_and_is_spandrels_model(tmp_path, name):
    path = _file(tmp_path, name)
    architecture, parts = _parts(path)
    *_, arch, scale, tile = LAYOUTS[name]
    assert parts.architecture == arch and architecture.kind == "upscaler"
    assert (parts.details["scale"], parts.details["tile"]) == (scale, tile)
    # the runtime starts tiles on the window, where the whole image's windows lie
    assert parts.details["multiple"] == parts.details["tile_multiple"] == (8 if arch == "SwinIR" else 16)
    part = parts.parts["upscaler"]
    assert part.profile["height"] == part.profile["width"] == (tile, tile, tile)
    image = torch.rand(1, 3, tile, tile, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = spandrel_model(path)(image), part.module(image)
    assert got.shape == (1, 3, tile * scale, tile * scale)
    assert torch.equal(got, want)


def test_details_are_read_from_the_keys(tmp_path):
    _, parts = _parts(_file(tmp_path, "swinir-real"))
    details = parts.details
    assert (details["embed_dim"], details["depths"], details["num_heads"]) == (12, [2, 2], [2, 2])
    assert (details["window_size"], details["upsampler"], details["img_range"]) == (8, "nearest+conv", 1.0)
    _, parts = _parts(_file(tmp_path, "dat"))
    assert (parts.details["split_size"], parts.details["tile_multiple"]) == ([8, 16], 16)


def test_another_tile_is_one_side_a_multiple_of_the_window(tmp_path):
    _, parts = _parts(_file(tmp_path, "hat"))  # window 16
    wider = with_profile(parts, {"height": (128, 128, 128), "width": (128, 128, 128)})
    assert wider.details["tile"] == 128 and wider.parts["upscaler"].profile["width"] == (128, 128, 128)
    with pytest.raises(ConfigError, match="not one tile side, a multiple of 16"):
        with_profile(parts, {"height": (64, 128, 192), "width": (64, 128, 192)})
    with pytest.raises(ConfigError, match="not one tile side, a multiple of 16"):
        with_profile(parts, {"height": (72, 72, 72), "width": (72, 72, 72)})
    with pytest.raises(ConfigError, match="square tiles of one size"):
        with_profile(parts, {"height": (64, 64, 64), "width": (128, 128, 128)})


def test_unsupported_variants_are_one_line(tmp_path):
    gray = save(swinir_state(in_chans=1, upsampler="", scale=1, seed=6), tmp_path / "004_grayDN_SwinIR-M.pth", "params")
    with pytest.raises(ConfigError, match="1 input and 1 output channels \\(a grayscale variant\\)") as raised:
        _parts(gray)
    assert "\n" not in str(raised.value)
    from spandrel.architectures.Swin2SR import Swin2SR

    swin2sr = Swin2SR(img_size=64, embed_dim=12, depths=[2], num_heads=[2], window_size=8, upscale=2)
    path = save(swin2sr.state_dict(), tmp_path / "Swin2SR_ClassicalSR_X2_64.pth", "params")
    with pytest.raises(ConfigError, match="Swin2SR's layout") as raised:
        _parts(path)
    assert "\n" not in str(raised.value)


def _spandrel_rrdbnet(state: dict, scale: int, plus: bool):
    from spandrel.architectures.ESRGAN import ESRGAN

    model = ESRGAN(in_nc=3, out_nc=3, num_filters=16, num_blocks=2, scale=scale, plus=plus)
    model.load_state_dict(state)
    return model.eval()


@pytest.mark.parametrize("scale", [4, 3])
def test_esrgan_plus_and_x3_are_spandrels_rrdbnet(tmp_path, scale):
    state = esrgan_plus_state(scale=scale, seed=7)
    path = save(state, tmp_path / f"{scale}x_ESRGANplus_Foo.pth", None)
    _, parts = _parts(path)
    assert (parts.architecture, parts.details["scale"], parts.details.get("plus")) == ("RRDBNet", scale, True)
    image = torch.rand(1, 3, 21, 30, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = _spandrel_rrdbnet(state, scale, True)(image), parts.parts["upscaler"].module(image)
    assert got.shape == (1, 3, 21 * scale, 30 * scale) and torch.equal(got, want)
    if scale == 4:
        assert torch.equal(spandrel_model(path)(image), got)  # spandrel's loader reads ESRGAN+ from the keys too


def test_only_the_name_tells_an_x3_file(tmp_path):
    """spandrel's loader reads an old-layout ×3 file as ×2 (one upsample step; the keys are the same), so the
    community's names (3x_…, …_x3) decide; a file so named with two steps is refused in one line."""
    state = {k: v for k, v in esrgan_plus_state(scale=3, seed=8).items() if ".conv1x1." not in k}
    x3 = save(state, tmp_path / "3x_BigFace_v3.pth", None)
    unnamed = save(state, tmp_path / "BigFace_v3.pth", None)
    assert _parts(x3)[1].details["scale"] == 3
    assert _parts(unnamed)[1].details["scale"] == 2
    with torch.no_grad():
        assert spandrel_model(unnamed)(torch.zeros(1, 3, 8, 8)).shape == (1, 3, 16, 16)
    wrong = save(old_esrgan_state(seed=9), tmp_path / "Foo_x3.pth", None)
    with pytest.raises(ConfigError, match="named as a ×3 ESRGAN model with 2 upsample steps"):
        _parts(wrong)


@pytest.mark.slow
def test_an_x3_esrgan_plus_file_exports(tmp_path):
    """The ×3 nearest-neighbour step and the 1x1 branches through ONNX, checked on ONNX Runtime by the export."""
    path = save(esrgan_plus_state(scale=3, seed=10), tmp_path / "3x_ESRGANplus.pth", None)
    export = export_filter(path, tmp_path / "out", profile={"height": (32, 48, 64), "width": (32, 48, 64)})
    assert export.architecture == "RRDBNet"
    assert max(max(p.deviations.values()) for p in export.parts) <= 1e-4
