"""Several optimization profiles per TensorRT engine (backends/nvidia/profiles.py): the rule that picks their opts,
and the session's pick of one per request, checked against the fake SDK (tests/fakes), which selects profiles and
refuses shapes outside the selected one as the real TensorRT does. The real TensorRT-RTX builds such engines in
tests/backends/test_nvidia_sdk_conformance.py."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from enginefarm.backends.nvidia.activations import SharedActivations, sharing
from enginefarm.backends.nvidia.build import BuildSpec
from enginefarm.backends.nvidia.build_process import build_plan
from enginefarm.backends.nvidia.profiles import optimization_profiles
from enginefarm.backends.nvidia.sdk import capturing_logger
from enginefarm.errors import ConfigError, InputError, RecipeError
from tests.nvidia_fakes import PROFILE, open_fake_session

# An SD 1.5 UNet's default export: 256-768 px around 512, classifier-free guidance's batch of 2, one prompt chunk.
SD15 = {
    "sample": {"min": [1, 4, 32, 32], "opt": [2, 4, 64, 64], "max": [2, 4, 96, 96]},
    "timestep": {"min": [1], "opt": [2], "max": [2]},
    "encoder_hidden_states": {"min": [1, 77, 768], "opt": [2, 77, 768], "max": [2, 308, 768]},
}


def opts(profiles, name="sample"):
    return [p[name]["opt"] for p in profiles]


def test_edges_adds_the_opt_with_its_image_edges_at_the_max_and_nothing_else():
    profiles = optimization_profiles(SD15, "edges")
    assert opts(profiles) == [[2, 4, 64, 64], [2, 4, 96, 64], [2, 4, 64, 96], [2, 4, 96, 96]]  # 512², 768×512, …
    for profile in profiles:  # one min and max for all; the text and the batch stay at their opt
        assert {n: (b["min"], b["max"]) for n, b in profile.items()} == {
            n: (b["min"], b["max"]) for n, b in SD15.items()
        }
        assert profile["encoder_hidden_states"]["opt"] == [2, 77, 768] and profile["timestep"]["opt"] == [2]
    assert optimization_profiles(SD15, "opt") == [SD15]
    at_max = {**SD15, "sample": {**SD15["sample"], "opt": [2, 4, 128, 128], "max": [2, 4, 128, 128]}}
    assert len(optimization_profiles(at_max, "edges")) == 1  # SDXL at 1024: its opt is the max, one profile
    with pytest.raises(ConfigError, match=r"^opt_profiles = 'all' is not a rule") as refused:
        optimization_profiles(SD15, "all")
    assert refused.value.hint == "use one of: edges, opt"


def test_the_recipe_option_defaults_per_sdk_and_refuses_other_values(fake_nvidia, write_recipe, tiny_sd, tmp_path):
    from enginefarm.builder.recipe import load_recipe
    from tests.backends.test_tensorrt import jobs_of, recipe

    path = recipe(write_recipe, tiny_sd, targets=("tensorrt:sm_89", "tensorrt-rtx:ampere+"), precisions=("fp16",))
    assert {j.target.backend: j.options["opt_profiles"] for j in jobs_of(path, tmp_path)} == {
        "tensorrt": "edges",
        "tensorrt-rtx": "opt",  # its runtime specialises kernels to the shapes it meets
    }
    with pytest.raises(RecipeError, match=r"options.tensorrt.opt_profiles: unknown value 'all'") as refused:
        load_recipe(recipe(write_recipe, tiny_sd, options='opt_profiles = "all"'))
    assert refused.value.hint == "use one of: edges, opt"


def fake_engine(tmp_path, tiny_sd, sdk: str, profiles: list[dict], name="decoder"):
    """A fake plan of the tiny decoder with these optimization profiles, built by our build_plan."""
    trt = importlib.import_module(sdk)
    spec = BuildSpec(
        sdk=sdk,
        onnx=str(tiny_sd),
        plan=str(tmp_path / f"{name}.plan"),
        profile=profiles[0],
        extra_profiles=profiles[1:],
        precision="fp32",
        strip_weights=False,
        refittable=False,
    )
    notes = build_plan(trt, spec, capturing_logger(trt))
    assert notes["optimization_profiles"] == len(profiles)
    return trt, (tmp_path / f"{name}.plan").read_bytes()


def latent(*shape):
    return np.random.default_rng(sum(shape)).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("sdk", ["tensorrt", "tensorrt_rtx"])
def test_each_request_runs_in_the_profile_whose_opt_is_its_shape_else_the_nearest(fake_nvidia, tiny_sd, tmp_path, sdk):
    profiles = optimization_profiles(PROFILE, "edges")  # opts 16², 32×16, 16×32, 32² within 8² .. 32²
    trt, plan = fake_engine(tmp_path, tiny_sd, sdk, profiles)
    _, one = fake_engine(tmp_path, tiny_sd, sdk, profiles[:1], "single")
    session, single = open_fake_session(trt, plan), open_fake_session(trt, one)
    assert session.how.endswith("4 optimization profiles") and "profiles" not in single.how
    asked = [((1, 4, 16, 16), 0), ((1, 4, 32, 16), 1), ((1, 4, 16, 32), 2), ((2, 4, 32, 32), 3)]  # the opts
    asked += [((1, 4, 24, 24), 3), ((1, 4, 8, 8), 0), ((1, 4, 28, 12), 1), ((1, 4, 32, 32), 3), ((1, 4, 16, 16), 0)]
    fake_nvidia.clear()
    for shape, expected in asked:
        x = latent(*shape)
        out = session.run({"latent": x})["sample"]
        assert session.active_profile == expected, shape
        assert np.array_equal(out, single.run({"latent": x})["sample"])  # the profile changes no number
    runs = fake_nvidia.calls("execute_async_v3")[::2]  # every other run is the single-profile engine's
    assert [(tuple(r["shapes"]["latent"]), r["profile"]) for r in runs] == asked  # what the SDK ran, and where
    switches = [c["index"] for c in fake_nvidia.calls("set_optimization_profile_async")]
    assert switches == [1, 2, 3, 0, 1, 3, 0]  # only when the profile changes: a repeat of one shape never switches
    session.run({"latent": latent(1, 4, 16, 16)})
    assert len(fake_nvidia.calls("set_optimization_profile_async")) == len(switches)


def test_a_request_outside_every_profile_is_refused_naming_them(fake_nvidia, tiny_sd, tmp_path):
    trt, plan = fake_engine(tmp_path, tiny_sd, "tensorrt", optimization_profiles(PROFILE, "edges"))
    session = open_fake_session(trt, plan)
    with pytest.raises(InputError, match=r"^input shapes latent \[1, 4, 64, 64\] are outside every optimization") as e:
        session.run({"latent": latent(1, 4, 64, 64)})
    assert e.value.hint.count("latent [1, 4, 8, 8] .. [2, 4, 32, 32]") == 4 and "(opt [1, 4, 32, 16])" in e.value.hint
    _, one = fake_engine(tmp_path, tiny_sd, "tensorrt", [PROFILE], "single")
    with pytest.raises(InputError, match=r"^input latent shape \[3, 4, 16, 16\] is outside the plan's profile") as e:
        open_fake_session(trt, one).run({"latent": latent(3, 4, 16, 16)})  # one profile: the SDK's refusal
    assert e.value.hint == "latent [1, 4, 8, 8] .. [2, 4, 32, 32] (opt [1, 4, 16, 16])"
    assert not session._context.set_optimization_profile_async(4, 0)  # no such profile: the SDK says False


@pytest.mark.parametrize("sdk", ["tensorrt", "tensorrt_rtx"])
def test_the_shared_activation_buffer_is_the_largest_profiles(fake_nvidia, tiny_sd, tmp_path, sdk):
    small = {"latent": {"min": [1, 4, 8, 8], "opt": [1, 4, 8, 8], "max": [1, 4, 16, 16]}}
    trt, plan = fake_engine(tmp_path, tiny_sd, sdk, [small, PROFILE])
    from cuda.bindings import runtime as gpu

    pool = SharedActivations()
    with sharing(pool):
        session = open_fake_session(trt, plan)
    engine = session._engine
    per_profile = [engine.get_device_memory_size_for_profile_v2(i) for i in range(engine.num_optimization_profiles)]
    assert per_profile[0] < per_profile[1]
    assert session.device_memory().activations == max(per_profile) == pool.size
    session.run({"latent": latent(1, 4, 8, 8)})  # the small profile runs first: the buffer is still the largest's
    assert session.active_profile == 0 and pool.allocated == max(per_profile)
    session.run({"latent": latent(2, 4, 32, 32)})  # only the second holds it: run there, in the same buffer
    assert session.active_profile == 1 and pool.allocated == max(per_profile)
    assert all(c["ok"] for c in fake_nvidia.calls("set_device_memory"))
    context = session._context  # the SDK itself refuses a shape outside the selected profile, though another holds it
    assert context.set_optimization_profile_async(0, 0) and not context.set_input_shape("latent", (2, 4, 32, 32))
    session.close()
    del session, engine, context
    assert pool.allocated == 0 and gpu.USED[0] == 0  # every engine, context and buffer given back


def test_rtx_kernel_specialisation_is_eager_unless_told(monkeypatch):
    from enginefarm.backends.tensorrt_rtx import SPECIALIZATION_ENV, kernel_specialization

    monkeypatch.delenv(SPECIALIZATION_ENV, raising=False)
    assert kernel_specialization() == "eager"
    monkeypatch.setenv(SPECIALIZATION_ENV, " Lazy ")
    assert kernel_specialization() == "lazy"
    monkeypatch.setenv(SPECIALIZATION_ENV, "sometimes")
    with pytest.raises(ConfigError, match=r"^ENGINEFARM_TRT_RTX_SPECIALIZATION='sometimes'$") as refused:
        kernel_specialization()
    assert "eager, lazy, none" in refused.value.hint
