"""enginefarm.diffusion.Pipeline against diffusers' FluxPipeline (dev: guidance embedding, resolution-dependent
shift, no negative prompt) and ChromaPipeline (T5 alone with its attention mask, true CFG): the tiny models
exported and built by the real CLI at fp32 and fp16 (T5 stays fp32: its table says so), Flux dev and schnell for ONNX
Runtime and OpenVINO, Chroma for ONNX Runtime; Flux dev's image to image (FluxImg2ImgPipeline) on ONNX Runtime fp32;
the T5 token count (max_sequence_length) chosen per call. Same weights, prompt, starting latent and schedule; fp32:
the final latent within 1e-4 of diffusers' (over its range), fp16: the image within 2e-2. diffusers takes and gives
Flux latents packed in 2x2 patches; its own packing is used to hand them over."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError

from .test_pipeline_matches_diffusers import BACKENDS, NEGATIVE, PROMPT, STEPS, _ours, _relative

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.slow

TOKENS = 512  # Flux dev's default T5 token count (the profile's opt), diffusers' max_sequence_length default
SIZE = (
    64  # image pixels: 8x8 latent, 16 tokens (the tiny transformers have no sample_size; the family's native is 1024)
)


def _theirs(source):
    pipe = diffusers.DiffusionPipeline.from_pretrained(source)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _latents(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 16, size // 8, size // 8)).astype(np.float32)


def _run_theirs(
    pipe, latents: np.ndarray, size: int, output: str, tokens: int = TOKENS, steps: int = STEPS, **kwargs
) -> np.ndarray:
    from diffusers import FluxPipeline

    packed = FluxPipeline._pack_latents(torch.from_numpy(latents), *latents.shape)
    result = pipe(
        PROMPT,
        num_inference_steps=steps,
        latents=packed,
        height=size,
        width=size,
        max_sequence_length=tokens,
        output_type=output,
        **kwargs,
    ).images
    return FluxPipeline._unpack_latents(result, size, size, 8).numpy() if output == "latent" else result[0]


CASES = [("flux", dict(guidance_scale=3.5), target) for target in BACKENDS] + [
    ("chroma", dict(negative_prompt=NEGATIVE, guidance_scale=4.0), "onnxruntime:cpu")
]


@pytest.mark.parametrize("family, kwargs, target", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_flux_and_chroma_text_to_image_match_diffusers(built, family, kwargs, target):
    source = built(family)[0]
    theirs = _theirs(source)
    for precision in ("fp32", "fp16"):
        ours = _ours(built(family), target, precision)
        assert ours.family.id == family and "transformer" in ours.sessions
        size = SIZE
        latents, output = _latents(size), "latent" if precision == "fp32" else "np"
        reference = _run_theirs(theirs, latents, size, output, **kwargs)
        got = ours(
            PROMPT,
            kwargs.get("negative_prompt"),
            steps=STEPS,
            latents=latents,
            guidance_scale=kwargs["guidance_scale"],
            height=size,
            width=size,
            output_type=output,
        )
        if precision == "fp32":
            assert got.shape == reference.shape and _relative(got, reference) < 1e-4, target
        else:
            assert got.shape == reference.shape and np.abs(got - reference).max() < 2e-2, target


def test_flux_guidance_and_resolution_change_the_result(built):
    """dev's guidance is a transformer input (not a second pass), and the shift follows the image's size: both
    change diffusers' result, and ours follows each (a non-square size: 24 tokens, not the square test's 16)."""
    ours = _ours(built("flux"), "onnxruntime:cpu", "fp32")
    theirs = _theirs(built("flux")[0])
    latents = np.random.default_rng(1).standard_normal((1, 16, 8, 12)).astype(np.float32)
    from diffusers import FluxPipeline

    packed = FluxPipeline._pack_latents(torch.from_numpy(latents), *latents.shape)
    results = {}
    for guidance in (1.5, 6.0):
        reference = theirs(
            PROMPT,
            num_inference_steps=3,
            latents=packed,
            height=64,
            width=96,
            guidance_scale=guidance,
            max_sequence_length=TOKENS,
            output_type="latent",
        ).images
        reference = FluxPipeline._unpack_latents(reference, 64, 96, 8).numpy()
        got = ours(PROMPT, steps=3, latents=latents, height=64, width=96, guidance_scale=guidance, output_type="latent")
        assert _relative(got, reference) < 1e-4
        results[guidance] = got
    assert np.abs(results[1.5] - results[6.0]).max() > 1e-3


def test_flux_image_to_image_matches_diffusers(built, monkeypatch):
    """FluxImg2ImgPipeline: the init image's VAE latent (shift, then scaling factor) mixed with the noise at the first
    sigma strength leaves (sigma * noise + (1 - sigma) * latent); the schedule cut as diffusers cuts it (strength 0.6
    of 4 steps runs 3). diffusers samples the VAE posterior and draws the noise from torch's generator; ours takes the
    posterior's mean and the noise given, so diffusers is given the same two."""
    import sys

    from diffusers import FluxImg2ImgPipeline, FluxPipeline

    source, _, _ = built("flux+vae_encoder")
    ours = _ours(built("flux+vae_encoder"), "onnxruntime:cpu", "fp32")
    image = np.random.default_rng(3).uniform(0, 1, (SIZE, SIZE, 3)).astype(np.float32)
    noise = _latents(SIZE, seed=5)
    theirs = FluxImg2ImgPipeline.from_pretrained(source)
    theirs.set_progress_bar_config(disable=True)
    module = sys.modules[FluxImg2ImgPipeline.__module__]
    monkeypatch.setattr(
        module, "retrieve_latents", lambda output, generator=None, sample_mode="sample": output.latent_dist.mode()
    )
    monkeypatch.setattr(module, "randn_tensor", lambda *a, **k: torch.from_numpy(noise))
    results = {}
    for strength in (0.6, 1.0):
        reference = theirs(
            PROMPT,
            image=image[None],
            strength=strength,
            num_inference_steps=STEPS,
            height=SIZE,
            width=SIZE,
            guidance_scale=3.5,
            max_sequence_length=TOKENS,
            output_type="latent",
        ).images
        reference = FluxPipeline._unpack_latents(reference, SIZE, SIZE, 8).numpy()
        got = ours(
            PROMPT, image=image, strength=strength, steps=STEPS, latents=noise, guidance_scale=3.5, output_type="latent"
        )
        assert got.shape == reference.shape and _relative(got, reference) < 1e-4, strength
        assert ours.timings["steps"] == (3 if strength == 0.6 else STEPS)
        results[strength] = got
    assert (
        np.abs(results[0.6] - results[1.0]).max() > 1e-3
    )  # the image is kept at 0.6, not at 1.0: strength reaches the result


@pytest.mark.parametrize("target", BACKENDS)
def test_flux_schnell_text_to_image_matches_diffusers(built, target):
    """schnell: no guidance input, an unshifted schedule (its scheduler's shift is 1, no dynamic shift), and the
    family's defaults when the caller gives none: 4 steps, one pass per step, 256 T5 tokens (what it was trained
    with; diffusers defaults to 512 and is given 256). fp32: the latent; fp16: the image."""
    theirs = _theirs(built("flux-schnell")[0])
    assert not theirs.transformer.config.guidance_embeds and not theirs.scheduler.config.use_dynamic_shifting
    latents = _latents(SIZE, seed=2)
    for precision in ("fp32", "fp16"):
        ours = _ours(built("flux-schnell"), target, precision)
        assert ours.family.id == "flux-schnell" and ours.prompts.default_length == 256
        assert "guidance" not in {tensor.name for tensor in ours.family.component("transformer").inputs}
        output = "latent" if precision == "fp32" else "np"
        reference = _run_theirs(theirs, latents, SIZE, output, tokens=256, guidance_scale=0.0)
        got = ours(PROMPT, latents=latents, height=SIZE, width=SIZE, output_type=output)
        assert ours.timings["steps"] == 4 == STEPS
        if precision == "fp32":
            assert got.shape == reference.shape and _relative(got, reference) < 1e-4, target
        else:
            assert got.shape == reference.shape and np.abs(got - reference).max() < 2e-2, target


def test_the_t5_token_count_is_the_callers_choice(built):
    """max_sequence_length picks T5's token count per call, as diffusers' argument does (the exported T5 and
    transformer take any count in their profile: 16..512): a short count matches diffusers at that count and changes
    the result (the prompt's padding is attended); a count outside the engines' profile is a one-line ConfigError
    before anything runs."""
    ours = _ours(built("flux"), "onnxruntime:cpu", "fp32")
    theirs = _theirs(built("flux")[0])
    latents = _latents(SIZE, seed=4)
    results = {}
    for tokens in (24, TOKENS):
        reference = _run_theirs(theirs, latents, SIZE, "latent", tokens=tokens, steps=2, guidance_scale=3.5)
        results[tokens] = ours(
            PROMPT, steps=2, latents=latents, height=SIZE, width=SIZE, max_sequence_length=tokens, output_type="latent"
        )
        assert _relative(results[tokens], reference) < 1e-4, tokens
    assert np.abs(results[24] - results[TOKENS]).max() > 1e-3
    for wrong in (8, 600):
        with pytest.raises(ConfigError, match="outside what .* built for \\(16..512 T5 tokens\\)") as caught:
            ours(PROMPT, steps=1, height=SIZE, width=SIZE, max_sequence_length=wrong)
        assert "--text-length" in caught.value.hint
