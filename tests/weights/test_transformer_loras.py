"""SD3 LoRAs and Flux-format LoRAs on Chroma, through Pipeline.load(loras=…) on the tiny SD3 and Chroma that the
session's `built` fixture exported and built (the pipeline tests build them too), against diffusers' pipelines with
`load_lora_weights`: a two-step generation's final latent, ONNX Runtime fp32, within 1e-4 of its range.

SD3: diffusers' own names (`transformer.` and `text_encoder.` prefixes, lora_A/lora_B), what its trainers write.
Chroma: sd-scripts' Flux names (Black Forest Labs' layout, fused q/k/v split by rows onto to_q/to_k/to_v, alpha),
which diffusers reads for Chroma through the Flux loader. The tiny transformers: SD3 2 blocks 32 wide (MLP 128);
Chroma 1 double and 1 single block 16 wide (MLP 64)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.diffusion.test_flux_pipelines_match_diffusers import _latents as flux_latents
from tests.diffusion.test_flux_pipelines_match_diffusers import _run_theirs as run_flux
from tests.diffusion.test_pipeline_matches_diffusers import NEGATIVE, PROMPT, _model_name, _relative
from tests.models import write_safetensors
from tests.weights.lora_reference import diffusers_with_loras, lora_pair

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.slow

STEPS, STRENGTH = 2, 0.8
TE_Q = "text_model.encoder.layers.0.self_attn.q_proj"


def ours(family, loras):
    from enginefarm.diffusion import Pipeline

    _, out, store = family
    return Pipeline.load(
        _model_name(out),
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        loras=loras,
    )


def peft(rng, prefix, out, inner, scale=0.2):
    return lora_pair(rng, prefix, out, inner, 4, scale=scale, down="lora_A.weight", up="lora_B.weight")


def test_sd3_lora_in_diffusers_names_matches_diffusers(built, tmp_path):
    sd3 = built("sd3")
    rng = np.random.default_rng(11)
    width, mlp, clip = 32, 128, sd3_clip_width(sd3[0])
    t = {
        **peft(rng, "transformer.transformer_blocks.0.attn.to_q", width, width),
        **peft(rng, "transformer.transformer_blocks.0.attn.add_k_proj", width, width),
        **peft(rng, "transformer.transformer_blocks.0.ff.net.0.proj", mlp, width),
        **peft(rng, "transformer.transformer_blocks.1.attn.to_out.0", width, width),
        **peft(rng, f"text_encoder.{TE_Q}", clip, clip, scale=1.0),
    }
    path = write_safetensors(tmp_path / "sd3.safetensors", t)
    pipe = ours(sd3, [(path, STRENGTH)])
    assert (
        "stack" in pipe.sessions["transformer"].artifact.options
        and "stack" in pipe.sessions["text_encoder"].artifact.options
    )
    size = pipe.assets.native_pixels
    latents = np.random.default_rng(0).standard_normal((1, 16, size // 8, size // 8)).astype(np.float32)

    reference = diffusers_with_loras(diffusers.StableDiffusion3Pipeline, sd3[0], (path,), STRENGTH)
    theirs = reference(
        PROMPT,
        negative_prompt=NEGATIVE,
        num_inference_steps=STEPS,
        latents=torch.from_numpy(latents),
        height=size,
        width=size,
        guidance_scale=6.0,
        output_type="latent",
    ).images.numpy()
    got = pipe(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0, output_type="latent")
    plain = ours(sd3, ())(PROMPT, NEGATIVE, steps=STEPS, latents=latents, guidance_scale=6.0, output_type="latent")
    diff = _relative(got, theirs)
    print(f"sd3 peft: {diff:.1e} of the latent's range off diffusers")
    assert diff < 1e-4, diff
    assert np.abs(got - plain).max() > 1e-2  # it changed something


def sd3_clip_width(source) -> int:
    import json

    return json.loads((source / "text_encoder" / "config.json").read_text())["hidden_size"]


def test_flux_kohya_lora_on_chroma_matches_diffusers(built, tmp_path):
    chroma = built("chroma")
    rng = np.random.default_rng(12)
    width, mlp = 16, 64
    t = {}
    for module, out, inner in (
        ("double_blocks_0_img_attn_qkv", 3 * width, width),
        ("double_blocks_0_txt_attn_qkv", 3 * width, width),
        ("double_blocks_0_img_attn_proj", width, width),
        ("double_blocks_0_txt_mlp_0", mlp, width),
        ("single_blocks_0_linear2", width, width + mlp),
    ):
        t.update(lora_pair(rng, f"lora_unet_{module}", out, inner, 4, scale=0.2, alpha=2.0))
    path = write_safetensors(tmp_path / "chroma_kohya.safetensors", t)
    pipe = ours(chroma, [(path, STRENGTH)])
    assert "stack" in pipe.sessions["transformer"].artifact.options
    kwargs = dict(negative_prompt=NEGATIVE, guidance_scale=4.0)
    latents, size = flux_latents(64), 64

    def mine(p):
        return p(
            PROMPT,
            NEGATIVE,
            steps=STEPS,
            latents=latents,
            guidance_scale=4.0,
            height=size,
            width=size,
            output_type="latent",
        )

    theirs = run_flux(
        diffusers_with_loras(diffusers.ChromaPipeline, chroma[0], (path,), STRENGTH),
        latents,
        size,
        "latent",
        steps=STEPS,
        **kwargs,
    )
    got, plain = mine(pipe), mine(ours(chroma, ()))
    diff = _relative(got, theirs)
    print(f"chroma kohya (Flux names): {diff:.1e} of the latent's range off diffusers")
    assert diff < 1e-4, diff
    assert np.abs(got - plain).max() > 1e-2
