"""Which denoiser a file is for, and whether that is the model's: a file for another family fails in one line
naming the file and both families, before anything is read or compiled.

Two callers: a pipeline knows its family (`same_family`); `enginefarm.load("MODEL/COMPONENT", weights=, loras=)`
knows only the component, so its kind is told by its checkpoint's names (`kind_of_component`: a UNet has top-level
`down_blocks.`, Flux's and Chroma's transformers `single_transformer_blocks.`, SD3's only `transformer_blocks.`).
A file whose names say no kind (a LoRA of text-encoder layers only) is not judged here: its names are checked later."""

from __future__ import annotations

from enginefarm.errors import WeightsError
from enginefarm.families import FAMILIES

# kind → (its module names in LoRAs, original or diffusers, dotted or kohya's '_'; the `blocks` trait of the
# families it fits)
DENOISERS = {
    "Flux": (("double_blocks", "single_blocks", "single_transformer_blocks"), "double-single"),
    "SD3": (("joint_blocks",), "mmdit"),
    "UNet (SD 1.x/2.x/SDXL)": (
        ("down_blocks", "up_blocks", "mid_block", "input_blocks", "output_blocks", "middle_block"),
        "unet",
    ),
}
UNET_KIND = "UNet (SD 1.x/2.x/SDXL)"


def families_of(kind: str) -> tuple[str, ...]:
    """The ids of the families whose denoiser has this kind's blocks, in the family table's order."""
    return tuple(f.id for f in FAMILIES.values() if f.traits.blocks == DENOISERS[kind][1])


def denoiser_of(parsed) -> tuple[str, str] | None:
    """(kind, an example module) of the denoiser a LoRA file's layers are for, or None when its names do not say."""
    for layer in parsed.layers:
        if layer.part in ("unet", "transformer"):
            dotted = layer.local.replace("_", ".")  # kohya's and dotted names alike
            for kind, (marks, _) in DENOISERS.items():
                if any(mark.replace("_", ".") in dotted for mark in marks):
                    return kind, layer.module
    return None


def same_family(parsed, family, text_width: int | None = None) -> None:
    """Raises, in one line naming the file and both families, when the file's denoiser layers are another family's.
    `text_width`: the model's UNet cross-attention width (its config's cross_attention_dim), which tells the UNet
    families apart: an SDXL LoRA on an SD 1.x model is named as such, not as layers that name no module."""
    found = denoiser_of(parsed)
    if found is None:
        return
    kind, example = found
    if family.traits.blocks != DENOISERS[kind][1]:
        raise WeightsError(
            f"{parsed.path}: a {kind} LoRA (e.g. {example}); this model is {family.title} ({family.id})",
            hint=f"use a LoRA trained for {family.title}",
        )
    theirs = cross_attention_width(parsed) if kind == UNET_KIND and text_width else None
    if theirs is not None and theirs != text_width:
        named = _UNET_BY_TEXT_WIDTH.get(theirs)
        what = f"an {named} LoRA" if named else "a LoRA"
        raise WeightsError(
            f"{parsed.path}: {what} (its UNet layers read {theirs}-wide text); this model is {family.title}, "
            f"whose UNet reads {text_width}-wide text",
            hint=f"use a LoRA trained for {family.title}",
        )


# The real UNets' cross-attention widths (their text encoders' output), which a LoRA's attn2.to_k/to_v layers read.
_UNET_BY_TEXT_WIDTH = {768: "SD 1.x", 1024: "SD 2.x", 2048: "SDXL", 1280: "SDXL refiner"}


def cross_attention_width(parsed) -> int | None:
    """The text width a UNet LoRA's cross-attention key/value layers read, or None when it has none."""
    for layer in parsed.layers:
        dotted = layer.local.replace("_", ".")
        if layer.part == "unet" and "attn2" in dotted and (dotted.endswith("to.k") or dotted.endswith("to.v")):
            return layer.out_in()[1]
    return None


def kind_of_component(names) -> str | None:
    """The denoiser kind of a component by its checkpoint's tensor names, or None (not a denoiser)."""
    tops = {name.split(".", 1)[0] for name in names}
    if "single_transformer_blocks" in tops:
        return "Flux"
    if "transformer_blocks" in tops:
        return "SD3"
    if "down_blocks" in tops and "conv_in" in tops:
        return UNET_KIND
    return None


def lora_fits_component(parsed, names, ref: str) -> None:
    """A LoRA loaded on one component (`ref`, checkpoint tensor `names`): raises when its denoiser layers are for
    another kind of denoiser than this component is."""
    found, mine = denoiser_of(parsed), kind_of_component(names)
    if found is None or mine is None or found[0] == mine:
        return
    kind, example = found
    raise WeightsError(
        f"{parsed.path}: a {kind} LoRA for {', '.join(families_of(kind))} (e.g. {example}); "
        f"{ref} is a {mine} denoiser, for {', '.join(families_of(mine))}",
        hint=f"use a LoRA trained for this {mine} model",
    )


def file_fits_component(path, layout, names, ref: str) -> None:
    """A whole-model or transformer file (`layout`, single_file.FileLayout) loaded on one component: raises when
    the layout's families are none of this denoiser's (a Flux file on SD3's transformer, an SDXL file on Flux's)."""
    mine = kind_of_component(names)
    if mine is None or set(layout.families) & set(families_of(mine)):
        return
    raise WeightsError(
        f"{path} is {layout.title}, for {', '.join(layout.families)}; {ref} is a {mine} denoiser, "
        f"for {', '.join(families_of(mine))}",
        hint=f"use a checkpoint made for this {mine} model",
    )
