"""Euler and Euler ancestral (Karras et al. 2022, k-diffusion): first-order ODE / SDE steps in sigma."""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32, Scheduler
from .config import require
from .noise_schedule import exponential_sigmas, karras_sigmas, leading, sigma_to_t, train_alphas_cumprod, train_sigmas


class SigmaScheduler(Scheduler):
    """Schedulers that run in the variance-exploding view: x = x0 + sigma * eps, the UNet sees x / sqrt(sigma^2 + 1)."""

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        self.alphas_cumprod = train_alphas_cumprod(self.config)
        if self.config.rescale_betas_zero_snr:
            # zero SNR means infinite sigma; diffusers uses the smallest float32 step instead
            self.alphas_cumprod[-1] = 2.0**-24
        self._train_sigmas = train_sigmas(self.alphas_cumprod)
        self.sigmas = np.concatenate([self._train_sigmas[::-1], [0.0]]).astype(F32)

    @property
    def init_noise_sigma(self) -> float:
        top = self.sigmas.max()
        if self.config.timestep_spacing in ("linspace", "trailing"):
            return float(top)
        return float((top**2 + 1) ** 0.5)

    def scale_model_input(self, x, t):
        sigma = self.sigmas[self._lookup_index(t)]
        return (np.asarray(x, F32) / (sigma**2 + 1) ** 0.5).astype(F32)

    def add_noise(self, original, noise, t):
        sigma = self.sigmas[self._lookup_index(t)]
        return (np.asarray(original, F32) + np.asarray(noise, F32) * sigma).astype(F32)

    def _spaced(self, steps: int) -> np.ndarray:
        cfg = self.config
        if cfg.timestep_spacing == "linspace":
            return np.linspace(0, cfg.num_train_timesteps - 1, steps, dtype=F32)[::-1].copy()
        if cfg.timestep_spacing == "leading":
            return leading(cfg, steps).astype(F32)
        ratio = cfg.num_train_timesteps / steps
        return np.arange(cfg.num_train_timesteps, 0, -ratio).round().astype(F32) - 1

    def _interpolated_sigmas(self, timesteps: np.ndarray) -> np.ndarray:
        return np.interp(timesteps, np.arange(len(self._train_sigmas)), self._train_sigmas)

    def _x0(self, model_output, x, sigma):
        kind = self.config.prediction_type
        if kind == "epsilon":
            return x - sigma * model_output
        if kind == "v_prediction":
            return model_output * (-sigma / (sigma**2 + 1) ** 0.5) + x / (sigma**2 + 1)
        return model_output

    def denoised(self, model_output, x):
        return self._x0(np.asarray(model_output, F32), x, self.sigmas[self._index])


class EulerDiscreteScheduler(SigmaScheduler):
    name = "EulerDiscreteScheduler"

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", ("epsilon", "v_prediction", "sample"))
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "interpolation_type", ("linear",))
        require(cfg, self.name, "timestep_type", ("discrete",))
        require(cfg, self.name, "use_beta_sigmas", (False,))
        require(cfg, self.name, "final_sigmas_type", ("zero", "sigma_min"))
        if cfg.use_karras_sigmas and cfg.use_exponential_sigmas:
            raise ConfigError(
                f"{self.name}: use_karras_sigmas and use_exponential_sigmas exclude each other",
                hint="set one of them to false",
            )

    def _timesteps_for(self, steps):
        cfg = self.config
        timesteps = self._spaced(steps)
        sigmas = self._interpolated_sigmas(timesteps)
        if cfg.use_karras_sigmas or cfg.use_exponential_sigmas:
            lo = cfg.sigma_min if cfg.sigma_min is not None else float(sigmas[-1])
            hi = cfg.sigma_max if cfg.sigma_max is not None else float(sigmas[0])
            convert = karras_sigmas if cfg.use_karras_sigmas else exponential_sigmas
            sigmas = convert(lo, hi, steps)
            timesteps = sigma_to_t(sigmas, np.log(self._train_sigmas))
        if cfg.final_sigmas_type == "sigma_min":
            last = ((1 - self.alphas_cumprod[0]) / self.alphas_cumprod[0]) ** 0.5
        else:
            last = 0.0
        self.sigmas = np.concatenate([sigmas, [last]]).astype(F32)
        return timesteps.astype(F32)

    def _step(self, model_output, x, noise):
        sigma, sigma_next = self.sigmas[self._index], self.sigmas[self._index + 1]
        derivative = (x - self._x0(model_output, x, sigma)) / sigma
        return (x + derivative * (sigma_next - sigma)).astype(F32)


class EulerAncestralDiscreteScheduler(SigmaScheduler):
    name = "EulerAncestralDiscreteScheduler"

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        require(self.config, self.name, "prediction_type", ("epsilon", "v_prediction"))
        require(self.config, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))

    def _timesteps_for(self, steps):
        timesteps = self._spaced(steps)
        self.sigmas = np.concatenate([self._interpolated_sigmas(timesteps), [0.0]]).astype(F32)
        return timesteps

    def _step(self, model_output, x, noise):
        sigma, sigma_next = self.sigmas[self._index], self.sigmas[self._index + 1]
        # step down to sigma_down deterministically, then add fresh noise of sigma_up: sigma_down^2 + sigma_up^2 =
        # sigma_next^2
        sigma_up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
        sigma_down = (sigma_next**2 - sigma_up**2) ** 0.5
        derivative = (x - self._x0(model_output, x, sigma)) / sigma
        x_prev = x + derivative * (sigma_down - sigma)
        # diffusers draws noise on every step, the last one (sigma_up = 0) too: same draws, same images
        return (x_prev + self._noise_like(x, noise) * sigma_up).astype(F32)
