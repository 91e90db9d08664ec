"""Tiny random-weight Flux.1 (dev: guidance embedding, resolution-dependent shift; schnell: neither) and Chroma
pipelines, written with `save_pretrained` (no download), seeded.

The real structure at toy sizes: FluxPipeline with CLIP-L (pooled output) and a T5 encoder with its unigram
tokenizer; ChromaPipeline with T5 alone; the transformers with 16-channel latents in 2x2 patches, position ids and
rotary embeddings over (2, 2, 4) axes; a 16-channel VAE (8x, no quant convs) with Flux's scaling and shift
factors; FlowMatchEulerDiscreteScheduler as each model ships it. Toy sizes: CLIP 32 wide, T5 32 wide with 2
layers, transformers 1 double and 1 single block of 2 heads x 8. T5 reads the family's token count (dev and
Chroma 512, schnell 256) or the call's `max_sequence_length`, as the real pipelines do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FLUX_FAMILIES = ("flux", "flux-schnell", "chroma")
T5_WIDTH = 32


def _t5(vocab_size: int):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=vocab_size,
        d_model=T5_WIDTH,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5EncoderModel(config).eval()


def _transformer(family: str):
    from diffusers import ChromaTransformer2DModel, FluxTransformer2DModel

    common = dict(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=T5_WIDTH,
        axes_dims_rope=(2, 2, 4),
    )
    if family == "chroma":
        return ChromaTransformer2DModel(
            **common, approximator_num_channels=16, approximator_hidden_dim=32, approximator_layers=2
        )
    return FluxTransformer2DModel(**common, pooled_projection_dim=32, guidance_embeds=family == "flux")


def _vae():
    """Flux's VAE: 16 latent channels, no quant convs, its scaling and shift factors; 8x like the real one."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(16, 16, 16, 16),
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=8,
        sample_size=64,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def _scheduler(family: str):
    """As the hub configs say: dev and Chroma shift by image size (mu from the token count), schnell not at all."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    if family == "flux-schnell":
        return FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False)
    return FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )


def make_tiny_flux(family: str, folder: Path, seed: int = 0) -> Path:
    """Write the tiny pipeline of `family` (one of FLUX_FAMILIES) to `folder` and return it."""
    import torch
    from diffusers import ChromaPipeline, FluxPipeline
    from transformers import CLIPTextModel, CLIPTokenizer, T5TokenizerFast

    from tests.diffusion_assets import write_t5_tokenizer
    from tests.tiny_pipelines import _text_config, write_tokenizer

    if family not in FLUX_FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FLUX_FAMILIES)}")
    folder = Path(folder)
    tokens = folder.parent / f".{folder.name}-tokenizers"
    torch.manual_seed(seed)
    t5_folder = write_t5_tokenizer(tokens / "t5", model_max_length=512)
    t5_tokenizer = T5TokenizerFast.from_pretrained(t5_folder)
    vocab = len(json.loads((t5_folder / "tokenizer.json").read_text())["model"]["vocab"])
    t5 = _t5(vocab + 8)
    common = dict(transformer=_transformer(family), vae=_vae(), scheduler=_scheduler(family))
    if family == "chroma":
        pipeline = ChromaPipeline(text_encoder=t5, tokenizer=t5_tokenizer, **common)
    else:
        clip = CLIPTextModel(_text_config(32)).eval()
        clip_tokenizer = CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "clip"))
        pipeline = FluxPipeline(
            text_encoder=clip, tokenizer=clip_tokenizer, text_encoder_2=t5, tokenizer_2=t5_tokenizer, **common
        )
    pipeline.save_pretrained(folder)
    shutil.rmtree(tokens)
    return folder
