"""Original (LDM / SGM) key names of each model part, as diffusers names them: the data behind single-file
checkpoints, VAE files and LoRAs in the original layout's names.

One direction is written: a diffusers name → where the original layout keeps that tensor (`Source`). Reading a file
inverts it over the names the model actually has (its weight map), so the layout's numbering (which depends on
layers per block and on which up-blocks have attention) is computed from the model, never guessed.

    original_names(UNET, names)["down_blocks.0.attentions.0.proj_in.weight"]  →  "input_blocks.1.1.proj_in.weight"
    diffusers_name(UNET, "input_blocks.1.1.proj_in", module_names)            →  "down_blocks.0.attentions.0.proj_in"

Names may be tensors (`….weight`) or modules: the rules rename prefixes only. Parts: UNET (the denoiser, LDM's
`model.diffusion_model.*` without that prefix), CLIP (transformers' CLIP text model: the same names with
`text_model.`), OPENCLIP (open_clip's text tower: SD 2.x and SDXL's second encoder; q/k/v fused in `in_proj`),
VAE (LDM's autoencoder: `encoder.down.0.block.0…`, mid attention as 1×1 convolutions); FLUX and SD3, the
transformers as Black Forest Labs and Stability ship them (`transformer_layouts.py`)."""

from __future__ import annotations

import re

from .tensor_source import Source

UNET, CLIP, OPENCLIP, VAE = "unet", "clip", "openclip", "vae"
FLUX, SD3, CHROMA = "flux", "sd3", "chroma"  # the transformers' original layouts (transformer_layouts.py)
PARTS = (UNET, CLIP, OPENCLIP, VAE, FLUX, SD3, CHROMA)


# -- UNet: LDM numbers input_blocks / output_blocks flat; diffusers nests blocks → resnets / attentions.

_UNET_TOP = {
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "add_embedding.linear_1": "label_emb.0.0",
    "add_embedding.linear_2": "label_emb.0.2",  # SDXL's pooled text + time ids
    "conv_in": "input_blocks.0.0",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}
_UNET_RESNET = {
    "norm1": "in_layers.0",
    "conv1": "in_layers.2",
    "time_emb_proj": "emb_layers.1",
    "norm2": "out_layers.0",
    "conv2": "out_layers.3",
    "conv_shortcut": "skip_connection",
}
_MID = {("resnets", 0): "middle_block.0", ("attentions", 0): "middle_block.1", ("resnets", 1): "middle_block.2"}
_BLOCK = re.compile(r"^(down_blocks|up_blocks)\.(\d+)\.(resnets|attentions|downsamplers|upsamplers)\.(\d+)(\.(.*))?$")
_MID_BLOCK = re.compile(r"^mid_block\.(resnets|attentions)\.(\d+)(\.(.*))?$")


def _rename(rest: str, table: dict[str, str]) -> str:
    for new, old in table.items():
        if rest == new or rest.startswith(new + "."):
            return old + rest[len(new) :]
    return rest


def _join(head: str, rest: str | None) -> str:
    return head + ("." + rest if rest else "")


class _Unet:
    def __init__(self, names) -> None:
        resnets = {
            int(m.group(4))
            for m in map(_BLOCK.match, names)
            if m and m.group(1) == "down_blocks" and m.group(3) == "resnets"
        }
        self.layers = max(resnets, default=1) + 1  # layers per block; up blocks have one more
        self.up_with_attention = {
            int(m.group(2))
            for m in map(_BLOCK.match, names)
            if m and m.group(1) == "up_blocks" and m.group(3) == "attentions"
        }

    def source(self, name: str) -> Source | None:
        block = _BLOCK.match(name)
        if block:
            kind, b, what, i, rest = (
                block.group(1),
                int(block.group(2)),
                block.group(3),
                int(block.group(4)),
                block.group(6),
            )
            if kind == "down_blocks":
                first = 1 + b * (self.layers + 1)
                if what == "downsamplers":
                    return Source(_join(f"input_blocks.{first + self.layers}.0", _rename(rest or "", {"conv": "op"})))
                return Source(
                    _join(
                        f"input_blocks.{first + i}.{0 if what == 'resnets' else 1}",
                        _rename(rest or "", _UNET_RESNET) if what == "resnets" else rest,
                    )
                )
            first = b * (self.layers + 1)
            if what == "upsamplers":
                return Source(
                    _join(f"output_blocks.{first + self.layers}.{2 if b in self.up_with_attention else 1}", rest)
                )
            return Source(
                _join(
                    f"output_blocks.{first + i}.{0 if what == 'resnets' else 1}",
                    _rename(rest or "", _UNET_RESNET) if what == "resnets" else rest,
                )
            )
        mid = _MID_BLOCK.match(name)
        if mid:
            head = _MID.get((mid.group(1), int(mid.group(2))))
            rest = mid.group(4)
            return (
                Source(_join(head, _rename(rest or "", _UNET_RESNET) if mid.group(1) == "resnets" else rest))
                if head
                else None
            )
        renamed = _rename(name, _UNET_TOP)
        return Source(renamed) if renamed != name else None


# -- CLIP text models: transformers 5 drops `text_model.` from CLIPTextModel's names (not from ...WithProjection's);
# the original layout always has it.


def _clip_core(name: str) -> str:
    return name[len("text_model.") :] if name.startswith("text_model.") else name


def _clip(name: str) -> Source | None:
    return Source("text_model." + _clip_core(name)) if name != "text_projection.weight" else Source(name)


_OPENCLIP_TOP = {
    "embeddings.token_embedding": "token_embedding",
    "embeddings.position_embedding.weight": "positional_embedding",
    "final_layer_norm": "ln_final",
    "text_projection.weight": "text_projection",
}
_OPENCLIP_LAYER = {
    "layer_norm1": "ln_1",
    "layer_norm2": "ln_2",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
    "self_attn.out_proj": "attn.out_proj",
}
_LAYER = re.compile(r"^encoder\.layers\.(\d+)(\.(.*))?$")
_QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}


def _openclip(name: str) -> Source | None:
    core = _clip_core(name)
    layer = _LAYER.match(core)
    if not layer:
        renamed = _rename(core, _OPENCLIP_TOP)
        return Source(renamed, transpose=core == "text_projection.weight") if renamed != core else None
    head, rest = f"transformer.resblocks.{layer.group(1)}", layer.group(3) or ""
    parts = rest.split(".")
    if len(parts) >= 2 and parts[0] == "self_attn" and parts[1] in _QKV:
        if len(parts) == 2:  # a module name: the fused projection holds it
            return Source(f"{head}.attn.in_proj")
        return Source(f"{head}.attn.in_proj_{parts[2]}", take=(_QKV[parts[1]], _QKV[parts[1]] + 1, 3))
    return Source(_join(head, _rename(rest, _OPENCLIP_LAYER)))


# -- VAE: LDM numbers the decoder's levels from the bottom (up.0 is diffusers' last up block).

_VAE_BLOCK = re.compile(
    r"^(encoder|decoder)\.(down_blocks|up_blocks)\.(\d+)\.(resnets|downsamplers|upsamplers)\.(\d+)(\.(.*))?$"
)
_VAE_MID = re.compile(r"^(encoder|decoder)\.mid_block\.(resnets|attentions)\.(\d+)(\.(.*))?$")
_VAE_RESNET = {"conv_shortcut": "nin_shortcut"}
_VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


class _Vae:
    def __init__(self, names) -> None:
        ups = {int(m.group(3)) for m in map(_VAE_BLOCK.match, names) if m and m.group(2) == "up_blocks"}
        self.ups = max(ups, default=-1) + 1

    def source(self, name: str) -> Source | None:
        block = _VAE_BLOCK.match(name)
        if block:
            half, kind, b, what, rest = (
                block.group(1),
                block.group(2),
                int(block.group(3)),
                block.group(4),
                block.group(7),
            )
            level = f"{half}.down.{b}" if kind == "down_blocks" else f"{half}.up.{self.ups - 1 - b}"
            if what == "resnets":
                return Source(_join(f"{level}.block.{block.group(5)}", _rename(rest or "", _VAE_RESNET)))
            return Source(_join(f"{level}.{'downsample' if what == 'downsamplers' else 'upsample'}", rest))
        mid = _VAE_MID.match(name)
        if mid:
            half, what, i, rest = mid.group(1), mid.group(2), int(mid.group(3)), mid.group(5) or ""
            if what == "resnets":
                return Source(_join(f"{half}.mid.block_{i + 1}", _rename(rest, _VAE_RESNET)))
            renamed = _rename(rest, _VAE_ATTENTION)
            return Source(
                _join(f"{half}.mid.attn_1", renamed),
                squeeze=renamed.split(".")[0] != "norm" and renamed.endswith("weight"),
            )
        if name.startswith(("encoder.conv_norm_out", "decoder.conv_norm_out")):
            return Source(name.replace("conv_norm_out", "norm_out"))
        if name.startswith(
            (
                "encoder.conv_in",
                "encoder.conv_out",
                "decoder.conv_in",
                "decoder.conv_out",
                "quant_conv",
                "post_quant_conv",
            )
        ):
            return Source(name)
        return None


def sources(part: str, names) -> dict[str, Source]:
    """diffusers name → where the original layout keeps it, for each of `names` the layout has (tensor or module
    names of one model part, as its diffusers/transformers state dict spells them)."""
    names = list(names)
    if part == UNET:
        rule = _Unet(names).source
    elif part == VAE:
        rule = _Vae(names).source
    elif part == CLIP:
        rule = _clip
    elif part == OPENCLIP:
        rule = _openclip
    elif part == FLUX:
        from .transformer_layouts import flux as rule
    elif part == CHROMA:
        from .transformer_layouts import chroma as rule
    elif part == SD3:
        from .transformer_layouts import Sd3

        rule = Sd3(names).source
    else:
        raise ValueError(f"unknown part {part!r}; one of {', '.join(PARTS)}")
    found = {name: rule(name) for name in names}
    return {name: source for name, source in found.items() if source is not None}


def original_names(part: str, names) -> dict[str, str]:
    """diffusers name → original key (values that the original layout fuses or reshapes share or keep their key)."""
    return {name: source.key for name, source in sources(part, names).items()}


def diffusers_names(part: str, names) -> dict[str, list[str]]:
    """original key → the diffusers names it holds (one, or q/k/v for OpenCLIP's fused in_proj), over `names`."""
    out: dict[str, list[str]] = {}
    for name, source in sources(part, names).items():
        out.setdefault(source.key, []).append(name)
    return out


def diffusers_name(part: str, original: str, names) -> str | None:
    """The diffusers name of one original key or module (None: `names` has nothing there; for a fused OpenCLIP
    in_proj, the first of q/k/v)."""
    found = diffusers_names(part, names).get(original)
    return found[0] if found else None
