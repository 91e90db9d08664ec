"""Model-family knowledge as data: components and their ONNX inputs and outputs, recipe profile ranges,
precisions, VAE factors, scheduler defaults and UNet conditioning, for each Stable Diffusion family.

The exporter (build side), custom weights and the runtime pipelines read the same tables. Pure data and small
helpers: importing this imports no torch and no numpy."""

from __future__ import annotations

from .detect import detect_family, family, with_controlnet
from .spec import (
    IMAGE_DIMS,
    LATENT_DIMS,
    TEXT_DIMS,
    TOKENS,
    Component,
    Family,
    JointText,
    Sizes,
    Tensor,
    controlnet_residuals,
    downscaled,
    input_ranges,
    is_dynamic,
    profile_dims,
    text_length_range,
)
from .table import ADDED_EMBEDS, FAMILIES

__all__ = [
    "ADDED_EMBEDS",
    "FAMILIES",
    "IMAGE_DIMS",
    "LATENT_DIMS",
    "TOKENS",
    "Component",
    "Family",
    "JointText",
    "Sizes",
    "Tensor",
    "controlnet_residuals",
    "detect_family",
    "downscaled",
    "family",
    "input_ranges",
    "is_dynamic",
    "profile_dims",
    "text_length_range",
    "TEXT_DIMS",
    "with_controlnet",
]
