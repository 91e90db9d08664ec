"""The numpy half of Flux and Chroma against diffusers: the schedule their traits ask of the flow-matching scheduler
(sigmas from 1 to 1/steps, shifted by mu from the image's token count where the config says; SD3's spacing beside
it) and Chroma's transformer text mask (enginefarm.diffusion.flux)."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.diffusion import flux
from enginefarm.diffusion.schedulers import FlowMatchEulerDiscreteScheduler
from enginefarm.families import FAMILIES

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

DEV = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)


@pytest.mark.parametrize("config", [DEV, dict(shift=1.0, use_dynamic_shifting=False)], ids=["dev", "schnell"])
@pytest.mark.parametrize("latent", [(8, 8), (128, 96), (64, 160)])
def test_the_schedule_matches_flux_pipeline(config, latent):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    steps = 7
    theirs = diffusers.FlowMatchEulerDiscreteScheduler(**config)
    tokens = (latent[0] // 2) * (latent[1] // 2)
    mu = calculate_shift(
        tokens,
        theirs.config.base_image_seq_len,
        theirs.config.max_image_seq_len,
        theirs.config.base_shift,
        theirs.config.max_shift,
    )
    theirs.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    ours = FlowMatchEulerDiscreteScheduler(dict(theirs.config))
    spacing = FAMILIES["flux"].traits.sigma_spacing
    ours.set_timesteps_for_image(steps, image_seq_len=tokens, spacing=spacing)
    np.testing.assert_allclose(ours.timesteps, theirs.timesteps.numpy(), rtol=1e-6)
    np.testing.assert_allclose(ours.sigmas, theirs.sigmas.numpy(), rtol=1e-6, atol=1e-7)
    if latent != (8, 8) and config is DEV:  # a bigger image shifts the schedule toward noise
        small = FlowMatchEulerDiscreteScheduler(dict(theirs.config))
        small.set_timesteps_for_image(steps, image_seq_len=16, spacing=spacing)
        assert (ours.sigmas[1:-1] > small.sigmas[1:-1]).all()


@pytest.mark.parametrize("config", [dict(shift=3.0), DEV], ids=["static", "dynamic"])
def test_sd3s_spacing_matches_sd3_pipeline(config):
    """SD3's trait keeps the scheduler's own spacing; mu (when the config shifts by size) from 2x2-patch tokens."""
    from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

    steps, tokens = 5, 24 * 40
    theirs = diffusers.FlowMatchEulerDiscreteScheduler(**config)
    cfg = theirs.config
    dynamic = dict(
        mu=calculate_shift(tokens, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift)
    )
    theirs.set_timesteps(steps, **(dynamic if cfg.use_dynamic_shifting else {}))
    ours = FlowMatchEulerDiscreteScheduler(dict(cfg))
    ours.set_timesteps_for_image(steps, image_seq_len=tokens, spacing=FAMILIES["sd3"].traits.sigma_spacing)
    np.testing.assert_allclose(ours.sigmas, theirs.sigmas.numpy(), rtol=1e-6, atol=1e-7)


def test_chroma_text_mask_matches_chroma_pipeline(tiny):
    from diffusers import ChromaPipeline

    from enginefarm.diffusion.tokenizer import T5Tokenizer

    source = tiny("chroma")
    pipe = ChromaPipeline.from_pretrained(source)
    prompts = ["a lighthouse", "a red fox in the snow at dawn, photographed", ""]
    _, theirs = pipe._get_t5_prompt_embeds(prompts, max_sequence_length=64)
    tokenizer = T5Tokenizer.from_folder(source / "tokenizer", max_length=64)
    ids = tokenizer(prompts)
    ours = flux.text_mask(ids != tokenizer.pad_id)
    assert ours.dtype == np.float32 and ours.shape == (3, 64)
    np.testing.assert_array_equal(ours, theirs.numpy())
    assert ours.sum(axis=1).tolist()[2] == 2  # the empty prompt: its end token and the first padding token
