"""The tiny pipelines are real diffusers pipelines, and the same seed writes the same weights (the runtime
pipeline's tests compare with diffusers' images from them)."""

from __future__ import annotations

import pytest

from tests.tiny_pipelines import make_tiny_pipeline

pytestmark = pytest.mark.slow


def test_the_same_seed_writes_the_same_weights(tmp_path):
    first, second = make_tiny_pipeline("sdxl", tmp_path / "a"), make_tiny_pipeline("sdxl", tmp_path / "b")
    other = make_tiny_pipeline("sdxl", tmp_path / "c", seed=1)
    weights = sorted(p.relative_to(first) for p in first.rglob("*.safetensors"))
    assert len(weights) == 4
    assert all((first / w).read_bytes() == (second / w).read_bytes() for w in weights)
    assert (first / "unet" / "diffusion_pytorch_model.safetensors").read_bytes() != (
        other / "unet" / "diffusion_pytorch_model.safetensors"
    ).read_bytes()


def test_diffusers_generates_with_a_tiny_pipeline(tiny):
    import diffusers
    import torch

    pipeline = diffusers.DiffusionPipeline.from_pretrained(tiny("controlnet-sdxl"))
    image = pipeline(
        "a lighthouse",
        image=torch.rand(1, 3, 64, 64),
        num_inference_steps=2,
        height=64,
        width=64,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert image.shape == (1, 64, 64, 3)
    tokens = pipeline.tokenizer_2("a lighthouse", padding="max_length", max_length=77).input_ids
    assert tokens[0] == 512 and tokens[-1] == ord(
        "!"
    )  # <|startoftext|> first, padded with "!" like SDXL's second tokenizer
