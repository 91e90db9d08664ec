"""Latent Consistency Models (Luo et al. 2023): each step predicts the clean latent directly, then re-noises it to
the next (fewer, larger) timestep with fresh noise; the last step returns the prediction."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32, AlphaScheduler
from .config import require
from .noise_schedule import clip_or_threshold, predict_x0_eps


class LCMScheduler(AlphaScheduler):
    name = "LCMScheduler"
    defaults = {
        "beta_start": 0.00085,
        "beta_end": 0.012,
        "beta_schedule": "scaled_linear",
        "timestep_spacing": "leading",
        "set_alpha_to_one": True,
    }
    _SIGMA_DATA = 0.5

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        require(self.config, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))

    def _schedule(self, steps, strength):
        """LCM's img2img (diffusers' LatentConsistencyModelImg2ImgPipeline) shortens the distillation schedule by
        `strength` and spreads all `steps` over what is left, instead of cutting the schedule."""
        original = self.config.original_inference_steps
        if original > self.config.num_train_timesteps:
            raise ConfigError(
                f"original_inference_steps {original} exceeds num_train_timesteps", hint="fix the scheduler config"
            )
        k = self.config.num_train_timesteps // original
        candidates = np.arange(1, int(original * strength) + 1) * k - 1
        if steps > original:
            raise ConfigError(
                f"LCM runs at most original_inference_steps={original} steps, not {steps}",
                hint=f"use {original} steps or fewer (LCM needs only 2 to 8)",
            )
        if len(candidates) // steps < 1:
            raise ConfigError(
                f"strength {strength} leaves {len(candidates)} LCM timesteps, fewer than {steps} steps",
                hint=f"use at most {len(candidates)} steps or raise strength",
            )
        picks = np.floor(np.linspace(0, len(candidates), num=steps, endpoint=False)).astype(np.int64)
        return candidates[::-1][picks], 0

    def _step(self, model_output, x, noise):
        i = self._index
        t = int(self._all_timesteps[i])
        t_prev = int(self._all_timesteps[i + 1]) if i + 1 < len(self._all_timesteps) else t
        a, a_prev = self.alphas_cumprod[t], self._alpha_prev(t_prev)
        x0, _ = predict_x0_eps(self.config.prediction_type, model_output, x, a)
        x0 = clip_or_threshold(x0, self.config)
        # the consistency model's boundary condition: identity at t = 0, the prediction at large t
        scaled = F32(t * self.config.timestep_scaling)
        c_skip = F32(self._SIGMA_DATA**2) / (scaled**2 + F32(self._SIGMA_DATA**2))
        c_out = scaled / (scaled**2 + F32(self._SIGMA_DATA**2)) ** F32(0.5)
        denoised = c_out * x0 + c_skip * x
        if i == self.num_inference_steps - 1:
            return denoised.astype(F32)
        return (a_prev**0.5 * denoised + (1 - a_prev) ** 0.5 * self._noise_like(x, noise)).astype(F32)
