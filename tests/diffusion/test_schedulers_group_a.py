"""Heun, DPM2, DPM2 ancestral, LMS and DDPM (and Easy Diffusion's names for them) against diffusers on whole sampling
loops: same timesteps, same start latent, same final latent to float32 rounding. Heun and DPM2 call the model twice
per step, so these loops also check the order-2 bookkeeping: interleaved timesteps, img2img's cut at t_start * order,
the ancestral noise of every second call. Where diffusers refuses a setting, ours raises a ConfigError."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.diffusion import make_scheduler
from enginefarm.diffusion.schedulers.lms import lms_coefficient
from enginefarm.errors import ConfigError
from tests.diffusion.sampling import CONFIGS, SD15, SD21V, SDXL, Case, deviation, run_diffusers, run_ours
from tests.diffusion.test_schedulers_match_diffusers import FINAL_TOLERANCE
from tests.diffusion.test_schedulers_match_diffusers import compare as compare_loops

pytest.importorskip("diffusers")
# diffusers' own numpy-2 deprecation noise, not ours (recording ~200 warnings per loop also costs time)
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:__array_wrap__ must accept:DeprecationWarning"),
]

# our name (class or alias) -> diffusers class and the config changes the name stands for
NAMES = {
    "heun": ("HeunDiscreteScheduler", {"use_karras_sigmas": False}),
    "heun_karras": ("HeunDiscreteScheduler", {"use_karras_sigmas": True}),
    "dpm2": ("KDPM2DiscreteScheduler", {"use_karras_sigmas": False}),
    "dpm2_karras": ("KDPM2DiscreteScheduler", {"use_karras_sigmas": True}),
    "dpm2_a": ("KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": False}),
    "dpm2_a_karras": ("KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": True}),
    "lms": ("LMSDiscreteScheduler", {"use_karras_sigmas": False}),
    "lms_karras": ("LMSDiscreteScheduler", {"use_karras_sigmas": True}),
    "ddpm": ("DDPMScheduler", {}),
    "plms": ("PNDMScheduler", {"skip_prk_steps": True}),
}

# DPM2 ancestral's midpoint sigma is sqrt(sigma * sigma_down), with sigma_down from a float32 difference of near-equal
# squares: an ulp of difference in the training schedule (torch's float32 cumprod vs ours) grows to ~3e-4 in a
# midpoint timestep, far below anything a UNet resolves (the final latents still agree to 1e-5)
TIMESTEP_ATOL = 1e-3


def compare(case: Case, monkeypatch, name: str | None = None) -> float:
    return compare_loops(case, monkeypatch, name, timestep_atol=TIMESTEP_ATOL)


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
    "heun_exponential": ("HeunDiscreteScheduler", {**SD15, "use_exponential_sigmas": True}),
    "heun_karras_own_range": (
        "HeunDiscreteScheduler",
        {**SDXL, "use_karras_sigmas": True, "sigma_min": 0.1, "sigma_max": 10.0},
    ),
    "heun_sample_clipped": (
        "HeunDiscreteScheduler",
        {**SD15, "prediction_type": "sample", "clip_sample": True, "clip_sample_range": 0.5},
    ),
    "heun_defaults_linear": ("HeunDiscreteScheduler", {}),
    "heun_cosine_trailing": (
        "HeunDiscreteScheduler",
        {"beta_schedule": "squaredcos_cap_v2", "timestep_spacing": "trailing"},
    ),
    "heun_karras_and_exponential": (
        "HeunDiscreteScheduler",
        {**SD15, "use_karras_sigmas": True, "use_exponential_sigmas": True},
    ),
    "dpm2_exponential_v": ("KDPM2DiscreteScheduler", {**SD21V, "use_exponential_sigmas": True}),
    "dpm2_karras_own_range": ("KDPM2DiscreteScheduler", {**SD15, "use_karras_sigmas": True, "sigma_min": 0.05}),
    "dpm2_zero_snr_ignored": (
        "KDPM2DiscreteScheduler",
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "dpm2_a_exponential": ("KDPM2AncestralDiscreteScheduler", {**SDXL, "use_exponential_sigmas": True}),
    "dpm2_a_defaults_linear": ("KDPM2AncestralDiscreteScheduler", {}),
    # LMS's Karras sigmas ignore sigma_min/max, its exponential ones do not
    "lms_karras_ignores_range": ("LMSDiscreteScheduler", {**SD15, "use_karras_sigmas": True, "sigma_min": 0.1}),
    "lms_exponential_own_range": (
        "LMSDiscreteScheduler",
        {**SD15, "use_exponential_sigmas": True, "sigma_min": 0.1, "sigma_max": 10.0},
    ),
    "lms_defaults_linear": ("LMSDiscreteScheduler", {}),
    "ddpm_defaults_clip_sample": ("DDPMScheduler", {}),
    "ddpm_fixed_small_log": ("DDPMScheduler", {**SD15, "variance_type": "fixed_small_log"}),
    "ddpm_fixed_large_v": ("DDPMScheduler", {**SD21V, "variance_type": "fixed_large"}),
    "ddpm_thresholding": ("DDPMScheduler", {"thresholding": True, "sample_max_value": 1.5}),
    "ddpm_zero_snr_trailing_v": (
        "DDPMScheduler",
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "ddpm_linspace": ("DDPMScheduler", {**SD15, "timestep_spacing": "linspace"}),
}


@pytest.mark.parametrize("strength", [1.0, 0.5])
@pytest.mark.parametrize("steps", [1, 4, 20])
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_other_settings_match_diffusers(extra, steps, strength, monkeypatch):
    cls, config = EXTRAS[extra]
    compare(Case(cls, config, steps, strength), monkeypatch)


@pytest.mark.parametrize(
    ("cls", "change"),
    [
        ("HeunDiscreteScheduler", {"use_beta_sigmas": True}),  # diffusers' needs scipy; ours has none
        ("LMSDiscreteScheduler", {"timestep_spacing": "uneven"}),
        ("DDPMScheduler", {"variance_type": "learned_range"}),  # needs a model that predicts its variance
        ("DDPMScheduler", {"variance_type": "fixed_large_log"}),
        ("KDPM2DiscreteScheduler", {"prediction_type": "sample"}),
    ],
)
def test_unsupported_settings_are_config_errors(cls, change):
    with pytest.raises(ConfigError):
        make_scheduler(cls, {**SD15, **change})


@pytest.mark.parametrize(("name", "cls"), [("dpm2_a", "KDPM2AncestralDiscreteScheduler"), ("ddpm", "DDPMScheduler")])
def test_noise_injection_reaches_diffusers(name, cls, monkeypatch):
    """The comparison is only as good as the shared noise: a different draw must change diffusers' result."""
    config = {**SDXL, **NAMES[name][1]}
    ours = run_ours(Case(cls, config, 4), name).final
    assert deviation(ours, run_diffusers(Case(cls, config, 4), monkeypatch).final) <= FINAL_TOLERANCE
    assert deviation(ours, run_diffusers(Case(cls, config, 4, seed=1), monkeypatch).final) > 1e-2


def test_dpm2_a_without_step_noise_follows_the_seed():
    """(Samplers with one draw per step are checked in test_scheduler_api.py.)"""

    def sample(seed: int) -> np.ndarray:
        sched = make_scheduler("dpm2_a", SD15, rng=np.random.default_rng(seed))
        sched.set_timesteps(4)
        x = np.ones((1, 4, 8, 8), np.float32) * np.float32(sched.init_noise_sigma)
        for t in sched.timesteps:
            x = sched.step(np.tanh(sched.scale_model_input(x, t)), t, x)
        return x

    assert np.array_equal(sample(0), sample(0))
    assert not np.allclose(sample(0), sample(1))


def test_lms_coefficients_are_the_exact_integrals():
    """What diffusers computes with scipy's quad (to its epsrel 1e-4), ours in closed form."""
    integrate = pytest.importorskip("scipy.integrate")
    sigmas = np.array([14.6, 9.7, 6.1, 3.2, 1.4, 0.6, 0.0], np.float32)
    for i in range(1, 6):
        for order in range(1, min(i + 1, 4) + 1):
            for k in range(order):
                nodes = [float(sigmas[i - j]) for j in range(order)]

                def basis(tau, nodes=nodes, k=k):
                    return np.prod([(tau - s) / (nodes[k] - s) for j, s in enumerate(nodes) if j != k])

                expected = integrate.quad(basis, float(sigmas[i]), float(sigmas[i + 1]), epsabs=0, epsrel=1e-13)[0]
                assert lms_coefficient(sigmas, i, order, k) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_order_two_schedules_call_the_model_twice_per_step():
    for name in ("heun", "dpm2", "dpm2_a"):
        sched = make_scheduler(name, SD15)
        sched.set_timesteps(10)
        assert len(sched.timesteps) == 2 * 10 - 1  # the last step, to sigma 0, is a single Euler call
        sched.set_timesteps(10, strength=0.5)
        assert len(sched.timesteps) == 2 * 5 - 1


@pytest.mark.parametrize("cls", sorted({cls for cls, _ in NAMES.values()} - {"PNDMScheduler"}))
def test_previews_are_diffusers_predicted_clean_latents(cls, monkeypatch):
    """`denoised` (called before `step`, for previews) is what diffusers' step returns as pred_original_sample, on
    either call of an order-2 step (DPM2's second call sees the midpoint sigma)."""
    import importlib

    import diffusers
    import torch

    from tests.diffusion.sampling import MODULES, fake_model

    _, start, noise = Case(cls, SD15, 4).inputs()
    call = [0]
    module = importlib.import_module(f"diffusers.schedulers.{MODULES[cls]}")
    monkeypatch.setattr(module, "randn_tensor", lambda *a, **k: torch.from_numpy(noise[call[0]].copy()), raising=False)
    theirs, ours = getattr(diffusers, cls).from_config(SD15), make_scheduler(cls, SD15)
    theirs.set_timesteps(4)
    ours.set_timesteps(4)
    x = start * np.float32(ours.init_noise_sigma)
    for call[0], t in enumerate(ours.timesteps):
        out = fake_model(ours.scale_model_input(x, t), t)
        preview = ours.denoised(out, x)
        their_t = theirs.timesteps[call[0]]
        theirs.scale_model_input(torch.from_numpy(x), their_t)  # sets diffusers' step index on the first call
        expected = theirs.step(torch.from_numpy(out), their_t, torch.from_numpy(x)).pred_original_sample.numpy()
        assert deviation(preview, expected) <= 1e-5, call[0]
        x = ours.step(out, t, x, noise=noise[call[0]])
