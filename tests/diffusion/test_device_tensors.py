"""Tensors that stay on the device between calls (`Session.bind`, `enginefarm.runner.binding`,
`enginefarm.hardware.tensors`): on the tiny SD 1.x built by the real CLI, for ONNX Runtime and OpenVINO, a bound run,
a kept output fed back as the next input, and a whole pipeline whose step loop binds its text states are bit for bit
what `Session.run` gives."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest

from enginefarm.errors import SessionClosed

pytest.importorskip("diffusers")

BACKENDS = ("onnxruntime:cpu", "openvino:cpu")


def _name(out) -> str:
    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def _unet_feeds(rng: np.random.Generator, hidden_width: int) -> tuple[dict, dict]:
    fixed = {"encoder_hidden_states": rng.standard_normal((2, 77, hidden_width)).astype(np.float32)}
    step = {
        "sample": rng.standard_normal((2, 4, 8, 8)).astype(np.float32),
        "timestep": np.array([500.0, 500.0], np.float32),
    }
    return fixed, step


@pytest.mark.parametrize("target", BACKENDS)
def test_bound_runs_and_kept_outputs_are_bit_identical_to_run(built, target):
    import enginefarm
    from enginefarm.errors import InputError
    from enginefarm.hardware.tensors import DeviceTensor

    _, out, store = built("sd1")
    with enginefarm.load(f"{_name(out)}/unet", store=str(store), precision="fp32", target=target, device="cpu") as unet:
        width = unet.artifact.profile["encoder_hidden_states"]["min"][2]
        fixed, step = _unet_feeds(np.random.default_rng(0), width)
        first = unet.run({**fixed, **step})["out_sample"]
        second = unet.run({**fixed, **step, "sample": first})["out_sample"]
        with unet.bind(fixed) as binding:
            assert binding.kind == "device"  # both backends keep tensors where they computed them
            kept = binding.run(step, keep=("out_sample",))["out_sample"]
            assert isinstance(kept, DeviceTensor) and kept.shape == first.shape
            again = binding.run({**step, "sample": kept})["out_sample"]  # the kept output, as the next input
            assert np.array_equal(kept.numpy(), first)  # the next run did not overwrite what was kept
            assert np.array_equal(again, second)
            fresh = np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)
            assert np.array_equal(
                binding.run({**step, "sample": fresh})["out_sample"],
                unet.run({**fixed, **step, "sample": fresh})["out_sample"],
            )
            with pytest.raises(InputError, match="already bound"):
                binding.run({**step, **fixed})
            with pytest.raises(InputError, match="names no output"):
                binding.run(step, keep=("latent",))
            with pytest.raises(InputError, match="outside the artifact's profile"):
                binding.run({**step, "sample": np.zeros((2, 4, 64, 64), np.float32)})
        leftover = unet.bind(fixed)
    with pytest.raises(SessionClosed):  # closing the session closed its binding too
        leftover.run(step)


@pytest.mark.parametrize("target", BACKENDS)
def test_the_bound_step_loop_gives_the_same_image_as_run(built, target):
    from enginefarm.diffusion import Pipeline

    _, out, store = built("sd1")
    with Pipeline.load(
        _name(out), store=str(store), precision="fp32", target=target, device="cpu", assets=out / "assets"
    ) as pipe:
        bound = pipe("a lighthouse", steps=3, seed=5)
        pipe.bind_steps = False
        plain = pipe("a lighthouse", steps=3, seed=5)
    assert np.array_equal(bound, plain)


def test_a_backend_without_bindings_runs_through_numpy(built):
    """The fallback (`HostBinding`) for a backend session without `bind`: same results, tensors kept as numpy."""
    import enginefarm

    _, out, store = built("sd1")
    with enginefarm.load(
        f"{_name(out)}/unet", store=str(store), precision="fp32", target="onnxruntime:cpu", device="cpu"
    ) as unet:
        width = unet.artifact.profile["encoder_hidden_states"]["min"][2]
        fixed, step = _unet_feeds(np.random.default_rng(2), width)
        inner = unet._session
        unet._session = type(
            "NoBind",
            (),
            {
                "run": inner.run,
                "output_names": inner.output_names,
                "input_names": inner.input_names,
                "close": inner.close,
            },
        )()
        with unet.bind(fixed) as binding:
            assert binding.kind == "host"
            kept = binding.run(step, keep=("out_sample",))["out_sample"]
            again = binding.run({**step, "sample": kept})["out_sample"]
        assert np.array_equal(kept.numpy(), inner.run({**fixed, **step})["out_sample"])
        assert np.array_equal(again, inner.run({**fixed, **step, "sample": kept.numpy()})["out_sample"])
