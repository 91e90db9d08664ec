"""`enginefarm.load("MODEL/COMPONENT", loras=, weights=)` knows no family, only the component: a Flux LoRA or a
Flux transformer file on SD 1.5's UNet fails in one line naming the file and both kinds' families, before anything
is patched or cached (the stock artifact still loads, and the device cache holds only it)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import numpy as np
import pytest

import enginefarm
from enginefarm.errors import WeightsError
from tests.models import write_safetensors
from tests.weights.lora_reference import lora_pair
from tests.weights.originals import original_tensors, write_file

pytest.importorskip("diffusers")


def _cached(home: Path) -> list[str]:
    root = home / "artifacts"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_a_flux_file_on_an_sd_unet_is_refused_naming_both_families(built, tiny, tmp_path):
    _, out, store = built("sd1")
    ref = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"] + "/unet"
    rng = np.random.default_rng(0)
    lora = write_safetensors(
        tmp_path / "flux-style.safetensors",
        lora_pair(rng, "lora_unet_double_blocks_0_img_attn_qkv", 48, 16, 4, scale=0.1),
    )
    transformer = write_file(tmp_path / "flux1-dev.safetensors", original_tensors(tiny("flux"), "flux"))
    home = Path(os.environ["ENGINEFARM_HOME"])
    for kwargs, path, said in (
        (dict(loras=[(lora, 0.8)]), lora, "a Flux LoRA for flux, flux-schnell, chroma"),
        (dict(weights=str(transformer)), transformer, "Flux.1 transformer file"),
    ):
        with pytest.raises(WeightsError) as caught:
            enginefarm.load(ref, store=str(store), target="onnxruntime:cpu", device="cpu", **kwargs)
        message = str(caught.value)
        assert "\n" not in message and str(path) in message and said in message, message
        assert f"{ref} is a UNet (SD 1.x/2.x/SDXL) denoiser, for sd1, sd2" in message, message
    cached = _cached(home)
    stock = enginefarm.load(ref, store=str(store), target="onnxruntime:cpu", device="cpu")
    assert "stack" not in stock.artifact.options and _cached(home) == cached and len(cached) <= 1


def test_an_sdxl_lora_on_an_sd1_pipeline_is_named_as_such(built, tmp_path):
    """Both are UNet LoRAs; the width their cross-attention keys read (2048 for SDXL, 768 for SD 1.x) tells them
    apart before anything loads."""
    from enginefarm.diffusion import Pipeline

    _, out, store = built("sd1")
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    rng = np.random.default_rng(0)
    tensors = {
        **lora_pair(
            rng, "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k", 640, 2048, 4, scale=0.1
        ),
        **lora_pair(rng, "lora_te2_text_model_encoder_layers_0_self_attn_q_proj", 1280, 1280, 4, scale=0.1),
    }
    lora = write_safetensors(tmp_path / "sdxl-style.safetensors", tensors)
    with pytest.raises(WeightsError) as caught:
        Pipeline.load(name, store=str(store), device="cpu", assets=out / "assets", loras=[(lora, 0.7)])
    message = str(caught.value)
    assert "\n" not in message and str(lora) in message, message
    assert "an SDXL LoRA (its UNet layers read 2048-wide text); this model is Stable Diffusion 1.x" in message
    assert caught.value.hint == "use a LoRA trained for Stable Diffusion 1.x"
