"""Seamless textures: `pipe(prompt, tiling="x" | "y" | "xy")`.

As diffusers with every Conv2d of the UNet and the VAE padding circularly in those axes (what Easy Diffusion's sdkit
does): the image's opposite edges continue into each other, so it tiles without a seam. The UNet (the ControlNet and
its UNet too), the VAE decoder and, for a call that encodes an image, the VAE encoder run as their seamless variants:
loaded through `enginefarm.load(..., tiling=)` on the first call with that setting (derived from the stored artifact on
this device once and cached: `enginefarm.runner.seamless`) and kept per setting while the pipeline lives, beside the
plain ones (under a memory budget they replace the plain ones for the call instead). VAE tiling
(`enable_vae_tiling`) is off for such a call: decoding in tiles would put seams back.

Transformer families (SD3, Flux, Chroma) are refused: attention reads the whole image, and their convolutions
(the patch embedding) have no padding to wrap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from enginefarm.errors import ConfigError

Pipeline = Any  # diffusion/pipeline.py's, which imports this module (named here without importing it back)


def check(pipe: Pipeline, tiling: str | None) -> str | None:
    """`tiling` spelled "x", "y" or "xy" (None for none); a ConfigError for a bad value or a family without it."""
    if tiling is None:
        return None
    from enginefarm.runner.seamless import check_tiling

    axes = check_tiling(tiling)
    if pipe.transformer:
        raise ConfigError(
            f"tiling is for the UNet families (SD 1.x, 2.x, XL); {pipe.family.title}'s transformer attends across the "
            "whole image, so its images do not wrap",
            hint="leave tiling out",
        )
    return axes


def components(pipe: Pipeline, encodes: bool) -> list[str]:
    """The components a seamless call runs as their seamless variants: the denoisers, the VAE decoder and, when the
    call encodes an image, the VAE encoder."""
    names = [*pipe._denoisers(), "vae_decoder"]
    return names + (["vae_encoder"] if encodes or pipe.family.inpainting else [])


@contextmanager
def tiled(pipe: Pipeline, tiling: str | None, encodes: bool):
    """For the `with` block, `pipe`'s components run seamless along `tiling`'s axes (nothing changes for None)."""
    axes = check(pipe, tiling)
    if axes is None:
        yield
        return
    names = components(pipe, encodes)
    kept = pipe.__dict__.setdefault("_seamless_sessions", {})  # (component, axes, LoRAs) → its seamless session
    plain = {name: pipe.sessions.get(name) for name in names}
    swapped = {}
    vae_tiling, pipe.vae_tiling = pipe.vae_tiling, None
    try:
        for name in names:
            key = (name, axes, _loras(pipe, name))
            for stale in [k for k in kept if k[:2] == key[:2] and k != key]:  # set_loras changed them since
                kept.pop(stale).close()
            session = kept.get(key)
            if session is None or session.closed:
                if pipe.residency is not None and plain[name] is not None:  # within the budget: one of the two
                    pipe.sessions.pop(name).close()
                    plain[name] = None
                session = _load(pipe, name, axes)
                if pipe.residency is None:
                    kept[key] = session
            pipe.sessions[name] = swapped[name] = session
        yield
    finally:
        pipe.vae_tiling = vae_tiling
        for name in names:
            session = swapped.get(name)
            if pipe.sessions.get(name) is session and session is not None:
                del pipe.sessions[name]
                if pipe.residency is not None:
                    session.close()
            if plain[name] is not None:
                pipe.sessions[name] = plain[name]


def _loras(pipe: Pipeline, component: str) -> tuple:
    """The component's LoRA stack now (`set_loras` may change it between calls): part of a kept variant's key."""
    live = getattr(pipe, "_loras", None)
    return tuple(live.dealt.get(component, ())) if live is not None else ()


def _load(pipe: Pipeline, component: str, axes: str):
    if pipe._load_component is None:
        raise ConfigError(f"this pipeline has no {component}", hint="load it with Pipeline.load")
    return pipe._load_component(component, tiling=axes)


def tiling_call(call: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps `Pipeline.__call__`: a call with `tiling=` runs inside `tiled`."""

    @functools.wraps(call)
    def wrapper(pipe: Pipeline, *args, tiling: str | None = None, **kwargs):
        if tiling is None:
            return call(pipe, *args, **kwargs)
        with tiled(pipe, tiling, kwargs.get("image") is not None):
            return call(pipe, *args, **kwargs)

    return wrapper
