"""What diffusers' k-diffusion ports (Heun, DPM2, DPM2 ancestral, LMS) share: the sigma schedule for a number of
steps, optionally Karras or exponential, and the interleaving of order-2 schedules.

An order-2 sampler evaluates the model twice per step: diffusers lists every timestep but the first twice (Heun) or
interleaves a midpoint timestep (DPM2), so `timesteps` has one entry per model call and the loop stays the same.
"""

from __future__ import annotations

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32
from .config import SchedulerConfig, require
from .euler import SigmaScheduler
from .noise_schedule import exponential_sigmas, karras_sigmas, sigma_to_t


class KSigmaScheduler(SigmaScheduler):
    """Sigma-space schedulers whose diffusers classes take only the k-diffusion settings (no zero-SNR rescale, no
    final_sigmas_type): the settings they lack are ignored, as diffusers' `from_config` ignores them."""

    prediction_types: tuple[str, ...] = ("epsilon", "v_prediction", "sample")
    karras_range_from_config = True  # LMS's Karras sigmas always span the spaced schedule, ignoring sigma_min/max
    round_karras_timesteps = False  # DPM2 rounds the timesteps of Karras sigmas (not of exponential ones)
    clips_sample = False  # only Heun has clip_sample; the others ignore it

    def __init__(self, config=None, rng=None):
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.parse(config or {}, self.defaults)
        super().__init__(config.replace(rescale_betas_zero_snr=False), rng)
        cfg = self.config
        require(cfg, self.name, "prediction_type", self.prediction_types)
        require(cfg, self.name, "timestep_spacing", ("leading", "trailing", "linspace"))
        require(cfg, self.name, "use_beta_sigmas", (False,))  # diffusers needs scipy for them
        if cfg.use_karras_sigmas and cfg.use_exponential_sigmas:
            raise ConfigError(
                f"{self.name}: use_karras_sigmas and use_exponential_sigmas exclude each other",
                hint="set one of them to false",
            )

    def _base_schedule(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """One timestep and one sigma (float64, without the final 0) per step, as diffusers' `set_timesteps`."""
        cfg = self.config
        timesteps = self._spaced(steps)
        sigmas = self._interpolated_sigmas(timesteps)
        if not (cfg.use_karras_sigmas or cfg.use_exponential_sigmas):
            return timesteps, sigmas
        own_range = cfg.use_exponential_sigmas or self.karras_range_from_config
        lo = cfg.sigma_min if own_range and cfg.sigma_min is not None else float(sigmas[-1])
        hi = cfg.sigma_max if own_range and cfg.sigma_max is not None else float(sigmas[0])
        sigmas = (karras_sigmas if cfg.use_karras_sigmas else exponential_sigmas)(lo, hi, steps)
        timesteps = sigma_to_t(sigmas, self._log_sigmas)
        if cfg.use_karras_sigmas and self.round_karras_timesteps:
            timesteps = timesteps.round()
        return timesteps, sigmas

    @property
    def _log_sigmas(self) -> np.ndarray:
        return np.log(self._train_sigmas)

    def _x0(self, model_output, x, sigma):
        x0 = super()._x0(model_output, x, sigma)
        if self.clips_sample and self.config.clip_sample:
            return np.clip(x0, -self.config.clip_sample_range, self.config.clip_sample_range).astype(F32)
        return x0


def interleave(values: np.ndarray) -> np.ndarray:
    """[v0, v1, v1, v2, v2, ..., v_last, v_last, v_last]: the per-model-call layout of diffusers' order-2 sigmas."""
    return np.concatenate([values[:1], np.repeat(values[1:], 2), values[-1:]])


def log_midpoint(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """exp of the midpoint of log(a) and log(b) (the geometric mean), in float32 as torch's lerp computes it at 0.5;
    0 where either is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log_a, log_b = np.log(a.astype(F32)), np.log(b.astype(F32))
        mid = np.exp(log_b - (log_b - log_a) * F32(0.5)).astype(F32)
    return np.where((a == 0) | (b == 0), F32(0), mid).astype(F32)
