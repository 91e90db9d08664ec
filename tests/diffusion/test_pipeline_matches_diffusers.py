"""enginefarm.diffusion.Pipeline against diffusers' own pipelines, family by family: the tiny random-weight model of
each family exported by `enginefarm export`, built by the real `enginefarm build` for ONNX Runtime and OpenVINO at fp32
and fp16, loaded through `enginefarm.load`, and run with the same weights, prompt, starting latent and scheduler as
diffusers. fp32: the final latent within 1e-4 of diffusers' (max abs over its range); fp16: the image within 2e-2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

PROMPT = "a lighthouse on a cliff at dawn"
NEGATIVE = "blurry"
STEPS = 4
BACKENDS = ("onnxruntime:cpu", "openvino:cpu")


def _ours(built_family, target: str, precision: str, controlnet: bool = False):
    from enginefarm.diffusion import Pipeline

    _, out, store = built_family
    return Pipeline.load(
        _model_name(out),
        store=str(store),
        precision=precision,
        target=target,
        device="cpu",
        assets=out / "assets",
        controlnet=controlnet,
    )


def _model_name(out: Path) -> str:
    import tomllib

    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def _theirs(source: Path, scheduler: str | None):
    pipe = diffusers.DiffusionPipeline.from_pretrained(source)
    pipe.set_progress_bar_config(disable=True)
    if scheduler is not None:
        from enginefarm.diffusion import ALIASES

        cls, overrides = ALIASES[scheduler]
        pipe.scheduler = getattr(diffusers, cls).from_config(pipe.scheduler.config, **overrides)
    return pipe


def _latents(pipe_ours, seed: int = 0) -> np.ndarray:
    size = pipe_ours.assets.native_pixels // pipe_ours.vae_scale_factor
    return np.random.default_rng(seed).standard_normal((1, pipe_ours.latent_channels, size, size)).astype(np.float32)


def _relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / (theirs.max() - theirs.min()))


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, scheduler",
    [
        ("sd1", None),
        ("sd1", "euler_a"),
        ("sd1", "dpm2_a"),  # order 2: two UNet calls a step, noise on every second one
        ("sd2-v", None),
        ("sdxl", None),
        ("sdxl", "dpmpp_2m_karras"),
    ],
)
@pytest.mark.parametrize("target", BACKENDS)
def test_text_to_image_matches_diffusers(built, family, scheduler, target):
    source, _, _ = built(family)
    theirs = _theirs(source, scheduler)
    for precision in ("fp32", "fp16"):
        ours = _ours(built(family), target, precision)
        latents = _latents(ours)
        size = ours.assets.native_pixels
        noise = _ancestral_noise(scheduler, latents)
        with _injected_noise(theirs, noise):
            kwargs = dict(
                num_inference_steps=STEPS,
                latents=torch.from_numpy(latents),
                height=size,
                width=size,
                guidance_scale=6.0,
            )
            reference = theirs(
                PROMPT, negative_prompt=NEGATIVE, output_type="latent" if precision == "fp32" else "np", **kwargs
            ).images
        got = ours(
            PROMPT,
            NEGATIVE,
            steps=STEPS,
            latents=latents,
            guidance_scale=6.0,
            scheduler=scheduler,
            output_type="latent" if precision == "fp32" else "np",
            step_noise=noise,
        )
        reference = np.asarray(reference.numpy() if hasattr(reference, "numpy") else reference)[
            0 if precision == "fp16" else slice(None)
        ]
        if precision == "fp32":
            assert _relative(got, reference) < 1e-4, (family, scheduler, target)
        else:
            assert got.shape == reference.shape and np.abs(got - reference).max() < 2e-2, (family, scheduler, target)


def _ancestral_noise(scheduler: str | None, latents: np.ndarray) -> list[np.ndarray] | None:
    """The fresh noise of each UNet call, given to both pipelines (diffusers draws it from torch's generator)."""
    if scheduler not in ("euler_a", "dpm2_a"):
        return None
    rng = np.random.default_rng(11)
    return [rng.standard_normal(latents.shape).astype(np.float32) for _ in range(2 * STEPS)]  # order 2: 2 calls/step


class _injected_noise:
    """Makes diffusers' scheduler draw noise[k] during its k-th step call, as ours is given step_noise[k]."""

    def __init__(self, pipe, noise):
        self.pipe, self.noise = pipe, noise

    def __enter__(self):
        if self.noise is None:
            return self
        import sys

        sched = self.pipe.scheduler
        calls: list[None] = []
        step = sched.step

        def counted_step(*args, **kwargs):
            calls.append(None)
            return step(*args, **kwargs)

        self.module = sys.modules[type(sched).__module__]
        self.original = getattr(self.module, "randn_tensor", None)  # deterministic schedulers' modules have none
        sched.step = counted_step
        self.module.randn_tensor = lambda *a, **k: torch.from_numpy(self.noise[len(calls) - 1])
        return self

    def __exit__(self, *exc):
        if self.noise is not None:
            if self.original is None:
                del self.module.randn_tensor
            else:
                self.module.randn_tensor = self.original
            del self.pipe.scheduler.step  # the instance's wrapper: the class's step again


@pytest.mark.slow
@pytest.mark.parametrize("family", ["sd1", "sdxl-refiner"])
def test_image_to_image_matches_diffusers(built, family, monkeypatch):
    source, _, _ = built(family)
    ours = _ours(built(family), "onnxruntime:cpu", "fp32")
    size = ours.assets.native_pixels
    image = np.random.default_rng(3).uniform(0, 1, (size, size, 3)).astype(np.float32)
    noise = _latents(ours, seed=5)
    theirs = diffusers.AutoPipelineForImage2Image.from_pretrained(source)
    theirs.set_progress_bar_config(disable=True)
    module = __import__(type(theirs).__module__, fromlist=["retrieve_latents"])
    # diffusers samples the VAE posterior and the noise from torch's generator; ours takes the posterior's mean and
    # the noise given, so diffusers is given the same two.
    monkeypatch.setattr(
        module, "retrieve_latents", lambda output, generator=None, sample_mode="sample": output.latent_dist.mode()
    )
    monkeypatch.setattr(module, "randn_tensor", lambda *a, **k: torch.from_numpy(noise))
    reference = theirs(
        PROMPT, image=image[None], strength=0.5, num_inference_steps=STEPS, output_type="latent", guidance_scale=6.0
    ).images.numpy()
    got = ours(PROMPT, image=image, strength=0.5, steps=STEPS, latents=noise, guidance_scale=6.0, output_type="latent")
    assert _relative(got, reference) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("base", ["sd1", "sdxl"])
def test_controlnet_matches_diffusers(built, tiny_controlnet, base):
    source, _, _ = built(f"controlnet-{base}")
    ours = _ours(built(f"controlnet-{base}"), "onnxruntime:cpu", "fp32", controlnet=True)
    size = ours.assets.native_pixels
    control = np.random.default_rng(4).uniform(0, 1, (size, size, 3)).astype(np.float32)
    latents = _latents(ours)
    cls = (
        diffusers.StableDiffusionXLControlNetPipeline if base == "sdxl" else diffusers.StableDiffusionControlNetPipeline
    )
    # SDXL's is built from diffusers' ControlNet pipeline folder, SD 1.x's from its base beside a ControlNet folder
    folder = source / "controlnet" if (source / "controlnet").is_dir() else tiny_controlnet(base)
    theirs = cls.from_pretrained(source, controlnet=diffusers.ControlNetModel.from_pretrained(folder))
    theirs.set_progress_bar_config(disable=True)
    reference = theirs(
        PROMPT,
        image=control[None],
        num_inference_steps=STEPS,
        latents=torch.from_numpy(latents),
        output_type="latent",
        height=size,
        width=size,
        controlnet_conditioning_scale=0.7,
    ).images.numpy()
    got = ours(
        PROMPT,
        steps=STEPS,
        latents=latents,
        control_image=control,
        controlnet_conditioning_scale=0.7,
        output_type="latent",
    )
    assert _relative(got, reference) < 1e-4
