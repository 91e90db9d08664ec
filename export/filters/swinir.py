"""Window-attention upscalers: SwinIR (classical, lightweight and real-world SR files such as
`003_realSR_BSRGAN_DFOWMFC_s64w8_SwinIR-L_x4_GAN.pth`), recognised from their keys as spandrel recognises them.

The hyper-parameters are read from the keys and shapes by spandrel's own loader and the torch module exported is
spandrel's, so the export is the reference model itself. These nets compute their shifted-window masks and padding
from the input's size in Python, so the traced graph is only right at the size it was traced at: each is exported
for one fixed tile (min = opt = max), and the runtime's Upscaler always runs it in tiles of exactly that side
(`details["tile"]` in filter.json). HAT and DAT (hat.py) share `fixed_tile_parts`."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from enginefarm.errors import ConfigError

from .esrgan import IMAGE_RANGE
from .registry import Architecture, Part, Parts, Source

# The tile side a fixed-size upscaler is exported for when the file does not say (SwinIR's s64 training patches):
# the smallest multiple of the net's window at or above it.
PREFERRED_TILE = 64


def fixed_tile(window: int, preferred: int = PREFERRED_TILE) -> int:
    """The tile side for a net whose windows are `window` pixels: `preferred` rounded up to a multiple of it, so the
    net's own reflection padding never runs inside a tile."""
    return -(-preferred // window) * window


def load_with_spandrel(source: Source, label: str):
    """spandrel's descriptor for the source's state (its architecture `label`'s loader reads the hyper-parameters
    and loads the weights strictly); a file whose layers do not fit is one ConfigError line, and so is a missing
    spandrel (the export extra's)."""
    try:
        architectures = importlib.import_module(f"spandrel.architectures.{label}")
    except ImportError:
        raise ConfigError(
            f"{source.path}: exporting a {label} model needs spandrel", hint="pip install 'enginefarm[export]'"
        ) from None
    try:
        descriptor = getattr(architectures, f"{label}Arch")().load(dict(source.state))
    except (KeyError, ValueError, RuntimeError, AssertionError, IndexError, ZeroDivisionError) as exc:
        first = (str(exc) or repr(exc)).splitlines()[0]
        raise ConfigError(
            f"{source.path}: a {label} model whose layers do not fit together ({first})",
            hint="is the file whole? re-download it",
        ) from None
    if descriptor.input_channels != 3 or descriptor.output_channels != 3:
        raise ConfigError(
            f"{source.path}: a {label} model with {descriptor.input_channels} input and {descriptor.output_channels} "
            "output channels (a grayscale variant): enginefarm exports RGB upscalers only",
            hint="export a 3-channel RGB model",
        )
    return descriptor


def fixed_tile_parts(
    architecture: str, model, scale: int, window: int, details: dict[str, Any], activation_channels: int
) -> Parts:
    """The upscaler part of a fixed-size net whose windows are `window` pixels: traced, checked and built at exactly
    `fixed_tile(window)` a side (batch 1); `details` gain the tile and the multiple another tile must be of."""
    tile = fixed_tile(window)
    part = Part(
        module=model.float().eval(),
        inputs={"image": ("batch", 3, "height", "width")},
        outputs={"upscaled": ("batch", 3, "upscaled_height", "upscaled_width")},
        profile={"batch": (1, 1, 1), "height": (tile, tile, tile), "width": (tile, tile, tile)},
        ranges={"image": IMAGE_RANGE},
        resources={"activation_channels": int(activation_channels)},
    )
    # "multiple": the runtime pads the image to the window (as the net itself does) and starts every tile on it, so
    # each tile's windows lie where the whole image's do (unaligned tiles' seams measured 3-6x further off)
    details = {**details, "scale": scale, "multiple": window, "tile": tile, "tile_multiple": window}
    return Parts(architecture, "upscaler", {"upscaler": part}, details)


def with_fixed_tile(parts: Parts, profile: dict[str, tuple[int, int, int]]) -> Parts:
    """A fixed-size net's `parts` exported for another tile: `profile` (export_filter's) may only name one side for
    height and width, as (T, T, T), a multiple of the net's window; anything else is one ConfigError line."""
    multiple, now = int(parts.details["tile_multiple"]), int(parts.details["tile"])
    sides = {dim: tuple(int(v) for v in profile[dim]) for dim in ("height", "width") if dim in profile}
    if set(profile) - {"height", "width"} or len({*sides.values()}) != 1:
        raise ConfigError(
            f"{parts.architecture} runs in square tiles of one size: its profile is height and width (T, T, T)",
            hint=f"e.g. height and width ({now}, {now}, {now})",
        )
    low, opt, high = next(iter(sides.values()))
    if not low == opt == high or low <= 0 or low % multiple:
        raise ConfigError(
            f"{parts.architecture}: profile {[low, opt, high]} is not one tile side, a multiple of {multiple} "
            "(its graph is right only at the size it was traced at)",
            hint=f"e.g. height and width ({now}, {now}, {now}) or ({now * 2}, {now * 2}, {now * 2})",
        )
    part = parts.parts["upscaler"]
    size = {"height": (low, low, low), "width": (low, low, low)}
    replaced = dataclasses.replace(part, profile={**part.profile, **size})
    return dataclasses.replace(parts, parts={"upscaler": replaced}, details={**parts.details, "tile": low})


def _has_all(state: dict, *keys: str) -> bool:
    return all(k in state for k in keys)


def is_swinir(source: Source) -> bool:
    """SwinIR's keys (spandrel's rule), without Swin2SR's (a patch-embedding conv and continuous position bias),
    which this module does not export."""
    s = source.state
    return (
        _has_all(
            s,
            "layers.0.residual_group.blocks.0.norm1.weight",
            "layers.0.residual_group.blocks.0.mlp.fc1.bias",
            "layers.0.residual_group.blocks.0.attn.relative_position_index",
        )
        and ("conv_first.weight" in s or "conv_first.1.weight" in s)
        and "patch_embed.proj.weight" not in s
        and not any(".attn.cpb_mlp." in k or k.endswith(".attn.logit_scale") for k in s)
    )


def build_swinir(source: Source) -> Parts:
    descriptor = load_with_spandrel(source, "SwinIR")
    h = descriptor.model.hyperparameters
    window = int(h["window_size"])
    embed, mlp = int(h["embed_dim"]), float(h["mlp_ratio"])
    details = {
        "embed_dim": embed,
        "depths": [int(d) for d in h["depths"]],
        "num_heads": [int(n) for n in h["num_heads"]],
        "window_size": window,
        "upsampler": h["upsampler"] or "none",
        "img_range": float(h["img_range"]),
        "resi_connection": h["resi_connection"],
    }
    scale = int(descriptor.scale)
    # held per input pixel at once: the MLP's hidden features, the attention scores, or the upsampler's output
    channels = max(int(embed * mlp), max(details["num_heads"]) * window * window, 64 * scale * scale)
    # the windows are over the unshuffled features, start_unshuffle times smaller than the input
    return fixed_tile_parts("SwinIR", descriptor.model, scale, window * int(h["start_unshuffle"]), details, channels)


ARCHITECTURES = [Architecture("SwinIR", "upscaler", is_swinir, build_swinir)]
