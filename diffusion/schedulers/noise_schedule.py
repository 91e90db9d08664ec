"""The training noise schedule and the helpers every discrete-time scheduler shares.

Precision follows diffusers so results agree to float32 rounding: betas and alphas are float32 (torch's default),
torch's CPU cumprod accumulates in float64, sigma conversions run in numpy's float64 on float32 inputs.
"""

from __future__ import annotations

import math

import numpy as np

from enginefarm.errors import ConfigError

from .config import SchedulerConfig

F32 = np.float32


def train_betas(cfg: SchedulerConfig) -> np.ndarray:
    n = cfg.num_train_timesteps
    if cfg.trained_betas is not None:
        betas = np.asarray(cfg.trained_betas, dtype=F32)
        if betas.shape != (n,):
            raise ConfigError(
                f"trained_betas has {betas.size} values but num_train_timesteps is {n}", hint="fix the scheduler config"
            )
    elif cfg.beta_schedule == "linear":
        betas = np.linspace(cfg.beta_start, cfg.beta_end, n).astype(F32)
    elif cfg.beta_schedule == "scaled_linear":
        betas = np.linspace(cfg.beta_start**0.5, cfg.beta_end**0.5, n).astype(F32) ** 2
    elif cfg.beta_schedule == "squaredcos_cap_v2":
        betas = _cosine_betas(n)
    else:
        raise ConfigError(
            f"beta_schedule {cfg.beta_schedule!r} is not supported",
            hint="use 'linear', 'scaled_linear' or 'squaredcos_cap_v2'",
        )
    if cfg.rescale_betas_zero_snr:
        betas = _rescale_zero_terminal_snr(betas)
    return betas


def train_alphas_cumprod(cfg: SchedulerConfig) -> np.ndarray:
    return _cumprod(1.0 - train_betas(cfg))


def _cumprod(x: np.ndarray) -> np.ndarray:
    return np.cumprod(x.astype(np.float64)).astype(F32)


def _cosine_betas(n: int, max_beta: float = 0.999) -> np.ndarray:
    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    return np.array([min(1 - alpha_bar((i + 1) / n) / alpha_bar(i / n), max_beta) for i in range(n)], dtype=F32)


def _rescale_zero_terminal_snr(betas: np.ndarray) -> np.ndarray:
    """Shift and scale sqrt(alpha_bar) so the last step has zero SNR (Lin et al. 2023, "Common Diffusion Noise
    Schedules and Sample Steps are Flawed"), keeping the first step's value."""
    root = np.sqrt(_cumprod(1.0 - betas))
    first, last = root[0], root[-1]
    root = (root - last) * (first / (first - last))
    alphas_bar = root**2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])
    return (1 - alphas).astype(F32)


def train_sigmas(alphas_cumprod: np.ndarray) -> np.ndarray:
    """Noise level of each training timestep in the variance-exploding view, sqrt((1 - a) / a); float32."""
    return (((1 - alphas_cumprod) / alphas_cumprod) ** 0.5).astype(F32)


def leading(cfg: SchedulerConfig, steps: int) -> np.ndarray:
    """Descending multiples of num_train // steps, shifted by steps_offset (SD 1.x and SDXL configs)."""
    ratio = cfg.num_train_timesteps // steps
    return (np.arange(steps) * ratio)[::-1].astype(np.int64) + cfg.steps_offset


def trailing(cfg: SchedulerConfig, steps: int, start: int | None = None) -> np.ndarray:
    """Descending from the last training timestep in equal (rounded) strides, so 1 step starts at pure noise."""
    ratio = cfg.num_train_timesteps / steps
    top = cfg.num_train_timesteps if start is None else start
    return np.round(np.arange(top, 0, -ratio)).astype(np.int64) - 1


def sigma_to_t(sigmas: np.ndarray, log_train_sigmas: np.ndarray) -> np.ndarray:
    """The fractional training timestep of each sigma, interpolating linearly in log-sigma."""
    sigmas = np.asarray(sigmas)
    log_sigma = np.log(np.maximum(sigmas, 1e-10)).reshape(-1)
    above = (log_sigma[None, :] - log_train_sigmas[:, None]) >= 0
    low = np.cumsum(above, axis=0).argmax(axis=0).clip(max=log_train_sigmas.shape[0] - 2)
    lo, hi = log_train_sigmas[low], log_train_sigmas[low + 1]
    w = np.clip((lo - log_sigma) / (lo - hi), 0, 1)
    return ((1 - w) * low + w * (low + 1)).reshape(sigmas.shape)


def karras_sigmas(sigma_min: float, sigma_max: float, steps: int, rho: float = 7.0) -> np.ndarray:
    """Karras et al. 2022: evenly spaced in sigma^(1/rho), denser near the low-noise end."""
    ramp = np.linspace(0, 1, steps)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def exponential_sigmas(sigma_min: float, sigma_max: float, steps: int) -> np.ndarray:
    return np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), steps))


def threshold(x0: np.ndarray, cfg: SchedulerConfig) -> np.ndarray:
    """Imagen's dynamic thresholding: clip each sample to its own percentile of |x0| (at least 1) and rescale."""
    flat = x0.reshape(x0.shape[0], -1)
    s = np.quantile(np.abs(flat), cfg.dynamic_thresholding_ratio, axis=1).astype(flat.dtype)
    s = np.clip(s, 1, cfg.sample_max_value)[:, None]
    return (np.clip(flat, -s, s) / s).reshape(x0.shape).astype(x0.dtype)


def clip_or_threshold(x0: np.ndarray, cfg: SchedulerConfig) -> np.ndarray:
    if cfg.thresholding:
        return threshold(x0, cfg)
    if cfg.clip_sample:
        return np.clip(x0, -cfg.clip_sample_range, cfg.clip_sample_range).astype(x0.dtype)
    return x0


def integer_timesteps(cfg: SchedulerConfig, steps: int) -> np.ndarray:
    """The integer training timesteps of DDIM and DDPM for `steps`, by the config's spacing."""
    if cfg.timestep_spacing == "linspace":
        return np.linspace(0, cfg.num_train_timesteps - 1, steps).round()[::-1].astype(np.int64)
    if cfg.timestep_spacing == "leading":
        return leading(cfg, steps)
    return trailing(cfg, steps)


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
