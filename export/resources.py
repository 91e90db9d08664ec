"""What a component's own config says about its memory at large images, for the recipe's `resources` table
(builder/memory.py applies it to the profile): the heads and token size of its largest attention, and a VAE's
widest activations. Read from the config, so a narrow model's need is its own, not the real SD VAE's."""

from __future__ import annotations

from enginefarm.families import Component

# diffusers' defaults where a config leaves the key out (UNet2DConditionModel, ControlNetModel, AutoencoderKL)
_UNET_DOWN_BLOCKS = ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",)
_UNET_HEADS = 8
_VAE_CHANNELS = (64,)


def component_resources(component: Component, config: dict) -> dict[str, tuple[int, str]]:
    """Resource key → (value, why) for the recipe: `attention_heads` and `attention_downscale` (see
    builder/recipe.Resources), `activation_channels` for a VAE; empty where the config says nothing."""
    if component.kind == "transformer":
        heads = int(config.get("num_attention_heads") or 0)
        return (
            {"attention_heads": (heads, "its need adds the attention scores at the profile's largest case")}
            if heads
            else {}
        )
    if component.kind in ("unet", "unet_controlnet", "controlnet"):
        heads, downscale = unet_attention(config)
        if not heads:
            return {}
        where = "latent pixel" if downscale == 1 else f"{downscale}x{downscale} latent pixels"
        return {
            "attention_heads": (heads, "its highest-resolution attention's; its scores count at the profile's max"),
            "attention_downscale": (downscale, f"one token per {where} there"),
        }
    if component.kind.startswith("vae"):
        resources = {"activation_channels": (vae_activation_channels(config), "its widest level at full image size")}
        if config.get("mid_block_add_attention", True):
            resources["attention_heads"] = (1, "the mid-block's attention over the latent pixels")
            resources["attention_downscale"] = (1, "one token per latent pixel")
        return resources
    return {}


def unet_attention(config: dict) -> tuple[int, int]:
    """(heads, downscale) of a UNet's (or ControlNet's) attention at its highest resolution: the first down block
    with attention (downscale 2^its index), else the mid block; (0, 0) without attention. diffusers reads a UNet's
    heads from `num_attention_heads`, else from `attention_head_dim` (which SD 1.x and 2.x configs use for heads)."""
    blocks = tuple(config.get("down_block_types") or _UNET_DOWN_BLOCKS)
    heads = config.get("num_attention_heads") or config.get("attention_head_dim") or _UNET_HEADS

    def at(level: int) -> int:
        return int(heads[level] if isinstance(heads, list | tuple) else heads)

    for level, block in enumerate(blocks):
        if "Attn" in block:
            return at(level), 2**level
    if "Attn" in str(config.get("mid_block_type") or "UNetMidBlock2DCrossAttn"):
        return at(len(blocks) - 1), 2 ** (len(blocks) - 1)
    return 0, 0


def vae_activation_channels(config: dict) -> int:
    """A VAE's widest activations, in channels at full image size: each level i (1/2^i of the image) holds its own
    channels and, in the decoder, the level below's upsampled into it; a level counts 1/4^i of the image's pixels."""
    channels = list(config.get("block_out_channels") or _VAE_CHANNELS)
    widest = 0
    for level, own in enumerate(channels):
        below = channels[min(level + 1, len(channels) - 1)]
        widest = max(widest, -(-max(own, below) // 4**level))
    return widest
