"""PNDM (Liu et al. 2022): SD 1.x's own scheduler. With skip_prk_steps (as SD ships it) it is PLMS, a 4th-order
linear multistep method on the noise prediction; without, the first steps are Runge-Kutta (PRK) steps."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32, AlphaScheduler
from .config import require


class PNDMScheduler(AlphaScheduler):
    name = "PNDMScheduler"
    defaults = {"timestep_spacing": "leading", "set_alpha_to_one": False}
    _RK = 4  # a PRK step is 4 model evaluations

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        require(self.config, self.name, "prediction_type", ("epsilon", "v_prediction"))
        require(self.config, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        self._reset()

    def _timesteps_for(self, steps: int) -> np.ndarray:
        cfg = self.config
        if not cfg.skip_prk_steps and steps < self._RK:
            raise ConfigError(
                f"{self.name} with Runge-Kutta warm-up (skip_prk_steps false) needs at least {self._RK} steps",
                hint=f"use {self._RK} or more steps, or set skip_prk_steps",
            )
        cfg_n = cfg.num_train_timesteps
        if cfg.timestep_spacing == "linspace":
            ascending = np.linspace(0, cfg_n - 1, steps).round().astype(np.int64)
        elif cfg.timestep_spacing == "leading":
            ascending = np.arange(steps) * (cfg_n // steps) + cfg.steps_offset
        else:
            ascending = np.round(np.arange(cfg_n, 0, -cfg_n / steps))[::-1].astype(np.int64) - 1
        if cfg.skip_prk_steps:
            # the second-to-last timestep is evaluated twice: PLMS's warm-up step is a 2-evaluation Heun-like step
            self._prk = np.zeros(0, np.int64)
            plms = np.concatenate([ascending[:-1], ascending[-2:-1], ascending[-1:]])[::-1]
        else:
            half = cfg_n // steps // 2
            prk = np.repeat(ascending[-self._RK :], 2) + np.tile([0, half], self._RK)
            self._prk = np.repeat(prk[:-1], 2)[1:-1][::-1]
            plms = ascending[:-3][::-1]
        return np.concatenate([self._prk, plms]).astype(np.int64)

    def _reset(self) -> None:
        self._eps_history: list[np.ndarray] = []
        self._rk_sum: np.ndarray | float = 0.0
        self._first_sample: np.ndarray | None = None

    def _step(self, model_output, x, noise):
        # diffusers' counter restarts at 0 for img2img (PNDM has no begin index), so ours counts from the cut too
        count = self._index - self._begin
        t = int(self._all_timesteps[self._index])
        if count < len(self._prk) and not self.config.skip_prk_steps:
            return self._prk_step(model_output, x, t, count)
        return self._plms_step(model_output, x, t, count)

    def _prk_step(self, e, x, t, count):
        half = self.config.num_train_timesteps // self.num_inference_steps // 2
        t_prev = t - (0 if count % 2 else half)
        t_from = int(self._prk[count // 4 * 4])
        stage = count % 4
        if stage == 0:
            self._rk_sum = self._rk_sum + F32(1 / 6) * e
            self._eps_history.append(e)
            self._first_sample = x
        elif stage in (1, 2):
            self._rk_sum = self._rk_sum + F32(1 / 3) * e
        else:
            e = self._rk_sum + F32(1 / 6) * e
            self._rk_sum = 0.0
        start = self._first_sample if self._first_sample is not None else x
        return self._transfer(start, t_from, t_prev, e)

    def _plms_step(self, e, x, t, count):
        stride = self.config.num_train_timesteps // self.num_inference_steps
        t_prev = t - stride
        if count != 1:
            self._eps_history = self._eps_history[-3:] + [e]
        else:
            # the repeated timestep: step again from the first sample, with the average of both noise predictions
            t_prev, t = t, t + stride
        h = self._eps_history
        if len(h) == 1 and count == 0:
            self._first_sample = x
        elif len(h) == 1 and count == 1:
            e = (e + h[-1]) / 2
            x, self._first_sample = self._first_sample, None
        elif len(h) == 2:
            e = (3 * h[-1] - h[-2]) / 2
        elif len(h) == 3:
            e = (23 * h[-1] - 16 * h[-2] + 5 * h[-3]) / 12
        else:
            e = F32(1 / 24) * (55 * h[-1] - 59 * h[-2] + 37 * h[-3] - 9 * h[-4])
        return self._transfer(x, t, t_prev, e)

    def _transfer(self, x, t, t_prev, e):
        """Formula (9) of the PNDM paper: x at t_prev from x at t and a noise estimate."""
        a, a_prev = self.alphas_cumprod[t], self._alpha_prev(t_prev)
        if self.config.prediction_type == "v_prediction":
            e = a**0.5 * e + (1 - a) ** 0.5 * x
        denom = a * (1 - a_prev) ** 0.5 + (a * (1 - a) * a_prev) ** 0.5
        return ((a_prev / a) ** 0.5 * x - (a_prev - a) * e / denom).astype(F32)
