"""make_scheduler's names and fallbacks, the loop's guard rails, the noise source, and the import-light promise."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from enginefarm.diffusion import ALIASES, SCHEDULERS, make_scheduler
from enginefarm.errors import ConfigError
from tests.diffusion.sampling import LCM, SD15, SD21V, SDXL, SHAPE, fake_model


def test_importing_diffusion_loads_no_torch_and_no_tokenizers():
    code = (
        "import sys, json, enginefarm.diffusion, enginefarm.diffusion.tokenizer; "
        "print(json.dumps(sorted(m for m in ('torch', 'diffusers', 'transformers', 'tokenizers') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_the_import_check_would_see_torch():
    code = "import sys, enginefarm.diffusion, torch; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "True"
    )


@pytest.mark.parametrize("name", [*SCHEDULERS, *ALIASES, "EULER_A", "DPMPP_2M_Karras"])
def test_every_name_and_alias_builds(name):
    sched = make_scheduler(name, SDXL)
    cls = ALIASES[name.lower()][0] if name.lower() in ALIASES else name
    assert type(sched).__name__ == cls == sched.name


def test_none_means_the_models_own_scheduler():
    assert make_scheduler(None, SDXL).name == "EulerDiscreteScheduler"
    assert make_scheduler(None, SD21V).name == "DDIMScheduler"
    assert make_scheduler(None, SD15).name == "PNDMScheduler"
    assert make_scheduler(None, LCM).name == "LCMScheduler"


@pytest.mark.parametrize("own", ["CMStochasticIterativeScheduler", None])
def test_a_class_we_do_not_implement_falls_back_to_ddim_with_the_models_settings(own):
    config = {**SD21V, "_class_name": own}
    sched = make_scheduler(None, config)
    assert sched.name == "DDIMScheduler"
    assert sched.config.prediction_type == "v_prediction" and sched.config.steps_offset == 1


def test_an_unknown_name_is_a_config_error_listing_the_names():
    with pytest.raises(ConfigError) as caught:
        make_scheduler("dpm_fast", SDXL)  # k-diffusion's, which diffusers (and sdkit with it) lacks
    assert "dpm_fast" in str(caught.value)
    for name in [*SCHEDULERS, *ALIASES]:
        assert name in caught.value.hint


def test_aliases_pin_the_sampler_whatever_the_config_says():
    karras_config = {**SDXL, "_class_name": "DPMSolverMultistepScheduler", "use_karras_sigmas": True, "solver_order": 3}
    plain_config = {**SDXL, "_class_name": "DPMSolverMultistepScheduler", "use_karras_sigmas": False, "solver_order": 3}
    assert make_scheduler("dpmpp_2m", plain_config).config.use_karras_sigmas is True  # Easy Diffusion's dpmpp_2m
    assert make_scheduler("dpmpp_2m", karras_config).config.solver_order == 2
    assert make_scheduler("dpmpp_2m_karras", SDXL).config.use_karras_sigmas is True
    assert make_scheduler("DPMSolverMultistepScheduler", karras_config).config.solver_order == 3
    plain, karras = make_scheduler("DPMSolverMultistepScheduler", SDXL), make_scheduler("dpmpp_2m", SDXL)
    plain.set_timesteps(20)
    karras.set_timesteps(20)
    assert not np.array_equal(plain.timesteps, karras.timesteps)


def test_one_class_config_builds_another_with_the_other_class_defaults():
    """SD 1.5's PNDM config has no timestep_spacing: DDIM's default is "leading", Euler's "linspace"."""
    ddim, euler = make_scheduler("ddim", SD15), make_scheduler("euler", SD15)
    assert ddim.config.timestep_spacing == "leading" and euler.config.timestep_spacing == "linspace"
    assert ddim.config.set_alpha_to_one is False  # from the config, over DDIM's default
    assert make_scheduler("ddim", {}).config.clip_sample is True  # DDIM's own default
    assert make_scheduler("lcm", {}).config.beta_schedule == "scaled_linear"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"beta_schedule": "quadratic"}, "beta_schedule"),
        ({"prediction_type": "flow"}, "prediction_type"),
        ({"timestep_spacing": "even"}, "timestep_spacing"),
        ({"num_train_timesteps": "many"}, "num_train_timesteps"),
        ({"clip_sample": "yes"}, "clip_sample"),
    ],
)
def test_bad_config_values_are_config_errors_naming_the_key(change, key):
    with pytest.raises(ConfigError, match=key):
        make_scheduler("ddim", {**SD15, **change})


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("euler", {"interpolation_type": "log_linear"}),
        ("euler", {"use_beta_sigmas": True}),
        ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver"}),
        ("dpmpp_2m", {"use_lu_lambdas": True}),
        ("euler_a", {"prediction_type": "sample"}),
    ],
)
def test_settings_we_do_not_implement_are_refused_not_ignored(name, change):
    with pytest.raises(ConfigError):
        make_scheduler(name, {**SDXL, **change})


@pytest.mark.parametrize(
    ("steps", "strength"), [(0, 1.0), (-3, 1.0), (2.5, 1.0), (1001, 1.0), (20, 0.0), (20, 1.5), (2, 0.2)]
)
def test_impossible_step_counts_and_strengths_are_config_errors(steps, strength):
    with pytest.raises(ConfigError):
        make_scheduler("euler", SDXL).set_timesteps(steps, strength)


def test_steps_must_follow_the_schedule():
    sched = make_scheduler("ddim", SD15)
    x = np.zeros(SHAPE, np.float32)
    with pytest.raises(RuntimeError):
        sched.step(x, 999, x)
    sched.set_timesteps(4)
    with pytest.raises(ValueError, match="expects timestep"):
        sched.step(x, sched.timesteps[1], x)
    for t in sched.timesteps:
        x = sched.step(fake_model(x, t), t, x)
    with pytest.raises(RuntimeError, match="set_timesteps again"):
        sched.step(x, sched.timesteps[-1], x)
    sched.set_timesteps(4)  # starts over
    sched.step(x, sched.timesteps[0], x)


def _sample(name, rng=None, noises=None):
    sched = make_scheduler(name, SDXL, rng=rng)
    sched.set_timesteps(6)
    x = np.random.default_rng(7).standard_normal(SHAPE, dtype=np.float32) * np.float32(sched.init_noise_sigma)
    for k, t in enumerate(sched.timesteps):
        x = sched.step(fake_model(sched.scale_model_input(x, t), t), t, x, noise=None if noises is None else noises[k])
    return x


@pytest.mark.parametrize("name", ["euler_a", "lcm", "ddpm"])
def test_fresh_noise_comes_from_the_seeded_generator(name):
    same = [_sample(name, np.random.default_rng(3)) for _ in range(2)]
    np.testing.assert_array_equal(same[0], same[1])
    assert not np.allclose(same[0], _sample(name, np.random.default_rng(4)))
    # passing the generator's draws explicitly gives the same result: one draw per step, the latent's shape
    draws = np.random.default_rng(3)
    explicit = [draws.standard_normal(SHAPE, dtype=np.float32) for _ in range(6)]
    np.testing.assert_array_equal(_sample(name, noises=explicit), same[0])


@pytest.mark.parametrize("name", ["ddim", "euler", "dpmpp_2m", "pndm", "heun", "dpm2", "lms"])
def test_deterministic_schedulers_ignore_the_generator(name):
    np.testing.assert_array_equal(_sample(name, np.random.default_rng(1)), _sample(name, np.random.default_rng(2)))


def test_injected_noise_of_the_wrong_shape_is_refused():
    sched = make_scheduler("euler_a", SDXL)
    sched.set_timesteps(2)
    x = np.zeros(SHAPE, np.float32)
    with pytest.raises(ValueError, match="shape"):
        sched.step(x, sched.timesteps[0], x, noise=np.zeros((1, 4, 4, 4), np.float32))


def test_flux_style_configs_need_mu():
    flux = {"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True, "shift": 3.0}
    with pytest.raises(ConfigError, match="mu"):
        make_scheduler(None, flux).set_timesteps(4)
