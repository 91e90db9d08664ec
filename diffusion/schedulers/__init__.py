"""numpy re-implementations of diffusers' schedulers, built from a model's `scheduler_config.json`.

`make_scheduler(name, config)` is the entry point; every scheduler follows `base.Scheduler`'s loop interface.
Results match diffusers' class of the same name and config to float32 rounding (the tests compare whole sampling
loops against diffusers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from enginefarm.errors import ConfigError

from .base import Scheduler
from .config import SchedulerConfig
from .ddim import DDIMScheduler
from .ddpm import DDPMScheduler
from .deis import DEISMultistepScheduler
from .dpmsolver import DPMSolverMultistepScheduler
from .dpmsolver_sde import DPMSolverSDEScheduler
from .dpmsolver_singlestep import DPMSolverSinglestepScheduler
from .euler import EulerAncestralDiscreteScheduler, EulerDiscreteScheduler
from .flow_match import FlowMatchEulerDiscreteScheduler, dynamic_shift_mu
from .heun import HeunDiscreteScheduler
from .kdpm2 import KDPM2AncestralDiscreteScheduler, KDPM2DiscreteScheduler
from .lcm import LCMScheduler
from .lms import LMSDiscreteScheduler
from .pndm import PNDMScheduler
from .unipc import UniPCMultistepScheduler

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        DDIMScheduler,
        PNDMScheduler,
        EulerDiscreteScheduler,
        EulerAncestralDiscreteScheduler,
        DPMSolverMultistepScheduler,
        LCMScheduler,
        FlowMatchEulerDiscreteScheduler,
        HeunDiscreteScheduler,
        KDPM2DiscreteScheduler,
        KDPM2AncestralDiscreteScheduler,
        LMSDiscreteScheduler,
        DDPMScheduler,
        DPMSolverSinglestepScheduler,
        DPMSolverSDEScheduler,
        DEISMultistepScheduler,
        UniPCMultistepScheduler,
    )
}

# Short names as UIs call the samplers: the class plus the settings that make the sampler what its name says,
# whatever the model's config had (a config with use_karras_sigmas still gives plain "euler").
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ddim": ("DDIMScheduler", {}),
    "pndm": ("PNDMScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {"use_karras_sigmas": False}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    # Easy Diffusion's "dpmpp_2m" has Karras sigmas (sdkit's setting); plain DPM++ 2M is the class by name
    "dpmpp_2m": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
    ),
    "dpmpp_2m_karras": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
    ),
    "lcm": ("LCMScheduler", {}),
    "flow_euler": ("FlowMatchEulerDiscreteScheduler", {}),
    # Easy Diffusion's (sdkit's) names; its PLMS is PNDM without the Runge-Kutta warm-up
    "plms": ("PNDMScheduler", {"skip_prk_steps": True}),
    "heun": ("HeunDiscreteScheduler", {"use_karras_sigmas": False}),
    "heun_karras": ("HeunDiscreteScheduler", {"use_karras_sigmas": True}),
    "dpm2": ("KDPM2DiscreteScheduler", {"use_karras_sigmas": False}),
    "dpm2_karras": ("KDPM2DiscreteScheduler", {"use_karras_sigmas": True}),
    "dpm2_a": ("KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": False}),
    "dpm2_a_karras": ("KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": True}),
    "lms": ("LMSDiscreteScheduler", {"use_karras_sigmas": False}),
    "lms_karras": ("LMSDiscreteScheduler", {"use_karras_sigmas": True}),
    "ddpm": ("DDPMScheduler", {}),
    # Easy Diffusion's DPM-Solver family, with sdkit's settings
    "dpmpp_2s_a": ("DPMSolverSinglestepScheduler", {"use_karras_sigmas": True}),
    "dpmpp_sde": ("DPMSolverSDEScheduler", {"use_karras_sigmas": True}),
    "dpmpp_2m_sde": ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++", "use_karras_sigmas": True}),
    "dpm_solver_stability": (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min"},
    ),
    "dpm": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min"}),
    "deis": ("DEISMultistepScheduler", {"use_karras_sigmas": False}),
    "deis_karras": ("DEISMultistepScheduler", {"use_karras_sigmas": True}),
    "unipc": ("UniPCMultistepScheduler", {"use_karras_sigmas": False}),
    "unipc_karras": ("UniPCMultistepScheduler", {"use_karras_sigmas": True}),
    # sdkit's time-uniform UniPC variants (it switches unipc_tu to unipc_tu_2 below 10 steps). unipc_tu_2's bh1 ends
    # at the smallest training sigma, as diffusers did when sdkit chose it: bh1 down to sigma 0 is NaN in diffusers
    "unipc_tu": (
        "UniPCMultistepScheduler",
        {"solver_type": "bh2", "solver_order": 2, "lower_order_final": True, "thresholding": False},
    ),
    "unipc_tu_2": (
        "UniPCMultistepScheduler",
        {
            "solver_type": "bh1",
            "solver_order": 2,
            "lower_order_final": True,
            "thresholding": False,
            "final_sigmas_type": "sigma_min",
        },
    ),
}


def make_scheduler(name: str | None, config: Mapping[str, Any], rng: np.random.Generator | None = None) -> Scheduler:
    """A scheduler configured from a diffusers scheduler config (`scheduler/scheduler_config.json`'s content).

    `name` is a diffusers class name (see `SCHEDULERS`) or an alias (see `ALIASES`); either way the config fills in
    every setting the class takes, as diffusers' `from_config` does across classes. `None` means the model's own
    scheduler, `config["_class_name"]`; when that class is not one of ours, DDIMScheduler is used (same noise schedule
    and prediction type, deterministic; it is what SD 1.x and 2.x both sample well with). `rng` draws the fresh noise
    of ancestral and LCM steps: seed it for reproducible images.
    """
    overrides: dict[str, Any] = {}
    if name is None:
        own = config.get("_class_name") if isinstance(config, Mapping) else None
        cls_name = own if own in SCHEDULERS else "DDIMScheduler"
    elif name in SCHEDULERS:
        cls_name = name
    elif isinstance(name, str) and name.lower() in ALIASES:
        cls_name, overrides = ALIASES[name.lower()]
    else:
        raise ConfigError(
            f"unknown scheduler {name!r}", hint=f"use one of {', '.join(SCHEDULERS)} or an alias: {', '.join(ALIASES)}"
        )
    cls = SCHEDULERS[cls_name]
    parsed = SchedulerConfig.parse(config, cls.defaults)
    return cls(parsed.replace(**overrides) if overrides else parsed, rng)


__all__ = ["ALIASES", "SCHEDULERS", "Scheduler", "SchedulerConfig", "make_scheduler", "dynamic_shift_mu", *SCHEDULERS]
