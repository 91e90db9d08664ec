"""The recipe an export writes beside its ONNX files: every component with the family's profile ranges,
precisions and validation input ranges, sources and checkpoints as paths relative to the recipe."""

from __future__ import annotations

import json
import re

from enginefarm.cache import precision_table
from enginefarm.families import input_ranges, profile_dims

from .resources import component_resources
from .source import ExportSource

DEFAULT_TARGETS = ("openvino:cpu", "onnxruntime:cpu")
DEFAULT_PRECISIONS = tuple(p.name for p in precision_table.TABLE.values() if p.exported_by_default)


def model_name(text: str) -> str:
    """A recipe model name (letters, digits, _ . -) from a folder name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "model"


def _toml(value) -> str:
    """TOML for strings, numbers and lists of them (JSON spells those the same way)."""
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)


def _list(items) -> str:
    return "[" + ", ".join(_toml(i) for i in items) + "]"


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def recipe_text(
    source: ExportSource,
    name: str,
    components: dict[str, str | None],
    *,
    targets=DEFAULT_TARGETS,
    precisions=DEFAULT_PRECISIONS,
    batch=None,
    latent=None,
    text_length=None,
    origin: str = "",
) -> str:
    """`components`: component → its checkpoint file (or None), in the order to write them."""
    family, sizes = source.family, source.sizes
    lines = [
        f"# Written by `enginefarm export` from {origin} ({family.id}: {family.title}).",
        "# Build it with `enginefarm build recipe.toml`; edit the profiles and targets as you need.",
        "",
        "[model]",
        f"name = {_toml(name)}",
        'version = "1"',
        f"description = {_toml(f'{family.title}, exported from diffusers')}",
        'assets = "assets"  # tokenizers and configs: published beside the artifacts, read by enginefarm.diffusion',
        "",
        "[defaults]",
        f"precisions = {_list(precisions)}",
        f"targets = {_list(targets)}",
    ]
    for component_name, checkpoint in components.items():
        component = family.component(component_name)
        lines += ["", f"[components.{component_name}]", f"source = {_toml(component_name + '.onnx')}"]
        if checkpoint:
            lines.append(f"checkpoint = {_toml(checkpoint)}")
        if component.precisions is not None:
            kept = [p for p in precisions if p in component.precisions] or list(component.precisions)
            if kept != list(precisions):
                lines.append(
                    f"precisions = {_list(kept)}  # {component.precisions_reason or 'the family table says so'}"
                )
        if component.fp16_keep_fp32:
            lines.append(f"fp16_keep_fp32 = {_list(component.fp16_keep_fp32)}")
        resources = component_resources(component, source.configs.get(component.folder, {}))
        if resources:
            lines += ["", f"[components.{component_name}.resources]"]
            lines += [f"{key} = {value}  # {why}" for key, (value, why) in resources.items()]
        dims = profile_dims(family, component, sizes, batch=batch, latent=latent, text_length=text_length)
        lines += ["", f"[components.{component_name}.profiles.default]"]
        lines += [f"{_key(dim)} = {_list(r)}" for dim, r in dims.items()]
        ranges = input_ranges(family, component, sizes, source.vae_scaling_factor)
        if ranges:
            spec = ", ".join(
                f"{_key(n)} = {{ low = {_toml(lo)}, high = {_toml(hi)} }}" for n, (lo, hi) in ranges.items()
            )
            lines += ["", f"[components.{component_name}.validate]", f"inputs = {{ {spec} }}"]
    return "\n".join(lines) + "\n"
