"""Flow-matching Euler (rectified flow: SD3, Flux). The model predicts the velocity noise - x0 and x moves along a
straight line, x_sigma = (1 - sigma) * x0 + sigma * noise, with sigma shifted toward the noisy end for big images."""

from __future__ import annotations

import math

import numpy as np

from enginefarm.errors import ConfigError

from .base import F32, Scheduler
from .config import require


class FlowMatchEulerDiscreteScheduler(Scheduler):
    name = "FlowMatchEulerDiscreteScheduler"

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        cfg = self.config
        for flag in (
            "use_karras_sigmas",
            "use_exponential_sigmas",
            "use_beta_sigmas",
            "invert_sigmas",
            "stochastic_sampling",
        ):
            require(cfg, self.name, flag, (False,))
        require(cfg, self.name, "time_shift_type", ("exponential", "linear"))
        n = cfg.num_train_timesteps
        sigmas = np.linspace(1, n, n, dtype=F32)[::-1] / F32(n)
        if not cfg.use_dynamic_shifting:
            sigmas = self._static_shift(sigmas)
        # the range set_timesteps spaces over: already shifted once (diffusers shifts sigma_min twice; so do we)
        self._sigma_min, self._sigma_max = float(sigmas[-1]), float(sigmas[0])
        self.sigmas = sigmas.astype(F32)
        self._mu: float | None = None
        self._custom_sigmas: np.ndarray | None = None

    def set_timesteps(
        self,
        steps: int,
        strength: float = 1.0,
        *,
        mu: float | None = None,
        sigmas: np.ndarray | list[float] | None = None,
    ) -> None:
        """`mu` is the resolution-dependent shift (log of the shift factor) that `use_dynamic_shifting` configs need:
        see `dynamic_shift_mu`. `sigmas` replaces the evenly spaced ones (Flux's pipeline passes linspace(1,
        1/steps))."""
        if self.config.use_dynamic_shifting and mu is None:
            raise ConfigError(
                f"{self.name}: this config shifts sigmas by image size (use_dynamic_shifting): pass mu",
                hint="mu = dynamic_shift_mu(config, image_seq_len) with image_seq_len = (h // 16) * (w // 16)",
            )
        if sigmas is not None and len(sigmas) != steps:
            raise ConfigError(f"{len(sigmas)} sigmas given for {steps} steps", hint="give one sigma per step")
        self._mu = mu
        self._custom_sigmas = None if sigmas is None else np.asarray(sigmas, F32)
        super().set_timesteps(steps, strength)

    def set_timesteps_for_image(
        self, steps: int, strength: float = 1.0, *, image_seq_len: int, spacing: str = "scheduler"
    ) -> None:
        """The schedule as diffusers' SD3, Flux and Chroma pipelines set it for an image of `image_seq_len`
        transformer tokens (OpenVINO GenAI's `set_timesteps_with_mu`): a config that shifts by resolution
        (`use_dynamic_shifting`) gets `mu` from the token count (`dynamic_shift_mu`, diffusers' `calculate_shift`),
        any other its static `shift`. `spacing` is the family's: "unit" passes sigmas linspace(1, 1/steps) (Flux's
        and Chroma's pipelines), "scheduler" keeps this scheduler's own (SD3's)."""
        if spacing not in ("scheduler", "unit"):
            raise ValueError(f"unknown sigma spacing {spacing!r}")
        sigmas = np.linspace(1.0, 1.0 / steps, steps) if spacing == "unit" else None
        mu = dynamic_shift_mu(self.config, image_seq_len) if self.config.use_dynamic_shifting else None
        self.set_timesteps(steps, strength, mu=mu, sigmas=sigmas)

    def _schedule(self, steps, strength):
        # SD3's and Flux's img2img pipelines round the cut differently from SD's: int(steps - steps * strength)
        return self._timesteps_for(steps), int(max(steps - min(steps * strength, steps), 0)) * self.order

    def _timesteps_for(self, steps):
        cfg, n = self.config, self.config.num_train_timesteps
        if self._custom_sigmas is not None:
            sigmas = self._custom_sigmas
        else:
            sigmas = np.linspace(self._sigma_max * n, self._sigma_min * n, steps) / n
        if cfg.use_dynamic_shifting:
            sigmas = self._time_shift(sigmas)
        else:
            sigmas = self._static_shift(sigmas)
        if cfg.shift_terminal and steps < 2:
            raise ConfigError(f"{self.name}: shift_terminal needs at least 2 steps", hint="use 2 or more steps")
        if cfg.shift_terminal:
            # stretch so the last sigma lands on shift_terminal
            one_minus = 1 - sigmas
            sigmas = 1 - one_minus / (one_minus[-1] / (1 - cfg.shift_terminal))
        sigmas = np.asarray(sigmas).astype(F32)
        self.sigmas = np.concatenate([sigmas, [0.0]]).astype(F32)
        return sigmas * F32(n)

    def _static_shift(self, sigmas):
        shift = self.config.shift
        return shift * sigmas / (1 + (shift - 1) * sigmas)

    def _time_shift(self, t):
        if self.config.time_shift_type == "exponential":
            return math.exp(self._mu) / (math.exp(self._mu) + (1 / t - 1) ** 1.0)
        return self._mu / (self._mu + (1 / t - 1) ** 1.0)

    def add_noise(self, original, noise, t):
        sigma = self.sigmas[self._lookup_index(t)]
        return (sigma * np.asarray(noise, F32) + (1.0 - sigma) * np.asarray(original, F32)).astype(F32)

    def _step(self, model_output, x, noise):
        sigma, sigma_next = self.sigmas[self._index], self.sigmas[self._index + 1]
        return (x + (sigma_next - sigma) * model_output).astype(F32)

    def denoised(self, model_output, x):
        # x_sigma = (1 - sigma) x0 + sigma noise and the model predicts noise - x0
        return (x - self.sigmas[self._index] * np.asarray(model_output, F32)).astype(F32)


def dynamic_shift_mu(config, image_seq_len: int) -> float:
    """Flux's `calculate_shift`: mu grows linearly with the latent's token count, from base_shift at
    base_image_seq_len to max_shift at max_image_seq_len."""
    from .config import SchedulerConfig

    cfg = config if isinstance(config, SchedulerConfig) else SchedulerConfig.parse(config)
    slope = (cfg.max_shift - cfg.base_shift) / (cfg.max_image_seq_len - cfg.base_image_seq_len)
    return image_seq_len * slope + (cfg.base_shift - slope * cfg.base_image_seq_len)
