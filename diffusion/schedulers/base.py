"""What every scheduler offers a sampling loop, and the bookkeeping they share.

A loop reads the same way for every scheduler:

    sched.set_timesteps(steps, strength)          # strength < 1: img2img
    x = noise * sched.init_noise_sigma            # txt2img; img2img: x = sched.add_noise(image_latent, noise,
    sched.timesteps[0])
    for t in sched.timesteps:
        out = unet(sched.scale_model_input(x, t), t)
        x = sched.step(out, t, x)

The scheduler keeps its own position in the schedule; `step` checks that the caller's `t` is the one expected, so a
loop that skips or repeats a step fails loudly instead of drifting from diffusers' result. Latents are float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from enginefarm.errors import ConfigError

from .config import SchedulerConfig
from .noise_schedule import predict_x0_eps, train_alphas_cumprod

F32 = np.float32


class Scheduler:
    """Base class. Subclasses fill `_schedule` (the full timestep list for `steps`) and `_step` (one update)."""

    name: ClassVar[str]  # diffusers' class name
    defaults: ClassVar[Mapping[str, Any]] = {}  # where the diffusers class's defaults differ from SchedulerConfig's
    order: ClassVar[int] = 1  # model evaluations per step, as diffusers' `order` (for img2img's cut)

    def __init__(
        self, config: SchedulerConfig | Mapping[str, Any] | None = None, rng: np.random.Generator | None = None
    ):
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.parse(config or {}, self.defaults)
        self.config = config
        self.rng = rng if rng is not None else np.random.default_rng()
        self.num_inference_steps: int | None = None
        self._all_timesteps = np.zeros(0, F32)  # the full schedule for `num_inference_steps`
        self._begin = 0  # img2img starts this far into it
        self._index = 0  # the next step to run

    @classmethod
    def from_config(cls, config: Mapping[str, Any], rng: np.random.Generator | None = None) -> Scheduler:
        return cls(SchedulerConfig.parse(config, cls.defaults), rng)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(prediction_type={self.config.prediction_type!r}, steps={self.num_inference_steps})"
        )

    # -- the loop's interface

    @property
    def timesteps(self) -> np.ndarray:
        """The `timestep` input of each UNet call, in order (float32)."""
        return self._all_timesteps[self._begin :].astype(F32)

    @property
    def init_noise_sigma(self) -> float:
        return 1.0

    def set_timesteps(self, steps: int, strength: float = 1.0) -> None:
        """Plan `steps` denoising steps. With `strength` < 1 (img2img) only the last `int(steps * strength)` run, as in
        diffusers' img2img pipelines (`get_timesteps`); the loop then starts from `add_noise(image, noise,
        timesteps[0])`."""
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ConfigError(f"the number of steps must be a positive integer, not {steps!r}", hint="e.g. steps=20")
        if steps > self.config.num_train_timesteps:
            raise ConfigError(
                f"{steps} steps is more than the {self.config.num_train_timesteps} the model was trained with",
                hint=f"use at most {self.config.num_train_timesteps} steps",
            )
        if not 0.0 < strength <= 1.0:
            raise ConfigError(
                f"strength must be in (0, 1], not {strength!r}", hint="1 is txt2img; 0.5 keeps half the image"
            )
        self.num_inference_steps = int(steps)
        self._all_timesteps, begin = self._schedule(int(steps), float(strength))
        if begin >= len(self._all_timesteps):
            raise ConfigError(
                f"strength {strength} leaves no step to run out of {steps}",
                hint=f"raise strength to at least {1 / steps:.3g} or use more steps",
            )
        self._begin = self._index = begin
        self._reset()

    def set_timesteps_for_image(
        self, steps: int, strength: float = 1.0, *, image_seq_len: int, spacing: str = "scheduler"
    ) -> None:
        """`set_timesteps` for an image of `image_seq_len` denoiser tokens with the family's sigma spacing (its
        `sigma_spacing` trait): only a flow-matching schedule depends on them (FlowMatchEulerDiscreteScheduler);
        any other plans the same steps whatever the image."""
        self.set_timesteps(steps, strength)

    def scale_model_input(self, x: np.ndarray, t: float) -> np.ndarray:
        """The UNet's input for this step (sigma-based schedulers divide by sqrt(sigma^2 + 1))."""
        return x

    def step(self, model_output: np.ndarray, t: float, x: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """One denoising update from `x` at timestep `t` to the next latent. Schedulers that add fresh noise
        (ancestral, LCM) take it from `noise` when given, else draw it from `self.rng`."""
        self._check_position(t)
        x_prev = self._step(np.asarray(model_output, F32), np.asarray(x, F32), noise)
        self._index += 1
        return x_prev

    def add_noise(self, original: np.ndarray, noise: np.ndarray, t: float) -> np.ndarray:
        """`original` noised to timestep `t`: img2img's start latent."""
        raise NotImplementedError

    def denoised(self, model_output: np.ndarray, x: np.ndarray) -> np.ndarray | None:
        """The clean latent that this step's model output predicts from `x` (call it before `step`), for previews;
        None where the scheduler cannot say."""
        return None

    # -- for subclasses

    def _schedule(self, steps: int, strength: float) -> tuple[np.ndarray, int]:
        """The full timestep list and where img2img starts in it (diffusers' `get_timesteps`)."""
        timesteps = self._timesteps_for(steps)
        kept = min(int(steps * strength), steps)
        return timesteps, max(steps - kept, 0) * self.order

    def _timesteps_for(self, steps: int) -> np.ndarray:
        raise NotImplementedError

    def _reset(self) -> None:
        """Forget multistep history: called by set_timesteps."""

    def _step(self, model_output: np.ndarray, x: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    def _noise_like(self, x: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        if noise is None:
            return self.rng.standard_normal(x.shape, dtype=F32)
        noise = np.asarray(noise, F32)
        if noise.shape != x.shape:
            raise ValueError(f"noise has shape {noise.shape}, the latent {x.shape}")
        return noise

    def _check_position(self, t: float) -> None:
        if self.num_inference_steps is None:
            raise RuntimeError(f"{self.name}: call set_timesteps before step")
        if self._index >= len(self._all_timesteps):
            raise RuntimeError(f"{self.name}: all {len(self.timesteps)} steps have run; call set_timesteps again")
        expected = self._all_timesteps[self._index]
        if not np.isclose(float(np.asarray(t).reshape(-1)[0]), float(expected), rtol=0, atol=1e-3):
            raise ValueError(
                f"{self.name}: step {self._index - self._begin} expects timestep {float(expected)}, got {t!r}; "
                "steps must follow sched.timesteps in order"
            )

    def _lookup_index(self, t: float) -> int:
        """Position of `t` in the schedule: the current one if it matches (img2img's first step), else the first
        match, or the second when `t` repeats, as diffusers' `index_for_timestep`."""
        t = float(np.asarray(t).reshape(-1)[0])
        if self._index < len(self._all_timesteps) and float(self._all_timesteps[self._index]) == t:
            return self._index
        hits = np.flatnonzero(self._all_timesteps.astype(F32) == F32(t))
        if hits.size == 0:
            raise ValueError(f"{self.name}: timestep {t} is not in the schedule")
        return int(hits[1] if hits.size > 1 else hits[0])


class AlphaScheduler(Scheduler):
    """Schedulers indexed by integer training timestep (DDIM, PNDM, LCM): noise by sqrt(alpha_bar)."""

    def __init__(self, config=None, rng=None):
        super().__init__(config, rng)
        self.alphas_cumprod = train_alphas_cumprod(self.config)
        self.final_alpha_cumprod = F32(1.0) if self.config.set_alpha_to_one else self.alphas_cumprod[0]

    def add_noise(self, original: np.ndarray, noise: np.ndarray, t: float) -> np.ndarray:
        a = self.alphas_cumprod[int(np.asarray(t).reshape(-1)[0])]
        return (a**0.5 * np.asarray(original, F32) + (1 - a) ** 0.5 * np.asarray(noise, F32)).astype(F32)

    def denoised(self, model_output, x):
        t = int(self._all_timesteps[min(self._index, len(self._all_timesteps) - 1)])
        return predict_x0_eps(self.config.prediction_type, np.asarray(model_output, F32), x, self.alphas_cumprod[t])[0]

    def _alpha_prev(self, t_prev: int) -> np.float32:
        return self.alphas_cumprod[t_prev] if t_prev >= 0 else self.final_alpha_cumprod
