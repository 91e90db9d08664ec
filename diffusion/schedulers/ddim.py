"""DDIM (Song et al. 2020), deterministic (eta = 0): SD 2.x's own scheduler."""

from __future__ import annotations

import numpy as np

from .base import F32, AlphaScheduler
from .config import require
from .noise_schedule import clip_or_threshold, integer_timesteps, predict_x0_eps


class DDIMScheduler(AlphaScheduler):
    name = "DDIMScheduler"
    defaults = {"timestep_spacing": "leading", "clip_sample": True, "set_alpha_to_one": True}

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        require(self.config, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(self.config, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))

    def _timesteps_for(self, steps: int) -> np.ndarray:
        return integer_timesteps(self.config, steps)

    def _step(self, model_output, x, noise):
        t = int(self._all_timesteps[self._index])
        t_prev = t - self.config.num_train_timesteps // self.num_inference_steps
        x0, eps = predict_x0_eps(self.config.prediction_type, model_output, x, self.alphas_cumprod[t])
        x0 = clip_or_threshold(x0, self.config)
        a_prev = self._alpha_prev(t_prev)
        return (a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps).astype(F32)
