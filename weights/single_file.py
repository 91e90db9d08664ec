"""Whole-model files as users download them, and the part each component takes.

A file is recognised by its keys (`detect`): an SD 1.x / 2.x single-file checkpoint in the original LDM layout, an
SDXL base or refiner one in the SGM layout, a Flux.1 or SD3/SD3.5 transformer as its publisher ships it, a VAE in the
original layout or as a full diffusers AutoencoderKL, or none of these (a component's own file in diffusers names, read
as it is). Each layout is a table: component → the file's section (key prefix) and the model part whose names it uses
(`layouts.py`).

`component_part(path, component, wmap)` is that component's part as a read-only tensor view in diffusers names,
checked against the component's weight map: a tensor of the part that has no place in the component, or the wrong
shape, is an error naming the file and what it is (a file for another family fails here). Tensors that are not
weights (scheduler buffers, EMA copies, position ids, open_clip's logit scale) are skipped silently; any other key
that belongs to no component of the layout is named once per file, in one warning line, and ignored: files from
model sites often carry such extras, and diffusers ignores them too."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enginefarm.errors import WeightsError
from enginefarm.formats.safetensors_io import SafeTensors, TensorEntry

from . import layouts
from .denoisers import file_fits_component
from .layouts import CHROMA, CLIP, FLUX, OPENCLIP, SD3, UNET, VAE, Source

log = logging.getLogger(__name__)

DIFFUSERS = "diffusers"  # a part already in diffusers names (a full AutoencoderKL file)
_DECODER, _ENCODER = ("decoder.", "post_quant_conv."), ("encoder.", "quant_conv.")


@dataclass(frozen=True)
class Section:
    part: str  # layouts.UNET, CLIP, OPENCLIP, VAE or DIFFUSERS
    prefix: str  # the file's prefix of the part's keys
    owns: tuple[str, ...] = ("",)  # the keys (after the prefix) this component takes: the VAE's halves share a section
    penultimate: bool = False  # a CLIP encoder read at its penultimate layer: its last layer and final norm are unused


def _sd(text_encoder: Section) -> dict[str, Section]:
    unet = Section(UNET, "model.diffusion_model.")
    return {
        "text_encoder": text_encoder,
        "unet": unet,
        "unet_controlnet": unet,
        "vae_decoder": Section(VAE, "first_stage_model.", _DECODER),
        "vae_encoder": Section(VAE, "first_stage_model.", _ENCODER),
    }


@dataclass(frozen=True)
class FileLayout:
    id: str
    title: str
    families: tuple[str, ...]  # the families whose components it fits
    components: dict[str, Section] = field(default_factory=dict)


_FLUX = ("flux", "flux-schnell")  # Chroma's transformer has other modules (its modulation approximator)
_LDM = "model.diffusion_model."
# ComfyUI's all-in-one files: the text encoders in transformers' names under `text_encoders.<name>.transformer.`,
# the VAE in the original layout under `vae.` (SD3's own "incl_clips" files: under `first_stage_model.`)
_COMFY_CLIP_L, _COMFY_CLIP_G, _COMFY_T5 = (
    "text_encoders.clip_l.transformer.",
    "text_encoders.clip_g.transformer.",
    "text_encoders.t5xxl.transformer.",
)
_ALL = ("sd1", "sd2", "sd2-v", "sdxl", "sdxl-refiner", "controlnet-sd1", "controlnet-sdxl")
# their VAEs (16 latent channels) ship in the same layouts: Flux.1's `ae.safetensors` is LDM's; shapes tell them apart
_TRANSFORMER_FAMILIES = ("sd3", "sd3.5", "flux", "flux-schnell", "chroma")
_SDXL_SECTIONS = _sd(Section(CLIP, "conditioner.embedders.0.transformer.", penultimate=True))


def _VAE_ONLY(part, prefix=""):  # noqa: N802 (a layout table entry, named like the constants beside it)
    return {"vae_decoder": Section(part, prefix, _DECODER), "vae_encoder": Section(part, prefix, _ENCODER)}


LAYOUTS = {
    layout.id: layout
    for layout in (
        FileLayout(
            "sd1",
            "a Stable Diffusion 1.x single-file checkpoint (original layout)",
            ("sd1", "controlnet-sd1"),
            _sd(Section(CLIP, "cond_stage_model.transformer.")),
        ),
        FileLayout(
            "sd2",
            "a Stable Diffusion 2.x single-file checkpoint (original layout, OpenCLIP)",
            ("sd2", "sd2-v"),
            _sd(Section(OPENCLIP, "cond_stage_model.model.")),
        ),
        FileLayout(
            "sdxl",
            "a Stable Diffusion XL single-file checkpoint (SGM layout)",
            ("sdxl", "controlnet-sdxl"),
            {**_SDXL_SECTIONS, "text_encoder_2": Section(OPENCLIP, "conditioner.embedders.1.model.")},
        ),
        FileLayout(
            "sdxl-refiner",
            "a Stable Diffusion XL refiner single-file checkpoint (SGM layout)",
            ("sdxl-refiner",),
            {k: v for k, v in _sd(Section(OPENCLIP, "conditioner.embedders.0.model.")).items() if k != "text_encoder"}
            | {"text_encoder_2": Section(OPENCLIP, "conditioner.embedders.0.model.")},
        ),
        FileLayout(
            "unet",
            "a UNet-only checkpoint (original layout)",
            _ALL,
            {
                "unet": Section(UNET, "model.diffusion_model."),
                "unet_controlnet": Section(UNET, "model.diffusion_model."),
            },
        ),
        FileLayout(
            "flux", "a Flux.1 transformer file (Black Forest Labs' layout)", _FLUX, {"transformer": Section(FLUX, "")}
        ),
        FileLayout(
            "flux-ldm",
            "a Flux.1 file (Black Forest Labs' layout under model.diffusion_model., ComfyUI's text_encoders./vae. if "
            "any)",
            _FLUX,
            {
                "transformer": Section(FLUX, _LDM),
                "text_encoder": Section(CLIP, _COMFY_CLIP_L),
                "text_encoder_2": Section(DIFFUSERS, _COMFY_T5),
                **_VAE_ONLY(VAE, "vae."),
            },
        ),
        FileLayout(
            "chroma",
            "a Chroma transformer file (lodestones' layout)",
            ("chroma",),
            {"transformer": Section(CHROMA, "")},
        ),
        FileLayout(
            "chroma-ldm",
            "a Chroma file (lodestones' layout under model.diffusion_model., ComfyUI's text_encoders./vae. if any)",
            ("chroma",),
            {
                "transformer": Section(CHROMA, _LDM),
                "text_encoder": Section(DIFFUSERS, _COMFY_T5),
                **_VAE_ONLY(VAE, "vae."),
            },
        ),
        FileLayout(
            "sd3",
            "an SD3/SD3.5 file (Stability's MMDiT layout, with text_encoders./first_stage_model. if any)",
            ("sd3", "sd3.5"),
            {
                "transformer": Section(SD3, _LDM),
                "text_encoder": Section(CLIP, _COMFY_CLIP_L),
                "text_encoder_2": Section(CLIP, _COMFY_CLIP_G),
                "text_encoder_3": Section(DIFFUSERS, _COMFY_T5),
                **_VAE_ONLY(VAE, "first_stage_model."),
            },
        ),
        FileLayout("vae", "a VAE in the original layout", _ALL + _TRANSFORMER_FAMILIES, _VAE_ONLY(VAE)),
        FileLayout(
            "vae-diffusers", "a VAE file (diffusers AutoencoderKL)", _ALL + _TRANSFORMER_FAMILIES, _VAE_ONLY(DIFFUSERS)
        ),
    )
}

# Not weights: scheduler buffers (top-level keys), EMA copies, SGM's sigmas, a VAE's training loss, position ids, logit
# scale.
_NOT_WEIGHTS = re.compile(
    r"^(?:[^.]+|model_ema\..*|denoiser\..*|(?:first_stage_model\.)?loss\..*|.*\.position_ids|.*logit_scale)$"
)


def detect(names) -> FileLayout | None:
    """The layout the keys say, or None: a component's own file in diffusers names."""
    keys = set(names)
    has = lambda prefix: any(k.startswith(prefix) for k in keys)  # noqa: E731
    if has("conditioner.embedders.1.model."):
        return LAYOUTS["sdxl"]
    if has("conditioner.embedders.0.model.") and has("model.diffusion_model."):
        return LAYOUTS["sdxl-refiner"]
    if has("cond_stage_model.model."):
        return LAYOUTS["sd2"]
    if has("cond_stage_model.transformer."):
        return LAYOUTS["sd1"]
    if has("distilled_guidance_layer.") or has(_LDM + "distilled_guidance_layer."):
        return LAYOUTS["chroma-ldm" if has(_LDM) else "chroma"]
    if has("model.diffusion_model.joint_blocks."):
        return LAYOUTS["sd3"]
    if has("model.diffusion_model.double_blocks."):
        return LAYOUTS["flux-ldm"]
    if has("model.diffusion_model."):
        return LAYOUTS["unet"]
    if has("double_blocks.") and has("single_blocks."):
        return LAYOUTS["flux"]
    if has("encoder.down.") or has("decoder.up."):
        return LAYOUTS["vae"]
    if has("encoder.down_blocks.") and has("decoder.up_blocks."):
        return LAYOUTS["vae-diffusers"]
    return None


class OpenedFile:
    """A file's header, layout and the keys no component of the layout takes (read once per process and file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tensors = SafeTensors(path)
        self.layout = detect(self.tensors.names)
        self.digest: str | None = None

    def section_keys(self, section: Section) -> list[str]:
        heads = tuple(section.prefix + own for own in section.owns)
        return [k for k in self.tensors.names if k.startswith(heads)]

    def components(self) -> list[str]:
        """The components this file has a part for (keys present, not only a layout entry)."""
        if self.layout is None:
            return []
        return [c for c, s in self.layout.components.items() if self.section_keys(s)]

    def strays(self) -> list[str]:
        if self.layout is None:
            return []
        heads = tuple(s.prefix + own for s in self.layout.components.values() for own in s.owns)
        return [k for k in self.tensors.names if not k.startswith(heads) and not _NOT_WEIGHTS.match(k)]


_OPENED: dict[tuple, OpenedFile] = {}


def open_file(path: str | Path) -> OpenedFile:
    """The file's header and layout, read once per process while the file is unchanged; its strays warned once."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        raise WeightsError(f"{path}: file not found") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _OPENED:
        opened = OpenedFile(path)
        strays = opened.strays()
        if strays:
            shown = ", ".join(strays[:6]) + (f" and {len(strays) - 6} more" if len(strays) > 6 else "")
            log.warning(
                "%s (%s): %d tensor(s) no component takes, ignored: %s",
                path,
                opened.layout.title if opened.layout else "no known layout",
                len(strays),
                shown,
            )
        if len(_OPENED) >= 16:
            _OPENED.pop(next(iter(_OPENED)))
        _OPENED[key] = opened
    return _OPENED[key]


def digest(path: str | Path) -> str:
    """The file's sha256, hashed once per process while the file is unchanged (every component of a pipeline keys
    its cached result by it)."""
    from enginefarm.cache.atomic import sha256_file

    opened = open_file(path)
    if opened.digest is None:
        opened.digest = sha256_file(opened.path)
    return opened.digest


class PartView:
    """One component's part of a file, in diffusers names: what `SafeTensors` offers a reader (names, entries,
    array, raw), converted on read (split, transposed, reshaped)."""

    def __init__(self, path: Path, tensors: SafeTensors, found: dict[str, tuple[str, Source]]) -> None:
        self.path = path
        self._tensors = tensors
        self._found = found  # diffusers name → (file key, how)
        self.entries: dict[str, TensorEntry] = {}
        for name, (key, source) in found.items():
            entry = tensors.entries[key]
            self.entries[name] = TensorEntry(entry.dtype, source.shape(entry.shape), entry.start, entry.end)

    @property
    def names(self) -> list[str]:
        return list(self._found)

    def __contains__(self, name: str) -> bool:
        return name in self._found

    def array(self, name: str) -> np.ndarray:
        key, source = self._found[name]
        return source.convert(self._tensors.array(key))

    def raw(self, name: str) -> np.ndarray:
        key, source = self._found[name]
        return source.convert(self._tensors.raw(key))


def _sources(section: Section, names) -> dict[str, Source]:
    if section.part == DIFFUSERS:
        return {n: Source(n) for n in names if n.startswith(section.owns)}
    return layouts.sources(section.part, names)


def _layers(names) -> int:
    return len({m.group(1) for m in (re.match(r"^(?:text_model\.)?encoder\.layers\.(\d+)\.", n) for n in names) if m})


def _known_unused(section: Section, key: str, names, layers: int) -> bool:
    """Tensors of a part the diffusers model has no place for, by design: SD 2.x reads OpenCLIP's penultimate layer
    (its encoder lacks the last block) and has no text projection."""
    if _NOT_WEIGHTS.match(key):
        return True
    if section.part == OPENCLIP:
        last = re.match(rf"^transformer\.resblocks\.{layers}\.", key)
        return bool(last) or (key == "text_projection" and "text_projection.weight" not in names)
    if section.part == CLIP:  # ComfyUI keeps CLIP-L's projection; Flux's text encoder (no projection) never reads it
        return key == "text_projection.weight" and key not in names
    return False


def _unread(section: Section, key: str, layers: int) -> bool:
    """Tensors the model has but its graph never reads (SDXL's first encoder stops at the penultimate layer): not
    offered, so a fine-tune that changed them is not refused for a change that could not show."""
    if not section.penultimate:
        return False
    return bool(re.match(rf"^text_model\.(encoder\.layers\.{layers - 1}\.|final_layer_norm\.)", key))


def component_part(
    path: str | Path, component: str, ref: str, mapped_shapes: dict[str, tuple[int, ...]], names
) -> PartView | None:
    """`component`'s part of the file at `path` (None: the file is in the component's own names: read it as it is).
    `names`: every tensor name of the component's base checkpoint; `mapped_shapes`: those the artifact holds, with
    their shapes. Raises WeightsError, naming the file and what it is, when the part does not fit."""
    opened = open_file(path)
    layout = opened.layout
    if layout is None:
        return None
    names = list(names)
    file_fits_component(opened.path, layout, names, ref)
    section = layout.components.get(component)
    if section is None or not opened.section_keys(section):
        has = ", ".join(opened.components()) or "nothing"
        raise WeightsError(
            f"{opened.path} is {layout.title}: it has no part for {ref} (it holds {has})",
            hint="give each component the file that holds its weights (Pipeline.load routes them)",
        )
    table: dict[str, list[tuple[str, Source]]] = {}
    for name, source in _sources(section, names).items():
        table.setdefault(section.prefix + source.key, []).append((name, source))
    found, homeless, misfits = {}, [], []
    layers = _layers(names)
    for key in opened.section_keys(section):
        if key not in table:
            if not _known_unused(section, key[len(section.prefix) :], names, layers):
                homeless.append(key)
            continue
        if _unread(section, key[len(section.prefix) :], layers):
            continue
        for name, source in table[key]:
            shape = source.shape(opened.tensors.entries[key].shape)
            want = mapped_shapes.get(name)
            if want is not None and tuple(want) != shape:
                misfits.append(f"{key} {list(shape)} vs {list(want)}")
            else:
                found[name] = (key, source)
    if homeless or misfits:
        parts = []
        if homeless:
            parts.append(
                f"{len(homeless)} tensor(s) have no place in it "
                f"({', '.join(homeless[:3])}{', …' if len(homeless) > 3 else ''})"
            )
        if misfits:
            parts.append(
                f"{len(misfits)} differ in shape ({', '.join(misfits[:3])}{', …' if len(misfits) > 3 else ''})"
            )
        raise WeightsError(
            f"{opened.path} is {layout.title}; its {component} part does not fit {ref}: {'; '.join(parts)}",
            hint="use a checkpoint of this model's family and size",
        )
    return PartView(opened.path, opened.tensors, found)


def same_family(path: str | Path, family_id: str) -> None:
    """Raises, naming the file and what it is, when a file of a known layout is for another family."""
    opened = open_file(path)
    if opened.layout is not None and family_id not in opened.layout.families:
        raise WeightsError(
            f"{opened.path} is {opened.layout.title}; this model is {family_id}",
            hint=f"use a checkpoint made for {family_id}",
        )
