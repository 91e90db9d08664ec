"""DPM-Solver++ SDE (k-diffusion's sample_dpmpp_sde, as diffusers' DPMSolverSDEScheduler): each step is two model
evaluations, an ancestral half step to the log-sigma midpoint then a second-order ancestral step from the start, each
adding fresh noise. Easy Diffusion's "dpmpp_sde" is this class with Karras sigmas.

The schedule interleaves the midpoints: timesteps are t0, mid0, t1, mid1, ..., t_last (2 * steps - 1 evaluations,
the last one an Euler step to sigma 0), so `order` is 2 and img2img cuts 2 entries per skipped step, as diffusers.

The noise: diffusers draws it from a torchsde Brownian tree (the two draws of a step are correlated, both come from
one Brownian path). Ours takes independent standard-normal draws, from `step(..., noise=)` per evaluation or else from
the scheduler's rng: the same kind of sampler, not the same images for a seed. Fed the same draws (the tests replace
diffusers' BrownianTreeNoiseSampler with them), the results match diffusers'.
"""

from __future__ import annotations

import numpy as np

from .base import F32
from .config import SchedulerConfig, require
from .euler import SigmaScheduler
from .noise_schedule import exponential_sigmas, karras_sigmas, sigma_to_t


class DPMSolverSDEScheduler(SigmaScheduler):
    name = "DPMSolverSDEScheduler"
    order = 2
    defaults = {"beta_start": 0.00085, "beta_end": 0.012}

    def __init__(self, config=None, rng=None):
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.parse(config or {}, self.defaults)
        super().__init__(config.replace(rescale_betas_zero_snr=False), rng)  # diffusers' class has no such setting
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction"))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "use_beta_sigmas", (False,))
        if cfg.use_karras_sigmas:
            require(cfg, self.name, "use_exponential_sigmas", (False,))
        self._reset()

    def _timesteps_for(self, steps):
        cfg = self.config
        timesteps = self._spaced(steps).astype(np.float64)
        log_sigmas = np.log(self._train_sigmas)
        sigmas = self._interpolated_sigmas(timesteps)
        if cfg.use_karras_sigmas or cfg.use_exponential_sigmas:
            # the range is the spaced schedule's, not the training one's (unlike the DPM-Solver family)
            sigmas = (karras_sigmas if cfg.use_karras_sigmas else exponential_sigmas)(sigmas[-1], sigmas[0], steps)
            timesteps = sigma_to_t(sigmas, log_sigmas)
        # the midpoint in -log(sigma) of each step
        log_mid = -np.log(sigmas[:-1]) + np.diff(-np.log(sigmas)) * 0.5
        midpoints = sigma_to_t(np.exp(-log_mid), log_sigmas)
        sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        self.sigmas = np.concatenate([sigmas[:1], np.repeat(sigmas[1:-1], 2), sigmas[-1:]])
        interleaved = np.concatenate([timesteps[:1], np.repeat(timesteps[1:], 2)])
        interleaved[1::2] = midpoints
        return interleaved

    def _reset(self):
        self._start: np.ndarray | None = None  # set between a step's two evaluations
        self._mid_sigma: np.float32 | None = None

    def scale_model_input(self, x, t):
        index = self._lookup_index(t)
        sigma = self.sigmas[index] if self._start is None else self._mid_sigma
        return (np.asarray(x, F32) / (sigma**2 + 1) ** 0.5).astype(F32)

    def denoised(self, model_output, x):
        sigma = self.sigmas[self._index] if self._start is None else self._mid_sigma
        return self._x0(np.asarray(model_output, F32), np.asarray(x, F32), sigma)

    def _step(self, model_output, x, noise):
        i, first = self._index, self._start is None
        sigma, sigma_next = (self.sigmas[i], self.sigmas[i + 1]) if first else (self.sigmas[i - 1], self.sigmas[i])
        t, t_next = -np.log(sigma), -np.log(sigma_next) if sigma_next > 0 else np.inf
        t_mid = t + (t_next - t) * F32(0.5)
        x0 = self._x0(model_output, x, sigma if first else np.exp(-t_mid))
        if sigma_next == 0:
            return (x + (x - x0) / sigma * (sigma_next - sigma)).astype(F32)
        if first:
            t_next = t_mid
        else:
            x = self._start
        sigma_from, sigma_to = np.exp(-t), np.exp(-t_next)
        sigma_up = min(sigma_to, (sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5)
        sigma_down = (sigma_to**2 - sigma_up**2) ** 0.5
        t_down = -np.log(sigma_down)
        x_prev = np.exp(-t_down) / np.exp(-t) * x - np.expm1(t - t_down) * x0
        x_prev = x_prev + self._noise_like(x, noise) * sigma_up
        self._start, self._mid_sigma = (x, np.exp(-t_next)) if first else (None, None)
        return x_prev.astype(F32)
