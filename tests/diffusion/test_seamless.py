"""Seamless tiling (`pipe(..., tiling=)`, diffusion/seamless.py, runner/seamless.py) against diffusers with every
Conv2d of the UNet and VAE padding circularly in the tiled axes, as Easy Diffusion's sdkit patches them: the tiny SD 1.x
built by the real CLI, its seamless variants derived on this device from the stored artifacts. fp32: the image within
1e-3 (and the final latent within 1e-4 of its range), fp16 within 2e-2; and the image is seamless: shifting the start
noise along a tiled axis shifts the image, edges wrapping around, which no plain model does."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from enginefarm.errors import ConfigError  # noqa: E402

from .test_pipeline_matches_diffusers import NEGATIVE, PROMPT, STEPS, _latents, _ours, _relative, _theirs  # noqa: E402

F = torch.nn.functional


def circular(pipe, tiling: str | None) -> None:
    """Every Conv2d of diffusers' UNet and VAE pads circularly along `tiling`'s axes and with zeros along the other
    (sdkit's `asymmetricConv2DConvForward`); None puts the plain convolution back."""
    for model in (pipe.unet, pipe.vae):
        for conv in model.modules():
            if not isinstance(conv, torch.nn.Conv2d):
                continue
            if tiling is None:
                conv.__dict__.pop("_conv_forward", None)
                continue
            ph, pw = conv.padding

            def forward(x, weight, bias, conv=conv, ph=ph, pw=pw):
                x = F.pad(x, (pw, pw, 0, 0), mode="circular" if "x" in tiling else "constant")
                x = F.pad(x, (0, 0, ph, ph), mode="circular" if "y" in tiling else "constant")
                return F.conv2d(x, weight, bias, conv.stride, 0, conv.dilation, conv.groups)

            conv._conv_forward = forward


def _reference(theirs, latents: np.ndarray, tiling: str, output_type: str) -> np.ndarray:
    circular(theirs, tiling)
    try:
        size = latents.shape[-1] * 8
        out = theirs(
            PROMPT,
            negative_prompt=NEGATIVE,
            num_inference_steps=STEPS,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            guidance_scale=6.0,
            output_type=output_type,
        ).images
    finally:
        circular(theirs, None)
    return np.asarray(out.numpy() if hasattr(out, "numpy") else out)[0 if output_type == "np" else slice(None)]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_seamless_images_match_diffusers_with_circular_convolutions(built, target):
    source, _, _ = built("sd1")
    theirs = _theirs(source, None)
    ours = _ours(built("sd1"), target, "fp32")
    latents = _latents(ours)
    for tiling in ("x", "y", "xy"):
        got = ours(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0, tiling=tiling)
        want = _reference(theirs, latents, tiling, "np")
        assert np.abs(got - want).max() < 1e-3, (tiling, target)
    plain = ours(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0)
    assert np.abs(plain - want).max() > 1e-2  # tiling changed the image: the comparison above can fail
    got = ours(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0, tiling="xy", output_type="latent")
    assert _relative(got, _reference(theirs, latents, "xy", "latent")) < 1e-4, target
    # each setting's variant is loaded once and kept: a second call loads nothing
    loads = {k for k in ours.timings if k.startswith("load ") and "tiling" in k}
    assert loads == {"load unet (tiling x)", "load unet (tiling y)", "load unet (tiling xy)"} | {
        f"load vae_decoder (tiling {t})" for t in ("x", "y", "xy")
    }
    fp16 = _ours(built("sd1"), target, "fp16")
    got = fp16(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0, tiling="xy")
    # fp16's own error: the plain fp16 image against the plain fp32 one (the tiny real-layout UNet's fp16 alone can
    # pass 2e-2); tiling must add no more than half as much again
    own = np.abs(fp16(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0) - plain).max()
    assert np.abs(got - want).max() < max(2e-2, 1.5 * own), (target, own)


@pytest.mark.slow
def test_seamless_image_wraps_around(built):
    """With tiling="x" the whole pipeline commutes with a horizontal shift: start noise rolled by k latent pixels gives
    the image rolled by k·8 pixels, its right edge continuing into its left; along y (not tiled), and without tiling,
    it does not."""
    ours = _ours(built("sd1"), "onnxruntime:cpu", "fp32")
    levels = len(ours.assets.configs["unet"]["block_out_channels"])
    shift = 2 ** (levels - 1)  # a whole step of the UNet's coarsest grid: every down and up block shifts alike
    factor = ours.vae_scale_factor
    size = 2 * shift  # latent pixels: two steps of the coarsest grid (the tiny profile's largest, 16)
    latents = np.random.default_rng(3).standard_normal((1, 4, size, size)).astype(np.float32)

    def image(noise, tiling):
        pixels = size * factor
        return ours(
            PROMPT, NEGATIVE, steps=2, latents=noise, guidance_scale=6.0, tiling=tiling, width=pixels, height=pixels
        )

    base = image(latents, "x")
    shifted = image(np.roll(latents, shift, axis=3), "x")
    assert np.abs(shifted - np.roll(base, shift * factor, axis=1)).max() < 1e-4
    shifted_y = image(np.roll(latents, shift, axis=2), "x")
    assert np.abs(shifted_y - np.roll(base, shift * factor, axis=0)).max() > 1e-2
    plain = image(latents, None)
    plain_shifted = image(np.roll(latents, shift, axis=3), None)
    assert np.abs(plain_shifted - np.roll(plain, shift * factor, axis=1)).max() > 1e-2


@pytest.mark.slow
def test_tiling_is_checked_before_any_work(built):
    ours = _ours(built("sd1"), "onnxruntime:cpu", "fp32")
    for bad in ("z", "xx", "", "horizontal"):
        with pytest.raises(ConfigError, match="tiling"):
            ours(PROMPT, steps=1, tiling=bad)


@pytest.mark.slow
def test_a_seamless_variant_is_made_once_and_never_picked_by_a_plain_load(built):
    import enginefarm

    from .test_pipeline_matches_diffusers import _model_name

    _, out, store = built("sd1")
    ref = f"{_model_name(out)}/vae_decoder"
    args = dict(store=str(store), precision="fp32", target="onnxruntime:cpu", device="cpu")
    tiled = enginefarm.load(ref, tiling="yx", **args)
    assert tiled.artifact.options["tiling"]["axes"] == "xy" and tiled.artifact.options["tiling"]["convolutions"] > 0
    again = enginefarm.load(ref, tiling="xy", **args)
    assert again.artifact.build_key == tiled.artifact.build_key  # the cached variant
    plain = enginefarm.load(ref, **args)
    assert "tiling" not in plain.artifact.options
    assert plain.artifact.build_key == tiled.artifact.options["tiling"]["base"]
    with pytest.raises(ConfigError, match="tiling"):
        enginefarm.load(ref, tiling="z", **args)


@pytest.mark.slow
def test_a_backend_without_its_own_rewrite_compiles_from_the_stored_onnx(built, tmp_path):
    """The path TensorRT and the other engine backends take (runner/seamless.py `_compiled`), run here with OpenVINO
    standing in: the component's stored ONNX Runtime artifact rewritten and an engine built from it on this device."""
    import enginefarm
    from enginefarm.backends import get_backend
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.cache.progress import as_progress
    from enginefarm.cache.stores import open_store
    from enginefarm.runner import seamless
    from enginefarm.settings import load_settings

    from .test_pipeline_matches_diffusers import _model_name

    _, out, store = built("sd1")
    ref = f"{_model_name(out)}/vae_decoder"
    args = dict(store=str(store), precision="fp32", device="cpu")
    plain = enginefarm.load(ref, target="openvino:cpu", **args)
    cache = DeviceCache(load_settings().home)
    variant = seamless._compiled(
        plain.artifact, "xy", "0" * 64, tmp_path, cache, open_store(str(store)), as_progress(None)
    )
    assert variant.options["tiling"]["axes"] == "xy" and any(f.role == "ir" for f in variant.files)
    compiled = get_backend("openvino").load(tmp_path, variant, "cpu")
    rewritten = enginefarm.load(ref, target="onnxruntime:cpu", tiling="xy", **args)
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    got, want = compiled.run({"latent_sample": x})["sample"], rewritten.run({"latent_sample": x})["sample"]
    assert np.abs(got - want).max() < 1e-4
    assert np.abs(plain.run({"latent_sample": x})["sample"] - want).max() > 1e-3
