"""DDPM (Ho et al. 2020): ancestral sampling of the posterior q(x_prev | x_t, x0), with fresh noise on every step
but the one that lands on timestep 0's predecessor (t = 0 adds none)."""

from __future__ import annotations

import numpy as np

from .base import F32, AlphaScheduler
from .config import require
from .noise_schedule import clip_or_threshold, integer_timesteps, predict_x0_eps


class DDPMScheduler(AlphaScheduler):
    name = "DDPMScheduler"
    defaults = {"timestep_spacing": "leading", "clip_sample": True, "variance_type": "fixed_small"}

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        # "learned" variances need a model that predicts them (twice the latent's channels): no SD UNet does
        require(cfg, self.name, "variance_type", (None, "fixed_small", "fixed_small_log", "fixed_large"))

    def _timesteps_for(self, steps: int) -> np.ndarray:
        return integer_timesteps(self.config, steps)

    def _step(self, model_output, x, noise):
        i, schedule = self._index, self._all_timesteps
        t = int(schedule[i])
        t_prev = int(schedule[i + 1]) if i + 1 < len(schedule) else -1
        a = self.alphas_cumprod[t]
        a_prev = self.alphas_cumprod[t_prev] if t_prev >= 0 else F32(1)
        beta, beta_prev = 1 - a, 1 - a_prev
        alpha_step = a / a_prev
        beta_step = 1 - alpha_step
        x0, _ = predict_x0_eps(self.config.prediction_type, model_output, x, a)
        x0 = clip_or_threshold(x0, self.config)
        # the posterior mean, formula (7) of the DDPM paper
        x_prev = (a_prev**0.5 * beta_step) / beta * x0 + alpha_step**0.5 * beta_prev / beta * x
        if t > 0:
            x_prev = x_prev + self._noise_scale(beta_step, beta_prev, beta) * self._noise_like(x, noise)
        return x_prev.astype(F32)

    def _noise_scale(self, beta_step, beta_prev, beta) -> np.float32:
        posterior_variance = max(beta_prev / beta * beta_step, F32(1e-20))
        kind = self.config.variance_type
        if kind == "fixed_large":
            return beta_step**0.5
        if kind == "fixed_small_log":
            return np.exp(F32(0.5) * np.log(posterior_variance))
        return posterior_variance**0.5
