"""Tiny random-weight diffusers pipelines of the transformer families (SD3, SD3.5), written with `save_pretrained`:
the same structure as the real models (pipeline class, CLIP-L and CLIP-G with projections, a T5 encoder and its
unigram tokenizer, the MMDiT with its patching and position embeddings, a 16-channel VAE with scaling and shift
factors, flow-matching scheduler with a static shift) at toy sizes, seeded. `make_tiny_pipeline` dispatches here.

Toy sizes: CLIPs 32 wide (pooled 32 + 32), T5 64 wide (the transformer's text width), transformer 2 layers of
4 heads × 8, patch 2; the T5 reads 256 tokens as SD3's pipeline does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TRANSFORMER_FAMILIES = ("sd3", "sd3.5")
SAMPLE_SIZE = 8  # latent pixels (64 image pixels through the 8x VAE)
T5_WIDTH = 64


def _t5(torch, vocab_size: int, width: int):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=vocab_size,
        d_model=width,
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


def _transformer(family: str, text_width: int):
    from diffusers import SD3Transformer2DModel

    extra = dict(qk_norm="rms_norm", dual_attention_layers=(0,)) if family == "sd3.5" else {}
    return SD3Transformer2DModel(
        sample_size=SAMPLE_SIZE,
        patch_size=2,
        in_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=text_width,
        caption_projection_dim=32,
        pooled_projection_dim=64,
        out_channels=16,
        pos_embed_max_size=16,
        **extra,
    )


def _vae():
    """SD3's VAE: 16 latent channels, no quant convs, scaling and shift factors; 8x like the real one."""
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
        sample_size=SAMPLE_SIZE * 8,
        scaling_factor=1.5305,
        shift_factor=0.0609,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def make_tiny_transformer_pipeline(family: str, folder: Path, seed: int = 0, t5_width: int = T5_WIDTH) -> Path:
    """`t5_width`: the T5's width and the transformer's text width (recipes/make_real_pipeline.py t5xxl swaps a
    real-size T5-XXL, 4096 wide, in beside the tiny parts)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5TokenizerFast

    from tests.diffusion_assets import write_t5_tokenizer
    from tests.tiny_pipelines import _text_config, write_tokenizer

    if family not in TRANSFORMER_FAMILIES:
        raise ValueError(f"unknown transformer family {family!r}; one of {', '.join(TRANSFORMER_FAMILIES)}")
    folder = Path(folder)
    tokens = folder.parent / f".{folder.name}-tokenizers"
    torch.manual_seed(seed)
    t5_folder = write_t5_tokenizer(tokens / "tokenizer_3", model_max_length=512)
    t5_tokenizer = T5TokenizerFast.from_pretrained(t5_folder)
    vocab = json.loads((t5_folder / "tokenizer.json").read_text())["model"]["vocab"]
    parts = dict(
        tokenizer=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer")),
        tokenizer_2=CLIPTokenizer.from_pretrained(write_tokenizer(tokens / "tokenizer_2", pad_token="!")),
        text_encoder=CLIPTextModelWithProjection(_text_config(32, projection=32)).eval(),
        text_encoder_2=CLIPTextModelWithProjection(_text_config(32, projection=32, pad_token="!")).eval(),
        text_encoder_3=_t5(torch, len(vocab) + 8, t5_width),
        tokenizer_3=t5_tokenizer,
        transformer=_transformer(family, t5_width),
        vae=_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    StableDiffusion3Pipeline(**parts).save_pretrained(folder)
    shutil.rmtree(tokens)
    return folder
