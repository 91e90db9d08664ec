"""DDIM (Song et al. 2020), deterministic (eta = 0): SD 2.x's own scheduler."""

from __future__ import annotations

import numpy as np

from .base import F32, AlphaScheduler
from .config import require
from .noise_schedule import clip_or_threshold, leading, trailing


class DDIMScheduler(AlphaScheduler):
    name = "DDIMScheduler"
    defaults = {"timestep_spacing": "leading", "clip_sample": True, "set_alpha_to_one": True}

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        require(self.config, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(self.config, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))

    def _timesteps_for(self, steps: int) -> np.ndarray:
        cfg = self.config
        if cfg.timestep_spacing == "linspace":
            return np.linspace(0, cfg.num_train_timesteps - 1, steps).round()[::-1].astype(np.int64)
        if cfg.timestep_spacing == "leading":
            return leading(cfg, steps)
        return trailing(cfg, steps)

    def _step(self, model_output, x, noise):
        t = int(self._all_timesteps[self._index])
        t_prev = t - self.config.num_train_timesteps // self.num_inference_steps
        x0, eps = predict_x0_eps(self.config.prediction_type, model_output, x, self.alphas_cumprod[t])
        x0 = clip_or_threshold(x0, self.config)
        a_prev = self._alpha_prev(t_prev)
        return (a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps).astype(F32)


def predict_x0_eps(prediction_type: str, model_output: np.ndarray, x: np.ndarray, alpha_bar: np.float32):
    """The clean sample and the noise that the model's output implies at a timestep with cumulative alpha
    `alpha_bar`."""
    beta_bar = 1 - alpha_bar
    if prediction_type == "epsilon":
        return (x - beta_bar**0.5 * model_output) / alpha_bar**0.5, model_output
    if prediction_type == "sample":
        return model_output, (x - alpha_bar**0.5 * model_output) / beta_bar**0.5
    # v_prediction (Salimans & Ho 2022): v = sqrt(a) * eps - sqrt(1 - a) * x0
    return alpha_bar**0.5 * x - beta_bar**0.5 * model_output, alpha_bar**0.5 * model_output + beta_bar**0.5 * x
