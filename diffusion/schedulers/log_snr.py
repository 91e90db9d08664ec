"""What the DPM-Solver family shares: DPM-Solver (multistep and singlestep), DEIS and UniPC.

They run in the variance-preserving view x = alpha_t x0 + sigma_t eps (the UNet sees x unscaled), step exactly in
log-SNR lambda = log(alpha_t / sigma_t), and place their steps the same ways: spaced training timesteps, or Karras /
exponential sigmas mapped back to timesteps. The exponential-integrator updates of DPM-Solver are functions here so
the multistep and singlestep solvers (and DEIS's first step) use the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32, Scheduler
from .config import SchedulerConfig, require
from .noise_schedule import exponential_sigmas, karras_sigmas, sigma_to_t, threshold, train_alphas_cumprod, train_sigmas

Point = tuple[np.float32, np.float32, np.float32]  # (alpha_t, sigma_t, lambda_t) at one sigma of the schedule


def alpha_sigma(sigma: np.float32) -> tuple[np.float32, np.float32]:
    """From the variance-exploding sigma to the variance-preserving (alpha_t, sigma_t) pair."""
    alpha = F32(1) / (sigma**2 + F32(1)) ** F32(0.5)
    return alpha, sigma * alpha


class LogSNRScheduler(Scheduler):
    """Base of the DPM-Solver family. `ignored` lists settings the diffusers class does not have, reset to their
    neutral value (diffusers' from_config drops them too)."""

    ignored: ClassVar[Mapping[str, Any]] = {}
    karras_range_from_config: ClassVar[bool] = False  # UniPC's Karras sigmas honour sigma_min / sigma_max

    def __init__(self, config=None, rng=None):
        if self.ignored:
            if not isinstance(config, SchedulerConfig):
                config = SchedulerConfig.parse(config or {}, self.defaults)
            config = config.replace(**self.ignored)
        super().__init__(config, rng)
        cfg = self.config
        for flag in ("use_beta_sigmas", "use_flow_sigmas", "use_dynamic_shifting"):
            require(cfg, self.name, flag, (False,))
        if cfg.use_karras_sigmas and cfg.use_exponential_sigmas:
            raise ConfigError(
                f"{self.name}: use_karras_sigmas and use_exponential_sigmas exclude each other",
                hint="set one of them to false",
            )
        self.alphas_cumprod = train_alphas_cumprod(cfg)
        if cfg.rescale_betas_zero_snr:
            self.alphas_cumprod[-1] = (
                2.0**-24
            )  # zero SNR is an infinite sigma; diffusers uses the smallest float32 step
        self._train_sigmas = train_sigmas(self.alphas_cumprod)
        self.sigmas = self._train_sigmas.copy()
        self._reset()

    def add_noise(self, original, noise, t):
        alpha, sigma = alpha_sigma(self.sigmas[self._lookup_index(t)])
        return (alpha * np.asarray(original, F32) + sigma * np.asarray(noise, F32)).astype(F32)

    def denoised(self, model_output, x):
        return self._x0(np.asarray(model_output, F32), np.asarray(x, F32))

    # -- the schedule

    def _spaced(self, steps: int, spacing: str, top: int | None = None) -> np.ndarray:
        """`steps` integer training timesteps, descending; `top` (default all) cuts off the noisiest ones."""
        cfg, n = self.config, self.config.num_train_timesteps
        top = n if top is None else top
        if spacing == "linspace":
            return np.linspace(0, top - 1, steps + 1).round()[::-1][:-1].astype(np.int64)
        if spacing == "leading":
            return (np.arange(steps + 1) * (top // (steps + 1)))[::-1][:-1].astype(np.int64) + cfg.steps_offset
        return np.arange(top, 0, -n / steps).round().astype(np.int64) - 1

    def _converted(self, steps: int, round_karras: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Karras or exponential sigmas over the whole training range, and their (fractional) timesteps."""
        cfg = self.config
        lo, hi = float(self._train_sigmas[0]), float(self._train_sigmas[-1])
        if self.karras_range_from_config:
            lo = cfg.sigma_min if cfg.sigma_min is not None else lo
            hi = cfg.sigma_max if cfg.sigma_max is not None else hi
        sigmas = (karras_sigmas if cfg.use_karras_sigmas else exponential_sigmas)(lo, hi, steps)
        timesteps = sigma_to_t(sigmas, np.log(self._train_sigmas))
        if cfg.use_karras_sigmas and round_karras:
            timesteps = timesteps.round()
        return sigmas, timesteps

    def _interpolated(self, timesteps: np.ndarray) -> np.ndarray:
        return np.interp(timesteps, np.arange(len(self._train_sigmas)), self._train_sigmas)

    def _smallest_train_sigma(self) -> np.float32:
        a = self.alphas_cumprod[0]
        return ((1 - a) / a) ** 0.5

    # -- model outputs

    def _x0(self, model_output: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The clean sample the model predicts (thresholded when the config asks)."""
        kind = self.config.prediction_type
        if kind == "sample":
            x0 = model_output
        else:
            alpha, sigma = alpha_sigma(self.sigmas[self._index])
            x0 = (x - sigma * model_output) / alpha if kind == "epsilon" else alpha * x - sigma * model_output
        return threshold(x0, self.config) if self.config.thresholding else x0

    def _eps(self, model_output: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The noise the model predicts (DPM-Solver's "dpmsolver" algorithm, UniPC without predict_x0)."""
        kind = self.config.prediction_type
        if kind == "epsilon":
            return model_output
        alpha, sigma = alpha_sigma(self.sigmas[self._index])
        if kind == "sample":
            return (x - alpha * model_output) / sigma
        return alpha * model_output + sigma * x

    def _points(self, *offsets: int) -> list[Point]:
        """(alpha, sigma, lambda) at sigmas[index + offset] for each offset, in float32."""
        out = []
        for k in offsets:
            alpha, sigma = alpha_sigma(self.sigmas[self._index + k])
            with np.errstate(divide="ignore"):  # sigma 0 (the final step) means lambda = +inf
                out.append((alpha, sigma, np.log(alpha) - np.log(sigma)))
        return out


# -- DPM-Solver's exponential-integrator updates from point s to point t. "dpmsolver++" and "sde-dpmsolver++"
# integrate the clean-sample prediction m, "dpmsolver" (and DEIS's first step) the noise prediction.


def first_order_update(algorithm: str, x, s: Point, t: Point, m, noise=None):
    """DDIM-equivalent step."""
    (a_s, s_s, l_s), (a_t, s_t, l_t) = s, t
    if s_t == 0 and algorithm != "dpmsolver":
        return m  # lambda_t = inf: the step lands on the prediction
    h = l_t - l_s
    if algorithm == "dpmsolver++":
        return s_t / s_s * x - a_t * (np.exp(-h) - 1.0) * m
    if algorithm == "dpmsolver":
        return a_t / a_s * x - s_t * (np.exp(h) - 1.0) * m
    return s_t / s_s * np.exp(-h) * x + a_t * (1 - np.exp(-2.0 * h)) * m + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * noise


def second_order_update(algorithm: str, solver_type: str, x, s: Point, t: Point, d0, d1, noise=None):
    """Second-order step with the prediction d0 and its scaled difference d1 (midpoint or Heun weighting)."""
    (a_s, s_s, l_s), (a_t, s_t, l_t) = s, t
    h = l_t - l_s
    midpoint = solver_type == "midpoint"
    if algorithm == "dpmsolver++":
        base = s_t / s_s * x - a_t * (np.exp(-h) - 1.0) * d0
        if midpoint:
            return base - 0.5 * (a_t * (np.exp(-h) - 1.0)) * d1
        return base + a_t * ((np.exp(-h) - 1.0) / h + 1.0) * d1
    if algorithm == "dpmsolver":
        base = a_t / a_s * x - s_t * (np.exp(h) - 1.0) * d0
        if midpoint:
            return base - 0.5 * (s_t * (np.exp(h) - 1.0)) * d1
        return base - s_t * ((np.exp(h) - 1.0) / h - 1.0) * d1
    base = s_t / s_s * np.exp(-h) * x + a_t * (1 - np.exp(-2.0 * h)) * d0
    if midpoint:
        base = base + 0.5 * (a_t * (1 - np.exp(-2.0 * h))) * d1
    else:
        base = base + a_t * ((1.0 - np.exp(-2.0 * h)) / (-2.0 * h) + 1.0) * d1
    return base + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * noise


def third_order_update(algorithm: str, x, s: Point, t: Point, d0, d1, d2, noise=None):
    """Third-order step with the prediction d0, its first and second scaled differences d1, d2."""
    (a_s, s_s, l_s), (a_t, s_t, l_t) = s, t
    h = l_t - l_s
    if algorithm == "dpmsolver++":
        return (
            s_t / s_s * x
            - a_t * (np.exp(-h) - 1.0) * d0
            + a_t * ((np.exp(-h) - 1.0) / h + 1.0) * d1
            - a_t * ((np.exp(-h) - 1.0 + h) / h**2 - 0.5) * d2
        )
    if algorithm == "dpmsolver":
        return (
            a_t / a_s * x
            - s_t * (np.exp(h) - 1.0) * d0
            - s_t * ((np.exp(h) - 1.0) / h - 1.0) * d1
            - s_t * ((np.exp(h) - 1.0 - h) / h**2 - 0.5) * d2
        )
    return (
        s_t / s_s * np.exp(-h) * x
        + a_t * (1.0 - np.exp(-2.0 * h)) * d0
        + a_t * ((1.0 - np.exp(-2.0 * h)) / (-2.0 * h) + 1.0) * d1
        + a_t * ((1.0 - np.exp(-2.0 * h) - 2.0 * h) / (2.0 * h) ** 2 - 0.5) * d2
        + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * noise
    )
