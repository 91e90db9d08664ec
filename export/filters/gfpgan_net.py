"""GFPGAN v1.3/v1.4's network in torch (GFPGANv1Clean's layout and key names), sized from a state dict's shapes.
See gfpgan.py for what it is and where it differs from GFPGAN's inference script."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class ModulatedConv(nn.Module):
    def __init__(self, weight_shape, style_size: int, demodulate: bool, upsample: bool):
        super().__init__()
        _, out_ch, in_ch, k, _ = weight_shape
        self.modulation = nn.Linear(style_size, in_ch)
        self.weight = nn.Parameter(torch.zeros(weight_shape))
        self.demodulate, self.upsample, self.padding = demodulate, upsample, k // 2

    def forward(self, x, style):
        scale = self.modulation(style)  # [b, in]
        if self.upsample:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        weight = self.weight[0]
        out = F.conv2d(x * scale[:, :, None, None], weight, padding=self.padding)
        if self.demodulate:  # 1/|w·s| per output channel, from the squared weights summed over the kernel
            energy = weight.pow(2).sum(dim=(2, 3))  # [out, in]
            out = out * torch.rsqrt(scale.pow(2) @ energy.t() + 1e-8)[:, :, None, None]
        return out


class StyleConv(nn.Module):
    def __init__(self, weight_shape, style_size: int, upsample: bool, noise):
        super().__init__()
        self.modulated_conv = ModulatedConv(weight_shape, style_size, True, upsample)
        self.weight = nn.Parameter(torch.zeros(1))  # the noise's strength
        self.bias = nn.Parameter(torch.zeros(1, weight_shape[1], 1, 1))
        self.register_buffer("noise", torch.zeros(noise.shape))

    def forward(self, x, style):
        out = self.modulated_conv(x, style) * math.sqrt(2) + self.weight * self.noise + self.bias
        return F.leaky_relu(out, 0.2)


class ToRGB(nn.Module):
    def __init__(self, weight_shape, style_size: int, upsample: bool):
        super().__init__()
        self.modulated_conv = ModulatedConv(weight_shape, style_size, False, False)
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))
        self.upsample = upsample

    def forward(self, x, style, skip=None):
        out = self.modulated_conv(x, style) + self.bias
        if skip is not None:
            if self.upsample:
                skip = F.interpolate(skip, scale_factor=2, mode="bilinear", align_corners=False)
            out = out + skip
        return out


class ResampleBlock(nn.Module):
    """GFPGAN's ResBlock: two 3×3 convs around a ×2 or ×½ bilinear resize, a 1×1 skip."""

    def __init__(self, state, prefix: str, down: bool):
        super().__init__()
        self.conv1 = _conv(state[f"{prefix}.conv1.weight"])
        self.conv2 = _conv(state[f"{prefix}.conv2.weight"])
        self.skip = _conv(state[f"{prefix}.skip.weight"], bias=False)
        self.down = down

    def resize(self, x):
        # bilinear ×½ without antialias on even sizes is exactly the 2×2 mean
        if self.down:
            return F.avg_pool2d(x, 2)
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)

    def forward(self, x):
        out = F.leaky_relu(self.conv1(x), 0.2)
        out = F.leaky_relu(self.conv2(self.resize(out)), 0.2)
        return out + self.skip(self.resize(x))


def _conv(weight, bias=True):
    out_ch, in_ch, k, _ = weight.shape
    return nn.Conv2d(in_ch, out_ch, k, padding=k // 2, bias=bias)


def _condition(state, prefix):
    first, second = state[f"{prefix}.0.weight"], state[f"{prefix}.2.weight"]
    return nn.Sequential(_conv(first), nn.LeakyReLU(0.2), _conv(second))


class Decoder(nn.Module):
    def __init__(self, state, levels: int, style_size: int, sft_half: bool):
        super().__init__()
        d = "stylegan_decoder"
        self.constant_input = nn.Module()
        self.constant_input.weight = nn.Parameter(torch.zeros(state[f"{d}.constant_input.weight"].shape))
        noise = [state[f"{d}.noises.noise{i}"] for i in range(2 * levels + 1)]
        shape = state[f"{d}.style_conv1.modulated_conv.weight"].shape
        self.style_conv1 = StyleConv(shape, style_size, False, noise[0])
        self.to_rgb1 = ToRGB(state[f"{d}.to_rgb1.modulated_conv.weight"].shape, style_size, False)
        self.style_convs = nn.ModuleList(
            StyleConv(state[f"{d}.style_convs.{j}.modulated_conv.weight"].shape, style_size, j % 2 == 0, noise[j + 1])
            for j in range(2 * levels)
        )
        self.to_rgbs = nn.ModuleList(
            ToRGB(state[f"{d}.to_rgbs.{k}.modulated_conv.weight"].shape, style_size, True) for k in range(levels)
        )
        self.sft_half = sft_half

    def forward(self, latent, conditions):
        out = self.constant_input.weight.expand(latent.shape[0], -1, -1, -1)
        out = self.style_conv1(out, latent[:, 0])
        skip = self.to_rgb1(out, latent[:, 1])
        for k, to_rgb in enumerate(self.to_rgbs):
            i = 2 * k + 1
            out = self.style_convs[2 * k](out, latent[:, i])
            scale, shift = conditions[2 * k], conditions[2 * k + 1]
            if self.sft_half:  # the conditions steer the second half of the channels only
                half = out.shape[1] // 2
                out = torch.cat([out[:, :half], out[:, half:] * scale + shift], dim=1)
            else:
                out = out * scale + shift
            out = self.style_convs[2 * k + 1](out, latent[:, i + 1])
            skip = to_rgb(out, latent[:, i + 2], skip)
        return skip


class GFPGANRestorer(nn.Module):
    def __init__(self, state, style_size: int):
        super().__init__()
        levels = sum(1 for key in state if key.startswith("conv_body_up.") and key.endswith(".conv1.weight"))
        self.conv_body_first = _conv(state["conv_body_first.weight"])
        self.conv_body_down = nn.ModuleList(ResampleBlock(state, f"conv_body_down.{k}", True) for k in range(levels))
        self.final_conv = _conv(state["final_conv.weight"])
        self.conv_body_up = nn.ModuleList(ResampleBlock(state, f"conv_body_up.{k}", False) for k in range(levels))
        self.condition_scale = nn.ModuleList(_condition(state, f"condition_scale.{k}") for k in range(levels))
        self.condition_shift = nn.ModuleList(_condition(state, f"condition_shift.{k}") for k in range(levels))
        linear = state["final_linear.weight"]
        self.final_linear = nn.Linear(linear.shape[1], linear.shape[0])
        sft_half = state["condition_scale.0.2.weight"].shape[0] == state["condition_scale.0.0.weight"].shape[0]
        self.stylegan_decoder = Decoder(state, levels, style_size, sft_half)
        self.style_size, self.latents = style_size, 2 * levels + 2

    def forward(self, face):
        feat = F.leaky_relu(self.conv_body_first(face), 0.2)
        skips = []
        for block in self.conv_body_down:
            feat = block(feat)
            skips.insert(0, feat)
        feat = F.leaky_relu(self.final_conv(feat), 0.2)
        code = self.final_linear(feat.flatten(1))
        if code.shape[1] == self.style_size:  # one code for every layer (different_w=False)
            latent = code[:, None].expand(-1, self.latents, -1)
        else:
            latent = code.view(code.shape[0], self.latents, self.style_size)
        conditions = []
        for block, scale, shift, skip in zip(
            self.conv_body_up, self.condition_scale, self.condition_shift, skips, strict=True
        ):
            feat = block(feat + skip)
            conditions += [scale(feat), shift(feat)]
        return self.stylegan_decoder(latent, conditions)
