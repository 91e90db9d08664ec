"""Heun's method (Karras et al. 2022, Algorithm 1 with no churn): an Euler step to the next sigma, then the model again
there, and the step redone with the average of both slopes. Two model calls per step, except the last (to sigma 0),
which is a plain Euler step."""

from __future__ import annotations

import numpy as np

from .base import F32
from .k_sigmas import KSigmaScheduler


class HeunDiscreteScheduler(KSigmaScheduler):
    name = "HeunDiscreteScheduler"
    defaults = {"beta_start": 0.00085, "beta_end": 0.012}
    order = 2
    clips_sample = True

    def _timesteps_for(self, steps):
        timesteps, sigmas = self._base_schedule(steps)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        # per model call: s0, then each later sigma twice (the Euler step's end is the correction's start), then 0
        self.sigmas = np.concatenate([sigmas[:1], np.repeat(sigmas[1:-1], 2), sigmas[-1:]])
        timesteps = timesteps.astype(F32)
        return np.concatenate([timesteps[:1], np.repeat(timesteps[1:], 2)])

    def _reset(self):
        self._first: tuple[np.ndarray, np.ndarray, np.float32] | None = None  # (x, slope, dt) of the Euler half

    def _step(self, model_output, x, noise):
        i = self._index
        if self._first is None:
            sigma, sigma_next = self.sigmas[i], self.sigmas[i + 1]
            slope = (x - self._x0(model_output, x, sigma)) / sigma
            dt = sigma_next - sigma
            self._first = (x, slope, dt)
            return (x + slope * dt).astype(F32)
        start, first_slope, dt = self._first
        sigma_next = self.sigmas[i]
        slope = (x - self._x0(model_output, x, sigma_next)) / sigma_next
        self._first = None
        return (start + (first_slope + slope) / 2 * dt).astype(F32)
