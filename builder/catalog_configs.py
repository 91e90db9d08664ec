"""The published diffusers configs of the UNet families' models, shipped with enginefarm: a catalog recipe's
single-file checkpoint is exported over them, so no config is fetched from the Hub at export time.

Each set is the diffusers folder's JSON files (model_index.json, scheduler/, text_encoder*/, unet/, vae/), written from
the values their publishers' repositories hold (stable-diffusion-v1-5/stable-diffusion-v1-5,
stabilityai/stable-diffusion-2-1, stabilityai/stable-diffusion-xl-base-1.0 and -refiner-1.0, stabilityai/sdxl-turbo,
the inpainting models); keys a diffusers or transformers class defaults are left at their default. Tokenizers are
not configs: a recipe names their files as pinned sources (`[export.files]`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_CLIP_L = {
    "_name_or_path": "openai/clip-vit-large-patch14",
    "architectures": ["CLIPTextModel"],
    "model_type": "clip_text_model",
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
    "layer_norm_eps": 1e-05,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}
# SD 2.x: OpenCLIP ViT-H's text tower, its last layer dropped (the pipelines read the penultimate one)
_OPEN_CLIP_H = dict(
    _CLIP_L,
    _name_or_path="laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=23,
    num_attention_heads=16,
    hidden_act="gelu",
    projection_dim=512,
)
_OPEN_CLIP_G = dict(
    _CLIP_L,
    _name_or_path="laion/CLIP-ViT-bigG-14-laion2B-39B-b160k",
    architectures=["CLIPTextModelWithProjection"],
    hidden_size=1280,
    intermediate_size=5120,
    num_hidden_layers=32,
    num_attention_heads=20,
    hidden_act="gelu",
    projection_dim=1280,
)
_VAE = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "sample_size": 512,
    "scaling_factor": 0.18215,
}
_SDXL_VAE = dict(_VAE, sample_size=1024, scaling_factor=0.13025, force_upcast=True)
_SD1_UNET = {
    "_class_name": "UNet2DConditionModel",
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "out_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "sample_size": 64,
}
_SD2_UNET = dict(
    _SD1_UNET, attention_head_dim=[5, 10, 20, 20], cross_attention_dim=1024, use_linear_projection=True, sample_size=96
)
_SDXL_UNET = dict(
    _SD1_UNET,
    attention_head_dim=[5, 10, 20],
    block_out_channels=[320, 640, 1280],
    cross_attention_dim=2048,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    transformer_layers_per_block=[1, 2, 10],
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
    sample_size=128,
)
# The refiner: OpenCLIP bigG alone (1280 wide), four levels, and the aesthetic score among its 5 time ids
_REFINER_UNET = dict(
    _SDXL_UNET,
    attention_head_dim=[6, 12, 24, 24],
    block_out_channels=[384, 768, 1536, 1536],
    cross_attention_dim=1280,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    transformer_layers_per_block=4,
    projection_class_embeddings_input_dim=2560,
)
_SCALED_LINEAR = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "steps_offset": 1,
    "clip_sample": False,
    "set_alpha_to_one": False,
}
_PNDM = dict(_SCALED_LINEAR, _class_name="PNDMScheduler", skip_prk_steps=True)
_EULER = dict(
    _SCALED_LINEAR,
    _class_name="EulerDiscreteScheduler",
    interpolation_type="linear",
    prediction_type="epsilon",
    timestep_spacing="leading",
    use_karras_sigmas=False,
)
_NONE = [None, None]


def _pipeline(cls: str, scheduler: str, encoders: dict[str, str], **extra: Any) -> dict[str, Any]:
    index: dict[str, Any] = {"_class_name": cls, "scheduler": ["diffusers", scheduler]}
    for folder, encoder in encoders.items():
        index[folder] = ["transformers", encoder]
        index[folder.replace("text_encoder", "tokenizer")] = ["transformers", "CLIPTokenizer"]
    index.update(unet=["diffusers", "UNet2DConditionModel"], vae=["diffusers", "AutoencoderKL"], **extra)
    return index


_SD = dict(safety_checker=_NONE, feature_extractor=_NONE, requires_safety_checker=False)
_XL = dict(force_zeros_for_empty_prompt=True)


def _sd1(unet: dict[str, Any], cls: str = "StableDiffusionPipeline") -> dict[str, Any]:
    return {
        "model_index.json": _pipeline(cls, "PNDMScheduler", {"text_encoder": "CLIPTextModel"}, **_SD),
        "scheduler/scheduler_config.json": _PNDM,
        "text_encoder/config.json": _CLIP_L,
        "unet/config.json": unet,
        "vae/config.json": _VAE,
    }


def _sd2(unet: dict[str, Any], scheduler: dict[str, Any], cls: str = "StableDiffusionPipeline") -> dict[str, Any]:
    return {
        "model_index.json": _pipeline(cls, scheduler["_class_name"], {"text_encoder": "CLIPTextModel"}, **_SD),
        "scheduler/scheduler_config.json": scheduler,
        "text_encoder/config.json": _OPEN_CLIP_H,
        "unet/config.json": unet,
        "vae/config.json": dict(_VAE, sample_size=unet["sample_size"] * 8),
    }


def _sdxl(unet: dict[str, Any], scheduler: dict[str, Any], cls: str = "StableDiffusionXLPipeline") -> dict[str, Any]:
    encoders = {"text_encoder": "CLIPTextModel", "text_encoder_2": "CLIPTextModelWithProjection"}
    return {
        "model_index.json": _pipeline(cls, scheduler["_class_name"], encoders, **_XL),
        "scheduler/scheduler_config.json": scheduler,
        "text_encoder/config.json": _CLIP_L,
        "text_encoder_2/config.json": _OPEN_CLIP_G,
        "unet/config.json": unet,
        "vae/config.json": _SDXL_VAE,
    }


# name → the folder's files (path → JSON). A catalog recipe names one in `[export] configs`.
CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "sd-1.5": _sd1(_SD1_UNET),
    "sd-1.5-inpainting": _sd1(dict(_SD1_UNET, in_channels=9), "StableDiffusionInpaintPipeline"),
    "sd-2.1-768-v": _sd2(
        dict(_SD2_UNET, upcast_attention=True),
        dict(_SCALED_LINEAR, _class_name="DDIMScheduler", prediction_type="v_prediction"),
    ),
    "sd-2-inpainting": _sd2(
        dict(_SD2_UNET, in_channels=9, sample_size=64),
        dict(_PNDM, prediction_type="epsilon"),
        "StableDiffusionInpaintPipeline",
    ),
    "sdxl-base-1.0": _sdxl(_SDXL_UNET, _EULER),
    "sdxl-turbo": _sdxl(
        dict(_SDXL_UNET, sample_size=64),
        dict(_EULER, _class_name="EulerAncestralDiscreteScheduler", timestep_spacing="trailing"),
    ),
    "sdxl-inpainting-0.1": _sdxl(dict(_SDXL_UNET, in_channels=9), _EULER, "StableDiffusionXLInpaintPipeline"),
    "sdxl-refiner-1.0": {
        "model_index.json": _pipeline(
            "StableDiffusionXLImg2ImgPipeline",
            "EulerDiscreteScheduler",
            {"text_encoder_2": "CLIPTextModelWithProjection"},
            text_encoder=_NONE,
            tokenizer=_NONE,
            requires_aesthetics_score=True,
            force_zeros_for_empty_prompt=False,
        ),
        "scheduler/scheduler_config.json": _EULER,
        "text_encoder_2/config.json": _OPEN_CLIP_G,
        "unet/config.json": _REFINER_UNET,
        "vae/config.json": _SDXL_VAE,
    },
}


def write_configs(name: str, folder: Path) -> list[Path]:
    """The config set `name` written into `folder` (a diffusers folder being assembled). Returns the files."""
    written = []
    for relative, data in CONFIGS[name].items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def class_config(name: str, relative: str, **changes: Any) -> dict[str, Any]:
    """One file of set `name` as keyword arguments of its class (`UNet2DConditionModel(**...)`, `CLIPTextConfig`):
    the diffusers and transformers bookkeeping keys dropped, lists made tuples, `changes` applied. For the makers of
    real-size folders (recipes/make_real_pipeline.py) and the benches, which build the published architectures."""
    data = CONFIGS[name][relative]
    skip = {"architectures", "model_type"}
    kept = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k[0] != "_" and k not in skip}
    return {**kept, **changes}
