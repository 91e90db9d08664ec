"""The transformer families' half of the denoising loop (SD3, SD3.5, Flux.1, Chroma): which scheduler can step
them and what the transformer is fed at a step, by the family's contract and traits. The schedule is the
flow-matching scheduler's (`set_timesteps_for_image`); the loop itself (classifier-free guidance where the family's
`guidance` trait is "cfg", the scheduler's Euler step, the VAE's scaling and shift factors) is the Pipeline's, shared
with the UNet families."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .prompts import TextConditioning

FLOW_SCHEDULERS = ("FlowMatchEulerDiscreteScheduler",)


def check_scheduler(sched) -> None:
    """A flow-matching model predicts a velocity: only a flow-matching scheduler can step with it."""
    if type(sched).__name__ not in FLOW_SCHEDULERS:
        raise ConfigError(
            f"{type(sched).__name__} cannot sample a flow-matching model",
            hint='leave scheduler= out (the model\'s FlowMatchEulerDiscreteScheduler), or use "flow_euler"',
        )


def feeds(family, x: np.ndarray, t: float, text: TextConditioning, guidance: float) -> dict[str, np.ndarray]:
    """The transformer's inputs at one step, as the family's contract names them: the latent, the timestep on the
    scheduler's 0…1000 scale (the exported graph divides it where the model wants), the joint text states, then the
    pooled text (SD3, Flux), the guidance scale where the family's guidance is embedded in the model (Flux dev) and
    the text mask (Chroma)."""
    batch = x.shape[0]
    inputs = {
        "hidden_states": x.astype(np.float32),
        "timestep": np.full((batch,), t, np.float32),
        "encoder_hidden_states": text.hidden,
    }
    names = {tensor.name for tensor in family.component("transformer").inputs}
    if "pooled_projections" in names:
        assert text.pooled is not None, "the family's text encoders give a pooled state"
        inputs["pooled_projections"] = text.pooled.astype(np.float32)
    if family.traits.guidance == "embedded":
        inputs["guidance"] = np.full((batch,), guidance, np.float32)
    if "attention_mask" in names:
        assert text.mask is not None, "the family's text encoder reads the tokenizer's mask"
        inputs["attention_mask"] = text.mask.astype(np.float32)
    return inputs
