"""The contract between the filter exporter and each architecture it knows.

An architecture module (esrgan.py, taesd.py, safety.py, gfpgan.py, …) defines one or more `Architecture` values and is
listed in `MODULES`; the exporter reads the user's file into a `Source`, asks each architecture whether it `matches`,
and `build`s the first that does into `Parts`: torch modules with their ONNX inputs and profiles, the details the
runtime's kind class reads (`filter.json`), and any extra asset files."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the architecture modules of this package, in the order they are asked (a more specific layout first)
MODULES: list[str] = [
    "esrgan",
    "swinir",
    "hat",
    "dat",
    "gfpgan",
    "codeformer",
    "retinaface",
    "depth",
    "hed",
    "pidinet",
    "lineart",
    "openpose",
    "taesd",
    "safety",
]


@dataclass(frozen=True)
class Source:
    """What the exporter read from the user's file or folder."""

    path: Path
    state: dict[str, Any]  # tensor name → torch.Tensor, unwrapped from "params_ema"/"state_dict"-style nesting
    config: dict[str, Any] | None = None  # a folder's config.json (diffusers AutoencoderTiny, the safety checker)


@dataclass(frozen=True)
class Part:
    """One ONNX component of a filter."""

    module: Any  # torch.nn.Module, in eval mode, fp32
    inputs: dict[str, tuple[str | int, ...]]  # input name → dims: an int is fixed, a str names a profile dim
    outputs: dict[str, tuple[str | int, ...]]
    profile: dict[str, tuple[int, int, int]]  # profile dim → (min, opt, max), written to the recipe
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # validation input ranges per input
    precisions: tuple[str, ...] | None = None  # None: the recipe's; else the precisions this part builds at
    # the recipe's [resources] for the builder's memory rule, e.g. {"activation_channels": N}: the channels held at
    # the input image's resolution (an upscaler's width x scale², since its last layers run at the output's size)
    resources: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Parts:
    architecture: str  # what was recognised, e.g. "RRDBNet", "SRVGGNetCompact", "AutoencoderTiny"
    kind: str  # one of enginefarm.filters.KINDS
    parts: dict[str, Part]  # component name → part
    details: dict[str, Any] = field(default_factory=dict)  # filter.json "details" (JSON values only)
    assets: dict[str, bytes] = field(default_factory=dict)  # extra files for the assets folder, by relative path


@dataclass(frozen=True)
class Architecture:
    name: str  # what users call it, in messages: "ESRGAN / RealESRGAN (RRDBNet)"
    kind: str
    matches: Callable[[Source], bool]  # from keys, shapes and config only: cheap, never raises on foreign files
    build: Callable[[Source], Parts]  # may raise ConfigError naming what is off


def architectures() -> list[Architecture]:
    """Every architecture the exporter knows, in the order to ask them."""
    found: list[Architecture] = []
    for name in MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
        found.extend(module.ARCHITECTURES)
    return found


def load_layout(model, source: Source, layout: str, hint: str):
    """`model` with the source's weights, fp32 and in eval mode; a file whose keys are not `layout`'s (a name users
    know, e.g. "ControlNetHED.pth") is one ConfigError line naming a missing and an unexpected key."""
    from enginefarm.errors import ConfigError

    missing, unexpected = model.load_state_dict(source.state, strict=False)
    if missing or unexpected:
        raise ConfigError(
            f"{source.path}: not the layout of {layout} ({len(missing)} missing keys, e.g. "
            f"{(missing or ['-'])[0]}; {len(unexpected)} unexpected, e.g. {(unexpected or ['-'])[0]})",
            hint=hint,
        )
    return model.float().eval()
