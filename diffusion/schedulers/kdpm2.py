"""DPM2 and DPM2 ancestral (Karras et al. 2022's second-order sampler, as k-diffusion's `sample_dpm_2`): the model
is called again at the geometric midpoint of each step's sigmas, and the step is taken with the midpoint's slope.
The ancestral variant steps down to `sigma_down` and adds fresh noise of `sigma_up` (as Euler ancestral does)."""

from __future__ import annotations

import numpy as np

from .base import F32
from .k_sigmas import KSigmaScheduler, interleave, log_midpoint
from .noise_schedule import sigma_to_t


class _DPM2Base(KSigmaScheduler):
    defaults = {"beta_start": 0.00085, "beta_end": 0.012}
    order = 2
    prediction_types = ("epsilon", "v_prediction")  # diffusers: "sample" is not implemented
    round_karras_timesteps = True

    def _reset(self):
        self._start: np.ndarray | None = None  # the step's starting latent while the midpoint call is pending

    def scale_model_input(self, x, t):
        i = self._lookup_index(t)
        sigma = self.sigmas[i] if self._start is None else self._midpoint_sigma(i)
        return (np.asarray(x, F32) / (sigma**2 + 1) ** 0.5).astype(F32)

    def denoised(self, model_output, x):
        i = self._index
        sigma = self.sigmas[i] if self._start is None else self._midpoint_sigma(i)
        return self._x0(np.asarray(model_output, F32), np.asarray(x, F32), sigma)

    def _midpoint_sigma(self, i: int) -> np.float32:
        """The sigma the midpoint call at index `i` was evaluated at."""
        raise NotImplementedError

    def _interleaved_timesteps(self, timesteps: np.ndarray, midpoints: np.ndarray) -> np.ndarray:
        """t0, then (midpoint, t) for each later step: one timestep per model call. float32: the ancestral midpoint
        lies at the next sigma, so its timestep can equal the next one, and the loop's float32 timesteps must find
        their own position (base `_lookup_index`)."""
        pairs = np.stack([midpoints, timesteps[1:]], axis=-1).reshape(-1)
        return np.concatenate([timesteps[:1], pairs]).astype(F32)


class KDPM2DiscreteScheduler(_DPM2Base):
    name = "KDPM2DiscreteScheduler"

    def _timesteps_for(self, steps):
        timesteps, sigmas = self._base_schedule(steps)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        # midpoint k lies between sigmas k-1 and k; midpoint 0 is unused, the last (towards 0) is 0: an Euler step
        midpoints = log_midpoint(sigmas, np.roll(sigmas, 1))
        self.sigmas, self._midpoints = interleave(sigmas), interleave(midpoints)
        mid_timesteps = sigma_to_t(midpoints[1:-1], self._log_sigmas)
        return self._interleaved_timesteps(timesteps, mid_timesteps)

    def _midpoint_sigma(self, i):
        return self._midpoints[i]

    def _step(self, model_output, x, noise):
        i = self._index
        if self._start is None:
            sigma, sigma_mid = self.sigmas[i], self._midpoints[i + 1]
            slope = (x - self._x0(model_output, x, sigma)) / sigma
            self._start = x
            return (x + slope * (sigma_mid - sigma)).astype(F32)
        sigma, sigma_mid, sigma_next = self.sigmas[i - 1], self._midpoints[i], self.sigmas[i]
        slope = (x - self._x0(model_output, x, sigma_mid)) / sigma_mid
        start, self._start = self._start, None
        return (start + slope * (sigma_next - sigma)).astype(F32)


class KDPM2AncestralDiscreteScheduler(_DPM2Base):
    name = "KDPM2AncestralDiscreteScheduler"

    def _timesteps_for(self, steps):
        timesteps, sigmas = self._base_schedule(steps)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        following = np.concatenate([sigmas[1:], [0.0]]).astype(F32)
        with np.errstate(divide="ignore", invalid="ignore"):  # the entry past the final 0 is 0/0, never used
            up = (following**2 * (sigmas**2 - following**2) / sigmas**2) ** F32(0.5)
            down = (following**2 - up**2) ** F32(0.5)
        down[-1] = 0.0
        # the midpoint of each step lies between its sigma and sigma_down; the last step is a plain Euler step
        midpoints = log_midpoint(sigmas, down)
        midpoints[-2:] = 0.0
        self.sigmas, self._midpoints = interleave(sigmas), interleave(midpoints)
        self._up, self._down = interleave(up), interleave(down)
        mid_timesteps = sigma_to_t(midpoints[:-2], self._log_sigmas)
        return self._interleaved_timesteps(timesteps, mid_timesteps)

    def _midpoint_sigma(self, i):
        return self._midpoints[i - 1]

    def _step(self, model_output, x, noise):
        i = self._index
        if self._start is None:
            sigma, sigma_mid = self.sigmas[i], self._midpoints[i]
            slope = (x - self._x0(model_output, x, sigma)) / sigma
            self._start = x
            return (x + slope * (sigma_mid - sigma)).astype(F32)
        sigma, sigma_mid = self.sigmas[i - 1], self._midpoints[i - 1]
        sigma_up, sigma_down = self._up[i - 1], self._down[i - 1]
        slope = (x - self._x0(model_output, x, sigma_mid)) / sigma_mid
        start, self._start = self._start, None
        x_prev = start + slope * (sigma_down - sigma)
        # only the midpoint call (the second of a step) draws noise, as diffusers does
        return (x_prev + self._noise_like(x, noise) * sigma_up).astype(F32)
