"""DPM-Solver singlestep, DPM-Solver SDE, DEIS and UniPC, and Easy Diffusion's names for the DPM-Solver family, against
diffusers' classes (the reference) on whole sampling loops, as tests/diffusion/test_schedulers_match_diffusers.py does.

DPMSolverSDEScheduler: diffusers draws its noise from a torchsde Brownian tree; here both sides get the same
standard-normal draw per step call (sampling.run_diffusers replaces diffusers' BrownianTreeNoiseSampler), so what is
compared is the solver's arithmetic given the noise, not the noise itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.diffusion import ALIASES, make_scheduler
from enginefarm.errors import ConfigError
from tests.diffusion.sampling import SD15, SD21V, SDXL, SDXL_TRAILING, Case, deviation, run_diffusers, run_ours
from tests.diffusion.test_schedulers_match_diffusers import FINAL_TOLERANCE, compare

pytest.importorskip("diffusers")
pytest.importorskip("torchsde")  # diffusers' DPMSolverSDEScheduler imports it
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:__array_wrap__ must accept:DeprecationWarning"),  # diffusers' DEIS
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # diffusers deprecates algorithm_type "dpmsolver"
]

SINGLESTEP, SDE = "DPMSolverSinglestepScheduler", "DPMSolverSDEScheduler"
DEIS, UNIPC, MULTISTEP = "DEISMultistepScheduler", "UniPCMultistepScheduler", "DPMSolverMultistepScheduler"

# our name -> diffusers class and the settings sdkit (Easy Diffusion) gives that name (sdkit/generate/sampler/
# diffusers_samplers.py); the model's config fills in the rest, as diffusers' from_config
NAMES = {
    SINGLESTEP: (SINGLESTEP, {}),
    "dpmpp_2s_a": (SINGLESTEP, {"use_karras_sigmas": True}),
    SDE: (SDE, {}),
    "dpmpp_sde": (SDE, {"use_karras_sigmas": True}),
    DEIS: (DEIS, {}),
    "deis_karras": (DEIS, {"use_karras_sigmas": True}),
    UNIPC: (UNIPC, {}),
    "unipc_karras": (UNIPC, {"use_karras_sigmas": True}),
    # sdkit's bh1 ends at sigma 0, which is NaN in diffusers 0.42: ours ends at the smallest training sigma
    "unipc_tu_2": (
        UNIPC,
        {"solver_type": "bh1", "solver_order": 2, "lower_order_final": True, "final_sigmas_type": "sigma_min"},
    ),
    "dpm_solver_stability": (MULTISTEP, {"algorithm_type": "dpmsolver", "final_sigmas_type": "sigma_min"}),
    "dpmpp_2m_sde": (MULTISTEP, {"algorithm_type": "sde-dpmsolver++", "use_karras_sigmas": True}),
}
# the spacings the real configs give these classes: SD 1.5's (no timestep_spacing: linspace), SDXL's leading, trailing
CONFIGS = {"sd15": SD15, "sdxl": SDXL, "sdxl_trailing": SDXL_TRAILING}
# one config where the spacing does not matter: the singlestep solver has none (always linspace), Karras sigmas
# replace the spaced timesteps (checked on every config through dpmpp_sde, whose range depends on them)
NAME_CONFIGS = [
    (n, c) for n in NAMES for c in CONFIGS if c == "sd15" or (NAMES[n][0] != SINGLESTEP and not n.endswith("_karras"))
]


@pytest.mark.parametrize("strength", [1.0, 0.5])
@pytest.mark.parametrize("steps", [1, 4, 20])
@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize(("name", "config"), NAME_CONFIGS)
def test_sampling_loop_matches_diffusers(name, config, prediction, steps, strength, monkeypatch):
    cls, changes = NAMES[name]
    case = Case(cls, {**CONFIGS[config], **changes, "prediction_type": prediction}, steps, strength)
    compare(case, monkeypatch, name)


EXTRAS = {
    "singlestep_order3_midpoint": (SINGLESTEP, {**SD15, "solver_order": 3}),
    "singlestep_order3_heun_dpmsolver": (
        SINGLESTEP,
        {
            **SD21V,
            "solver_order": 3,
            "solver_type": "heun",
            "algorithm_type": "dpmsolver",
            "final_sigmas_type": "sigma_min",
        },
    ),
    "singlestep_full_order_sigma_min": (
        SINGLESTEP,
        {**SD15, "solver_type": "heun", "final_sigmas_type": "sigma_min", "lower_order_final": False},
    ),
    "singlestep_sde_order3": (SINGLESTEP, {**SDXL, "algorithm_type": "sde-dpmsolver++", "solver_order": 3}),
    "singlestep_sde_heun_karras": (
        SINGLESTEP,
        {**SDXL, "algorithm_type": "sde-dpmsolver++", "solver_type": "heun", "use_karras_sigmas": True},
    ),
    "singlestep_cosine_clipped": (SINGLESTEP, {"beta_schedule": "squaredcos_cap_v2", "lambda_min_clipped": -5.1}),
    "singlestep_exponential": (SINGLESTEP, {**SD15, "use_exponential_sigmas": True}),
    "singlestep_ignores_zero_snr": (
        SINGLESTEP,
        {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
    ),
    "singlestep_thresholding": (SINGLESTEP, {**SD15, "prediction_type": "sample", "thresholding": True}),
    "singlestep_dpmsolver_final_zero": (SINGLESTEP, {**SD15, "algorithm_type": "dpmsolver"}),
    "sde_exponential_v": (SDE, {**SD21V, "use_exponential_sigmas": True}),
    "sde_karras_trailing_ignores_zero_snr": (
        SDE,
        {**SD21V, "use_karras_sigmas": True, "timestep_spacing": "trailing", "rescale_betas_zero_snr": True},
    ),
    "deis_order3": (DEIS, {**SD15, "solver_order": 3}),
    "deis_order1_v": (DEIS, {**SD21V, "solver_order": 1}),
    "deis_karras_order3": (DEIS, {**SDXL, "use_karras_sigmas": True, "solver_order": 3}),
    "deis_exponential": (DEIS, {**SD15, "use_exponential_sigmas": True}),
    "deis_thresholding": (DEIS, {**SD15, "prediction_type": "sample", "thresholding": True, "sample_max_value": 1.5}),
    "deis_sde_algorithm": (DEIS, {**SD15, "algorithm_type": "sde-dpmsolver++"}),
    "unipc_order3_bh1_sigma_min": (
        UNIPC,
        {**SD15, "solver_order": 3, "solver_type": "bh1", "final_sigmas_type": "sigma_min"},
    ),
    "unipc_order3_no_lower_order_final": (
        UNIPC,
        {**SDXL, "solver_order": 3, "lower_order_final": False, "final_sigmas_type": "sigma_min"},
    ),
    "unipc_karras_own_range": (UNIPC, {**SD15, "use_karras_sigmas": True, "sigma_min": 0.1, "sigma_max": 10.0}),
    "unipc_karras_sigma_min": (UNIPC, {**SDXL, "use_karras_sigmas": True, "final_sigmas_type": "sigma_min"}),
    "unipc_exponential_v": (UNIPC, {**SD21V, "use_exponential_sigmas": True}),
    "unipc_noise_prediction": (
        UNIPC,
        {**SD15, "predict_x0": False, "final_sigmas_type": "sigma_min", "solver_order": 3},
    ),
    "unipc_disable_corrector": (UNIPC, {**SDXL, "disable_corrector": [0, 2]}),
    "unipc_zero_snr_trailing_v": (UNIPC, {**SD21V, "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"}),
    "unipc_thresholding": (UNIPC, {**SD15, "prediction_type": "sample", "thresholding": True}),
    "multistep_dpmsolver_order3_heun_thresholding": (
        MULTISTEP,
        {
            **SD15,
            "algorithm_type": "dpmsolver",
            "final_sigmas_type": "sigma_min",
            "solver_order": 3,
            "thresholding": True,
        },
    ),
    "multistep_dpmsolver_final_zero": (MULTISTEP, {**SD15, "algorithm_type": "dpmsolver"}),
}


@pytest.mark.parametrize("strength", [1.0, 0.5])
@pytest.mark.parametrize("steps", [1, 4, 20])
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_other_settings_match_diffusers(extra, steps, strength, monkeypatch):
    cls, config = EXTRAS[extra]
    compare(Case(cls, config, steps, strength), monkeypatch)


@pytest.mark.parametrize(
    "changes",
    [
        {"solver_type": "bh1"},
        {"predict_x0": False},
        {"lower_order_final": False},
        {"solver_order": 3, "lower_order_final": False},
    ],
    ids=["bh1", "noise_prediction", "full_order", "full_order3"],
)
def test_unipc_ending_at_sigma_zero_where_diffusers_breaks_is_refused(changes, monkeypatch):
    """diffusers 0.42 divides by zero or solves a singular system on the last step there (inf, NaN or an error); ours
    raises a ConfigError instead."""
    case = Case(UNIPC, {**SD15, **changes}, 4)
    try:
        assert not np.isfinite(run_diffusers(case, monkeypatch).final).all()
    except RuntimeError:  # torch's LinAlgError
        pass
    with pytest.raises(ConfigError, match="sigma 0"):
        run_ours(case)


def test_sde_noise_injection_reaches_diffusers(monkeypatch):
    """The comparison is only as good as the shared noise: another draw must change diffusers' result."""
    case = Case(SDE, SDXL, 4)
    first = run_diffusers(case, monkeypatch).final
    other = run_diffusers(Case(SDE, SDXL, 4, seed=1), monkeypatch).final
    assert deviation(run_ours(case).final, first) <= FINAL_TOLERANCE
    assert deviation(run_ours(case).final, other) > 1e-2


def _sample_without_given_noise(name: str, config: dict, seed: int) -> np.ndarray:
    sched = make_scheduler(name, config, rng=np.random.default_rng(seed))
    sched.set_timesteps(4)
    x = np.random.default_rng(99).standard_normal((1, 4, 8, 8), dtype=np.float32) * np.float32(sched.init_noise_sigma)
    for t in sched.timesteps:
        x = sched.step(np.tanh(sched.scale_model_input(x, t)), t, x)
    return x


@pytest.mark.parametrize(
    ("name", "config"),
    [("dpmpp_sde", SD15), (SINGLESTEP, {**SD15, "algorithm_type": "sde-dpmsolver++"})],
    ids=["dpmpp_sde", "singlestep_sde"],
)
def test_stochastic_steps_draw_from_the_seeded_rng(name, config):
    """Without `noise=`, the SDE steps draw from the scheduler's rng: same seed, same latent; another seed, another."""
    once, again = (_sample_without_given_noise(name, config, 1) for _ in range(2))
    np.testing.assert_array_equal(once, again)
    assert np.abs(once - _sample_without_given_noise(name, config, 2)).max() > 1e-3


def test_easy_diffusion_names_resolve_to_sdkits_settings():
    """Each of sdkit's diffusers sampler names that maps to one of these classes is an alias with sdkit's settings;
    the variants sdkit refuses (logSNR and time-quadratic UniPC) are refused by name."""
    for name, (cls, changes) in NAMES.items():
        if name in ALIASES:
            assert ALIASES[name][0] == cls and changes.items() <= ALIASES[name][1].items(), name
    assert ALIASES["unipc_tu"][0] == UNIPC and ALIASES["unipc_tu"][1]["solver_type"] == "bh2"
    assert ALIASES["dpm"] == ALIASES["dpm_solver_stability"]
    assert ALIASES["deis"] == (DEIS, {"use_karras_sigmas": False})
    for refused in ("unipc_snr", "unipc_tq", "unipc_snr_2"):
        with pytest.raises(ConfigError):
            make_scheduler(refused, SD15)


@pytest.mark.parametrize("prediction", ["epsilon", "v_prediction"])
def test_sde_preview_is_diffusers_pred_original_sample_on_every_call(prediction, monkeypatch):
    """Scheduler.denoised (the live preview) before each step call equals the pred_original_sample diffusers' step
    returns, the midpoint call (another sigma than the timestep's) included."""
    import diffusers
    import torch

    config = {**SDXL, "use_karras_sigmas": True, "prediction_type": prediction}
    draws = iter(Case(SDE, config, 4).inputs()[2])
    module = __import__("diffusers.schedulers.scheduling_dpmsolver_sde", fromlist=["BrownianTreeNoiseSampler"])
    monkeypatch.setattr(
        module, "BrownianTreeNoiseSampler", lambda *a, **k: lambda s, s_next: torch.from_numpy(next(draws))
    )
    theirs, ours = diffusers.DPMSolverSDEScheduler.from_config(config), make_scheduler(SDE, config)
    theirs.set_timesteps(4)
    ours.set_timesteps(4)
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8), dtype=np.float32) * np.float32(ours.init_noise_sigma)
    for k, t in enumerate(ours.timesteps):
        out = np.tanh(ours.scale_model_input(x, t))
        preview = ours.denoised(out, x)
        reference = theirs.step(torch.from_numpy(out), theirs.timesteps[k], torch.from_numpy(x))
        np.testing.assert_allclose(preview, reference.pred_original_sample.numpy(), rtol=1e-5, atol=1e-5)
        ours.step(out, t, x)  # advances ours to the same state; diffusers' result goes on, so both see the same x
        x = reference.prev_sample.numpy()
