"""HAT (Hybrid Attention Transformer: `Real_HAT_GAN_SRx4.pth`, HAT-S, HAT-L), recognised from its keys as spandrel
recognises it and exported as spandrel's module at one fixed tile (see swinir.py: its windows' masks are computed
from the input's size in Python)."""

from __future__ import annotations

from .registry import Architecture, Parts, Source
from .swinir import fixed_tile_parts, load_with_spandrel

_BLOCK = "layers.0.residual_group.blocks.0."
_OVERLAP = "layers.0.residual_group.overlap_attn."
# spandrel's detection rule: the shared window index, the channel-attention conv block and the overlapping
# cross-attention that set HAT apart from SwinIR
_KEYS = (
    "relative_position_index_SA",
    "conv_first.weight",
    _BLOCK + "norm1.weight",
    _BLOCK + "conv_block.cab.0.weight",
    _BLOCK + "conv_block.cab.2.weight",
    _BLOCK + "conv_block.cab.3.attention.1.weight",
    _BLOCK + "conv_block.cab.3.attention.3.weight",
    _BLOCK + "mlp.fc1.bias",
    _BLOCK + "mlp.fc2.weight",
    _OVERLAP + "relative_position_bias_table",
    _OVERLAP + "qkv.weight",
    _OVERLAP + "proj.weight",
    _OVERLAP + "mlp.fc1.weight",
    _OVERLAP + "mlp.fc2.weight",
    "conv_last.weight",
)


def is_hat(source: Source) -> bool:
    return all(k in source.state for k in _KEYS)


def build_hat(source: Source) -> Parts:
    descriptor = load_with_spandrel(source, "HAT")
    h = descriptor.model.hyperparameters
    window = int(h["window_size"])
    # the overlapping cross-attention reads windows of window·(1 + overlap_ratio) around each window
    overlap_window = window + int(float(h["overlap_ratio"]) * window)
    embed, heads = int(h["embed_dim"]), [int(n) for n in h["num_heads"]]
    details = {
        "embed_dim": embed,
        "depths": [int(d) for d in h["depths"]],
        "num_heads": heads,
        "window_size": window,
        "overlap_ratio": float(h["overlap_ratio"]),
        "compress_ratio": h["compress_ratio"],
        "squeeze_factor": h["squeeze_factor"],
        "upsampler": h["upsampler"],
        "resi_connection": h["resi_connection"],
    }
    scale = int(descriptor.scale)
    channels = max(
        int(embed * float(h["mlp_ratio"])), max(heads) * overlap_window**2, int(h["num_feat"]) * scale * scale
    )
    return fixed_tile_parts("HAT", descriptor.model, scale, window, details, channels)


ARCHITECTURES = [Architecture("HAT (Hybrid Attention Transformer)", "upscaler", is_hat, build_hat)]
