"""More than one image per call and live previews, on the tiny models the pipeline tests build (ONNX Runtime fp32).

A batch of N: image i equals the one-image call with seed + i (the engines' batch of 2N rows is cut into calls of the
profile's max batch, 2 for the tiny models, so these batches run in chunks); against diffusers' num_images_per_prompt
with the same [N, ...] latents, the final latents within 1e-4 of their range. Previews: one per step, of the step's
predicted clean latent through the family's published latent-to-RGB factors."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.diffusion.batch import SeedNoise
from enginefarm.diffusion.preview import LATENT_RGB, latent_rgb, linear_preview
from enginefarm.errors import ConfigError

from .test_pipeline_matches_diffusers import NEGATIVE, PROMPT, STEPS, _latents, _ours, _relative

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal within fp rounding: a batched engine call may sum in another order than a one-row call."""
    return _relative(a, b) < 1e-5


def test_seed_noise_draws_each_image_from_its_own_stream():
    batch = SeedNoise([7, 8, 9], 1).standard_normal((3, 4, 2, 2), dtype=np.float32)
    for i, seed in enumerate((7, 8, 9)):
        alone = np.random.default_rng([seed, 1]).standard_normal((1, 4, 2, 2), dtype=np.float32)
        assert np.array_equal(batch[i : i + 1], alone)
    with pytest.raises(ValueError, match="batch of 3"):
        SeedNoise([7, 8, 9]).standard_normal((2, 4))


def test_every_latent_space_has_factors_for_its_channels():
    from enginefarm.families import FAMILIES

    for family in FAMILIES.values():
        channels = 16 if family.vae_scaling_factor in (1.5305, 0.3611) else 4
        factors, bias = latent_rgb(family.vae_scaling_factor, channels)
        assert factors.shape == (channels, 3) and bias.shape == (3,), family.id
    assert sorted(len(f) for f, _ in LATENT_RGB.values()) == [4, 4, 16, 16]
    with pytest.raises(ConfigError, match="no preview map"):
        latent_rgb(0.5, 4)


def test_linear_preview_maps_channels_to_colours():
    factors, bias = latent_rgb(0.18215, 4)
    latent = np.zeros((2, 4, 3, 5), np.float32)
    latent[1, 3] = -1.0  # SD's fourth channel, negated, is mostly blue
    out = linear_preview(latent, factors, bias)
    assert out.shape == (2, 3, 5, 3) and out.min() >= 0 and out.max() <= 1
    assert np.allclose(out[0], 0.5)
    assert np.allclose(out[1, 0, 0], 0.5 - factors[3] / 2) and out[1, 0, 0, 2] > out[1, 0, 0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("family, scheduler", [("sd1", "euler_a"), ("sdxl", None)])
def test_a_batch_is_the_single_calls_with_seed_plus_i(built, family, scheduler):
    ours = _ours(built(family), "onnxruntime:cpu", "fp32")
    kwargs = dict(steps=STEPS, guidance_scale=6.0, scheduler=scheduler, output_type="latent")
    batch = ours(PROMPT, NEGATIVE, seed=5, num_images_per_prompt=3, **kwargs)  # 6 rows in 3 calls of 2
    assert batch.shape[0] == 3
    for i in range(3):
        assert _close(batch[i : i + 1], ours(PROMPT, NEGATIVE, seed=5 + i, **kwargs)), (family, i)
    ours.denoiser_batch = 1  # one row per engine call: the same images
    assert _close(ours(PROMPT, NEGATIVE, seed=5, num_images_per_prompt=3, **kwargs), batch)
    ours.denoiser_batch = None
    images = ours(PROMPT, NEGATIVE, seed=5, num_images_per_prompt=2, steps=STEPS)
    size = ours.assets.native_pixels
    assert images.shape == (2, size, size, 3)
    assert np.abs(images[1] - ours(PROMPT, NEGATIVE, seed=6, steps=STEPS)).max() < 1e-4
    with pytest.raises(ConfigError, match="num_images_per_prompt=0"):
        ours(PROMPT, num_images_per_prompt=0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_a_batch_matches_diffusers_num_images_per_prompt(built, family):
    source, _, _ = built(family)
    ours = _ours(built(family), "onnxruntime:cpu", "fp32")
    latents = np.concatenate([_latents(ours, seed) for seed in (0, 1)])
    theirs = diffusers.DiffusionPipeline.from_pretrained(source)
    theirs.set_progress_bar_config(disable=True)
    reference = theirs(
        PROMPT,
        negative_prompt=NEGATIVE,
        num_images_per_prompt=2,
        num_inference_steps=STEPS,
        latents=torch.from_numpy(latents),
        guidance_scale=6.0,
        output_type="latent",
    ).images.numpy()
    got = ours(
        PROMPT,
        NEGATIVE,
        steps=STEPS,
        latents=latents,
        guidance_scale=6.0,
        num_images_per_prompt=2,
        output_type="latent",
    )
    assert got.shape == reference.shape == latents.shape
    assert _relative(got, reference) < 1e-4


@pytest.mark.slow
def test_a_transformer_batch_is_the_single_calls_with_seed_plus_i(built):
    ours = _ours(built("sd3"), "onnxruntime:cpu", "fp32")
    kwargs = dict(steps=2, guidance_scale=6.0, output_type="latent")
    previews: list[np.ndarray] = []
    batch = ours(
        PROMPT, NEGATIVE, seed=3, num_images_per_prompt=2, on_preview=lambda _, image: previews.append(image), **kwargs
    )
    assert batch.shape[:2] == (2, 16)
    # flow matching's last step lands on its predicted clean latent; SD3's 16-channel map
    factors, bias = latent_rgb(ours.family.vae_scaling_factor, 16)
    assert len(previews) == 2 and np.abs(previews[-1] - linear_preview(batch, factors, bias)).max() < 1e-5
    for i in range(2):
        assert _close(batch[i : i + 1], ours(PROMPT, NEGATIVE, seed=3 + i, **kwargs)), i


@pytest.mark.slow
def test_previews_come_once_per_step_of_the_predicted_image(built):
    ours = _ours(built("sd1"), "onnxruntime:cpu", "fp32")
    seen: list[tuple[int, np.ndarray]] = []
    final = ours(
        PROMPT,
        steps=STEPS,
        scheduler="euler",
        output_type="latent",
        on_preview=lambda step, image: seen.append((step, image)),
    )
    side = ours.assets.native_pixels // ours.vae_scale_factor
    assert [step for step, _ in seen] == list(range(1, STEPS + 1))
    assert all(image.shape == (side, side, 3) and 0 <= image.min() and image.max() <= 1 for _, image in seen)
    # Euler's last step lands on its predicted clean latent: the last preview is the final latent's map
    factors, bias = latent_rgb(ours.family.vae_scaling_factor, 4)
    assert np.abs(seen[-1][1] - linear_preview(final, factors, bias)[0]).max() < 1e-5
    assert not np.allclose(seen[0][1], seen[-1][1])
    assert ours.timings["preview"] > 0
    batched: list[np.ndarray] = []
    calls: list[int] = []
    ours(
        PROMPT,
        steps=3,
        scheduler="pndm",
        num_images_per_prompt=2,
        on_preview=lambda _, image: batched.append(image),
        on_step=lambda done, total: calls.append(total),
    )
    # one per model call, as on_step: PNDM repeats a step's call, so there are more calls than steps
    assert len(batched) == calls[-1] > 3 and batched[0].shape == (2, side, side, 3)
