"""Text to image and image to image for the UNet families (SD 1.x, 2.x, XL and its refiner, ControlNet) and the
transformer families (SD3, SD3.5: `transformer_step.py`, `joint_text.py`), on `enginefarm.load` sessions and numpy
only: the family table says what each component takes and gives.

    pipe = Pipeline.load("my-sdxl", store="s3://…", precision="fp16")
    image = pipe("a lighthouse at dawn", steps=25, seed=7)          # float [H, W, 3] in [0, 1]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enginefarm.errors import ConfigError, SessionClosed

from . import batch, inpaint, seamless, transformer_step
from .assets import ModelAssets
from .call import Asked, Call, PreviewCallback, StepCallback, added_conditioning
from .images import to_image, to_nchw
from .joint_text import JointTextEncoder
from .loading import components, read_embeddings
from .prompts import PromptEncoder, TextConditioning, check_prompt_options, check_prompt_tokens
from .sizes import check_image_size

if TYPE_CHECKING:
    from collections.abc import Sequence

    from enginefarm.cache.progress import ProgressLike
    from enginefarm.filters.preview import PreviewDecoder
    from enginefarm.runner.request import LoraSpec

    from .budget import Residency
    from .embedding_folder import EmbeddingFolder
    from .embeddings import EmbeddingSpec
    from .live_loras import LiveLoras
    from .tiles import Tiling

log = logging.getLogger(__name__)


class Pipeline:
    """A model's components as loaded sessions, with its assets (tokenizers, scheduler config, configs)."""

    def __init__(
        self,
        name: str,
        assets: ModelAssets,
        sessions: dict,
        controlnet: str | None = None,
        load_component: Callable[[str], object] | None = None,
    ) -> None:
        self.name = name
        self._load_component = load_component  # for what only some calls need (the VAE encoder: image to image)
        self.assets = assets
        self.family = assets.family
        self.sessions = sessions
        self.controlnet = controlnet
        self.transformer = self.family.denoiser == "transformer"
        self.prompts = JointTextEncoder(assets, sessions) if self.transformer else PromptEncoder(assets, sessions)
        self.timings: dict[str, float] = {}  # stage → seconds, of the last call (and of loading)
        self.vae_tiling: Tiling | None = None  # once enable_vae_tiling() is called
        self.residency: Residency | None = None  # when loaded with a memory budget
        self.closed = False
        self.bind_steps = (
            True  # the step loop's fixed inputs bound once (diffusion/denoiser.py); False: Session.run each step
        )
        self.denoiser_batch: int | None = None  # most rows per denoiser call; None: its engine profile's max batch
        # on_preview's decoder: model-space latents [N, C, h, w] → [N, H, W, 3] in [0, 1]; None: the linear map
        self.preview_decoder: Callable[[np.ndarray], np.ndarray] | None = None
        # the final decode's replacement for the VAE (Pipeline.load(decoder=)): the same contract; None: the VAE
        self.image_decoder: Callable[[np.ndarray], np.ndarray] | None = None
        self._owned_filters: list = []  # filters Pipeline.load loaded for preview=/decoder=: closed with the pipeline
        self._load_timings: dict[str, float] = {}
        self.notes: list[str] = []  # what loading left out (LoRA layers no component takes)
        self.last_settings: dict[str, object] = {}  # the last call's steps, guidance, scheduler, size (resolved)
        self._loras: LiveLoras | None = None  # the LoRA stack (set by load; changed by set_loras)
        self.embedding_folder: EmbeddingFolder | None = None  # embeddings_dir: files loaded when a prompt names them

    @classmethod
    def load(
        cls,
        name: str,
        *,
        store: str | None = None,
        precision: str | None = None,
        target: str | None = None,
        device: str = "auto",
        controlnet: bool = False,
        assets: str | Path | None = None,
        version: str | None = None,
        weights: str | Path | None = None,
        vae: str | Path | None = None,
        loras: Sequence[LoraSpec] = (),
        embeddings: Sequence[EmbeddingSpec] = (),
        embeddings_dir: str | Path | None = None,
        progress: ProgressLike = None,
        memory_budget: int | str | None = None,
        preview: str | PreviewDecoder | None = None,
        decoder: str | PreviewDecoder | None = None,
    ) -> Pipeline:
        """Load every component of model `name` a generation needs, each through `enginefarm.load`.

        Args:
            name: The model's name in the store (the recipe's `[model] name`).
            store: A store URL or folder; default ENGINEFARM_STORE.
            precision: "fp32", "fp16" or "bf16", where the family builds it (SDXL's VAE is fp32); default the
                fastest measured for this device.
            target: A backend or target every component must run on ("openvino", "onnxruntime:cpu"); default any.
            device: "auto", "cpu", "nvidia", "intel"…
            controlnet: Also load the ControlNet and the UNet that takes its residuals (the model must be exported
                with one).
            assets: A folder to read the model's assets from (tokenizers, scheduler and component configs: the
                assets/ that `enginefarm export` writes); default `MODEL/assets` from the store, where `build`
                publishes them, fetched and verified like any artifact.
            version: The model version; default the newest.
            weights: A whole-model file as model sites ship it (an SD 1.x/2.x single-file checkpoint in the
                original layout, SDXL's in the SGM layout) or a UNet in diffusers names. Each component takes its
                part, applied to its stored artifact (`enginefarm.load(..., weights=)`); the file is checked against
                the family before anything loads.
            vae: A VAE file (diffusers AutoencoderKL or the original layout), applied the same way.
            loras: LoRA files as shipped, each a path (strength 1) or (path, strength): each component takes its own
                part (UNet, text encoders); layers no component takes are named once, in `pipe.notes` and the log.
                Changed later, without a reload, by `pipe.set_loras`.
            embeddings: Textual-inversion files, each a path or (path, word), read and checked before anything is
                loaded; no rebuild (see `enginefarm.diffusion.embeddings`).
            embeddings_dir: A folder of embedding files, each loaded when a prompt first names its stem, as Easy
                Diffusion does (`enginefarm.diffusion.embedding_folder`).
            progress: A callable receiving messages, or a `Progress`.
            memory_budget: Bytes, a size ("6G") or "auto": components load when a stage needs them and those no
                stage needs now are closed when the next would not fit (`enginefarm.diffusion.budget`), counted in
                the GPU's memory where the SDK reports it (TensorRT, TensorRT-RTX), else the host's ("auto": 90% of
                what is available there). None: all loaded up front.
            preview: A preview decoder (a TAESD-class filter: its name in the store, or a loaded
                `enginefarm.filters.preview.PreviewDecoder`) that turns on_preview's latents into full-size images.
            decoder: One that decodes the final images instead of the VAE (which is then not loaded). Each of
                `preview` and `decoder` is checked against the model's latent space (channels, and the family where
                the decoder's name tells it) before anything loads.

        Returns:
            The pipeline, its components loaded (or loaded by stage under a budget); close it (or use `with`) to
            give their memory back.

        Raises:
            UnknownModelError: The store holds no model `name` (the message names what it holds).
            WeightsError: A weights, VAE, LoRA or embedding file that does not fit the model's family or shapes.
            ConfigError: An option the model cannot take (`controlnet=True` on a model exported without one, a
                preview decoder of another latent space).
        """
        from enginefarm.runner.request import Request

        from .budget import Residency, parse_budget
        from .loading import (
            ComponentLoader,
            components,
            fetch_assets,
            open_components,
            preview_filters,
            read_embeddings,
        )

        request = Request(name, precision, device, store, target, version)  # the model's; each component's from it
        budget = parse_budget(memory_budget)
        folder = None
        if embeddings_dir is not None:
            from .embedding_folder import EmbeddingFolder

            folder = EmbeddingFolder(embeddings_dir)  # checked before anything is fetched
        if assets is None:
            assets = fetch_assets(request, progress)
        found = ModelAssets.from_folder(assets)
        read = read_embeddings(embeddings, found)  # a bad file costs nothing: nothing is fetched or loaded yet
        loader = ComponentLoader(request, found, controlnet, progress)
        loader.route_weights(weights, vae)
        ignored = loader.start_loras(loras)
        wanted = components(found, controlnet)
        if decoder is not None:  # the preview decoder makes the final images: no VAE decoder
            wanted.remove("vae_decoder")
        filters, owned = preview_filters(
            found, preview, decoder, store=store, precision=precision, target=target, device=device, progress=progress
        )
        try:
            sessions = open_components(loader, wanted) if budget is None else {}
        except BaseException:
            for one in owned:
                one.close()
            raise
        pipe = cls(name, found, sessions, controlnet="controlnet" if controlnet else None, load_component=loader)
        pipe.prompts.add_embeddings(read)
        if folder is not None:
            folder.loaded.update(e.word for e in read)  # given by name already
            pipe.embedding_folder = folder
        pipe.timings = pipe._load_timings = loader.timings
        pipe._owned_filters = owned
        if "preview" in filters:
            pipe.preview_decoder = filters["preview"].decode
        if "decoder" in filters:
            pipe.image_decoder = filters["decoder"].decode
        pipe.notes = ([ignored] if ignored else []) + loader.notes
        pipe._loras = loader.live
        if budget is not None:
            pipe.residency = Residency(budget, loader, pipe.sessions, loader.estimate, auto=memory_budget == "auto")
        return pipe

    def session(self, component: str):
        """A component's session, loaded on first use if the pipeline did not load it up front."""
        if component not in self.sessions:
            if self._load_component is None:
                raise ConfigError(f"this pipeline has no {component}", hint="load it with Pipeline.load")
            self.sessions[component] = self._load_component(component)
        return self.sessions[component]

    def set_loras(self, loras) -> None:
        """Replace the whole LoRA stack for the next call: [(file, strength), ...] as `Pipeline.load(loras=)` takes
        it; [] for none. Only what changed is redone: files read before are not read again, a strength change
        merges the weights it touches and copies them into the running sessions (no session is opened again unless
        the stack touches weights the last one did not; `enginefarm.diffusion.live_loras`). A bad file is one line
        and leaves the previous stack in use. `pipe.timings` says where the time went ("set_loras read/merge/apply")."""
        if self.closed:
            raise SessionClosed(f"{self.name}: this pipeline is closed", hint="load it again with Pipeline.load(...)")
        if self._loras is None:
            raise ConfigError("this pipeline was not made by Pipeline.load", hint="load it with Pipeline.load(...)")
        self._loras.set(loras, self.sessions)
        self.notes = [n for n in self.notes if not n.startswith("ignored,")] + (
            [self._loras.ignored] if self._loras.ignored else []
        )
        self._load_timings = {
            **self._load_timings,
            **{f"set_loras {stage}": s for stage, s in self._loras.timings.items()},
        }
        self.timings = dict(self._load_timings)

    def enable_vae_tiling(self, tile_pixels: int | None = None, overlap: float = 0.25) -> None:
        """Decode and encode images larger than a tile in overlapping tiles (diffusers' `enable_vae_tiling()`: tiles
        of the VAE config's sample_size, a quarter overlapping): the VAE's memory follows the tile, not the image, and
        sizes past the decoder's profile decode too."""
        from .tiles import Tiling

        self.vae_tiling = Tiling.from_vae(
            self.assets.configs.get("vae", {}), self.vae_scale_factor, tile_pixels, overlap
        )

    def disable_vae_tiling(self) -> None:
        """Decode and encode whole images again (the default)."""
        self.vae_tiling = None

    def _text_encoders(self) -> list[str]:
        """The text stage's components: the family's encoders this model was exported with (SD3 may lack T5)."""
        return [n for n in components(self.assets, self.controlnet is not None) if n in self.family.text_encoders]

    def _denoisers(self) -> list[str]:
        """The denoising stage's components: the UNet (and ControlNet) or the transformer."""
        names = components(self.assets, self.controlnet is not None)
        return [n for n in names[:-1] if n not in self.family.text_encoders and not n.startswith("vae")]

    def _stage(self, components) -> None:
        """Make a stage's components loaded: within the memory budget if there is one, else on first use."""
        if self.residency is not None:
            self.residency.need(tuple(components))
        for component in components:
            self.session(component)

    def close(self) -> None:
        """Close every loaded component (`Session.close`): their memory goes back now. Closing twice is harmless;
        a closed pipeline refuses to generate."""
        self.closed = True
        self._load_component = self.residency = None
        self._loras = None  # with the base values it kept
        while self.sessions:
            self.sessions.popitem()[1].close()
        while self._owned_filters:
            self._owned_filters.pop().close()
        for session in self.__dict__.pop("_seamless_sessions", {}).values():  # diffusion/seamless.py's
            session.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- one image

    @seamless.tiling_call  # tiling=: the call runs inside seamless.tiled
    def __call__(
        self,
        prompt: str,
        negative_prompt: str | None = None,
        *,
        steps: int | None = None,
        guidance_scale: float | None = None,
        width: int | None = None,
        height: int | None = None,
        seed: int = 0,
        latents: np.ndarray | None = None,
        scheduler: str | None = None,
        image: np.ndarray | None = None,
        mask_image: np.ndarray | None = None,
        strength: float | None = None,
        control_image: np.ndarray | None = None,
        controlnet_conditioning_scale: float = 1.0,
        original_size: tuple[int, int] | None = None,
        crops_coords_top_left: tuple[int, int] = (0, 0),
        target_size: tuple[int, int] | None = None,
        aesthetic_score: float = 6.0,
        negative_aesthetic_score: float = 2.5,
        output_type: str = "np",
        on_step: StepCallback | None = None,
        step_noise: list[np.ndarray] | None = None,
        max_sequence_length: int | None = None,
        num_images_per_prompt: int = 1,
        on_preview: PreviewCallback | None = None,
        tiling: str | None = None,
        prompt_syntax: str = "a1111",
        clip_skip: int | None = None,
    ) -> np.ndarray:
        """One image (or a batch) from a prompt, with the family's own denoising loop over the loaded engines.

        Image i of a batch is the image a one-image call with seed + i makes: its start noise is drawn from
        `default_rng(seed + i)` and an ancestral scheduler's fresh noise from `default_rng([seed + i, 1])`. The
        denoiser runs the batch (2N rows under classifier-free guidance) in calls of at most its engine profile's max
        batch (or `pipe.denoiser_batch`, when set lower); the VAE decodes image by image.

        Args:
            prompt: The prompt; weights in it are read as `prompt_syntax` says.
            negative_prompt: What to steer away from (classifier-free guidance); default the empty prompt.
            steps: Denoising steps; default the family's (25; Flux schnell, distilled: 4).
            guidance_scale: Classifier-free guidance (Flux dev: the guidance it was distilled with); default the
                family's (7.5 SD 1.x/2.x, 5.0 SDXL, 7.0 SD3, 3.5 SD3.5 and Flux dev, 5.0 Chroma).
            width: Image width in pixels; default the model's native size (or `image`'s).
            height: Image height in pixels; default as `width`.
            seed: Seeds the start noise and an ancestral scheduler's fresh noise (numpy's `default_rng`).
            latents: The starting noise, [1, C, H/f, W/f] unscaled (the scheduler's init sigma is applied, as
                diffusers does); for a batch [N, C, H/f, W/f], or [1, ...] for one noise for every image. Default
                drawn from `seed`. With `image`, the noise added to it.
            scheduler: A diffusers class name or alias (see `enginefarm.diffusion.ALIASES`); default the model's own.
            image: Image to image (or inpainting, with `mask_image`): float [H, W, 3] in [0, 1]. The VAE posterior's
                mean is the start (its spread is negligible for trained VAEs, and the result stays reproducible);
                used for every image of a batch.
            mask_image: Inpainting, as diffusers' StableDiffusion(XL)InpaintPipeline (`diffusion/inpaint.py`):
                float [H, W] in [0, 1] at the image's size, 1 = repaint (binarized at 0.5). An inpainting model
                (9-channel UNet) sees the mask and the masked image; any other UNet model keeps the unmasked region
                by blending the image, re-noised, back in after each step.
            strength: How far `image` is noised; default 0.8 for image to image, 1.0 for inpainting (SDXL
                families: 0.9999, diffusers' default).
            control_image: The ControlNet's condition, float [H, W, 3] in [0, 1] (a pipeline loaded with
                `controlnet=True` needs it).
            controlnet_conditioning_scale: How strongly the ControlNet's residuals steer the UNet.
            original_size: SDXL's micro-conditioning; default the output size.
            crops_coords_top_left: SDXL's micro-conditioning; default no crop.
            target_size: SDXL's micro-conditioning; default the output size.
            aesthetic_score: The SDXL refiner's conditioning.
            negative_aesthetic_score: The SDXL refiner's conditioning for the negative prompt.
            output_type: "np" for images, "latent" for the final latents.
            on_step: Called as on_step(steps done, steps in all) after each step.
            step_noise: The fresh noise of each ancestral step (default drawn from `seed`), for reproducing another
                implementation's run: one entry per denoiser call (`len(sched.timesteps)`: order-2 schedulers such
                as heun and dpm2_a call it twice per step), each used by the step call that adds noise, if it does;
                [N, C, H/f, W/f] for a batch.
            max_sequence_length: The T5 token count of the transformer families (diffusers' argument; default the
                export's: SD3 and schnell 256, Flux dev and Chroma 512), within what the engines were built for
                (`enginefarm export --text-length`).
            num_images_per_prompt: N images of the prompt in one call.
            on_preview: Called as on_preview(step, preview) after each step's model call with the image the step
                predicts (the scheduler's predicted clean latent where it gives one, else the latent itself), mapped
                to RGB by the family's linear latent-to-RGB factors (`enginefarm.diffusion.preview`): float
                [h, w, 3] in [0, 1] at the latent's resolution (H/f × W/f; `np.repeat` it f times on both axes for
                full size), [N, h, w, 3] for a batch. `pipe.preview_decoder` (a TAESD from
                `Pipeline.load(preview=)`), when set, replaces the linear map: its images are full size.
            tiling: "x", "y" or "xy": a seamless texture, as diffusers with every Conv2d of the UNet and VAE padding
                circularly in those axes (Easy Diffusion's `tiling`): the UNet families' UNet (and ControlNet) and
                VAE run as their seamless variants, made on this device from the stored artifacts at the first call
                with that setting and kept per setting (`enginefarm.diffusion.seamless`); VAE tiling is off for the
                call.
            prompt_syntax: How prompt weights are written: "a1111" (`(word:1.3)`, `(word)`, `[word]`, `\\(`;
                A1111's emphasis), "compel" (`word+`, `word--`, `(words)1.3`; as the compel package computes it) or
                "none". Prompts past 75 tokens are encoded in chunks of 77 (`enginefarm.diffusion.weighted_text`).
                SD3, Flux and Chroma read the prompt as written.
            clip_skip: diffusers' meaning (1: the layer before the one the pipeline reads), for SD 1.x, 2.x and
                SDXL.

        Returns:
            One image float [H, W, 3] in [0, 1] ("np"), or [N, H, W, 3] for N images; with "latent", the final
            latents [N, C, H/f, W/f].

        Raises:
            ConfigError: A size, step count, scheduler, mask, strength or option this model cannot take, in one
                line, before any work.
            SessionClosed: The pipeline was closed.
        """
        asked = Asked(
            prompt,
            negative_prompt,
            steps=steps,
            guidance_scale=guidance_scale,
            width=width,
            height=height,
            seed=seed,
            latents=latents,
            scheduler=scheduler,
            image=image,
            mask_image=mask_image,
            strength=strength,
            control_image=control_image,
            controlnet_conditioning_scale=controlnet_conditioning_scale,
            original_size=original_size,
            crops_coords_top_left=crops_coords_top_left,
            target_size=target_size,
            aesthetic_score=aesthetic_score,
            negative_aesthetic_score=negative_aesthetic_score,
            output_type=output_type,
            on_step=on_step,
            step_noise=step_noise,
            max_sequence_length=max_sequence_length,
            num_images_per_prompt=num_images_per_prompt,
            on_preview=on_preview,
            prompt_syntax=prompt_syntax,
            clip_skip=clip_skip,
        )
        return self._generate(asked)

    def _generate(self, asked: Asked) -> np.ndarray:
        """`pipe(...)` with its arguments as one record, through its stages."""
        self._check(asked)
        call = self._plan(asked)  # the user's mistakes surface before any work is done
        call.control = self._control(asked.control_image, call.height, call.width)
        self.last_settings = call.resolved()
        timings: dict[str, float] = {}
        text = self._encode_text(call, timings)
        x = self._start_latents(call, timings)
        self._condition(call, text)
        x = self._run_denoiser(call, x, timings)
        self.timings = {**self._load_timings, **timings}
        return x if asked.output_type == "latent" else self._decode(call, x)

    def _check(self, asked: Asked) -> None:
        """What can be refused from the arguments alone; the embedding folder's files the prompts name, loaded."""
        if self.closed:
            raise SessionClosed(f"{self.name}: this pipeline is closed", hint="load it again with Pipeline.load(...)")
        if self.embedding_folder is not None:  # the folder's files these prompts name (embedding_folder.py)
            self.embedding_folder.load_named(
                [asked.prompt, asked.negative_prompt],
                lambda items: read_embeddings(items, self.assets),
                self.prompts.add_embeddings,
            )
        if asked.output_type not in ("np", "latent"):
            raise ConfigError(f"output_type {asked.output_type!r}", hint='use "np" (an image) or "latent"')
        if asked.max_sequence_length is not None and not self.transformer:
            raise ConfigError(
                f"max_sequence_length is for the T5 encoders of SD3, Flux and Chroma; {self.family.title} reads "
                "CLIP's 77 tokens",
                hint="leave max_sequence_length out",
            )

    def _encode_text(self, call: Call, timings: dict[str, float]) -> TextConditioning:
        """The prompts' conditioning, [negative, positive] under guidance."""
        asked = call.asked
        prompts = (asked.prompt, asked.negative_prompt)
        check_prompt_options(self.family, list(prompts), asked.prompt_syntax, asked.clip_skip)
        start = time.perf_counter()
        self._stage(self._text_encoders())
        text = (
            self.prompts.encode_pair(*prompts, call.use_guidance, asked.max_sequence_length)
            if isinstance(self.prompts, JointTextEncoder)
            else self.prompts.encode_pair(*prompts, call.use_guidance, asked.prompt_syntax, asked.clip_skip)
        )
        check_prompt_tokens(self.family, self.sessions, text)
        timings["text"] = time.perf_counter() - start
        return text

    def _condition(self, call: Call, text: TextConditioning) -> None:
        """What the denoiser takes beside the latent, repeated per image: rows [negative × N, positive × N]."""
        extra = added_conditioning(self.family, call, text)
        call.extra = {name: batch.per_image(value, call.count) for name, value in extra.items()}
        call.text = batch.per_image_text(text, call.count)
        control = batch.per_image(call.control, call.count)
        call.control = np.concatenate([control, control]) if control is not None and call.use_guidance else control

    def _run_denoiser(self, call: Call, x: np.ndarray, timings: dict[str, float]) -> np.ndarray:
        """The denoising loop over the denoiser's sessions, in calls of the rows its engines take."""
        start = time.perf_counter()
        self._stage(self._denoisers())
        with batch.ChunkedDenoiser(
            self.sessions.get("transformer" if self.transformer else "unet"), self.bind_steps, self._denoiser_rows()
        ) as denoiser:
            x = self._denoise_loop(call, x, denoiser, timings)
        timings["denoise"] = time.perf_counter() - start - timings.get("preview", 0.0)
        timings["steps"] = len(call.sched.timesteps)
        return x

    def _decode(self, call: Call, x: np.ndarray) -> np.ndarray:
        """The final latents as images, image by image (diffusers' VAE slicing: the decoder's memory and profile are
        those of one image)."""
        start = time.perf_counter()
        if self.image_decoder is not None:  # a preview decoder takes the model-space latent
            images = list(self.image_decoder(x))
        else:
            scale, shift = np.float32(self.assets.vae_scaling_factor), np.float32(self.assets.vae_shift_factor)
            latent = (x / scale + shift).astype(np.float32)
            decoded = [self._vae("vae_decoder", "latent_sample", "sample", one) for one in np.split(latent, call.count)]
            images = [to_image(one) for one in decoded]
        self.timings["decode"] = time.perf_counter() - start
        return images[0] if call.count == 1 else np.stack(images)

    def _plan(self, asked: Asked) -> Call:
        """A call's settings resolved (the family's defaults, the image's size) and checked, before any work."""
        from .schedulers import make_scheduler

        steps, guidance_scale, width, height = asked.steps, asked.guidance_scale, asked.width, asked.height
        image, mask_image, strength = asked.image, asked.mask_image, asked.strength

        steps = self.family.default_steps if steps is None else steps
        if steps < 1:
            raise ConfigError(f"steps={steps}", hint="use one step or more")
        factor = self.vae_scale_factor
        height = height or (image.shape[0] if image is not None and np.ndim(image) == 3 else self.assets.native_pixels)
        width = width or (image.shape[1] if image is not None and np.ndim(image) == 3 else self.assets.native_pixels)
        multiple = factor * self.assets.latent_multiple  # patches of a transformer, a UNet's halvings
        if height % multiple or width % multiple:
            near = f"{_nearest(width, multiple)}×{_nearest(height, multiple)}"
            raise ConfigError(
                f"{width}×{height} is not a multiple of {multiple}",
                hint=f"use sizes divisible by {multiple}, e.g. {near}",
            )
        denoiser_name = "transformer" if self.transformer else "unet"
        check_image_size(
            self.sessions.get(denoiser_name),
            "hidden_states" if self.transformer else "sample",
            height,
            width,
            factor,
            self.family.title,
        )
        mask = inpaint.check_mask(self.family, image, mask_image, height, width)
        strength = inpaint.default_strength(self.family, strength, mask is not None)
        count = batch.check_count(asked.num_images_per_prompt)
        seeds = batch.seeds_for(asked.seed, count)
        sched = make_scheduler(asked.scheduler, self.assets.scheduler_config, rng=batch.noise_streams(seeds, 1))
        if self.transformer:
            transformer_step.check_scheduler(sched)
        default_guidance = self.family.guidance_scale if self.transformer else 5.0 if self.family.time_ids else 7.5
        guidance = guidance_scale if guidance_scale is not None else default_guidance
        return Call(
            asked=asked,
            height=height,
            width=width,
            steps=steps,
            count=count,
            # image i's start noise: default_rng(seed + i), a one-image call's stream
            rng=batch.noise_streams(seeds),
            sched=sched,
            guidance=guidance,
            use_guidance=guidance > 1.0 and self.family.true_cfg,  # Flux: no negative pass (dev feeds the scale)
            mask=mask,
            strength=strength,
        )

    def _start_latents(self, call: Call, timings: dict[str, float]) -> np.ndarray:
        """The scheduler's timesteps set, and the loop's first latent: noise (txt2img), the image noised to the first
        timestep (img2img), or an inpainting start."""
        image, latents = call.asked.image, call.asked.latents
        factor = self.vae_scale_factor
        shape = (call.count, self.latent_channels, call.height // factor, call.width // factor)
        noise = self._noise(latents, shape, call.rng)
        sched, strength = call.sched, call.strength if image is not None else 1.0
        patch = self.assets.patch_size  # a flow-matching schedule shifts with the image's token count
        sched.set_timesteps_for_image(
            call.steps,
            strength,
            image_seq_len=(shape[-2] // patch) * (shape[-1] // patch),
            spacing=self.family.traits.sigma_spacing,
        )
        start = time.perf_counter()
        if call.mask is not None:
            encode = lambda pixels: self._encode_image(pixels, call.height, call.width)  # noqa: E731
            call.painter = inpaint.Inpainting.prepare(
                self.family, encode, image, call.mask, factor, call.strength, noise
            )
            x = call.painter.start(sched, call.strength)
        elif image is not None:  # set_timesteps refused a strength that leaves no step
            encoded = batch.per_image(self._encode_image(image, call.height, call.width), call.count)
            x = sched.add_noise(encoded, noise, sched.timesteps[0])
        else:
            return (noise * np.float32(sched.init_noise_sigma)).astype(np.float32)
        timings["encode image"] = time.perf_counter() - start
        return x

    def _denoise_loop(self, call: Call, x: np.ndarray, denoiser, timings: dict[str, float]) -> np.ndarray:
        sched, text, control, painter = call.sched, call.text, call.control, call.painter
        assert text is not None  # set by __call__ before the loop
        total = len(sched.timesteps)
        for done, t in enumerate(sched.timesteps, 1):
            x_in = np.concatenate([x, x]) if call.use_guidance else x
            x_in = sched.scale_model_input(x_in, t).astype(np.float32)
            if painter is not None:  # an inpainting UNet's mask and masked image beside the latents
                x_in = painter.model_input(x_in)
            if self.transformer:
                predicted = denoiser(transformer_step.feeds(self.family, x_in, t, text, call.guidance))
            else:
                feeds = {
                    "sample": x_in,
                    "timestep": np.full((x_in.shape[0],), t, np.float32),
                    "encoder_hidden_states": text.hidden,
                    **call.extra,
                }
                if control is None:
                    predicted = denoiser(feeds)
                else:  # the control image is cut into chunks with the rows it conditions
                    predicted = denoiser(
                        {**feeds, "controlnet_cond": control},
                        run=lambda part: self._denoise(
                            {n: v for n, v in part.items() if n != "controlnet_cond"},
                            part["controlnet_cond"],
                            call.controlnet_scale,
                        ),
                    )
            if call.use_guidance:  # rows are [negative × N, positive × N]
                uncond, cond = np.split(predicted, 2)
                predicted = uncond + np.float32(call.guidance) * (cond - uncond)
            if call.on_preview is not None:
                started = time.perf_counter()
                call.on_preview(done, self._preview(sched, predicted, x))
                timings["preview"] = timings.get("preview", 0.0) + time.perf_counter() - started
            noise = None if call.step_noise is None else call.step_noise[done - 1]
            x = sched.step(predicted, t, x, noise).astype(np.float32)
            if painter is not None:  # any other UNet: the known region is the image, noised to the next step
                x = painter.blend(sched, x, done - 1)
            if call.on_step is not None:
                call.on_step(done, total)
        return x

    # -- pieces

    @property
    def vae_scale_factor(self) -> int:
        """Image pixels per latent pixel: 2 ** (VAE levels - 1), from the VAE's config, as diffusers computes it."""
        levels = self.assets.configs.get("vae", {}).get("block_out_channels")
        return 2 ** (len(levels) - 1) if levels else self.family.vae_scale_factor

    @property
    def latent_channels(self) -> int:
        """Channels of the VAE's latent space (the VAE config's `latent_channels`: 4 for SD 1.x/2.x/XL, 16 for SD3
        and Flux)."""
        return int(self.assets.configs.get("vae", {}).get("latent_channels", 4))

    def _noise(self, latents: np.ndarray | None, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        if latents is None:
            return rng.standard_normal(shape).astype(np.float32)
        latents = np.asarray(latents, dtype=np.float32)
        if latents.shape[0] == 1 and latents.shape[1:] == shape[1:]:
            return np.repeat(latents, shape[0], axis=0)  # one noise for every image of the batch
        if latents.shape != shape:
            raise ConfigError(
                f"latents have shape {list(latents.shape)}, this call needs {list(shape)}",
                hint="latents are [images, channels, height / f, width / f] for images of height × width",
            )
        return latents

    def _denoiser_rows(self) -> int | None:
        """The most rows one denoiser call takes: its engines' profile, or `denoiser_batch` where that is lower."""
        rows = batch.row_limit([self.sessions[name] for name in self._denoisers() if name in self.sessions])
        if self.denoiser_batch is not None:
            rows = self.denoiser_batch if rows is None else min(rows, self.denoiser_batch)
        return rows

    def _preview(self, sched, predicted: np.ndarray, x: np.ndarray) -> np.ndarray:
        """on_preview's image of this step: the predicted clean latent (else x) through the preview decoder."""
        from . import preview

        denoised = sched.denoised(predicted, x)
        latent = x if denoised is None else denoised
        if self.preview_decoder is not None:
            images = self.preview_decoder(latent)
        else:
            factors, bias = preview.latent_rgb(self.family.vae_scaling_factor, latent.shape[1])
            images = preview.linear_preview(latent, factors, bias)
        return images[0] if images.shape[0] == 1 else images

    def _control(self, control_image: np.ndarray | None, height: int, width: int) -> np.ndarray | None:
        if self.controlnet is None:
            if control_image is not None:
                raise ConfigError(
                    "control_image= needs the ControlNet", hint=f"Pipeline.load({self.name!r}, controlnet=True)"
                )
            return None
        if control_image is None:
            raise ConfigError(
                "this pipeline was loaded with a ControlNet: give control_image=",
                hint="or load it without controlnet=True",
            )
        return to_nchw(control_image, height, width, "control_image")

    def _encode_image(self, image: np.ndarray, height: int, width: int) -> np.ndarray:
        pixels = to_nchw(image, height, width, "image") * 2 - 1
        moments = self._vae("vae_encoder", "sample", "latent_parameters", pixels.astype(np.float32))
        mean = moments[:, : moments.shape[1] // 2]
        return ((mean - np.float32(self.assets.vae_shift_factor)) * np.float32(self.assets.vae_scaling_factor)).astype(
            np.float32
        )

    def _vae(self, component: str, input_name: str, output_name: str, x: np.ndarray) -> np.ndarray:
        """One VAE run, in tiles when tiling is on and `x` is larger than a tile."""
        from . import tiles

        self._stage((component,))
        session = self.session(component)
        run = lambda part: session.run({input_name: part})[output_name]  # noqa: E731
        tiling = self.vae_tiling
        tile = None if tiling is None else tiling.latent if component == "vae_decoder" else tiling.sample
        if tile is None or not tiles.needed(x.shape, tile):
            return run(x)
        bounds = session.artifact.profile.get(input_name)
        min_tile = max(bounds["min"][2:]) if bounds else 1
        assert tiling is not None  # a tile size came from it
        return (tiles.decode if component == "vae_decoder" else tiles.encode)(run, x, tiling, min_tile)

    def _denoise(self, feeds: dict[str, np.ndarray], control: np.ndarray | None, scale: float) -> np.ndarray:
        if control is None:
            return self.sessions["unet"].run(feeds)["out_sample"]
        residuals = self.sessions["controlnet"].run({**feeds, "controlnet_cond": control})
        for name, value in residuals.items():
            key = name.replace("down_block_res_sample_", "down_block_additional_residual_").replace(
                "mid_block_res_sample", "mid_block_additional_residual"
            )
            feeds[key] = (value * np.float32(scale)).astype(np.float32)
        return self.sessions["unet_controlnet"].run(feeds)["out_sample"]


def _nearest(size: int, multiple: int) -> int:
    return max(multiple, round(size / multiple) * multiple)
