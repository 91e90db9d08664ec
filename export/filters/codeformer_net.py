"""CodeFormer in torch at `codeformer.pth`'s key layout, its blocks read from the state dict (a block's keys say what
it is): a VQGAN encoder, a transformer that predicts each 16×16 position's codebook entry, the codebook lookup with the
encoder's statistics (AdaIN), and the VQGAN generator, into which the encoder's features are fused at the connected
resolutions with the fidelity weight `w` (0: the codebook's face, 1: closest to the input)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

# where the published CodeFormer taps its encoder and fuses into its generator, per feature size (blocks' indices)
ENCODER_TAPS = {"512": 2, "256": 5, "128": 8, "64": 11, "32": 14, "16": 18}
GENERATOR_FUSES = {"16": 6, "32": 9, "64": 12, "128": 15, "256": 18, "512": 21}
HEADS = 8  # the published model's; a state dict does not say it


def _conv(weight: torch.Tensor, stride: int = 1, padding: int | None = None) -> nn.Conv2d:
    out_ch, in_ch, k, _ = weight.shape
    return nn.Conv2d(in_ch, out_ch, k, stride, k // 2 if padding is None else padding)


def _norm(weight: torch.Tensor) -> nn.GroupNorm:
    return nn.GroupNorm(32, weight.shape[0], eps=1e-6)


class ResBlock(nn.Module):
    def __init__(self, state, prefix: str):
        super().__init__()
        self.norm1, self.conv1 = _norm(state[f"{prefix}.norm1.weight"]), _conv(state[f"{prefix}.conv1.weight"])
        self.norm2, self.conv2 = _norm(state[f"{prefix}.norm2.weight"]), _conv(state[f"{prefix}.conv2.weight"])
        self.conv_out = _conv(state[f"{prefix}.conv_out.weight"]) if f"{prefix}.conv_out.weight" in state else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (self.conv_out(x) if self.conv_out is not None else x)


class AttnBlock(nn.Module):
    def __init__(self, state, prefix: str):
        super().__init__()
        self.norm = _norm(state[f"{prefix}.norm.weight"])
        self.q, self.k, self.v, self.proj_out = (
            _conv(state[f"{prefix}.{n}.weight"]) for n in ("q", "k", "v", "proj_out")
        )

    def forward(self, x):
        b, c, h, w = x.shape
        normed = self.norm(x)
        q = self.q(normed).flatten(2).transpose(1, 2)  # [b, hw, c]
        k = self.k(normed).flatten(2)  # [b, c, hw]
        v = self.v(normed).flatten(2)
        weights = torch.softmax(q @ k * c**-0.5, dim=2)  # [b, hw (query), hw (key)]
        return x + self.proj_out((v @ weights.transpose(1, 2)).reshape(b, c, h, w))


class Downsample(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.conv = _conv(weight, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # padded right and below only, as the VQGAN trained


class Upsample(nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.conv = _conv(weight)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _blocks(state, prefix: str, resample) -> nn.ModuleList:
    """The blocks under `prefix`, each made as its keys say: a ResBlock, an attention block, a resampling conv, a
    GroupNorm (no activation after it, as CodeFormer's VQGAN has it) or a plain conv."""
    count = 1 + max(int(k[len(prefix) :].split(".")[0]) for k in state if k.startswith(prefix))
    blocks: list[nn.Module] = []
    for i in range(count):
        at = f"{prefix}{i}"
        if f"{at}.norm1.weight" in state:
            blocks.append(ResBlock(state, at))
        elif f"{at}.q.weight" in state:
            blocks.append(AttnBlock(state, at))
        elif f"{at}.conv.weight" in state:
            blocks.append(resample(state[f"{at}.conv.weight"]))
        elif state[f"{at}.weight"].ndim == 1:
            blocks.append(_norm(state[f"{at}.weight"]))
        else:
            blocks.append(_conv(state[f"{at}.weight"]))
    return nn.ModuleList(blocks)


class TransformerLayer(nn.Module):
    """Pre-norm self-attention (positions added to queries and keys) and a GELU MLP, torch's MultiheadAttention
    weights (`self_attn.in_proj_weight`, `out_proj`) used directly."""

    def __init__(self, state, prefix: str):
        super().__init__()
        dim = state[f"{prefix}.self_attn.in_proj_weight"].shape[1]
        self.self_attn = nn.Module()
        self.self_attn.in_proj_weight = nn.Parameter(torch.zeros(3 * dim, dim))
        self.self_attn.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.self_attn.out_proj = nn.Linear(dim, dim)
        hidden = state[f"{prefix}.linear1.weight"].shape[0]
        self.linear1, self.linear2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x, pos):  # x, pos: [tokens, dim]
        h = self.norm1(x)
        w, b = self.self_attn.in_proj_weight, self.self_attn.in_proj_bias
        dim = x.shape[-1]
        q = F.linear(h + pos, w[:dim], b[:dim])
        k = F.linear(h + pos, w[dim : 2 * dim], b[dim : 2 * dim])
        v = F.linear(h, w[2 * dim :], b[2 * dim :])
        split = [t.reshape(t.shape[0], HEADS, dim // HEADS).transpose(0, 1) for t in (q, k, v)]  # [heads, tokens, d]
        weights = torch.softmax(split[0] @ split[1].transpose(1, 2) * (dim // HEADS) ** -0.5, dim=-1)
        attended = (weights @ split[2]).transpose(0, 1).reshape(x.shape[0], dim)
        x = x + self.self_attn.out_proj(attended)
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class FuseBlock(nn.Module):
    """The encoder's feature and the generator's, joined into a scale and shift that `w` weighs."""

    def __init__(self, state, prefix: str):
        super().__init__()
        self.encode_enc = ResBlock(state, f"{prefix}.encode_enc")
        self.scale = nn.Sequential(
            _conv(state[f"{prefix}.scale.0.weight"]), nn.LeakyReLU(0.2), _conv(state[f"{prefix}.scale.2.weight"])
        )
        self.shift = nn.Sequential(
            _conv(state[f"{prefix}.shift.0.weight"]), nn.LeakyReLU(0.2), _conv(state[f"{prefix}.shift.2.weight"])
        )

    def forward(self, enc, dec, w):
        joined = self.encode_enc(torch.cat([enc, dec], dim=1))
        return dec + w * (dec * self.scale(joined) + self.shift(joined))


def _mean_std(x):
    flat = x.flatten(2)
    return flat.mean(dim=2)[..., None, None], (flat.var(dim=2) + 1e-5).sqrt()[..., None, None]


class CodeFormerRestorer(nn.Module):
    """face [1, 3, 512, 512] in [-1, 1], w [1] in [0, 1] → restored, the same range (one face per call)."""

    def __init__(self, state):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.blocks = _blocks(state, "encoder.blocks.", Downsample)
        self.generator = nn.Module()
        self.generator.blocks = _blocks(state, "generator.blocks.", Upsample)
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(*state["quantize.embedding.weight"].shape)
        self.position_emb = nn.Parameter(torch.zeros(state["position_emb"].shape))
        self.feat_emb = nn.Linear(*reversed(state["feat_emb.weight"].shape))
        layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("ft_layers."))
        self.ft_layers = nn.ModuleList(TransformerLayer(state, f"ft_layers.{i}") for i in range(layers))
        dim, codes = state["idx_pred_layer.1.weight"].shape[1], state["idx_pred_layer.1.weight"].shape[0]
        self.idx_pred_layer = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, codes, bias=False))
        self.connect = [s for s in GENERATOR_FUSES if f"fuse_convs_dict.{s}.scale.0.weight" in state]
        self.fuse_convs_dict = nn.ModuleDict({s: FuseBlock(state, f"fuse_convs_dict.{s}") for s in self.connect})

    def forward(self, face, w):
        taps = {ENCODER_TAPS[s]: s for s in self.connect}
        encoded: dict[str, torch.Tensor] = {}
        x = face
        for i, block in enumerate(self.encoder.blocks):
            x = block(x)
            if i in taps:
                encoded[taps[i]] = x
        tokens = self.feat_emb(x.flatten(2)[0].transpose(0, 1))  # [hw, dim]
        for layer in self.ft_layers:
            tokens = layer(tokens, self.position_emb)
        # the most likely code per position (softmax keeps the order), looked up in the codebook
        codes = self.idx_pred_layer(tokens).argmax(dim=-1)
        side = x.shape[-1]
        quant = self.quantize.embedding.weight[codes].transpose(0, 1).reshape(1, -1, side, side)
        quant_mean, quant_std = _mean_std(quant)
        x_mean, x_std = _mean_std(x)
        x = (quant - quant_mean) / quant_std * x_std + x_mean
        w = w.reshape(-1, 1, 1, 1)
        fuses = {GENERATOR_FUSES[s]: s for s in self.connect}
        for i, block in enumerate(self.generator.blocks):
            x = block(x)
            if i in fuses:
                x = self.fuse_convs_dict[fuses[i]](encoded[fuses[i]], x, w)
        return x
