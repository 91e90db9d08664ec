"""Bounds on the sizes a model's configs give (component configs, the scheduler config, an export's family.json),
checked when the assets are read (diffusion/assets.py) and when an export reads its source (export/source.py): each
sizes arrays (the default image, the scheduler's tables, the prompt embeddings, the model torch builds), and they come
from a store or a folder the user may not control: unchecked, a `unet.sample_size` of 10000 would make `generate`
reach gigabytes, and `num_train_timesteps: 3e9` ask for tens of them. Real models sit far inside each bound."""

from __future__ import annotations

from typing import Any

from enginefarm.errors import ConfigError

from .spec import Family

MAX_TRAIN_TIMESTEPS = 100_000  # diffusers' models: 1000
MAX_WIDTH = 16_384  # a text encoder's hidden size, a UNet level's channels (T5-XXL: 4096, SDXL's UNet: 1280)
MAX_VOCAB = 1 << 20  # CLIP 49408, T5 32128
MAX_LEVELS = 8
MAX_CHANNELS = 64  # latent and sample channels (SD 4, SD3 and Flux 16, inpainting 9)
MAX_SIZE = 1 << 20  # any other count family.json gives
MAX_LAYERS = 256  # layers and blocks per level (T5-XXL: 24, Flux: 19 + 38)
_LAYER_COUNTS = ("num_hidden_layers", "num_layers", "num_single_layers", "layers_per_block", "num_attention_heads")
_WIDTHS = (
    "cross_attention_dim",
    "attention_head_dim",
    "projection_dim",
    "joint_attention_dim",
    "pooled_projection_dim",
)


def _hint(where: str) -> str:
    return f"{where} is not one an export writes for this model: re-export the model with `enginefarm export`"


def _count(value: Any, where: str, most: int, least: int = 1) -> None:
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # JSON may write 1000.0
    if isinstance(value, bool) or not whole or not least <= value <= most:
        raise ConfigError(f"{where} {value!r} is not a whole number in {least}-{most}", hint=_hint(where.split(":")[0]))


def _levels(value: Any, where: str, most: int) -> None:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LEVELS:
        shown = value if not isinstance(value, list) else f"a list of {len(value)}"
        raise ConfigError(
            f"{where} {shown!r} is not a list of 1-{MAX_LEVELS} channel counts", hint=_hint(where.split(":")[0])
        )
    for item in value:
        _count(item, where, most)


def check_configs(configs: dict[str, dict[str, Any]], family: Family) -> None:
    """Refuse, in one line, a size in the configs (folder → config) past what the family's models hold."""
    latent = family.native_pixels // family.vae_scale_factor
    for name, config in configs.items():
        file = f"{name}/{'scheduler_config' if name == 'scheduler' else 'config'}.json"

        def bounded(key: str, most: int, least: int = 1, config: dict = config, file: str = file) -> None:
            if config.get(key) is not None:
                _count(config[key], f"{file}: {key}", most, least)

        for keys, most in ((_LAYER_COUNTS, MAX_LAYERS), (_WIDTHS, MAX_WIDTH)):
            for key in keys:
                if isinstance(config.get(key), list):  # one per level (SD 2.x's attention_head_dim)
                    _levels(config[key], f"{file}: {key}", most)
                else:
                    bounded(key, most)
        if name in ("unet", "transformer", "controlnet"):
            bounded("sample_size", 4 * latent)  # the default image: 4x the family's native side at most
            bounded("in_channels", MAX_CHANNELS)
            bounded("patch_size", 16)
            if config.get("block_out_channels") is not None:
                _levels(config["block_out_channels"], f"{file}: block_out_channels", MAX_WIDTH)
        elif name == "vae":
            bounded("sample_size", 4 * family.native_pixels)  # its tile, in pixels
            bounded("latent_channels", MAX_CHANNELS)
            if config.get("block_out_channels") is not None:
                _levels(config["block_out_channels"], f"{file}: block_out_channels", MAX_WIDTH)
        elif name.startswith("text_encoder"):
            bounded("hidden_size", MAX_WIDTH)
            bounded("d_model", MAX_WIDTH)
            bounded("vocab_size", MAX_VOCAB)
            bounded("intermediate_size", 8 * MAX_WIDTH)
            bounded("d_ff", 8 * MAX_WIDTH)
        elif name == "scheduler":
            bounded("num_train_timesteps", MAX_TRAIN_TIMESTEPS)


def check_sizes(sizes: Any) -> None:
    """Refuse family.json's `sizes` if a count in it is not a whole number in 0-MAX_SIZE (text widths: MAX_WIDTH)."""
    if not isinstance(sizes, dict):
        raise ConfigError(f"family.json: sizes {type(sizes).__name__} is not an object", hint=_hint("family.json"))
    for key, value in sizes.items():
        most = MAX_WIDTH if key in ("text_widths", "cross_attention_dim", "pooled_width") else MAX_SIZE
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
            else:
                _count(item, f"family.json: sizes.{key}", most, least=0)
