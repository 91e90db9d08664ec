"""enginefarm: ahead-of-time engines for Stable Diffusion-class models, fetched and verified on the device.

    import enginefarm
    with enginefarm.load("sd15/vae_decoder", precision="fp16") as session:
        outputs = session.run({"latent": latent})

    from enginefarm import Pipeline                 # enginefarm.diffusion.Pipeline: a whole model, prompt to image
    with Pipeline.load("my-sdxl", memory_budget="6G") as pipe:
        image = pipe("a lighthouse at dawn", steps=25, seed=7)

Importing this package loads no vendor SDK, no onnx and no boto3: `Session` and `Pipeline` load when first named.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .errors import (
    ArtifactNotFoundError,
    ConfigError,
    DiskFullError,
    EnginefarmError,
    IntegrityError,
    OfflineError,
    SessionClosed,
    StoreError,
    TrustError,
    UnknownModelError,
    WeightsError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from enginefarm.cache.progress import ProgressLike
    from enginefarm.diffusion import Pipeline
    from enginefarm.runner.models import ModelSummary
    from enginefarm.runner.request import LoraSpec
    from enginefarm.runner.session import Session
    from enginefarm.settings import Settings

__version__ = "0.1.0"


def load(
    ref: str,
    precision: str | None = None,
    device: str = "auto",
    store: str | None = None,
    weights: str | Path | None = None,
    loras: Sequence[LoraSpec] = (),
    *,
    recipe: str | Path | None = None,
    target: str | None = None,
    progress: ProgressLike = None,
    settings: Settings | None = None,
    channel: str | None = None,
    trusted_root: str | Path | None = None,
    version: str | None = None,
    tiling: str | None = None,
) -> Session:
    """The best artifact of `ref` for this device, fetched into the local cache, verified and loaded; close it (or
    use it in a `with` block) to give its memory back. `session.explain()` says why it was chosen.

    Args:
        ref: "model/component" (the recipe's model name and one of its components).
        precision: "fp32", "fp16" or "bf16"; None: the fastest measured.
        device: "auto", "cpu", "nvidia", "intel"…
        store: A store URL or folder; default ENGINEFARM_STORE.
        weights: A custom checkpoint: the base checkpoint's names, or a whole-model file as model sites ship it
            (the component takes its part).
        loras: LoRA files, each a path (strength 1) or (path, strength), applied in order.
        recipe: Compile here from this recipe when nothing stored fits.
        target: A backend or target that must serve it ("openvino", "openvino:cpu"); default any.
        progress: A callable receiving messages, or a `Progress`.
        settings: Overrides the environment's (`enginefarm.settings.load_settings`).
        channel: A release channel ("stable"): with `trusted_root`, load only what the maintainers released and
            signed in it; default ENGINEFARM_CHANNEL.
        trusted_root: The channel's root.json, shipped with the app; default ENGINEFARM_TRUSTED_ROOT.
        version: The model version to serve; default the newest usable here.
        tiling: "x", "y" or "xy": the artifact's seamless variant (every 2D convolution padding circularly in those
            axes), derived on this device at the first such load and cached.

    Returns:
        The loaded `Session`: `session.run({name: array})` runs it.

    Raises:
        UnknownModelError: The store holds no such model (the message names what it holds).
        ArtifactNotFoundError: Nothing stored runs on this device (and no `recipe` to compile from).
        IntegrityError: A fetched or cached file is not what its manifest says.
        WeightsError: `weights` or a LoRA that does not fit the artifact.
        TrustError: The release channel's signatures do not check out.
    """
    from enginefarm.runner.request import Request

    request = Request(
        ref,
        precision,
        device,
        store,
        target,
        version,
        weights,
        loras,
        recipe=recipe,
        channel=channel,
        trusted_root=trusted_root,
        tiling=tiling,
    )
    if request.plain:
        from enginefarm.runner import warm  # a warm start: the pick made last time, if nothing it read has changed
        from enginefarm.settings import load_settings

        here = settings or load_settings()
        if warm.remembers(request.store, here):
            index_file = warm.index_file(request.model, request.store, here)
            session = warm.reopen(warm.request(request, here), here.home, index_file)
            if session is not None:
                return session
    from enginefarm.runner.load import load as _load

    return _load(request, progress=progress, settings=settings)


def models(store: str | None = None, device: str = "auto") -> list[ModelSummary]:
    """Every model in a store, from the store's index alone: nothing is fetched or loaded.

    Args:
        store: A store URL or folder; default ENGINEFARM_STORE.
        device: The device to judge "runs here" and the download size by: "auto" (this machine's), "cpu",
            "nvidia", "intel"…

    Returns:
        One `enginefarm.runner.models.ModelSummary` per model, by name: its family, versions (newest first),
        components, built targets, the bytes this device would download to run it, and whether every component
        has an artifact it can load (`missing` names those that have none).

    Raises:
        StoreError: The store cannot be read (a remote one unreachable). A local folder that does not exist yet
            is an empty store.
    """
    from enginefarm.runner.models import models as _models

    return _models(store, device)


def __getattr__(name: str):
    """`enginefarm.Session` and `enginefarm.Pipeline`, imported when first named (the pipeline brings its
    tokenizers)."""
    if name == "Session":
        from enginefarm.runner.session import Session

        return Session
    if name == "Pipeline":
        from enginefarm.diffusion import Pipeline

        return Pipeline
    raise AttributeError(f"module 'enginefarm' has no attribute {name!r}")


__all__ = [
    "ArtifactNotFoundError",
    "ConfigError",
    "DiskFullError",
    "EnginefarmError",
    "IntegrityError",
    "OfflineError",
    "Pipeline",
    "Session",
    "SessionClosed",
    "StoreError",
    "TrustError",
    "UnknownModelError",
    "WeightsError",
    "__version__",
    "load",
    "models",
]
