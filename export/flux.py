"""What the export of a packed transformer (Flux's, Chroma's: a family whose `latent_packing` trait is 2) needs for
ONNX files whose dynamic dims really are dynamic (checked at a second shape by `export.check`).

The contract is the SD3 transformer's: unpacked latents in and out, (batch, channels, height, width). The exporter
(export/wrappers.py, PackedTransformer) packs them into 2x2-patch tokens, builds the position ids (image: (0, row,
column); text: zeros) and unpacks the result inside the graph with the functions here, so every dynamic dim is
batch, height or width, which recipe profiles already range, and the runtime's denoising loop is the same for every
transformer family.

Three things in diffusers 0.42 stop a plain `torch.onnx.export(dynamo=False)`, each fixed for the duration of the
export only (`traceable_flux`):
- `aten::rms_norm` (nn.RMSNorm, the attention's query/key norms) has no opset-17 symbolic: one is registered that
  writes x / sqrt(mean(x²) + eps) · weight;
- the rotary embedding reshapes with `x.reshape(*x.shape[:-1], -1, 2)`: the tracer records those sizes as
  constants, so the file ran only at its export shape although its dims were declared dynamic. The same rotation
  is written as a matmul with a constant ±1 pair-swap matrix (exact: each output is one input times ±1);
- Chroma's timestep embedding builds its guidance input with `torch.tensor([0] * batch_size)`, a constant batch.
"""

from __future__ import annotations

from contextlib import contextmanager

# An unset eps in torch's RMSNorm means float32's machine epsilon.
_FLOAT32_EPS = 1.1920928955078125e-07


@contextmanager
def traceable_flux():
    """Patch what the tracer cannot follow (see the module's doc) and restore it afterwards."""
    import torch
    from diffusers.models.transformers import transformer_chroma, transformer_flux

    rotary, chroma_embed = (
        transformer_flux.apply_rotary_emb,
        transformer_chroma.ChromaCombinedTimestepTextProjEmbeddings.forward,
    )
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm_symbolic, 17)
    transformer_flux.apply_rotary_emb = _rotary
    transformer_chroma.ChromaCombinedTimestepTextProjEmbeddings.forward = _chroma_timestep_embedding
    try:
        yield
    finally:
        transformer_flux.apply_rotary_emb = rotary
        transformer_chroma.ChromaCombinedTimestepTextProjEmbeddings.forward = chroma_embed
        torch.onnx.unregister_custom_op_symbolic("aten::rms_norm", 17)


def _rms_norm_symbolic(g, x, normalized_shape, weight, eps):
    import torch
    from torch.onnx import symbolic_helper

    axes = list(range(-len(symbolic_helper._parse_arg(normalized_shape, "is")), 0))
    epsilon = _FLOAT32_EPS if symbolic_helper._is_none(eps) else symbolic_helper._parse_arg(eps, "f")
    mean_square = g.op("ReduceMean", g.op("Mul", x, x), axes_i=axes, keepdims_i=1)
    denominator = g.op(
        "Sqrt", g.op("Add", mean_square, g.op("Constant", value_t=torch.tensor(epsilon, dtype=torch.float32)))
    )
    normed = g.op("Div", x, denominator)
    return normed if symbolic_helper._is_none(weight) else g.op("Mul", normed, weight)


def _rotary(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=1):
    """diffusers' apply_rotary_emb as Flux calls it (real cos/sin, interleaved pairs, tokens on axis 1): the pair
    (a, b) becomes (a·cos - b·sin, b·cos + a·sin); the swap (a, b) → (-b, a) is a matmul with a constant matrix."""
    import torch

    if not use_real or use_real_unbind_dim != -1 or sequence_dim != 1:
        raise NotImplementedError(
            "the ONNX export rewrites only Flux's rotary embedding (interleaved, tokens on axis 1)"
        )
    cos, sin = freqs_cis
    width = x.shape[-1]
    swap = torch.zeros(width, width)
    swap[torch.arange(1, width, 2), torch.arange(0, width, 2)] = -1.0
    swap[torch.arange(0, width, 2), torch.arange(1, width, 2)] = 1.0
    real = x.float()
    return (real * cos[None, :, None, :] + (real @ swap) * sin[None, :, None, :]).to(x.dtype)


def _chroma_timestep_embedding(self, timestep):
    """ChromaCombinedTimestepTextProjEmbeddings.forward with the batch taken from `timestep`'s shape, not a list."""
    import torch

    mod_index_length = self.mod_proj.shape[0]
    timesteps_proj = self.time_proj(timestep).to(dtype=timestep.dtype)
    guidance_proj = self.guidance_proj(torch.zeros_like(timestep)).to(dtype=timestep.dtype)
    timestep_guidance = torch.cat([timesteps_proj, guidance_proj], dim=1).unsqueeze(1).repeat(1, mod_index_length, 1)
    mod_proj = self.mod_proj.to(dtype=timesteps_proj.dtype)[None] * torch.ones_like(timestep)[:, None, None]
    return torch.cat([timestep_guidance, mod_proj], dim=-1).to(timestep.dtype)


def pack(latents):
    """(batch, channels, height, width) → (batch, height/2 · width/2, channels · 4): Flux's 2x2 patches, row-major,
    each patch's features channel-major (c, dy, dx), written with dynamic-shape ops only."""
    import torch

    patches = torch.nn.functional.pixel_unshuffle(latents, 2)  # (b, c·4, h/2, w/2), channel c·4 + dy·2 + dx
    return patches.flatten(2).transpose(1, 2)


def unpack(tokens, like):
    """The inverse of `pack`, back to `like`'s latent shape."""
    import torch

    rows = like[:, :1, ::2, ::2]  # (b, 1, h/2, w/2): carries the patch grid's shape, dynamically
    grid = tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], rows.shape[2], rows.shape[3])
    return torch.nn.functional.pixel_shuffle(grid, 2)


def position_ids(latents, text):
    """(image ids, text ids): (0, row, column) of each patch, row-major; zeros for each text token."""
    import torch

    column = latents[0, 0, 0, ::2]  # one value per patch column
    row = latents[0, 0, ::2, 0]
    columns = torch.ones_like(column).cumsum(0) - 1
    rows = torch.ones_like(row).cumsum(0) - 1
    grid_rows = rows[:, None] + torch.zeros_like(columns)[None, :]
    grid_columns = torch.zeros_like(rows)[:, None] + columns[None, :]
    image = torch.stack([torch.zeros_like(grid_rows), grid_rows, grid_columns], dim=-1).reshape(-1, 3)
    text_ids = torch.zeros_like(text[0, :, :1]).repeat(1, 3)
    return image, text_ids
