"""Original key names of the diffusion transformers as their publishers ship them, as diffusers names them: Flux.1's
(Black Forest Labs' `double_blocks.0.img_attn.qkv.weight`, `single_blocks.0.linear1.weight`) and SD3/SD3.5's MMDiT
(Stability's `joint_blocks.0.x_block.attn.qkv.weight`). The same direction and `Source` as `layouts.py` (which
dispatches here): a diffusers name → where the original keeps it. Both fuse q, k and v into one `qkv`; Flux's single
blocks fuse q, k, v and the MLP's input into `linear1` (the MLP is four units wide: diffusers' Flux fixes mlp_ratio
at 4); the final adaLN holds (shift, scale) where diffusers holds (scale, shift). A rule names a module or one of
its tensors; the table maps module prefixes, so `….weight` and `….bias` follow their module."""

from __future__ import annotations

import re

from .tensor_source import Source

FLUX, SD3, CHROMA = "flux", "sd3", "chroma"

_QKV = ("q", "k", "v")


def _fused(head: str, names: tuple[str, ...], n: int) -> dict[str, tuple[str, tuple[int, int, int]]]:
    return {name: (head, (i, i + 1, n)) for i, name in enumerate(names)}


# diffusers module (after the block's prefix) → (original module, rows taken or None)
_FLUX_DOUBLE = {
    "norm1.linear": ("img_mod.lin", None),
    "norm1_context.linear": ("txt_mod.lin", None),
    **_fused("img_attn.qkv", tuple(f"attn.to_{x}" for x in _QKV), 3),
    **_fused("txt_attn.qkv", tuple(f"attn.add_{x}_proj" for x in _QKV), 3),
    "attn.to_out.0": ("img_attn.proj", None),
    "attn.to_add_out": ("txt_attn.proj", None),
    "ff.net.0.proj": ("img_mlp.0", None),
    "ff.net.2": ("img_mlp.2", None),
    "ff_context.net.0.proj": ("txt_mlp.0", None),
    "ff_context.net.2": ("txt_mlp.2", None),
}
_FLUX_SINGLE = {
    "norm.linear": ("modulation.lin", None),
    "proj_out": ("linear2", None),
    "proj_mlp": ("linear1", (3, 7, 7)),
    **_fused("linear1", tuple(f"attn.to_{x}" for x in _QKV), 7),
}
# RMSNorm scales: tensors, not modules (diffusers' `.weight` is the original's `.scale`)
_FLUX_DOUBLE_NORMS = {
    "attn.norm_q.weight": "img_attn.norm.query_norm.scale",
    "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
    "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
    "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
}
_FLUX_SINGLE_NORMS = {"attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale"}
_FLUX_TOP = {
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "context_embedder": "txt_in",
    "x_embedder": "img_in",
    "proj_out": "final_layer.linear",
}
_FINAL_ADALN = ("norm_out.linear", "final_layer.adaLN_modulation.1")  # (scale, shift) vs (shift, scale): swapped

_SD3_BLOCK = {
    **_fused("x_block.attn.qkv", tuple(f"attn.to_{x}" for x in _QKV), 3),
    **_fused("context_block.attn.qkv", tuple(f"attn.add_{x}_proj" for x in _QKV), 3),
    **_fused("x_block.attn2.qkv", tuple(f"attn2.to_{x}" for x in _QKV), 3),  # SD3.5 medium's second attention
    "attn.norm_q": ("x_block.attn.ln_q", None),
    "attn.norm_k": ("x_block.attn.ln_k", None),
    "attn.norm_added_q": ("context_block.attn.ln_q", None),
    "attn.norm_added_k": ("context_block.attn.ln_k", None),
    "attn2.norm_q": ("x_block.attn2.ln_q", None),
    "attn2.norm_k": ("x_block.attn2.ln_k", None),
    "attn.to_out.0": ("x_block.attn.proj", None),
    "attn.to_add_out": ("context_block.attn.proj", None),
    "attn2.to_out.0": ("x_block.attn2.proj", None),
    "norm1.linear": ("x_block.adaLN_modulation.1", None),
    "norm1_context.linear": ("context_block.adaLN_modulation.1", None),
    "ff.net.0.proj": ("x_block.mlp.fc1", None),
    "ff.net.2": ("x_block.mlp.fc2", None),
    "ff_context.net.0.proj": ("context_block.mlp.fc1", None),
    "ff_context.net.2": ("context_block.mlp.fc2", None),
}
_SD3_TOP = {
    "pos_embed.proj": "x_embedder.proj",
    "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
    "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
    "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
    "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
    "context_embedder": "context_embedder",
    "proj_out": "final_layer.linear",
}
_BLOCK = re.compile(r"^(transformer_blocks|single_transformer_blocks)\.(\d+)\.(.+)$")


def _module(rest: str, table: dict) -> tuple[str, tuple | None, str] | None:
    """(original module, rows, the tensor's suffix) for a name under one of the table's modules."""
    for new, (old, take) in table.items():
        if rest == new or rest.startswith(new + "."):
            return old, take, rest[len(new) :]
    return None


def _top(name: str, table: dict[str, str]) -> Source | None:
    for new, old in table.items():
        if name == new or name.startswith(new + "."):
            return Source(old + name[len(new) :])
    head, original = _FINAL_ADALN
    if name == head or name.startswith(head + "."):
        return Source(original + name[len(head) :], swap=True)
    return None


def flux(name: str) -> Source | None:
    block = _BLOCK.match(name)
    if not block:
        return _top(name, _FLUX_TOP)
    double = block.group(1) == "transformer_blocks"
    head, rest = f"{'double' if double else 'single'}_blocks.{block.group(2)}", block.group(3)
    norm = (_FLUX_DOUBLE_NORMS if double else _FLUX_SINGLE_NORMS).get(rest)
    if norm is not None:
        return Source(f"{head}.{norm}")
    found = _module(rest, _FLUX_DOUBLE if double else _FLUX_SINGLE)
    return Source(f"{head}.{found[0]}{found[2]}", take=found[1]) if found else None


# Chroma: Flux.1's blocks without their modulation (one approximator network computes it from the timestep)
_CHROMA_APPROXIMATOR = re.compile(
    r"^distilled_guidance_layer\.(?:layers\.(\d+)\.linear_([12])|norms\.(\d+)\.weight)(.*)$"
)


def chroma(name: str) -> Source | None:
    approximator = _CHROMA_APPROXIMATOR.match(name)
    if approximator:
        layer, linear, norm, rest = approximator.groups()
        if norm is not None:
            return Source(f"distilled_guidance_layer.norms.{norm}.scale")
        return Source(f"distilled_guidance_layer.layers.{layer}.{'in_layer' if linear == '1' else 'out_layer'}{rest}")
    if name.startswith(("distilled_guidance_layer.in_proj.", "distilled_guidance_layer.out_proj.")):
        return Source(name)
    return flux(name)


class Sd3:
    """MMDiT: the last joint block's context half is pre-only (no projection out, no MLP) and its adaLN is the
    continuous kind, which holds (shift, scale) as the final layer's does."""

    def __init__(self, names) -> None:
        blocks = {int(m.group(2)) for m in map(_BLOCK.match, names) if m}
        self.last = max(blocks, default=-1)

    def source(self, name: str) -> Source | None:
        if name == "pos_embed.pos_embed":
            return Source("pos_embed")
        block = _BLOCK.match(name)
        if not block:
            return _top(name, _SD3_TOP)
        if block.group(1) != "transformer_blocks":
            return None
        found = _module(block.group(3), _SD3_BLOCK)
        if found is None:
            return None
        swap = int(block.group(2)) == self.last and found[0] == "context_block.adaLN_modulation.1"
        return Source(f"joint_blocks.{block.group(2)}.{found[0]}{found[2]}", take=found[1], swap=swap)
