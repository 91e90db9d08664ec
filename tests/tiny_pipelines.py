"""Tiny random-weight diffusers pipelines, one per model family, written with `save_pretrained` (no download).

Each has the real family's structure (its pipeline class, components, UNet conditioning, scheduler, tokenizer
padding, VAE 8x scale and scaling factor) at toy sizes, seeded, so the same call writes the same weights: the
exporter's tests and the runtime pipeline's tests (diffusers' own images as the reference) share them.

    make_tiny_pipeline("sdxl", tmp_path / "sdxl")              # a pipeline folder (model_index.json)
    make_tiny_controlnet(tmp_path / "sdxl", tmp_path / "cn")   # a standalone ControlNet folder for that base

What is not toy-sized, and why: SD1's and SD2's text width (768, 1024) is the real one, because the family is told
apart by the UNet's cross_attention_dim; their encoders have 2 layers and a narrow MLP to stay small (~6 and ~10 M
parameters). SDXL is told apart by its pipeline class, so its encoders are 32 wide.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_flux import FLUX_FAMILIES, make_tiny_flux
from tests.tiny_transformers import TRANSFORMER_FAMILIES, make_tiny_transformer_pipeline

FAMILIES = (
    "sd1",
    "sd2",
    "sd2-v",
    "sdxl",
    "sdxl-refiner",
    "controlnet-sd1",
    "controlnet-sdxl",
    "sd1-inpaint",
    "sdxl-inpaint",
    "sd3",
    "sd3.5",
    *FLUX_FAMILIES,
)

VOCAB_SIZE = 1000  # the text encoders' embedding rows; more than the tokenizer's 514 entries
SAMPLE_SIZE = 8  # latent pixels the UNet was "trained" at (64 image pixels through the 8x VAE)

# CLIP's byte-level alphabet: printable bytes map to themselves, the rest to code points from 256 up.
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]


def _byte_alphabet() -> list[str]:
    extra = iter(range(256, 512))
    return [chr(b) if b in _PRINTABLE else chr(next(extra)) for b in range(256)]


def write_tokenizer(folder: Path, *, pad_token: str = "<|endoftext|>") -> Path:
    """A CLIP tokenizer with no merges: every word is spelled out in single characters, the last one marked
    with </w>. 514 ids: the 256 byte characters, the same with </w>, then <|startoftext|> and <|endoftext|>
    (the last two, like CLIP's 49406 and 49407). SD 2.x and SDXL's second tokenizer pad with "!"."""
    from transformers import CLIPTokenizer

    alphabet = _byte_alphabet()
    tokens = alphabet + [f"{c}</w>" for c in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        vocab=str(folder / "vocab.json"), merges=str(folder / "merges.txt"), pad_token=pad_token, model_max_length=77
    )
    tokenizer.save_pretrained(folder)
    return folder


def _text_config(hidden: int, *, projection: int | None = None, pad_token: str = "<|endoftext|>"):
    from transformers import CLIPTextConfig

    pad_id = 513 if pad_token == "<|endoftext|>" else ord(pad_token)  # "!" is byte 33, its own id
    return CLIPTextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        hidden_act="quick_gelu" if hidden == 768 else "gelu",
        projection_dim=projection or hidden,
        bos_token_id=512,
        eos_token_id=513,
        pad_token_id=pad_id,
    )


def _trained_norm(torch, text_encoder, seed: int):
    """SD 1.x/2.x read the final layer norm's output: a trained one has gains and a bias, a fresh one (1, 0) makes
    every token's state average 0 over its channels, which A1111's emphasis divides by. Drawn from a generator of its
    own, so the other weights stay as they were."""
    generator = torch.Generator().manual_seed(seed + 7)
    norm = text_encoder.final_layer_norm
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(norm.weight.shape, generator=generator))
        norm.bias.copy_(0.2 * torch.randn(norm.bias.shape, generator=generator))
    return text_encoder


def _unet(torch, *, cross_attention_dim: int, text_time: tuple[int, int] | None = None, in_channels: int = 4):
    """text_time: (time ids, pooled text width) for SDXL's added conditioning; in_channels 9: an inpainting UNet
    (latents, mask, masked-image latents)."""
    from diffusers import UNet2DConditionModel

    # The real layouts at narrow widths (what decides a build's memory: where the attention is): SD 1.x's
    # CrossAttnDownBlock2D levels over a DownBlock2D at the bottom, attention at the full latent resolution, 8 heads
    # (three levels, not four: the fourth, with random weights, moved the fp16 builds' outputs to cosine 0.990 of fp32
    # at some timesteps, under the gate's 0.999; three stay above 0.99998); SD 2.x's the same with per-level heads and
    # linear projections; SDXL's (and the refiner's) DownBlock2D at full resolution, attention from the level below
    # on, linear projections (two levels: a third and SDXL's deeper transformers cost the suite 31% more CPU time in
    # the tiny SDXL's export and build, without changing where its attention is).
    layout: dict = dict(
        block_out_channels=(32, 64, 64),
        down_block_types=("CrossAttnDownBlock2D",) * 2 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 2,
        attention_head_dim=8,
    )
    if text_time is None and cross_attention_dim == 1024:  # SD 2.x
        layout.update(attention_head_dim=(2, 4, 4), use_linear_projection=True)
    if text_time is not None:
        time_ids, pooled = text_time
        layout = dict(
            block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=8 * time_ids + pooled,
            use_linear_projection=True,
            transformer_layers_per_block=(1, 1),
            attention_head_dim=(2, 4),
        )
    return UNet2DConditionModel(
        **{
            "sample_size": SAMPLE_SIZE,
            "in_channels": in_channels,
            "out_channels": 4,
            "layers_per_block": 1,
            "cross_attention_dim": cross_attention_dim,
            **layout,
        }
    )


def _vae(scaling_factor: float):
    """Four blocks, so the VAE scales by 8 like the real ones; narrow, with 8 channels per norm group."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 16, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=SAMPLE_SIZE * 8,
        scaling_factor=scaling_factor,
    )


def _scheduler(family: str):
    """Each family's shipped scheduler, with its training schedule."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler, PNDMScheduler

    schedule = dict(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1
    )
    if family.startswith(("sdxl", "controlnet-sdxl")):
        return EulerDiscreteScheduler(**schedule, timestep_spacing="leading")
    if family.startswith("sd2"):
        prediction = "v_prediction" if family == "sd2-v" else "epsilon"
        return DDIMScheduler(**schedule, clip_sample=False, set_alpha_to_one=False, prediction_type=prediction)
    return PNDMScheduler(**schedule, skip_prk_steps=True, set_alpha_to_one=False)


def _controlnet(torch, unet, seed: int):
    """A ControlNet copied from the UNet, 8x conditioning embedding. Its zero convolutions (which make a fresh
    ControlNet a no-op) get small random weights, so its residuals are something to check."""
    from diffusers import ControlNetModel

    controlnet = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(8, 16, 16, 16))
    generator = torch.Generator().manual_seed(seed + 1)
    zero_convs = [
        *controlnet.controlnet_down_blocks,
        controlnet.controlnet_mid_block,
        controlnet.controlnet_cond_embedding.conv_out,
    ]
    with torch.no_grad():
        for conv in zero_convs:
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) * 0.1)
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=generator) * 0.01)
    return controlnet


def make_tiny_pipeline(family: str, folder: Path, seed: int = 0) -> Path:
    """Write the tiny pipeline of `family` (one of FAMILIES) to `folder` and return it."""
    import torch
    from diffusers import (
        StableDiffusionControlNetPipeline,
        StableDiffusionInpaintPipeline,
        StableDiffusionPipeline,
        StableDiffusionXLControlNetPipeline,
        StableDiffusionXLImg2ImgPipeline,
        StableDiffusionXLInpaintPipeline,
        StableDiffusionXLPipeline,
    )
    from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if family in TRANSFORMER_FAMILIES:
        return make_tiny_transformer_pipeline(family, folder, seed)
    if family in FLUX_FAMILIES:
        return make_tiny_flux(family, folder, seed)
    folder = Path(folder)
    tokens = folder.parent / f".{folder.name}-tokenizers"
    torch.manual_seed(seed)
    xl = family in ("sdxl", "sdxl-refiner", "controlnet-sdxl", "sdxl-inpaint")
    in_channels = 9 if family.endswith("-inpaint") else 4
    vae = _vae(0.13025 if xl else 0.18215)
    scheduler = _scheduler(family)
    if not xl:
        width = 1024 if family.startswith("sd2") else 768
        pad = "!" if family.startswith("sd2") else "<|endoftext|>"
        tokenizer = CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer", pad_token=pad))
        text_encoder = _trained_norm(torch, CLIPTextModel(_text_config(width, pad_token=pad)).eval(), seed)
        unet = _unet(torch, cross_attention_dim=width, in_channels=in_channels)
        parts = dict(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
        if family == "controlnet-sd1":
            pipeline = StableDiffusionControlNetPipeline(**parts, controlnet=_controlnet(torch, unet, seed))
        elif family == "sd1-inpaint":
            pipeline = StableDiffusionInpaintPipeline(**parts)
        else:
            pipeline = StableDiffusionPipeline(**parts)
    else:
        tokenizer_2 = CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer_2", pad_token="!"))
        text_encoder_2 = CLIPTextModelWithProjection(_text_config(32, projection=32, pad_token="!")).eval()
        if family == "sdxl-refiner":  # the refiner has only the second encoder and conditions on an aesthetic score
            unet = _unet(torch, cross_attention_dim=32, text_time=(5, 32))
            pipeline = StableDiffusionXLImg2ImgPipeline(
                vae=vae,
                text_encoder=None,
                text_encoder_2=text_encoder_2,
                tokenizer=None,
                tokenizer_2=tokenizer_2,
                unet=unet,
                scheduler=scheduler,
                requires_aesthetics_score=True,
                force_zeros_for_empty_prompt=False,
            )
        else:
            tokenizer = CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer"))
            text_encoder = CLIPTextModel(_text_config(32)).eval()
            unet = _unet(torch, cross_attention_dim=64, text_time=(6, 32), in_channels=in_channels)
            parts = dict(
                vae=vae,
                text_encoder=text_encoder,
                text_encoder_2=text_encoder_2,
                tokenizer=tokenizer,
                tokenizer_2=tokenizer_2,
                unet=unet,
                scheduler=scheduler,
            )
            if family == "controlnet-sdxl":
                pipeline = StableDiffusionXLControlNetPipeline(**parts, controlnet=_controlnet(torch, unet, seed))
            elif family == "sdxl-inpaint":
                pipeline = StableDiffusionXLInpaintPipeline(**parts)
            else:
                pipeline = StableDiffusionXLPipeline(**parts)
    pipeline.save_pretrained(folder)
    import shutil

    shutil.rmtree(tokens)
    return folder


def make_tiny_controlnet(base: Path, folder: Path, seed: int = 0) -> Path:
    """A standalone ControlNet folder (config.json + weights) made from the UNet of the tiny pipeline at `base`
    (an "sd1" or "sdxl" one), as real ControlNets start from their base model's UNet."""
    import torch
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(Path(base) / "unet")
    _controlnet(torch, unet, seed).save_pretrained(folder)
    return Path(folder)
