"""Inpainting against diffusers' StableDiffusionInpaintPipeline and StableDiffusionXLInpaintPipeline: the tiny
inpainting models (9-channel UNet) exported and built by the real CLI, and the 4-channel way (the known region blended
back after each step) on the tiny SD 1.x and SDXL that the text-to-image checks build. diffusers is given the same
start noise through its own draw (it ignores the image whenever `latents=` is passed) and the VAE posterior's mode.
fp32: the final latent within 1e-4 of diffusers' range; fp16: the image within 2e-2."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError
from enginefarm.families import FAMILIES

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from tests.diffusion.test_pipeline_matches_diffusers import (  # noqa: E402 (after the skips)
    BACKENDS,
    NEGATIVE,
    PROMPT,
    STEPS,
    _latents,
    _ours,
    _relative,
)


def _image_and_mask(size: int) -> tuple[np.ndarray, np.ndarray]:
    """A random image and a mask with soft values on both sides of 0.5 and edges off the 8-pixel latent grid, so
    binarization and the nearest-pixel downscale are both checked."""
    rng = np.random.default_rng(3)
    image = rng.uniform(0, 1, (size, size, 3)).astype(np.float32)
    mask = np.where(rng.uniform(0, 1, (size, size)) < 0.5, 0.2, 0.0).astype(np.float32)
    mask[size // 5 : size * 3 // 4, size // 8 : size * 5 // 8] = 0.7
    mask[size // 3 : size // 2, :] = 1.0
    return image, mask


def _theirs(source, xl: bool, monkeypatch, noise: np.ndarray):
    cls = diffusers.StableDiffusionXLInpaintPipeline if xl else diffusers.StableDiffusionInpaintPipeline
    pipe = cls.from_pretrained(source)
    pipe.set_progress_bar_config(disable=True)
    module = __import__(type(pipe).__module__, fromlist=["retrieve_latents"])
    monkeypatch.setattr(
        module, "retrieve_latents", lambda output, generator=None, sample_mode="sample": output.latent_dist.mode()
    )
    # The start noise through diffusers' own draw: given as `latents=`, it would start from pure noise at any strength.
    monkeypatch.setattr(module, "randn_tensor", lambda *a, **k: torch.from_numpy(noise.copy()))
    return pipe


def _compare(ours, theirs, image, mask, noise, precision: str, **call) -> float:
    """Our deviation from diffusers: fp32's final latent over its range, fp16's image (max abs)."""
    output_type = "latent" if precision == "fp32" else "np"
    kwargs = dict(num_inference_steps=STEPS, guidance_scale=6.0, output_type=output_type, **call)
    reference = theirs(PROMPT, negative_prompt=NEGATIVE, image=image[None], mask_image=mask.copy(), **kwargs).images
    reference = np.asarray(reference.numpy() if hasattr(reference, "numpy") else reference)
    got = ours(
        PROMPT,
        NEGATIVE,
        image=image,
        mask_image=mask,
        steps=STEPS,
        latents=noise,
        guidance_scale=6.0,
        output_type=output_type,
        **call,
    )
    if precision == "fp32":
        return _relative(got, reference)
    assert got.shape == reference[0].shape
    return float(np.abs(got - reference[0]).max())


def _limit(precision: str) -> float:
    return 1e-4 if precision == "fp32" else 2e-2


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, target, precisions",
    [*(("sd1-inpaint", target, ("fp32", "fp16")) for target in BACKENDS), ("sdxl-inpaint", BACKENDS[0], ("fp32",))],
)
def test_inpainting_model_matches_diffusers(built, family, target, precisions, monkeypatch, record_property):
    """Each family's own default strength: SD 1.x's 1.0 (pure noise start), SDXL's 0.9999 (the image noised)."""
    source = built(family)[0]
    for precision in precisions:
        ours = _ours(built(family), target, precision)
        assert "vae_encoder" in ours.sessions  # loaded with the others: every call encodes
        image, mask = _image_and_mask(ours.assets.native_pixels)
        noise = _latents(ours, seed=5)
        theirs = _theirs(source, family.startswith("sdxl"), monkeypatch, noise)
        deviation = _compare(ours, theirs, image, mask, noise, precision)
        record_property(f"deviation {precision}", deviation)
        assert deviation < _limit(precision), (family, target, precision, deviation)
        if precision == "fp32" and target == BACKENDS[0]:  # a batch: image i is the one-image call with seed + i
            call = dict(image=image, mask_image=mask, steps=2, output_type="latent")
            both = ours(PROMPT, seed=4, num_images_per_prompt=2, **call)
            for i in range(2):
                np.testing.assert_array_equal(both[i : i + 1], ours(PROMPT, seed=4 + i, **call))
    with pytest.raises(ConfigError, match="mask_image has shape"):  # before any engine runs
        ours(PROMPT, image=image, mask_image=mask[:8])


@pytest.mark.slow
@pytest.mark.parametrize("family, strength", [("sd1", 0.75), ("sdxl", None)])
def test_inpainting_with_a_plain_unet_matches_diffusers(built, family, strength, monkeypatch, record_property):
    """A 4-channel UNet in diffusers' inpaint pipeline: the known region is the image re-noised after each step."""
    source = built(family)[0]
    ours = _ours(built(family), "onnxruntime:cpu", "fp32")
    image, mask = _image_and_mask(ours.assets.native_pixels)
    noise = _latents(ours, seed=5)
    theirs = _theirs(source, family == "sdxl", monkeypatch, noise)
    call = {} if strength is None else {"strength": strength}
    deviation = _compare(ours, theirs, image, mask, noise, "fp32", **call)
    record_property("deviation fp32", deviation)
    assert deviation < _limit("fp32"), (family, deviation)
    # after the last step the known region is the image's latents themselves (the last blend adds no noise)
    got = ours(PROMPT, NEGATIVE, image=image, mask_image=mask, steps=STEPS, latents=noise, output_type="latent", **call)
    size, factor = ours.assets.native_pixels, ours.vae_scale_factor
    keep = mask[::factor, ::factor] < 0.5
    assert 0 < keep.sum() < keep.size
    np.testing.assert_array_equal(got[0][:, keep], ours._encode_image(image, size, size)[0][:, keep])


def test_bad_masks_are_one_line_errors():
    sd1, inpainting, sd3 = FAMILIES["sd1"], FAMILIES["sd1-inpaint"], FAMILIES["sd3"]
    image, mask = np.zeros((64, 64, 3), np.float32), np.zeros((64, 64), np.float32)
    from enginefarm.diffusion.inpaint import check_mask

    cases = [
        ((sd1, None, mask), "needs image="),
        ((sd1, image, mask[:32]), "mask_image has shape [32, 64]"),
        ((sd1, image, mask[..., None]), "mask_image has shape [64, 64, 1]"),
        ((sd1, image, mask + 2), "outside [0, 1]"),
        ((sd1, image, np.full_like(mask, np.nan)), "outside [0, 1]"),
        ((inpainting, image, None), "is an inpainting model"),
        ((inpainting, None, None), "is an inpainting model"),
        ((sd3, image, mask), "not supported for Stable Diffusion 3"),
    ]
    for (family, given_image, given_mask), says in cases:
        with pytest.raises(ConfigError) as caught:
            check_mask(family, given_image, given_mask, 64, 64)
        assert says in str(caught.value) and caught.value.hint and "\n" not in str(caught.value), says
    soft = np.full((64, 64), 0.49, np.float32)
    soft[:, 32:] = 0.5
    binary = check_mask(sd1, image, soft, 64, 64)  # binarized at 0.5, as diffusers' mask processor
    assert binary is not None and (binary[:, :32] == 0).all() and (binary[:, 32:] == 1).all()
    assert check_mask(sd1, image, None, 64, 64) is None
