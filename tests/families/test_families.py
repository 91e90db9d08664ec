"""The family table and detection: pure data, no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from enginefarm.errors import ConfigError
from enginefarm.families import (
    FAMILIES,
    controlnet_residuals,
    detect_family,
    family,
    input_ranges,
    profile_dims,
    with_controlnet,
)

CN_SD1 = {"_class_name": "ControlNetModel", "cross_attention_dim": 768, "addition_embed_type": None}
CN_SDXL = {"_class_name": "ControlNetModel", "cross_attention_dim": 2048, "addition_embed_type": "text_time"}


def _index(cls: str, **extra) -> dict:
    return {"_class_name": cls, "text_encoder": ["transformers", "CLIPTextModel"], **extra}


@pytest.mark.parametrize(
    "index, configs, expected",
    [
        (_index("StableDiffusionPipeline"), {"unet": {"cross_attention_dim": 768}}, "sd1"),
        (_index("StableDiffusionImg2ImgPipeline"), {"unet": {"cross_attention_dim": 768}}, "sd1"),
        (
            _index("StableDiffusionPipeline"),
            {"unet": {"cross_attention_dim": 1024}, "scheduler": {"prediction_type": "epsilon"}},
            "sd2",
        ),
        (
            _index("StableDiffusionPipeline"),
            {"unet": {"cross_attention_dim": 1024}, "scheduler": {"prediction_type": "v_prediction"}},
            "sd2-v",
        ),
        (_index("StableDiffusionXLPipeline"), {"unet": {"cross_attention_dim": 2048}}, "sdxl"),
        (_index("StableDiffusionXLImg2ImgPipeline"), {}, "sdxl"),
        (
            _index("StableDiffusionXLImg2ImgPipeline", text_encoder=[None, None], requires_aesthetics_score=True),
            {},
            "sdxl-refiner",
        ),
        ({"_class_name": "StableDiffusionXLImg2ImgPipeline", "text_encoder": [None, None]}, {}, "sdxl-refiner"),
        (_index("StableDiffusionControlNetPipeline"), {"unet": {"cross_attention_dim": 768}}, "controlnet-sd1"),
        (_index("StableDiffusionXLControlNetPipeline"), {}, "controlnet-sdxl"),
        (CN_SD1, {}, "controlnet-sd1"),
        (CN_SDXL, {}, "controlnet-sdxl"),
        # inpainting: a 9-channel UNet, saved as the inpaint pipeline or (some fine-tunes) as the plain one
        (
            _index("StableDiffusionInpaintPipeline"),
            {"unet": {"cross_attention_dim": 768, "in_channels": 9}},
            "sd1-inpaint",
        ),
        (_index("StableDiffusionPipeline"), {"unet": {"cross_attention_dim": 768, "in_channels": 9}}, "sd1-inpaint"),
        (
            _index("StableDiffusionInpaintPipeline"),
            {"unet": {"cross_attention_dim": 1024, "in_channels": 9}},
            "sd2-inpaint",
        ),
        (_index("StableDiffusionXLInpaintPipeline"), {"unet": {"in_channels": 9}}, "sdxl-inpaint"),
        (_index("StableDiffusionXLPipeline"), {"unet": {"in_channels": 9}}, "sdxl-inpaint"),
        # an inpaint pipeline around a 4-channel UNet is the plain family (diffusers blends the known region)
        (_index("StableDiffusionInpaintPipeline"), {"unet": {"cross_attention_dim": 768, "in_channels": 4}}, "sd1"),
        (_index("StableDiffusionXLInpaintPipeline"), {"unet": {"in_channels": 4}}, "sdxl"),
    ],
)
def test_detect_family(index, configs, expected):
    assert detect_family(index, configs).id == expected


@pytest.mark.parametrize(
    "index, configs, says",
    [
        ({"_class_name": "FluxFillPipeline"}, {}, "'FluxFillPipeline'"),
        ({}, {}, "None"),
        (_index("StableDiffusionPipeline"), {"unet": {"cross_attention_dim": 512}}, "cross_attention_dim 512"),
        # a width per block (a list) was looked up in a dict: TypeError (unhashable), a traceback, not this line
        (_index("StableDiffusionPipeline"), {"unet": {"cross_attention_dim": [768, 768]}}, "dim [768, 768]"),
        (
            _index("StableDiffusionDepth2ImgPipeline"),
            {"unet": {"cross_attention_dim": 1024, "in_channels": 5}},
            "5-channel UNet",
        ),
        (_index("StableDiffusionXLImg2ImgPipeline"), {"unet": {"in_channels": 9}}, "9-channel (inpainting) UNet"),
        ({"_class_name": "ControlNetModel", "cross_attention_dim": 1024}, {}, "cross_attention_dim 1024"),
    ],
)
def test_an_unknown_family_is_a_config_error_with_a_hint(index, configs, says):
    with pytest.raises(ConfigError) as caught:
        detect_family(index, configs)
    assert says in str(caught.value) and caught.value.hint
    assert "\n" not in str(caught.value)


def test_family_lookup_and_controlnet_variants():
    assert family("sdxl") is FAMILIES["sdxl"]
    with pytest.raises(ConfigError):
        family("sd4")
    assert with_controlnet(FAMILIES["sd1"]).id == "controlnet-sd1"
    assert with_controlnet(FAMILIES["controlnet-sdxl"]).id == "controlnet-sdxl"
    with pytest.raises(ConfigError):
        with_controlnet(FAMILIES["sdxl-refiner"])


def test_controlnet_residuals_of_the_real_models():
    sd1_down, sd1_mid = controlnet_residuals((320, 640, 1280, 1280), 2)
    sdxl_down, sdxl_mid = controlnet_residuals((320, 640, 1280), 2)
    assert len(sd1_down) == 12 and sd1_mid == (1280, 8)
    assert len(sdxl_down) == 9 and sdxl_mid == (1280, 4)
    assert [f for _, f in sd1_down] == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]
    unet_cn = FAMILIES["controlnet-sd1"].component("unet_controlnet")
    inputs, _ = unet_cn.io(FAMILIES["controlnet-sd1"].sizes)
    assert [t.name for t in inputs][-13:] == [f"down_block_additional_residual_{i}" for i in range(12)] + [
        "mid_block_additional_residual"
    ]
    _, outputs = FAMILIES["controlnet-sdxl"].component("controlnet").io(FAMILIES["controlnet-sdxl"].sizes)
    assert [t.name for t in outputs] == [f"down_block_res_sample_{i}" for i in range(9)] + ["mid_block_res_sample"]
    assert outputs[-1].shape == ("batch", 1280, "height_div4", "width_div4")


def test_the_onnx_contract_per_family():
    sdxl = FAMILIES["sdxl"]
    te2_in, te2_out = sdxl.component("text_encoder_2").io(sdxl.sizes)
    assert [(t.name, t.dtype, t.shape) for t in te2_in] == [
        ("input_ids", "int64", ("batch", 77)),
        ("added_embeds", "float32", ("batch", 77, 1280)),
        ("attention_mask", "int64", ("batch", 77)),  # compel's down-weighting masks words out
    ]
    assert [(t.name, t.shape) for t in te2_out] == [
        ("hidden_states", ("batch", 77, 1280)),
        ("text_embeds", ("batch", 1280)),
        ("layer_states", ("batch", 33, 77, 1280)),  # clip_skip: the embeddings and each of CLIP-G's 32 layers
    ]
    unet_in, unet_out = sdxl.component("unet").io(sdxl.sizes)
    assert [(t.name, t.shape) for t in unet_in] == [
        ("sample", ("batch", 4, "height", "width")),
        ("timestep", ("batch",)),
        ("encoder_hidden_states", ("batch", "prompt_tokens", 2048)),  # long prompts: chunks of 77
        ("text_embeds", ("batch", 1280)),
        ("time_ids", ("batch", 6)),
    ]
    assert unet_out[0].name == "out_sample"
    refiner = FAMILIES["sdxl-refiner"]
    assert refiner.component("unet").io(refiner.sizes)[0][-1].shape == ("batch", 5) and refiner.aesthetic_score
    sd1 = FAMILIES["sd1"]
    assert (
        sd1.component("text_encoder").io(sd1.sizes)[1][0].name == "last_hidden_state"
        and sd1.prompt_output == "last_hidden_state"
    )
    vae_in, vae_out = sd1.component("vae_encoder").io(sd1.sizes)
    assert vae_in[0].shape == ("batch", 3, "image_height", "image_width") and vae_out[0].shape == (
        "batch",
        8,
        "height",
        "width",
    )
    assert sd1.component("unet").io(sd1.sizes)[0][1].dtype == "float32"  # fractional timesteps (Euler)


def test_the_inpainting_unet_takes_9_channels_and_the_vae_stays_at_the_latents():
    for family_id, base in (("sd1-inpaint", "sd1"), ("sd2-inpaint", "sd2"), ("sdxl-inpaint", "sdxl")):
        inpainting, plain = FAMILIES[family_id], FAMILIES[base]
        assert inpainting.inpainting and not plain.inpainting and inpainting.component_names == plain.component_names
        unet_in, unet_out = inpainting.component("unet").io(inpainting.sizes)
        assert unet_in[0].shape == ("batch", 9, "height", "width") and unet_out[0].shape == (
            "batch",
            4,
            "height",
            "width",
        )
        assert [t.name for t in unet_in] == [t.name for t in plain.component("unet").io(plain.sizes)[0]]
        assert (
            inpainting.component("vae_encoder").io(inpainting.sizes)[1][0].shape[1] == 8
        )  # 4 latent channels' moments
        assert inpainting.component("vae_decoder").io(inpainting.sizes)[0][0].shape[1] == 4
    # an SD 1.x/2.x/SDXL UNet LoRA applies to the inpainting UNets too (the same module names)
    from enginefarm.weights.denoisers import UNET_KIND, families_of

    assert {"sd1-inpaint", "sd2-inpaint", "sdxl-inpaint"} <= set(families_of(UNET_KIND))
    # a family without inpainting reads its sample channels from the latent's (SD3: 16)
    assert FAMILIES["sd3"].sizes.value("sample_channels", FAMILIES["sd3"].component("transformer")) == 16


def test_profiles_and_validation_ranges():
    sd1, sdxl = FAMILIES["sd1"], FAMILIES["sdxl"]
    # the default profiles fit a 24 GB machine (tests/builder/test_memory.py): SD 1.x 256-768 px, SDXL 512-1024 px,
    # batch 1-2 (one image with guidance), the VAE an image at a time
    assert sd1.latent_range == (32, 64, 96) and FAMILIES["sd2-v"].latent_range == (64, 96, 96)
    assert sdxl.latent_range == (64, 128, 128)
    unet = profile_dims(sd1, sd1.component("unet"), sd1.sizes)
    assert {dim: unet[dim] for dim in ("batch", "height", "width")} == {
        "batch": (1, 2, 2),
        "height": (32, 64, 96),
        "width": (32, 64, 96),
    }
    assert profile_dims(sd1, sd1.component("vae_decoder"), sd1.sizes)["batch"] == (1, 1, 1)
    # `--batch` widens the denoiser, never the VAE (it runs an image at a time)
    encoder = profile_dims(sd1, sd1.component("vae_encoder"), sd1.sizes, latent=(8, 8, 16), batch=(1, 1, 2))
    assert encoder == {"batch": (1, 1, 1), "image_height": (64, 64, 128), "image_width": (64, 64, 128)}
    assert profile_dims(sd1, sd1.component("unet"), sd1.sizes, batch=(1, 2, 4))["batch"] == (1, 2, 4)
    cn = FAMILIES["controlnet-sd1"]
    assert profile_dims(cn, cn.component("unet_controlnet"), cn.sizes)["height_div8"] == (4, 8, 12)
    ranges = input_ranges(sdxl, sdxl.component("unet"), sdxl.sizes, 0.13025)
    assert ranges["timestep"] == (0, 999) and ranges["time_ids"] == (0, 1024)
    assert input_ranges(sd1, sd1.component("text_encoder"), sd1.sizes, 0.18215) == {
        "input_ids": (0, 49407),
        "added_embeds": (-0.1, 0.1),
        "attention_mask": (1, 1),  # validated at all ones; masking is checked against compel (tests/diffusion)
    }
    assert unet["prompt_tokens"] == (77, 77, 308)  # a long prompt: up to 4 chunks of 77, one at the opt
    assert "text_embeds" not in input_ranges(sd1, sd1.component("unet"), sd1.sizes, 0.18215)
    assert sdxl.component("vae_decoder").precisions == ("fp32",) and sd1.component("vae_decoder").precisions is None


def test_importing_the_families_loads_no_torch_and_no_numpy():
    code = (
        "import sys, json, enginefarm.families; print(json.dumps([m for m in ('torch', 'numpy', 'diffusers', "
        "'onnx') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_importing_the_exporter_loads_no_torch():
    code = (
        "import sys, json, enginefarm.export; print(json.dumps([m for m in ('torch', 'diffusers', 'transformers') "
        "if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_config_values_win_over_family_defaults():
    sdxl, sd2v = FAMILIES["sdxl"], FAMILIES["sd2-v"]
    assert sdxl.scaling_factor(None) == 0.13025 and sdxl.scaling_factor({"scaling_factor": 0.2}) == 0.2
    assert FAMILIES["sd1"].scaling_factor({}) == 0.18215
    assert (
        sd2v.prediction(None) == "v_prediction"
        and FAMILIES["sd1"].prediction({"prediction_type": "v_prediction"}) == "v_prediction"
    )
