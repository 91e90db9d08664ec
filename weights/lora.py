"""LoRA files as model sites ship them: the layers, their format, and which component each belongs to (numpy only).

One file may hold layers for the UNet (or transformer) and the text encoders at once. Each layer's module name
says whose it is (PARTS): kohya's `lora_unet_…`, `lora_te_…` (SDXL: `lora_te1_…`, `lora_te2_…`), or the
diffusers/PEFT prefixes `unet.`, `text_encoder.`, `text_encoder_2.`, `transformer.`; a name with none of them
is the denoiser's, or the first text encoder's when it starts with `text_model.`.

The formats (LoRA/LoCon, LoHa, LoKr, full, DoRA) and the change each makes are `lora_layer.py`'s, one class each.
A load reads each file once (`read`) and deals the parsed files to its components (`deal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginefarm.errors import WeightsError
from enginefarm.formats.safetensors_io import FLOATS, SafeTensors

from .denoisers import same_family
from .lora_layer import SUFFIXES, Layer, format_of

KOHYA_PARTS = {
    "lora_unet_": "unet",
    "lora_te_": "text_encoder",
    "lora_te1_": "text_encoder",
    "lora_te2_": "text_encoder_2",
    "lora_te3_": "text_encoder_3",
    "lora_transformer_": "transformer",
}  # kohya's Flux LoRAs: te1 CLIP-L, te3 T5
DOTTED_PARTS = {
    "unet.": "unet",
    "text_encoder.": "text_encoder",
    "text_encoder_2.": "text_encoder_2",
    "transformer.": "transformer",
    "diffusion_model.": "unet",
}  # ComfyUI's and musubi's names: the original layout, dotted
# which components take each part's layers: kohya names Flux's transformer `lora_unet_…` too
PART_COMPONENTS = {
    "unet": ("unet", "unet_controlnet", "transformer"),
    "transformer": ("transformer",),
    "text_encoder": ("text_encoder",),
    "text_encoder_2": ("text_encoder_2",),
    "text_encoder_3": ("text_encoder_3",),
}
TAKERS = frozenset(c for cs in PART_COMPONENTS.values() for c in cs)


def part_of(module: str) -> tuple[str, str]:
    """(part, name without the part's prefix)."""
    for prefix, part in KOHYA_PARTS.items():
        if module.startswith(prefix):
            return part, module[len(prefix) :]
    module = module.removeprefix("base_model.model.")  # PEFT's wrapper
    for prefix, part in DOTTED_PARTS.items():
        if module.startswith(prefix):
            return part, module[len(prefix) :]
    return ("text_encoder" if module.startswith("text_model.") else "unet"), module


@dataclass(eq=False)
class LoraFile:
    """A LoRA file as read once: its layers (each of its format's class), and the file's identity when read. Two
    reads are two values (compared and hashed by identity): a load reads each file once and passes that value on."""

    path: Path
    layers: list[Layer]
    key: tuple = ()  # (resolved path, size, mtime) when read: a file rewritten in place is another file
    _digest: str | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def digest(self) -> str:
        """The file's sha256 (what a cached result of it is keyed by), hashed on first use: a load that caches
        nothing never hashes."""
        if self._digest is None:
            from enginefarm.cache.atomic import sha256_file

            self._digest = sha256_file(self.path)
        return self._digest

    def parts(self) -> dict[str, int]:
        """part → how many layers it holds."""
        out: dict[str, int] = {}
        for layer in self.layers:
            out[layer.part] = out.get(layer.part, 0) + 1
        return out

    def for_component(self, component: str) -> list[Layer]:
        """The layers `component` takes; a component that no part names (a plain model) takes every layer."""
        if component not in TAKERS:
            return list(self.layers)
        return [layer for layer in self.layers if component in PART_COMPONENTS[layer.part]]


def file_key(path: Path) -> tuple:
    """(resolved path, size, mtime): what tells a file read before from one rewritten since."""
    try:
        stat = Path(path).stat()
    except OSError:  # gone (or never there): unlike any file read
        return (str(path), None, None)
    return (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


def read(path: Path) -> LoraFile:
    """Every layer of the file, its format checked and its tensors finite; all problems are raised together. A load
    reads each of its files once here and hands the parsed file on (`deal`, `runner.custom.Stack`)."""
    key = file_key(Path(path))
    found = _read(Path(path))
    found.key = key
    return found


def deal(
    loras: list[tuple[LoraFile, float]], components, family=None, text_width=None
) -> tuple[dict[str, list[tuple[LoraFile, float]]], str]:
    """A pipeline's LoRAs, read, dealt to its components: component → [(file, strength)] of the files that hold
    layers for it. Also one line naming the layers no component takes ('' when every layer has a taker). A file with
    nothing for any of them, or for another family's denoiser (`text_width`: the UNet's cross-attention width), is
    an error."""
    dealt: dict[str, list[tuple[LoraFile, float]]] = {}
    left: list[str] = []
    for parsed, strength in loras:
        path = parsed.path
        if family is not None:
            same_family(parsed, family, text_width)
        taken = 0
        for component in components:
            if mine := parsed.for_component(component) if component in TAKERS else []:
                dealt.setdefault(component, []).append((parsed, strength))
                taken += len(mine)
        counts = {
            part: n for part, n in parsed.parts().items() if not any(c in components for c in PART_COMPONENTS[part])
        }
        if not taken:
            theirs = ", ".join(f"{part} ({n})" for part, n in sorted(parsed.parts().items()))
            raise WeightsError(
                f"{path}: no layer of this LoRA fits this pipeline's {', '.join(c for c in components if c in TAKERS)} "
                f"(it holds layers for {theirs})",
                hint="use a LoRA trained for this model family",
            )
        if counts:
            left.append(f"{Path(path).name}: {', '.join(f'{n} {part} layer(s)' for part, n in sorted(counts.items()))}")
    line = f"ignored, no component of this pipeline takes them: {'; '.join(left)}" if left else ""
    return dealt, line


def _read(path: Path) -> LoraFile:
    st = SafeTensors(path)
    groups: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for name in st.names:
        module, role = _split(name)
        if role is None:
            problems.append(
                f"{name}: not a LoRA tensor (lora_down/up, lora_A/B, hada_*, lokr_*, diff, alpha, dora_scale)"
            )
        else:
            groups.setdefault(module, {})[role] = name
    layers = []
    for module, roles in sorted(groups.items()):
        layer, problem = _layer(st, module, roles)
        if layer is None:
            problems.append(f"{module}: {problem}")
        else:
            layers.append(layer)
    if not groups and not problems:
        problems.append("holds no tensors")
    if problems:
        raise WeightsError(f"{path}: {len(problems)} problem(s) in this LoRA: {shown(problems)}", hint=FORMATS)
    return LoraFile(Path(path), layers)


FORMATS = (
    "a kohya, PEFT or LyCORIS LoRA holds, per module, lora_down/lora_up (or lora_A/lora_B), hada_w1_a… (LoHa), "
    "lokr_w1… (LoKr) or diff, with optional alpha and dora_scale"
)


def shown(problems: list[str]) -> str:
    return "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")


def _split(name: str) -> tuple[str, str | None]:
    for suffix in sorted(SUFFIXES, key=len, reverse=True):  # lora_magnitude_vector.weight before .weight-less forms
        if name.endswith("." + suffix):
            return name[: -len(suffix) - 1], SUFFIXES[suffix]
    return name, None


def _layer(st: SafeTensors, module: str, roles: dict[str, str]) -> tuple[Layer | None, str]:
    form = format_of(set(roles))
    if form is None:
        return (
            None,
            f"has only {', '.join(sorted(name.rsplit('.', 1)[-1] for name in roles.values()))}, no LoRA weights",
        )
    if why := form.incomplete(set(roles)):
        return None, why
    tensors = {}
    for role, name in roles.items():
        entry = st.entries[name]
        if entry.dtype not in FLOATS:
            return None, f"{name} is {entry.dtype}, not float"
        value = st.array(name)
        if not np.isfinite(value).all():
            return None, f"{name} holds Inf or NaN"
        tensors[role] = value
    alpha = tensors.pop("alpha", None)
    if alpha is not None and alpha.size != 1:
        return None, "alpha must be one number"
    part, local = part_of(module)
    layer = form(module, part, local, tensors, float(alpha.reshape(-1)[0]) if alpha is not None else None)
    try:  # the weight's shape is checked against the model later
        why = layer.problem()
    except (IndexError, ValueError) as exc:
        why = f"tensor shapes do not fit the format ({exc})"
    return (layer, "") if why == "" else (None, why)
