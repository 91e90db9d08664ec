#!/usr/bin/env python3
"""Write a Stable Diffusion 1.5, XL (base) or 3.5 Medium diffusers folder at real size, with seeded random weights.

Every component has the published config (SD 1.5: CLIP ViT-L text encoder, the 0.86 B-parameter UNet; SDXL base 1.0:
CLIP ViT-L and OpenCLIP ViT-bigG text encoders, the 2.6 B-parameter UNet; SD3.5 Medium: the same two CLIPs with
projections, the 2.2 B-parameter MMDiT, the 16-channel VAE, flow matching with shift 3, and no T5-XXL, whose bf16 job
needs 38 GB; each with its VAE and scheduler); nothing is
downloaded (the farm reaches PyPI only). The tokenizers are CLIP tokenizers with a hand-written byte vocabulary and no
merges (tests/tiny_pipelines.py): prompts become real token ids, spelled out letter by letter. What the weights are does
not change what a build needs or how fast an artifact runs, so this folder measures `enginefarm export`, `build` and
`generate` at real size; its images are noise.

    # 8.7 GB on disk (the UNet saved at fp16); 99 s, 14 GB peak
    python recipes/make_real_pipeline.py sdxl --out /tmp/sdxl
    enginefarm export /tmp/sdxl --out /tmp/sdxl-onnx --precisions fp16 --batch 1,2,2 --latent 64,96,128
    # 8.6 GB on disk (the transformer at fp16); 46 s, 10.9 GB peak; the export: 21 min, 17.4 GB peak,
    # 27 GB on disk with its checkpoints (docs/large-models.md has the builds)
    python recipes/make_real_pipeline.py sd35-medium --out /tmp/sd35
    enginefarm export /tmp/sd35 --out /tmp/sd35-onnx --precisions fp16 --batch 1,2,2 --latent 64,96,128
    # 4.3 GB on disk; 23 s, 5.0 GB peak; the export: 9 min 53 s, 4.7 GB peak
    python recipes/make_real_pipeline.py sd15 --out /tmp/sd15
    enginefarm export /tmp/sd15 --out recipes/models/sd15 --batch 1,2,2 --latent 32,32,64

Needs the `export` extra (torch, diffusers, transformers).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from enginefarm.builder.catalog_configs import class_config

ROOT = Path(__file__).resolve().parents[1]
SEED = 0

# The published configs enginefarm ships (builder/catalog_configs.py), as the classes' keyword arguments
CLIP_L = class_config("sd-1.5", "text_encoder/config.json")
CLIP_G = class_config("sdxl-base-1.0", "text_encoder_2/config.json")
SD15_UNET = class_config("sd-1.5", "unet/config.json")
UNET = class_config("sdxl-base-1.0", "unet/config.json")
VAE = class_config("sdxl-base-1.0", "vae/config.json")
SD15_VAE = class_config("sd-1.5", "vae/config.json")
SD15_SCHEDULER = class_config("sd-1.5", "scheduler/scheduler_config.json")
SCHEDULER = class_config("sdxl-base-1.0", "scheduler/scheduler_config.json")
# stabilityai/stable-diffusion-3.5-medium: transformer/, vae/, scheduler/ config.json (its CLIPs are SDXL's, both
# with projections; T5-XXL is left out, see make_sd35_medium)
SD35_MEDIUM_TRANSFORMER = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)),
    qk_norm="rms_norm",
)
SD3_VAE = dict(
    VAE,
    latent_channels=16,
    scaling_factor=1.5305,
    shift_factor=0.0609,
    use_quant_conv=False,
    use_post_quant_conv=False,
)
FLOW_SHIFT = 3.0
# google/t5-v1_1-xxl, SD3's text_encoder_3/config.json: 4.76 B parameters, 19 GB at fp32
T5_XXL = dict(
    vocab_size=32128,
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_heads=64,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu",
    dropout_rate=0.0,
    pad_token_id=0,
    eos_token_id=1,
)
FAMILIES = ("sd15", "sdxl", "sd35-medium", "t5xxl")


def make_sd15(out: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from tests.tiny_pipelines import write_tokenizer

    torch.manual_seed(SEED)
    tokens = out.parent / f".{out.name}-tokenizers"
    ids = dict(bos_token_id=512, eos_token_id=513, pad_token_id=513)  # the hand-written vocabulary's
    text_encoder = CLIPTextModel(CLIPTextConfig(**{**CLIP_L, **ids})).eval()
    pipeline = StableDiffusionPipeline(
        vae=AutoencoderKL(**SD15_VAE),
        text_encoder=text_encoder,
        tokenizer=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer")),
        unet=UNet2DConditionModel(**SD15_UNET),
        scheduler=PNDMScheduler.from_config(SD15_SCHEDULER),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(out)
    import shutil

    shutil.rmtree(tokens)
    return out


def make_sdxl(out: Path) -> Path:
    sys.path.insert(0, str(ROOT))  # the hand-written tokenizer lives with the tiny test models
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    from tests.tiny_pipelines import write_tokenizer

    torch.manual_seed(SEED)
    tokens = out.parent / f".{out.name}-tokenizers"
    ids = dict(bos_token_id=512, eos_token_id=513)  # the hand-written vocabulary's <|startoftext|>, <|endoftext|>
    text_encoder = CLIPTextModel(CLIPTextConfig(**{**CLIP_L, **ids, "pad_token_id": 513})).eval()
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**{**CLIP_G, **ids, "pad_token_id": ord("!")})).eval()
    unet = UNet2DConditionModel(**UNET).half()  # 10.3 GB at fp32; the exporter reads it back at fp32
    pipeline = StableDiffusionXLPipeline(
        vae=AutoencoderKL(**VAE),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer")),
        tokenizer_2=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer_2", pad_token="!")),
        unet=unet,
        scheduler=EulerDiscreteScheduler.from_config(SCHEDULER),
    )
    pipeline.save_pretrained(out)
    import shutil

    shutil.rmtree(tokens)
    return out


def make_sd35_medium(out: Path) -> Path:
    """SD3.5 Medium without its third text encoder: T5-XXL's bf16 job needs 38 GB (bench/real_sizes.py), past a
    24 GB machine; diffusers' StableDiffusion3Pipeline runs without it (zeros in its place), as the family allows."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    from tests.tiny_pipelines import write_tokenizer

    torch.manual_seed(SEED)
    # first, and halved at once: 9.0 GB at fp32, so the other parts are made beside its 4.5 GB
    transformer = SD3Transformer2DModel(**SD35_MEDIUM_TRANSFORMER).half()
    tokens = out.parent / f".{out.name}-tokenizers"
    ids = dict(bos_token_id=512, eos_token_id=513)
    clip_g = CLIPTextConfig(**{**CLIP_G, **ids, "pad_token_id": ord("!")})
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer,
        vae=AutoencoderKL(**SD3_VAE),
        text_encoder=CLIPTextModelWithProjection(CLIPTextConfig(**{**CLIP_L, **ids, "pad_token_id": 513})).eval(),
        text_encoder_2=CLIPTextModelWithProjection(clip_g).eval(),
        text_encoder_3=None,
        tokenizer=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer")),
        tokenizer_2=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer_2", pad_token="!")),
        tokenizer_3=None,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=FLOW_SHIFT),
    )
    pipeline.save_pretrained(out)
    import shutil

    shutil.rmtree(tokens)
    return out


def make_t5xxl(out: Path, t5_layers: int = T5_XXL["num_layers"]) -> Path:
    """An SD3 pipeline whose T5-XXL is real-size and everything else the tiny test model's (a transformer whose text
    width is T5's 4096): what `export` and `build --component text_encoder_3` do with SD3's largest text encoder,
    on a machine with the memory for it (its fp32 job needs 47.7 GB, its bf16 one 38.1: the family never builds
    T5 at fp16). `t5_layers` fewer than 24 rehearses the same
    steps small."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import StableDiffusion3Pipeline
    from transformers import T5Config, T5EncoderModel

    from tests import tiny_transformers

    tiny = tiny_transformers.make_tiny_transformer_pipeline(
        "sd3.5", out.parent / f".{out.name}-tiny", seed=SEED, t5_width=T5_XXL["d_model"]
    )
    torch.manual_seed(SEED)
    t5 = T5EncoderModel(T5Config(**{**T5_XXL, "num_layers": t5_layers})).eval().half()  # 9.5 GB: read back at fp32
    pipeline = StableDiffusion3Pipeline.from_pretrained(tiny, text_encoder_3=t5, local_files_only=True)
    pipeline.save_pretrained(out)
    import shutil

    shutil.rmtree(tiny)
    return out


MAKERS = {"sd15": make_sd15, "sdxl": make_sdxl, "sd35-medium": make_sd35_medium, "t5xxl": make_t5xxl}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("family", choices=FAMILIES)
    p.add_argument("--out", type=Path, required=True, help="the folder to write (must not exist)")
    p.add_argument("--t5-layers", type=int, default=T5_XXL["num_layers"], help="t5xxl: fewer layers, to rehearse")
    args = p.parse_args()
    if args.out.exists():
        print(f"error: {args.out} exists; choose a new folder", file=sys.stderr)
        return 2
    started = time.monotonic()
    if args.family == "t5xxl":
        make_t5xxl(args.out, args.t5_layers)
    else:
        MAKERS[args.family](args.out)
    size = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"wrote {args.out}: {size / 1e9:.2f} GB in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
