"""The transformer families' half of the denoising loop (SD3, SD3.5): what the transformer is fed at a step and
how the flow-matching schedule is set. The loop itself (true classifier-free guidance, the scheduler's Euler
step, the VAE's scaling and shift factors) is the Pipeline's, shared with the UNet families."""

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


def set_timesteps(sched, steps: int, strength: float, latent_shape: tuple[int, ...], patch_size: int) -> None:
    """The schedule, with the resolution-dependent shift `mu` when the scheduler config asks for it (as diffusers'
    SD3 pipeline computes it: from the latent's patch count)."""
    from .schedulers import dynamic_shift_mu

    if sched.config.use_dynamic_shifting:
        tokens = (latent_shape[-2] // patch_size) * (latent_shape[-1] // patch_size)
        sched.set_timesteps(steps, strength, mu=dynamic_shift_mu(sched.config, tokens))
    else:
        sched.set_timesteps(steps, strength)


def feeds(x: np.ndarray, t: float, text: TextConditioning) -> dict[str, np.ndarray]:
    """SD3's MMDiT inputs: the latent, the timestep on the scheduler's 0…1000 scale, the joint text states and the
    pooled text."""
    batch = x.shape[0]
    assert text.pooled is not None, "SD3's text encoders give a pooled state"
    return {
        "hidden_states": x.astype(np.float32),
        "timestep": np.full((batch,), t, np.float32),
        "encoder_hidden_states": text.hidden,
        "pooled_projections": text.pooled.astype(np.float32),
    }
