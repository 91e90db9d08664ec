"""A scheduler's settings, read from a diffusers `scheduler_config.json`.

One dataclass holds every setting any of our schedulers reads, under diffusers' own names. diffusers' `from_config`
lets one class's config build another class: keys the new class knows override its defaults, the rest are ignored.
`SchedulerConfig.parse` does the same, with each class's own defaults (they differ: DDIM spaces timesteps "leading"
and clips samples by default, Euler spaces them "linspace"; LCM has its own beta range).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from enginefarm.errors import ConfigError

MAX_TRAIN_TIMESTEPS = 100_000  # the tables a scheduler builds have this many rows; diffusers' models train with 1000


@dataclass(frozen=True)
class SchedulerConfig:
    num_train_timesteps: int = 1000
    beta_start: float = 0.0001
    beta_end: float = 0.02
    beta_schedule: str = "linear"
    trained_betas: tuple[float, ...] | None = None
    rescale_betas_zero_snr: bool = False
    prediction_type: str = "epsilon"
    timestep_spacing: str = "linspace"
    steps_offset: int = 0
    # DDIM, PNDM, LCM
    set_alpha_to_one: bool = True
    clip_sample: bool = False
    clip_sample_range: float = 1.0
    thresholding: bool = False
    dynamic_thresholding_ratio: float = 0.995
    sample_max_value: float = 1.0
    # PNDM
    skip_prk_steps: bool = False
    # Euler, DPM-Solver
    use_karras_sigmas: bool = False
    use_exponential_sigmas: bool = False
    use_beta_sigmas: bool = False
    use_lu_lambdas: bool = False
    use_flow_sigmas: bool = False
    sigma_min: float | None = None
    sigma_max: float | None = None
    final_sigmas_type: str = "zero"
    interpolation_type: str = "linear"
    timestep_type: str = "discrete"
    # DPM-Solver
    solver_order: int = 2
    algorithm_type: str = "dpmsolver++"
    solver_type: str = "midpoint"
    lower_order_final: bool = True
    euler_at_final: bool = False
    lambda_min_clipped: float = -math.inf
    variance_type: str | None = None
    # LCM
    original_inference_steps: int = 50
    timestep_scaling: float = 10.0
    # Flow matching
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    invert_sigmas: bool = False
    shift_terminal: float | None = None
    time_shift_type: str = "exponential"
    stochastic_sampling: bool = False
    # UniPC
    predict_x0: bool = True
    disable_corrector: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> SchedulerConfig:
        """`config` over `defaults` over the dataclass's defaults; unknown keys are kept in `extra`, unused."""
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"a scheduler config must be a mapping, not {type(config).__name__}",
                hint="pass the content of the model's scheduler/scheduler_config.json",
            )
        known = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        values = dict(defaults or {})
        extra = {}
        for key, value in config.items():
            if key not in known:
                extra[key] = value
            elif value is not None or known[key].default is None:
                values[key] = value
            # else: a JSON null where we need a value keeps the class default
        try:
            values = {k: _coerce(k, v, str(known[k].type)) for k, v in values.items()}  # str: postponed annotations
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"scheduler config: {e}", hint="check the model's scheduler/scheduler_config.json"
            ) from None
        for key in ("num_train_timesteps", "original_inference_steps"):  # each sizes the scheduler's tables
            if key in values and not 1 <= values[key] <= MAX_TRAIN_TIMESTEPS:
                raise ConfigError(
                    f"scheduler config: {key} {values[key]} is not in 1-{MAX_TRAIN_TIMESTEPS} (diffusers' models "
                    "train with 1000)",
                    hint="check the model's scheduler/scheduler_config.json",
                )
        return cls(**values, extra=extra)

    def replace(self, **changes: Any) -> SchedulerConfig:
        return dataclasses.replace(self, **changes)


def _coerce(key: str, value: Any, annotation: str) -> Any:
    if value is None:
        return None
    if key == "trained_betas":
        if isinstance(value, (str, bytes)) or not all(isinstance(b, (int, float)) for b in value):
            raise TypeError("trained_betas must be a list of numbers")
        return tuple(float(b) for b in value)
    if key == "disable_corrector":
        if isinstance(value, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise TypeError("disable_corrector must be a list of step indices")
        return tuple(value)
    if annotation.startswith("bool"):
        if not isinstance(value, bool):
            raise TypeError(f"{key} must be true or false, not {value!r}")
        return value
    if annotation.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
            raise TypeError(f"{key} must be an integer, not {value!r}")
        return int(value)
    if annotation.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{key} must be a number, not {value!r}")
        return float(value)
    if annotation.startswith("str"):
        if not isinstance(value, str):
            raise TypeError(f"{key} must be a string, not {value!r}")
        return value
    return value


def require(cfg: SchedulerConfig, scheduler: str, key: str, allowed: tuple) -> None:
    """A setting our implementation of `scheduler` does not cover is an error, never silently ignored."""
    value = getattr(cfg, key)
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise ConfigError(
            f"{scheduler}: {key}={value!r} is not supported (supported: {shown})",
            hint="pick another scheduler or change the setting in the scheduler config",
        )
