"""One sampling loop, run the same way through diffusers' scheduler (the reference) and through ours.

The "model" is a fixed smooth function of (x, t) computed in numpy for both, the start latent and every fresh noise
draw are the same arrays: whatever differs at the end comes from the schedulers.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
from dataclasses import dataclass

import numpy as np

from enginefarm.diffusion import make_scheduler

SHAPE = (1, 4, 8, 8)

# Real diffusers configs, as the models ship them (scheduler/scheduler_config.json)
SD15 = {
    "_class_name": "PNDMScheduler",
    "_diffusers_version": "0.6.0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
    "clip_sample": False,
}
SD21V = {
    "_class_name": "DDIMScheduler",
    "_diffusers_version": "0.8.0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
}
SDXL = {
    "_class_name": "EulerDiscreteScheduler",
    "_diffusers_version": "0.19.0.dev0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
    "use_karras_sigmas": False,
}
SDXL_TRAILING = {**SDXL, "timestep_spacing": "trailing"}
LCM = {
    "_class_name": "LCMScheduler",
    "_diffusers_version": "0.22.0.dev0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "clip_sample_range": 1.0,
    "dynamic_thresholding_ratio": 0.995,
    "num_train_timesteps": 1000,
    "original_inference_steps": 50,
    "prediction_type": "epsilon",
    "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0,
    "set_alpha_to_one": True,
    "steps_offset": 1,
    "thresholding": False,
    "timestep_scaling": 10.0,
    "timestep_spacing": "leading",
    "trained_betas": None,
}
SD3 = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.29.0.dev0",
    "num_train_timesteps": 1000,
    "shift": 3.0,
}
FLUX = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.30.0.dev0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}

CONFIGS = {"sd15": SD15, "sd21v": SD21V, "sdxl": SDXL, "sdxl_trailing": SDXL_TRAILING, "lcm": LCM}

# diffusers' module of each class, for patching its noise source
MODULES = {
    "DDIMScheduler": "scheduling_ddim",
    "PNDMScheduler": "scheduling_pndm",
    "EulerDiscreteScheduler": "scheduling_euler_discrete",
    "EulerAncestralDiscreteScheduler": "scheduling_euler_ancestral_discrete",
    "DPMSolverMultistepScheduler": "scheduling_dpmsolver_multistep",
    "LCMScheduler": "scheduling_lcm",
    "FlowMatchEulerDiscreteScheduler": "scheduling_flow_match_euler_discrete",
    "HeunDiscreteScheduler": "scheduling_heun_discrete",
    "KDPM2DiscreteScheduler": "scheduling_k_dpm_2_discrete",
    "KDPM2AncestralDiscreteScheduler": "scheduling_k_dpm_2_ancestral_discrete",
    "LMSDiscreteScheduler": "scheduling_lms_discrete",
    "DDPMScheduler": "scheduling_ddpm",
    "DPMSolverSinglestepScheduler": "scheduling_dpmsolver_singlestep",
    "DPMSolverSDEScheduler": "scheduling_dpmsolver_sde",
    "DEISMultistepScheduler": "scheduling_deis_multistep",
    "UniPCMultistepScheduler": "scheduling_unipc_multistep",
}


def fake_model(x: np.ndarray, t: float) -> np.ndarray:
    """Smooth in x and t, different per element, of the size a real noise prediction has."""
    ramp = np.linspace(-1, 1, x.size, dtype=np.float32).reshape(x.shape)
    return (0.8 * np.tanh(x) + 0.3 * np.cos(np.float32(t) * np.float32(0.01) + 3 * ramp)).astype(np.float32)


@dataclass
class Run:
    timesteps: np.ndarray
    init_noise_sigma: float
    start: np.ndarray
    final: np.ndarray


@dataclass
class Case:
    cls: str
    config: dict
    steps: int
    strength: float = 1.0
    seed: int = 0
    mu: float | None = None
    sigmas: list | None = None

    def inputs(self):
        rng = np.random.default_rng(self.seed)
        image = rng.standard_normal(SHAPE, dtype=np.float32) * np.float32(0.5)
        start_noise = rng.standard_normal(SHAPE, dtype=np.float32)
        step_noise = [
            rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(4 * self.steps + 4)
        ]  # PRK runs 4 evaluations a step
        return image, start_noise, step_noise

    @property
    def flow(self) -> bool:
        return self.cls == "FlowMatchEulerDiscreteScheduler"


def run_ours(case: Case, name: str | None = None) -> Run:
    image, start_noise, step_noise = case.inputs()
    sched = make_scheduler(name or case.cls, case.config)
    kwargs = {"mu": case.mu, "sigmas": case.sigmas} if case.flow else {}
    sched.set_timesteps(case.steps, case.strength, **kwargs)
    timesteps = sched.timesteps
    if case.strength < 1:
        x = sched.add_noise(image, start_noise, timesteps[0])
    else:
        x = start_noise * np.float32(sched.init_noise_sigma)
    start = x.copy()
    for k, t in enumerate(timesteps):
        out = fake_model(sched.scale_model_input(x, t), t)
        x = sched.step(out, t, x, noise=step_noise[k])
    return Run(timesteps, sched.init_noise_sigma, start, x)


def run_diffusers(case: Case, monkeypatch) -> Run:
    """As diffusers' pipelines drive the scheduler: SD's img2img get_timesteps, LCM's and SD3/Flux's own."""
    import torch

    image, start_noise, step_noise = case.inputs()
    # a draw during the k-th step call gets step_noise[k], the noise ours is given there (order-2 ancestral
    # schedulers draw on every second call only)
    call = [0]
    module = importlib.import_module(f"diffusers.schedulers.{MODULES[case.cls]}")
    monkeypatch.setattr(
        module, "randn_tensor", lambda shape, **kw: torch.from_numpy(step_noise[call[0]].copy()), raising=False
    )
    if hasattr(module, "BrownianTreeNoiseSampler"):  # DPMSolverSDE: the same draws instead of a torchsde Brownian tree
        sampler = lambda *a, **kw: lambda sigma, sigma_next: torch.from_numpy(step_noise[call[0]].copy())  # noqa: E731
        monkeypatch.setattr(module, "BrownianTreeNoiseSampler", sampler)
    sched = _reference_scheduler(case.cls, json.dumps(case.config, sort_keys=True))
    if case.cls == "LCMScheduler":
        sched.set_timesteps(case.steps, strength=case.strength)
        timesteps = sched.timesteps
    else:
        if case.flow:
            sched.set_timesteps(case.steps, mu=case.mu, sigmas=case.sigmas)
            t_start = int(max(case.steps - min(case.steps * case.strength, case.steps), 0))
        else:
            sched.set_timesteps(case.steps)
            t_start = max(case.steps - min(int(case.steps * case.strength), case.steps), 0)
        timesteps = sched.timesteps[t_start * sched.order :]
        if case.strength < 1 and hasattr(sched, "set_begin_index"):
            sched.set_begin_index(t_start * sched.order)
    if len(timesteps) < 1:
        raise ValueError("no step left: diffusers' img2img pipelines refuse this strength")
    init_sigma = float(getattr(sched, "init_noise_sigma", 1.0))
    if case.strength < 1:
        noise_it = sched.scale_noise if case.flow else (lambda a, t, n: sched.add_noise(a, n, t))
        x = noise_it(torch.from_numpy(image), timesteps[:1], torch.from_numpy(start_noise))
    else:
        x = torch.from_numpy(start_noise) * init_sigma
    start = x.numpy().copy()
    for call[0], t in enumerate(timesteps):
        x_in = x if case.flow else sched.scale_model_input(x, t)
        out = torch.from_numpy(fake_model(x_in.numpy(), float(t)))
        x = sched.step(out, t, x).prev_sample
    return Run(timesteps.numpy(), init_sigma, start, x.numpy())


@functools.cache
def _built_reference(cls: str, config: str):
    import diffusers

    return getattr(diffusers, cls).from_config(json.loads(config))


def _reference_scheduler(cls: str, config: str):
    """A fresh diffusers scheduler: a copy of one built once per class and config (building the k-diffusion ports
    plans 1000 steps and takes a quarter of a second)."""
    return copy.deepcopy(_built_reference(cls, config))


def deviation(ours: np.ndarray, ref: np.ndarray) -> float:
    """Largest difference relative to the reference's range."""
    span = float(ref.max() - ref.min()) or 1.0
    return float(np.abs(ours.astype(np.float64) - ref).max() / span)
