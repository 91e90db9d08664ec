"""Sizes outside what a model's engines were built for are said in pixels and images, not latent tensor shapes."""

from __future__ import annotations

import pytest

from enginefarm.diffusion.sizes import pixel_range
from enginefarm.errors import ConfigError
from tests.diffusion.test_pipeline_matches_diffusers import _ours


def test_a_denoiser_profile_reads_in_pixels():
    """The issue's message was `[2, 4, 64, 96]` outside `[1, 4, 32, 32] .. [2, 4, 64, 64]`: that profile is 256-512 px
    a side at batch 1-2."""
    profile = {"sample": {"min": [1, 4, 32, 32], "opt": [2, 4, 64, 64], "max": [2, 4, 64, 48]}}
    covered = pixel_range(profile, "sample", 8)
    assert covered is not None and (covered.batch, covered.height, covered.width) == ((1, 2), (256, 512), (256, 384))
    assert str(covered) == "256-384 x 256-512 px, batch 1-2"
    assert pixel_range(profile, "hidden_states", 8) is None


@pytest.mark.slow
def test_an_image_size_outside_the_engines_is_one_line_in_pixels(built):
    """The tiny SD 1.x is built for 64-128 px (latent 8-16, tests/conftest.py's TINY_PROFILE)."""
    with _ours(built("sd1"), "onnxruntime:cpu", "fp32") as ours:
        with pytest.raises(
            ConfigError, match=r"256x64 px is outside what this Stable Diffusion 1.x model's engines"
        ) as e:
            ours("a lighthouse", height=64, width=256, steps=1)
        assert "64-128 x 64-128 px, batch 1-2" in str(e.value) and "--latent" in e.value.hint
