"""Text to image and image to image for the UNet families (SD 1.x, 2.x, XL and its refiner, ControlNet), on
`enginefarm.load` sessions and numpy only: the family table says what each component takes and gives.

    pipe = Pipeline.load("my-sdxl", store="s3://…", precision="fp16")
    image = pipe("a lighthouse at dawn", steps=25, seed=7)          # float [H, W, 3] in [0, 1]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from enginefarm.errors import ConfigError

from .assets import ModelAssets
from .images import to_image, to_nchw
from .prompts import PromptEncoder, TextConditioning

StepCallback = Callable[[int, int], None]  # (steps done, steps in all)


class Pipeline:
    """A model's components as loaded sessions, with its assets (tokenizers, scheduler config, configs)."""

    def __init__(self, name: str, assets: ModelAssets, sessions: dict, controlnet: str | None = None,
                 load_component: Callable[[str], object] | None = None) -> None:
        self.name = name
        self._load_component = load_component  # for what only some calls need (the VAE encoder: image to image)
        self.assets = assets
        self.family = assets.family
        self.sessions = sessions
        self.controlnet = controlnet
        self.prompts = PromptEncoder(assets, sessions)
        self.timings: dict[str, float] = {}  # stage → seconds, of the last call (and of loading)
        self._load_timings: dict[str, float] = {}

    @classmethod
    def load(cls, name: str, *, store: str | None = None, precision: str | None = None, target: str | None = None,
             device: str = "auto", controlnet: bool = False, assets: str | Path | None = None, version: str | None = None,
             progress=None, embeddings=()) -> "Pipeline":
        """Load every component of model `name` a generation needs through `enginefarm.load`.

        assets: a folder to read the model's assets from (tokenizers, scheduler and component configs: the assets/
        that `enginefarm export` writes); default: `MODEL/assets` from the store, where `build` publishes them, fetched
        and verified like any artifact. version: the model version (default the newest). controlnet: also load the ControlNet and the UNet that takes its residuals
        (the model must be exported with one). precision applies where the family builds it (SDXL's VAE is fp32).
        embeddings: textual-inversion files (FILE, or (FILE, WORD)), read and checked before anything is loaded; no
        rebuild (see `enginefarm.diffusion.embeddings`)."""
        import enginefarm

        if assets is None:
            assets = _fetch_assets(name, store, device, version, progress)
        found = ModelAssets.from_folder(assets)
        family = found.family
        read = _read_embeddings(embeddings, found)  # a bad file costs nothing: nothing is fetched or loaded yet
        timings: dict[str, float] = {}

        def load_component(component: str):
            spec = family.component(component)
            chosen = precision if precision is None or spec.precisions is None or precision in spec.precisions else spec.precisions[0]
            start = time.perf_counter()
            session = enginefarm.load(f"{name}/{component}", precision=chosen, device=device, store=store, target=target, progress=progress,
                                      version=version)
            timings[f"load {component}"] = time.perf_counter() - start
            return session

        sessions = {component: load_component(component) for component in _components(family, controlnet)}
        pipe = cls(name, found, sessions, controlnet="controlnet" if controlnet else None, load_component=load_component)
        pipe.prompts.add_embeddings(read)
        pipe.timings = pipe._load_timings = timings
        return pipe

    def session(self, component: str):
        """A component's session, loaded on first use if the pipeline did not load it up front."""
        if component not in self.sessions:
            if self._load_component is None:
                raise ConfigError(f"this pipeline has no {component}", hint="load it with Pipeline.load")
            self.sessions[component] = self._load_component(component)
        return self.sessions[component]

    # -- one image

    def __call__(self, prompt: str, negative_prompt: str | None = None, *, steps: int = 25, guidance_scale: float | None = None,
                 width: int | None = None, height: int | None = None, seed: int = 0, latents: np.ndarray | None = None,
                 scheduler: str | None = None, image: np.ndarray | None = None, strength: float = 0.8,
                 control_image: np.ndarray | None = None, controlnet_conditioning_scale: float = 1.0,
                 original_size: tuple[int, int] | None = None, crops_coords_top_left: tuple[int, int] = (0, 0),
                 target_size: tuple[int, int] | None = None, aesthetic_score: float = 6.0, negative_aesthetic_score: float = 2.5,
                 output_type: str = "np", on_step: StepCallback | None = None, step_noise: list[np.ndarray] | None = None) -> np.ndarray:
        """One image: float [H, W, 3] in [0, 1] (output_type "np") or the final latent [1, C, H/f, W/f] ("latent").

        latents: the starting noise, [1, C, H/f, W/f] unscaled (the scheduler's init sigma is applied, as diffusers
        does); default drawn from `seed`. image + strength: image to image (the VAE posterior's mean is the start:
        its spread is negligible for trained VAEs, and the result stays reproducible); `latents` is then the noise
        added to it. scheduler: a diffusers class name or alias (see `enginefarm.diffusion.ALIASES`); default the
        model's own. original_size, crops_coords_top_left, target_size: SDXL's micro-conditioning (default: the
        output size, no crop); aesthetic scores: the refiner's. step_noise: the fresh noise of each ancestral step
        (default drawn from `seed`), for reproducing another implementation's run."""
        from .schedulers import make_scheduler

        if output_type not in ("np", "latent"):
            raise ConfigError(f"output_type {output_type!r}", hint='use "np" (an image) or "latent"')
        if steps < 1:
            raise ConfigError(f"steps={steps}", hint="use one step or more")
        timings: dict[str, float] = {}
        factor = self.vae_scale_factor
        height = height or (image.shape[0] if image is not None and np.ndim(image) == 3 else self.assets.native_pixels)
        width = width or (image.shape[1] if image is not None and np.ndim(image) == 3 else self.assets.native_pixels)
        if height % factor or width % factor:
            raise ConfigError(f"{width}×{height} is not a multiple of {factor}", hint=f"use sizes divisible by {factor}")
        control = self._control(control_image, height, width)  # the user's mistakes surface before any work is done
        rng = np.random.default_rng(seed)
        sched = make_scheduler(scheduler, self.assets.scheduler_config, rng=np.random.default_rng([seed, 1]))
        guidance = (guidance_scale if guidance_scale is not None else 5.0 if self.family.time_ids else 7.5)
        use_guidance = guidance > 1.0

        start = time.perf_counter()
        text = self.prompts.encode_pair(prompt, negative_prompt, use_guidance)
        timings["text"] = time.perf_counter() - start

        shape = (1, self.latent_channels, height // factor, width // factor)
        noise = self._noise(latents, shape, rng)
        sched.set_timesteps(steps, strength if image is not None else 1.0)
        if image is not None:  # set_timesteps refused a strength that leaves no step
            start = time.perf_counter()
            x = sched.add_noise(self._encode_image(image, height, width), noise, sched.timesteps[0])
            timings["encode image"] = time.perf_counter() - start
        else:
            x = (noise * np.float32(sched.init_noise_sigma)).astype(np.float32)

        extra = self._added_conditioning(height, width, original_size, crops_coords_top_left, target_size, aesthetic_score,
                                         negative_aesthetic_score, text, use_guidance)
        if control is not None and use_guidance:
            control = np.concatenate([control, control])

        start = time.perf_counter()
        total = len(sched.timesteps)
        for done, t in enumerate(sched.timesteps, 1):
            x_in = np.concatenate([x, x]) if use_guidance else x
            x_in = sched.scale_model_input(x_in, t).astype(np.float32)
            feeds = {"sample": x_in, "timestep": np.full((x_in.shape[0],), t, np.float32), "encoder_hidden_states": text.hidden, **extra}
            predicted = self._denoise(feeds, control, controlnet_conditioning_scale)
            if use_guidance:
                uncond, cond = predicted[:1], predicted[1:]
                predicted = uncond + np.float32(guidance) * (cond - uncond)
            x = sched.step(predicted, t, x, None if step_noise is None else step_noise[done - 1]).astype(np.float32)
            if on_step is not None:
                on_step(done, total)
        timings["denoise"] = time.perf_counter() - start
        timings["steps"] = total
        self.timings = {**self._load_timings, **timings}
        if output_type == "latent":
            return x
        start = time.perf_counter()
        latent = (x / np.float32(self.assets.vae_scaling_factor) + np.float32(self.assets.vae_shift_factor)).astype(np.float32)
        decoded = self.sessions["vae_decoder"].run({"latent_sample": latent})["sample"]
        self.timings["decode"] = time.perf_counter() - start
        return to_image(decoded)

    # -- pieces

    @property
    def vae_scale_factor(self) -> int:
        """Image pixels per latent pixel: 2 ** (VAE levels - 1), from the VAE's config, as diffusers computes it."""
        levels = self.assets.configs.get("vae", {}).get("block_out_channels")
        return 2 ** (len(levels) - 1) if levels else self.family.vae_scale_factor

    @property
    def latent_channels(self) -> int:
        return int(self.assets.configs.get("vae", {}).get("latent_channels", 4))

    def _noise(self, latents: np.ndarray | None, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if latents is None:
            return rng.standard_normal(shape).astype(np.float32)
        latents = np.asarray(latents, dtype=np.float32)
        if latents.shape != shape:
            raise ConfigError(f"latents have shape {list(latents.shape)}, this image needs {list(shape)}",
                              hint="latents are [1, channels, height / f, width / f] for an image of height × width")
        return latents

    def _control(self, control_image: np.ndarray | None, height: int, width: int) -> np.ndarray | None:
        if self.controlnet is None:
            if control_image is not None:
                raise ConfigError("control_image= needs the ControlNet", hint=f"Pipeline.load({self.name!r}, controlnet=True)")
            return None
        if control_image is None:
            raise ConfigError("this pipeline was loaded with a ControlNet: give control_image=", hint="or load it without controlnet=True")
        return to_nchw(control_image, height, width, "control_image")

    def _encode_image(self, image: np.ndarray, height: int, width: int) -> np.ndarray:
        pixels = to_nchw(image, height, width, "image") * 2 - 1
        moments = self.session("vae_encoder").run({"sample": pixels.astype(np.float32)})["latent_parameters"]
        mean = moments[:, : moments.shape[1] // 2]
        return ((mean - np.float32(self.assets.vae_shift_factor)) * np.float32(self.assets.vae_scaling_factor)).astype(np.float32)

    def _added_conditioning(self, height, width, original_size, crops, target_size, aesthetic, negative_aesthetic,
                            text: TextConditioning, use_guidance: bool) -> dict[str, np.ndarray]:
        """SDXL's pooled text and micro-conditioning time ids ([negative, positive] under guidance)."""
        if not self.family.time_ids:
            return {}
        original = tuple(original_size or (height, width))
        if self.family.aesthetic_score:
            ids = [[*original, *crops, negative_aesthetic], [*original, *crops, aesthetic]]
        else:
            ids = [[*original, *crops, *(target_size or (height, width))]] * 2
        time_ids = np.array(ids if use_guidance else ids[1:], np.float32)
        return {"text_embeds": text.pooled.astype(np.float32), "time_ids": time_ids}

    def _denoise(self, feeds: dict[str, np.ndarray], control: np.ndarray | None, scale: float) -> np.ndarray:
        if control is None:
            return self.sessions["unet"].run(feeds)["out_sample"]
        residuals = self.sessions["controlnet"].run({**feeds, "controlnet_cond": control})
        for name, value in residuals.items():
            key = name.replace("down_block_res_sample_", "down_block_additional_residual_").replace("mid_block_res_sample", "mid_block_additional_residual")
            feeds[key] = (value * np.float32(scale)).astype(np.float32)
        return self.sessions["unet_controlnet"].run(feeds)["out_sample"]


def _read_embeddings(embeddings, assets: ModelAssets) -> list:
    from .embeddings import read_embedding

    if isinstance(embeddings, (str, Path)):  # iterating it would read each character as a file
        raise ConfigError(f"embeddings={str(embeddings)!r} is one path, not a list", hint=f'embeddings=["{embeddings}"]')
    return [read_embedding(item, assets.text_widths) for item in embeddings or ()]


def _fetch_assets(name: str, store: str | None, device: str, version: str | None, progress) -> Path:
    from enginefarm.errors import ArtifactNotFoundError
    from enginefarm.runner.load import fetch

    try:
        _, folder, _ = fetch(f"{name}/assets", device=device, store=store, progress=progress, version=version)
    except ArtifactNotFoundError as exc:
        raise ConfigError(f"{name} has no assets in the store ({exc})",
                          hint="build its recipe with `[model] assets = \"assets\"` (what `enginefarm export` writes), or pass assets=FOLDER") from None
    return folder


def _components(family, controlnet: bool) -> list[str]:
    names = list(family.text_encoders)
    if controlnet:
        if not family.is_controlnet:
            raise ConfigError(f"{family.title} has no ControlNet in this model", hint="export the model with a ControlNet (`enginefarm export … --controlnet DIR`)")
        names += ["controlnet", "unet_controlnet"]
    else:
        names.append("unet")
    return names + ["vae_decoder"]  # the VAE encoder loads at the first image-to-image call
