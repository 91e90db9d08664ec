"""Our schedulers against diffusers' (the reference) on whole sampling loops: same timesteps, same start latent,
same final latent to float32 rounding. Where diffusers refuses a setting, ours raises a ConfigError."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from enginefarm.diffusion import dynamic_shift_mu
from enginefarm.errors import ConfigError
from tests.diffusion.sampling import (
    CONFIGS,
    FLUX,
    LCM,
    SD3,
    SD15,
    SD21V,
    SDXL,
    Case,
    deviation,
    run_diffusers,
    run_ours,
)

pytest.importorskip("diffusers")
# diffusers' own numpy-2 deprecation noise, not ours
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

# our name (class or alias) -> diffusers class and the config changes the alias stands for
NAMES = {
    "DDIMScheduler": ("DDIMScheduler", {}),
    "PNDMScheduler": ("PNDMScheduler", {}),
    "EulerDiscreteScheduler": ("EulerDiscreteScheduler", {}),
    "EulerAncestralDiscreteScheduler": ("EulerAncestralDiscreteScheduler", {}),
    "dpmpp_2m": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),  # sdkit's dpmpp_2m
    "dpmpp_2m_karras": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
    "LCMScheduler": ("LCMScheduler", {}),
}

FINAL_TOLERANCE = 1e-5  # of the final latent's range
START_TOLERANCE = 1e-6


# Zero-SNR schedules start at sigma = sqrt((1 - 2^-24) / 2^-24), just under 4096 and within half an ulp of it: a
# correctly rounded square root gives 4095.99976 (ours, numpy), torch's vectorized pow on AVX2-only CPUs 4096.0. That
# one ulp of the reference's first sigma moves a 4-step v-prediction Euler loop's final latent by 4.9e-5 of its range
# (measured on an AMD EPYC VM; within 1e-5 where torch rounds the same way).
ZERO_SNR_TOLERANCE = 1e-4


def compare(case: Case, monkeypatch, name: str | None = None, timestep_atol: float = 0.0) -> float:
    try:
        ref = run_diffusers(case, monkeypatch)
    except (ValueError, NotImplementedError):
        with pytest.raises(ConfigError):
            run_ours(case, name)
        return 0.0
    ours = run_ours(case, name)
    assert ours.timesteps.dtype == np.float32
    np.testing.assert_allclose(ours.timesteps, ref.timesteps.astype(np.float32), rtol=1e-6, atol=timestep_atol)
    assert ours.init_noise_sigma == pytest.approx(ref.init_noise_sigma, rel=1e-6)
    assert deviation(ours.start, ref.start) <= START_TOLERANCE
    assert np.isfinite(ours.final).all()
    dev = deviation(ours.final, ref.final)
    tolerance = ZERO_SNR_TOLERANCE if case.config.get("rescale_betas_zero_snr") else FINAL_TOLERANCE
    assert dev <= tolerance, f"final latent off by {dev:.3g} of its range"
    return dev


@pytest.mark.parametrize("strength", [1.0, 0.5])
@pytest.mark.parametrize("steps", [1, 4, 20])
@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name", list(NAMES))
def test_sampling_loop_matches_diffusers(name, config, prediction, steps, strength, monkeypatch):
    cls, changes = NAMES[name]
    case = Case(cls, {**CONFIGS[config], **changes, "prediction_type": prediction}, steps, strength)
    compare(case, monkeypatch, name)


EXTRAS = {
    "dpm_sde": ("DPMSolverMultistepScheduler", {**SDXL, "algorithm_type": "sde-dpmsolver++"}),
    "dpm_sde_karras_heun": (
        "DPMSolverMultistepScheduler",
        {**SDXL, "algorithm_type": "sde-dpmsolver++", "use_karras_sigmas": True, "solver_type": "heun"},
    ),
    "dpm_order3": ("DPMSolverMultistepScheduler", {**SD15, "solver_order": 3}),
    "dpm_order3_v_sigma_min_trailing": (
        "DPMSolverMultistepScheduler",
        {**SD21V, "solver_order": 3, "final_sigmas_type": "sigma_min", "timestep_spacing": "trailing"},
    ),
    "dpm_cosine_lambda_clipped": (
        "DPMSolverMultistepScheduler",
        {"beta_schedule": "squaredcos_cap_v2", "lambda_min_clipped": -5.1, "solver_type": "heun"},
    ),
    "dpm_exponential_sigmas": ("DPMSolverMultistepScheduler", {**SD15, "use_exponential_sigmas": True}),
    "dpm_sample_thresholding": (
        "DPMSolverMultistepScheduler",
        {**SD15, "prediction_type": "sample", "thresholding": True, "sample_max_value": 1.5},
    ),
    "dpm_zero_snr": (
        "DPMSolverMultistepScheduler",
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "ddim_zero_snr_trailing": (
        "DDIMScheduler",
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "ddim_thresholding": (
        "DDIMScheduler",
        {"thresholding": True, "dynamic_thresholding_ratio": 0.9, "sample_max_value": 1.2},
    ),
    "ddim_defaults_linspace": ("DDIMScheduler", {"timestep_spacing": "linspace"}),
    "ddim_defaults_clip_sample": ("DDIMScheduler", {}),
    "ddim_trained_betas": (
        "DDIMScheduler",
        {"num_train_timesteps": 50, "trained_betas": list(np.linspace(1e-3, 0.2, 50))},
    ),
    "pndm_prk_linspace": ("PNDMScheduler", {**SD15, "skip_prk_steps": False, "timestep_spacing": "linspace"}),
    "pndm_trailing_v": ("PNDMScheduler", {**SD21V, "timestep_spacing": "trailing"}),
    "euler_karras_sigma_min": (
        "EulerDiscreteScheduler",
        {**SDXL, "use_karras_sigmas": True, "final_sigmas_type": "sigma_min"},
    ),
    "euler_karras_sd15": ("EulerDiscreteScheduler", {**SD15, "use_karras_sigmas": True}),
    "euler_exponential": ("EulerDiscreteScheduler", {**SD15, "use_exponential_sigmas": True}),
    "euler_karras_own_range": (
        "EulerDiscreteScheduler",
        {**SD15, "use_karras_sigmas": True, "sigma_min": 0.1, "sigma_max": 10.0},
    ),
    "euler_zero_snr_v": (
        "EulerDiscreteScheduler",
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "euler_a_zero_snr_v": (
        "EulerAncestralDiscreteScheduler",
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "euler_defaults_linear": ("EulerDiscreteScheduler", {}),
    "lcm_v_clip": ("LCMScheduler", {**LCM, "prediction_type": "v_prediction", "clip_sample": True}),
    "lcm_sample_100_original_steps": (
        "LCMScheduler",
        {**LCM, "prediction_type": "sample", "original_inference_steps": 100, "timestep_scaling": 5.0},
    ),
    "lcm_thresholding": ("LCMScheduler", {**LCM, "thresholding": True}),
    "sd3_flow_shift": ("FlowMatchEulerDiscreteScheduler", SD3),
    "sd3_flow_shift_terminal": ("FlowMatchEulerDiscreteScheduler", {**SD3, "shift_terminal": 0.02}),
}


@pytest.mark.parametrize("strength", [1.0, 0.5])
@pytest.mark.parametrize("steps", [1, 4, 20])
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_other_settings_match_diffusers(extra, steps, strength, monkeypatch):
    cls, config = EXTRAS[extra]
    if extra == "sd3_flow_shift_terminal" and steps == 1:
        with pytest.raises(ConfigError):  # diffusers divides 0 by 0 here
            run_ours(Case(cls, config, steps, strength))
        return
    compare(Case(cls, config, steps, strength), monkeypatch)


@pytest.mark.parametrize(("steps", "strength"), list(itertools.product([1, 4, 20], [1.0, 0.5])))
@pytest.mark.parametrize("image_seq_len", [256, 1024, 4096])
def test_flux_dynamic_shift_with_custom_sigmas_matches_diffusers(image_seq_len, steps, strength, monkeypatch):
    """As FluxPipeline drives it: mu from the image's token count, sigmas linspace(1, 1/steps)."""
    case = Case(
        "FlowMatchEulerDiscreteScheduler",
        FLUX,
        steps,
        strength,
        mu=dynamic_shift_mu(FLUX, image_seq_len),
        sigmas=list(np.linspace(1.0, 1 / steps, steps)),
    )
    compare(case, monkeypatch)


def test_noise_injection_reaches_diffusers(monkeypatch):
    """The comparison is only as good as the shared noise: a different draw must change diffusers' result."""
    case = Case("EulerAncestralDiscreteScheduler", SDXL, 4)
    first = run_diffusers(case, monkeypatch).final
    other = run_diffusers(Case("EulerAncestralDiscreteScheduler", SDXL, 4, seed=1), monkeypatch).final
    ours = run_ours(case).final
    assert deviation(ours, first) <= FINAL_TOLERANCE
    assert deviation(ours, other) > 1e-2
