"""Which component of a pipeline takes which file: `Pipeline.load(NAME, weights=FILE, vae=FILE)`.

A whole-model file goes to every component it has a part for; a VAE file (vae=) to the decoder and the encoder,
winning over the checkpoint's own VAE. A file in one component's diffusers names goes to that component when its
names say which (a UNet; a VAE half). Everything is checked from the files' headers before anything loads."""

from __future__ import annotations

from pathlib import Path

from enginefarm.errors import WeightsError
from enginefarm.formats.safetensors_io import SafeTensors

from .single_file import open_file, same_family

_VAE = ("vae_decoder", "vae_encoder")


def _diffusers_component(path: Path) -> list[str]:
    """A file in one component's diffusers names: the components its names say, or [] when they do not."""
    names = SafeTensors(path).names
    has = lambda prefix: any(n.startswith(prefix) for n in names)  # noqa: E731
    if has("down_blocks.") and has("conv_in.") and has("time_embedding."):
        return ["unet", "unet_controlnet"]
    return [c for c, prefix in (("vae_decoder", "decoder."), ("vae_encoder", "encoder.")) if has(prefix)]


def _parts(path: Path, family) -> list[str]:
    opened = open_file(path)
    if opened.layout is None:
        found = _diffusers_component(opened.path)
        if not found:
            raise WeightsError(
                f"{opened.path}: its tensor names are neither a whole-model layout nor a UNet's or a VAE's",
                hint='load a component\'s own file with enginefarm.load("MODEL/COMPONENT", weights=FILE)',
            )
        return found
    same_family(path, family.id)
    return opened.components()


def route(family, components: list[str], weights: str | Path | None, vae: str | Path | None) -> dict[str, Path]:
    """component → the file it takes, over the family's components (`components`: those this pipeline may load)."""
    taken: dict[str, Path] = {}
    if weights is not None:
        for component in _parts(Path(weights), family):
            if component in components and not (component in _VAE and vae is not None):
                taken[component] = Path(weights)
    if vae is not None:
        parts = _parts(Path(vae), family)
        if not set(parts) <= set(_VAE):
            what = open_file(vae).layout
            raise WeightsError(
                f"vae={vae}: {what.title if what else 'not a VAE file'}, not a VAE",
                hint="pass a whole-model checkpoint as weights=, a VAE file as vae=",
            )
        taken.update({component: Path(vae) for component in parts if component in components})
    for path in {p for p in (weights, vae) if p is not None}:
        if not any(p == Path(path) for p in taken.values()):
            raise WeightsError(
                f"{path}: no component of this {family.title} model takes it",
                hint="check that the file is for this model",
            )
    return taken
