"""How `Pipeline.load` gets a model's components: its assets, the user's files checked before anything loads, and
each component's session through `enginefarm.load` (with the precision the family builds, the user's weights, the
LoRA stack's live weights, a seamless variant) when a stage needs it."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginefarm.errors import ConfigError

from .assets import ModelAssets
from .live_loras import LiveLoras

if TYPE_CHECKING:
    from enginefarm.runner.request import Request

log = logging.getLogger(__name__)


class ComponentLoader:
    """One model's components as `enginefarm.load` serves them, with the settings `Pipeline.load` was given; loads
    on demand (`__call__`), so a memory budget can close and reload them. Its TensorRT engines share one activation
    buffer (`activations`; they run a stage at a time), as TensorRT's demo/Diffusion does."""

    def __init__(self, request: Request, found: ModelAssets, controlnet: bool, progress=None) -> None:
        self.request = request  # the model's: each component is asked as `request.component(name, ...)`
        self.found, self.controlnet, self.progress = found, controlnet, progress
        self.files: dict = {}  # component → the user's weights file for it
        self.timings: dict[str, float] = {}
        self.live: LiveLoras | None = None
        self.notes: list[str] = []  # what the user's files leave to the stored weights (pipe.notes)
        from enginefarm.backends.nvidia.activations import SharedActivations

        self.activations = SharedActivations()

    def route_weights(self, weights, vae) -> None:
        """The user's whole-model or UNet file and VAE file, each component's part, checked against the family."""
        if weights is not None or vae is not None:
            from enginefarm.weights.routing import route

            family = self.found.family
            self.files = route(family, list(family.component_names), weights, vae)
            denoiser = "transformer" if "transformer" in family.component_names else "unet"
            if weights is not None and denoiser in family.component_names and denoiser not in self.files:
                self.notes.append(f"weights={weights}: it holds no {denoiser} part; the model's own {denoiser} runs")
                log.warning("%s", self.notes[-1])

    def start_loras(self, loras) -> str:
        """The LoRA files read and dealt to the components (a bad one costs nothing: nothing is loaded yet); returns
        the line naming layers no component takes ('' when none)."""
        self.live = LiveLoras(self._deal, self._fetch, lambda c, stack: self(c, stack=stack), set(self.files))
        return self.live.start(loras)

    def chosen_precision(self, component: str) -> str | None:
        """The asked precision where the family builds it for this component, else the component's first."""
        spec = self.found.family.component(component)
        asked = self.request.precision
        return asked if asked is None or spec.precisions is None or asked in spec.precisions else spec.precisions[0]

    def estimate(self, component: str) -> int:
        """The bytes a component's artifact holds, from its manifest (for a memory budget)."""
        from .budget import artifact_bytes

        manifest, _, _ = self._fetch(component, progress=None)
        return artifact_bytes(manifest)

    def __call__(self, component: str, tiling: str | None = None, stack=None):
        """A component's session: its live-LoRA session where `set_loras` can change its weights in place, else
        `enginefarm.load` with its weights, its LoRA stack (or `stack`) and its seamless variant (`tiling`)."""
        from enginefarm.backends.nvidia.activations import sharing

        with sharing(self.activations):
            return self._open(component, tiling, stack)

    def _open(self, component: str, tiling: str | None, stack):
        from enginefarm.runner.load import load as load_session  # `enginefarm.load` itself

        start = time.perf_counter()
        live = self.live
        if tiling is None and stack is None and live is not None and live.takes(component):
            session = live.session(component)
            self.timings[f"load {component}"] = time.perf_counter() - start
            return session
        asked = self.request.component(
            component,
            precision=self.chosen_precision(component),
            weights=self.files.get(component),
            loras=(live.dealt.get(component, ()) if live is not None else ()) if stack is None else stack,
            tiling=tiling,  # its seamless variant (diffusion/seamless.py)
        )
        session = load_session(asked, progress=self.progress)
        self.timings[f"load {component}" + (f" (tiling {tiling})" if tiling else "")] = time.perf_counter() - start
        return session

    def side_by_side(self) -> bool:
        """Whether components may open at once: stored artifacts only (no weights file or LoRA to merge, whose
        memory would add up) on a CPU the request names (a GPU's engines share one activation pool and device
        context). "auto" opens in turn: finding out what it means here (every device probe, 0.35 s) cost what
        opening side by side saved."""
        request = self.request
        if self.files or (self.live is not None and any(self.live.dealt.values())) or not request.plain:
            return False
        return request.device == "cpu" or (request.target or "").endswith(":cpu")

    def _fetch(self, component: str, progress=...):
        from enginefarm.runner.load import fetch

        return fetch(
            self.request.component(component, precision=self.chosen_precision(component)),
            progress=self.progress if progress is ... else progress,
        )

    def _deal(self, asked, read):
        """The asked LoRAs, each file read once (`read`), dealt to the components as parsed files."""
        from enginefarm.runner.custom import Stack
        from enginefarm.weights.lora import deal

        width = self.found.configs.get("unet", {}).get("cross_attention_dim")
        dealt, ignored = deal(
            Stack.parse(None, asked, read).loras,
            components(self.found, self.controlnet),
            self.found.family,
            width if isinstance(width, int) else None,
        )
        if ignored:
            log.warning("%s", ignored)
        return dealt, ignored


def open_components(loader: ComponentLoader, wanted: list[str]) -> dict:
    """Each wanted component's session, opened side by side where `loader.side_by_side()` allows: OpenVINO's
    compile, or its import from the device's compiled-model cache, releases the GIL, so a warm start takes about
    as long as its largest component (docs/benchmarks.md). Where one fails, those opened are closed and its error
    raised."""
    if len(wanted) < 2 or not loader.side_by_side():
        opened: dict = {}
        try:
            for component in wanted:
                opened[component] = loader(component)
        except BaseException:
            _close_all(opened.values())
            raise
        return opened
    from concurrent.futures import wait

    futures = {component: _loading_threads().submit(loader, component) for component in wanted}
    wait(futures.values())
    failed = [error for error in (f.exception() for f in futures.values()) if error is not None]
    if failed:
        _close_all(f.result() for f in futures.values() if f.exception() is None)
        raise failed[0]
    return {component: future.result() for component, future in futures.items()}


_THREADS: Any = None  # a ThreadPoolExecutor, made at the first side-by-side load


def _loading_threads():
    """The process's loading threads, made once and kept: threads made per load and ended would each leave the
    memory they freed in a heap of their own (glibc's arenas), which load and close cycles then grow (1.7 MB a
    cycle on ONNX Runtime, tests/diffusion/test_close_memory.py)."""
    global _THREADS
    if _THREADS is None:
        import os
        from concurrent.futures import ThreadPoolExecutor

        _THREADS = ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 4), thread_name_prefix="load")
    return _THREADS


def _close_all(sessions) -> None:
    for session in sessions:
        close = getattr(session, "close", None)
        if close is not None:
            close()


def read_embeddings(embeddings, assets: ModelAssets) -> list:
    """Textual-inversion files (FILE or (FILE, WORD)) read and checked against the model's text encoders."""
    from .embeddings import read_embedding

    if isinstance(embeddings, (str, Path)):  # iterating it would read each character as a file
        raise ConfigError(
            f"embeddings={str(embeddings)!r} is one path, not a list", hint=f'embeddings=["{embeddings}"]'
        )
    t5 = tuple(n for n in assets.family.text_encoders if assets.family.component(n).tokenizer == "t5")
    clips = {n: w for n, w in assets.text_widths.items() if n not in t5}
    return [read_embedding(item, clips, t5) for item in embeddings or ()]


def fetch_assets(request: Request, progress) -> Path:
    """The assets folder of the request's model from the store (`MODEL/assets`, fetched and verified like any
    artifact)."""
    from enginefarm.runner.assets import fetch_assets as fetch_model_assets

    hint = 'build its recipe with `[model] assets = "assets"` (what `enginefarm export` writes), or pass assets=FOLDER'
    return fetch_model_assets(request, progress, missing_hint=hint)


def components(assets: ModelAssets, controlnet: bool) -> list[str]:
    """The components a generation loads, in stage order: text encoders, denoiser(s), VAE."""
    family = assets.family
    names = [name for name in family.text_encoders if name in assets.components]  # SD3 may ship without T5
    if family.denoiser == "transformer":
        if controlnet:
            raise ConfigError(
                f"ControlNet is not supported for {family.title} yet", hint="load it without controlnet=True"
            )
        return names + ["transformer", "vae_decoder"]
    if controlnet:
        if not family.is_controlnet:
            raise ConfigError(
                f"{family.title} has no ControlNet in this model",
                hint="export the model with a ControlNet (`enginefarm export … --controlnet DIR`)",
            )
        names += ["controlnet", "unet_controlnet"]
    else:
        names.append("unet")
    # The VAE encoder loads at the first image-to-image call; an inpainting model's every call needs it.
    return names + (["vae_encoder"] if family.inpainting else []) + ["vae_decoder"]


def preview_filters(found: ModelAssets, preview, decoder, **load_options) -> tuple[dict, list]:
    """`Pipeline.load(preview=, decoder=)`: {"preview": filter, "decoder": filter} for those given, each a filter
    name in the store (loaded with `load_options`, once when both name the same) or a loaded PreviewDecoder, checked
    against the model's latent space before any component loads; and the filters loaded here (the pipeline closes
    those)."""
    from enginefarm.filters import load as load_filter
    from enginefarm.filters.preview import PreviewDecoder

    chosen: dict = {}
    loaded: dict = {}  # name → the filter loaded for it
    try:
        for role, spec in (("preview", preview), ("decoder", decoder)):
            if spec is None:
                continue
            if isinstance(spec, str):
                if spec not in loaded:
                    loaded[spec] = load_filter(spec, **load_options)
                spec = loaded[spec]
            if not isinstance(spec, PreviewDecoder):
                what = spec.kind if hasattr(spec, "kind") else type(spec).__name__
                raise ConfigError(
                    f"{role}= takes a preview decoder (TAESD-class); {getattr(spec, 'name', spec)!r} is a {what}",
                    hint="export a TAESD decoder with `enginefarm export taesd_decoder.safetensors --out DIR`",
                )
            channels = int(found.configs.get("vae", {}).get("latent_channels", 4))
            spec.check_fits(channels, found.family.vae_scaling_factor, found.family.title)
            chosen[role] = spec
    except BaseException:
        for one in loaded.values():
            one.close()
        raise
    return chosen, list(loaded.values())
