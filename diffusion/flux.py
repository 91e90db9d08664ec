"""What Flux.1 and Chroma do differently from SD3 in the denoising loop, in numpy (the transformer sessions take
unpacked latents: packing into 2x2 patches and the position ids are inside the exported graph, export/flux.py).

- The schedule: sigmas evenly spaced from 1 down to 1/steps (not to the scheduler's sigma_min), shifted by `mu`,
  which grows with the image's token count (latent height/2 x width/2) when the scheduler config asks
  (`use_dynamic_shifting`: dev and Chroma; schnell's config has a plain shift of 1).
- Flux dev is guidance-distilled: the scale is a transformer input (`guidance`), one pass per step, no negative
  prompt. schnell takes neither. Chroma uses true classifier-free guidance like SD3.
- Chroma: T5 alone, read with the tokenizer's attention mask; the transformer's text mask attends every prompt
  token and the first padding token (its end of sequence), nothing after.
"""

from __future__ import annotations

import numpy as np

PATCH = 2  # latent pixels per side of one Flux token


def is_flux_like(family) -> bool:
    """Flux and Chroma: the families whose transformer is fed 2x2 patches (their distinct schedule and inputs)."""
    return family.id in ("flux", "flux-schnell", "chroma")


def image_tokens(latent_shape: tuple[int, ...]) -> int:
    return (latent_shape[-2] // PATCH) * (latent_shape[-1] // PATCH)


def set_timesteps(sched, steps: int, strength: float, latent_shape: tuple[int, ...]) -> None:
    """As FluxPipeline and ChromaPipeline set them: sigmas linspace(1, 1/steps), mu from the token count."""
    from .schedulers import dynamic_shift_mu

    sigmas = np.linspace(1.0, 1.0 / steps, steps)
    mu = dynamic_shift_mu(sched.config, image_tokens(latent_shape)) if sched.config.use_dynamic_shifting else None
    sched.set_timesteps(steps, strength, mu=mu, sigmas=sigmas)


def text_mask(token_mask: np.ndarray) -> np.ndarray:
    """Chroma's transformer mask from the tokenizer's (1 on prompt tokens and the end of sequence): every position up
    to and including the first padding one, as float32 (what the exported transformer's `attention_mask` takes)."""
    lengths = np.asarray(token_mask).sum(axis=1, keepdims=True)
    return (np.arange(token_mask.shape[1])[None, :] <= lengths).astype(np.float32)


def feeds(
    family,
    x: np.ndarray,
    t: float,
    hidden: np.ndarray,
    pooled: np.ndarray | None,
    mask: np.ndarray | None,
    guidance: float,
) -> dict[str, np.ndarray]:
    """The transformer's inputs at one step: the latent, the scheduler's timestep (0…1000; the graph divides it as
    the pipelines do), the T5 states, and by family the pooled CLIP state and the guidance scale (Flux) or the text
    mask (Chroma)."""
    batch = x.shape[0]
    inputs = {
        "hidden_states": x.astype(np.float32),
        "timestep": np.full((batch,), t, np.float32),
        "encoder_hidden_states": hidden,
    }
    names = {tensor.name for tensor in family.component("transformer").inputs}
    if "pooled_projections" in names:
        assert pooled is not None, "the family's text encoders give a pooled state"
        inputs["pooled_projections"] = pooled.astype(np.float32)
    if "guidance" in names:
        inputs["guidance"] = np.full((batch,), guidance, np.float32)
    if "attention_mask" in names:
        assert mask is not None, "the family's text encoder reads the tokenizer's mask"
        inputs["attention_mask"] = mask.astype(np.float32)
    return inputs
