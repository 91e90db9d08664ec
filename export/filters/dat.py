"""DAT (Dual Aggregation Transformer: `4xNomos8kDAT.pth` and the DAT, DAT-S, DAT-2, DAT-light files), recognised from
its keys as spandrel recognises it and exported as spandrel's module at one fixed tile (see swinir.py: its
rectangle-window masks and padding are computed from the input's size in Python)."""

from __future__ import annotations

from .registry import Architecture, Parts, Source
from .swinir import fixed_tile_parts, load_with_spandrel

_BLOCK = "layers.0.blocks.0."
# spandrel's detection rule: the spatial-window and channel attention, their interaction branches and the
# spatial-gate feed-forward of the first block
_KEYS = (
    "conv_first.weight",
    "before_RG.1.weight",
    "before_RG.1.bias",
    "norm.weight",
    *(
        _BLOCK + k
        for k in (
            "norm1.weight",
            "norm2.weight",
            "ffn.fc1.weight",
            "ffn.sg.norm.weight",
            "ffn.sg.conv.weight",
            "ffn.fc2.weight",
            "attn.qkv.weight",
            "attn.proj.weight",
            "attn.dwconv.0.weight",
            "attn.dwconv.1.running_mean",
            "attn.channel_interaction.1.weight",
            "attn.channel_interaction.2.running_mean",
            "attn.channel_interaction.4.weight",
            "attn.spatial_interaction.0.weight",
            "attn.spatial_interaction.1.running_mean",
            "attn.spatial_interaction.3.weight",
            "attn.attns.0.rpe_biases",
            "attn.attns.0.relative_position_index",
            "attn.attns.0.pos.pos_proj.weight",
            "attn.attns.0.pos.pos1.0.weight",
            "attn.attns.0.pos.pos3.0.weight",
        )
    ),
)


def is_dat(source: Source) -> bool:
    s = source.state
    if not all(k in s for k in _KEYS):
        return False
    # the residual connection (one conv or three) and the upsampler (pixel shuffle or the direct, lightweight one)
    one_conv = "conv_after_body.weight" in s
    return (one_conv or "conv_after_body.4.weight" in s) and (
        (one_conv and "conv_before_upsample.0.weight" in s and "conv_last.weight" in s) or "upsample.0.weight" in s
    )


def build_dat(source: Source) -> Parts:
    descriptor = load_with_spandrel(source, "DAT")
    h = descriptor.model.hyperparameters
    split = [int(n) for n in h["split_size"]]
    embed, heads = int(h["embed_dim"]), [int(n) for n in h["num_heads"]]
    details = {
        "embed_dim": embed,
        "depths": [int(d) for d in h["depth"]],
        "num_heads": heads,
        "split_size": split,
        "expansion_factor": float(h["expansion_factor"]),
        "upsampler": h["upsampler"],
        "resi_connection": h["resi_connection"],
    }
    scale = int(descriptor.scale)
    # the spatial attention pads each side to a multiple of the longer window side
    channels = max(int(embed * float(h["expansion_factor"])), max(heads) * split[0] * split[1], 64 * scale * scale)
    return fixed_tile_parts("DAT", descriptor.model, scale, max(split), details, channels)


ARCHITECTURES = [Architecture("DAT (Dual Aggregation Transformer)", "upscaler", is_dat, build_dat)]
