"""enginefarm.diffusion.Pipeline against diffusers' StableDiffusion3Pipeline: the tiny SD3 exported and built by
the real CLI for ONNX Runtime and OpenVINO at fp32 and fp16 (the T5 encoder stays fp32: its table says so),
the tiny SD3.5 (RMS-normalized attention, a dual attention layer) on ONNX Runtime fp32. Same weights, prompts,
starting latent and flow-matching schedule; fp32: the final latent within 1e-4 of diffusers' (over its range),
fp16: the image within 2e-2."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from .test_pipeline_matches_diffusers import BACKENDS, NEGATIVE, PROMPT, STEPS, _ours, _relative

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.slow


def _theirs(source, **parts):
    pipe = diffusers.DiffusionPipeline.from_pretrained(source, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _latents(ours, seed: int = 0) -> np.ndarray:
    size = ours.assets.native_pixels // ours.vae_scale_factor
    return np.random.default_rng(seed).standard_normal((1, 16, size, size)).astype(np.float32)


@pytest.mark.parametrize("target", BACKENDS)
def test_sd3_text_to_image_matches_diffusers(built, target):
    source = built("sd3")[0]
    theirs = _theirs(source)
    for precision in ("fp32", "fp16"):
        ours = _ours(built("sd3"), target, precision)
        assert ours.family.id == "sd3" and "transformer" in ours.sessions
        latents, size = _latents(ours), ours.assets.native_pixels
        output = "latent" if precision == "fp32" else "np"
        reference = theirs(
            PROMPT,
            negative_prompt=NEGATIVE,
            num_inference_steps=STEPS,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            guidance_scale=6.0,
            output_type=output,
        ).images
        got = ours(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0, output_type=output)
        if precision == "fp32":
            assert _relative(got, reference.numpy()) < 1e-4, target
        else:
            assert got.shape == reference[0].shape and np.abs(got - reference[0]).max() < 2e-2, target


def test_sd3_without_t5_feeds_zeros_as_diffusers_does(built, tmp_path):
    """A model shipped without T5: the export lists no text_encoder_3, and the pipeline feeds zeros in its place."""
    source, out, store = built("sd3")
    assets = shutil.copytree(out / "assets", tmp_path / "assets")
    described = json.loads((assets / "family.json").read_text())
    described["components"].remove("text_encoder_3")
    (assets / "family.json").write_text(json.dumps(described))
    from enginefarm.diffusion import Pipeline

    ours = Pipeline.load(
        out.name.rsplit("-", 1)[0],
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=assets,
    )
    assert "text_encoder_3" not in ours.sessions
    theirs = _theirs(source, text_encoder_3=None, tokenizer_3=None)
    latents, size = _latents(ours), ours.assets.native_pixels
    reference = theirs(
        PROMPT, num_inference_steps=2, latents=torch.from_numpy(latents), height=size, width=size, output_type="latent"
    ).images
    with_t5 = _ours(built("sd3"), "onnxruntime:cpu", "fp32")(PROMPT, steps=2, latents=latents, output_type="latent")
    got = ours(PROMPT, steps=2, latents=latents, output_type="latent")
    assert _relative(got, reference.numpy()) < 1e-4
    assert _relative(with_t5, reference.numpy()) > 1e-3  # T5's states do matter: the zeros are what made the match


def test_sd3_reads_the_t5_token_count_the_caller_asks_for(built):
    """max_sequence_length (default 256, SD3's) sets T5's token count, and the transformer's text tokens follow
    (CLIP's 77 + T5's): a short count matches diffusers at that count and differs from the default's result."""
    source = built("sd3")[0]
    ours = _ours(built("sd3"), "onnxruntime:cpu", "fp32")
    assert ours.prompts.default_length == 256
    theirs = _theirs(source)
    latents, size = _latents(ours, seed=5), ours.assets.native_pixels
    results = {}
    for tokens in (40, None):
        reference = theirs(
            PROMPT,
            negative_prompt=NEGATIVE,
            num_inference_steps=2,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            guidance_scale=6.0,
            max_sequence_length=tokens or 256,
            output_type="latent",
        ).images
        results[tokens] = ours(
            PROMPT,
            NEGATIVE,
            steps=2,
            latents=latents,
            guidance_scale=6.0,
            max_sequence_length=tokens,
            output_type="latent",
        )
        assert _relative(results[tokens], reference.numpy()) < 1e-4, tokens
    assert np.abs(results[40] - results[None]).max() > 1e-4


def test_sd35_text_and_image_to_image_match_diffusers(built, monkeypatch):
    source = built("sd3.5")[0]
    ours = _ours(built("sd3.5"), "onnxruntime:cpu", "fp32")
    assert ours.family.id == "sd3.5"
    latents, size = _latents(ours), ours.assets.native_pixels
    reference = _theirs(source)(
        PROMPT,
        negative_prompt=NEGATIVE,
        num_inference_steps=STEPS,
        latents=torch.from_numpy(latents),
        height=size,
        width=size,
        guidance_scale=4.5,
        output_type="latent",
    ).images
    got = ours(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=4.5, output_type="latent")
    assert _relative(got, reference.numpy()) < 1e-4

    image = np.random.default_rng(3).uniform(0, 1, (size, size, 3)).astype(np.float32)
    theirs = diffusers.AutoPipelineForImage2Image.from_pretrained(source)
    theirs.set_progress_bar_config(disable=True)
    module = __import__(type(theirs).__module__, fromlist=["retrieve_latents"])
    # diffusers samples the VAE posterior and the noise from torch's generator; ours takes the posterior's mean and
    # the noise given, so diffusers is given the same two.
    monkeypatch.setattr(
        module, "retrieve_latents", lambda output, generator=None, sample_mode="sample": output.latent_dist.mode()
    )
    monkeypatch.setattr(module, "randn_tensor", lambda *a, **k: torch.from_numpy(latents))
    reference = theirs(
        PROMPT, image=image[None], strength=0.6, num_inference_steps=STEPS, output_type="latent", guidance_scale=6.0
    ).images.numpy()
    got = ours(
        PROMPT, image=image, strength=0.6, steps=STEPS, latents=latents, output_type="latent", guidance_scale=6.0
    )
    assert _relative(got, reference) < 1e-4


def test_a_flow_model_refuses_a_noise_prediction_scheduler_and_sizes_off_the_patch_grid(built):
    ours = _ours(built("sd3.5"), "onnxruntime:cpu", "fp32")
    with pytest.raises(ConfigError, match="cannot sample a flow-matching model") as caught:
        ours(PROMPT, steps=2, scheduler="euler")
    assert caught.value.hint
    with pytest.raises(ConfigError, match="multiple of 16"):
        ours(PROMPT, steps=2, height=72, width=64)  # 72 / 8 = 9 latent pixels: not whole patches of 2
    default = ours(PROMPT, steps=2, output_type="latent")  # the model's own scheduler and size, the family's guidance
    assert default.shape == (1, 16, 8, 8) and np.isfinite(default).all()
