"""The transformer families in the table (SD3, SD3.5): detection, the ONNX contract with per-encoder token counts,
the joint text layout, VAE factors, and the sizes an export reads from the configs (JSON only, no torch)."""

from __future__ import annotations

import pytest

from enginefarm.errors import ConfigError
from enginefarm.families import FAMILIES, detect_family, input_ranges, profile_dims

SD3_INDEX = {"_class_name": "StableDiffusion3Pipeline", "text_encoder_3": ["transformers", "T5EncoderModel"]}


@pytest.mark.parametrize(
    "transformer, expected",
    [
        ({"qk_norm": None, "dual_attention_layers": []}, "sd3"),
        ({}, "sd3"),
        ({"qk_norm": "rms_norm", "dual_attention_layers": []}, "sd3.5"),  # 3.5 Large
        ({"qk_norm": "rms_norm", "dual_attention_layers": [0, 1, 2]}, "sd3.5"),  # 3.5 Medium
    ],
)
def test_sd3_and_sd35_are_told_apart_by_the_transformer_config(transformer, expected):
    assert detect_family(SD3_INDEX, {"transformer": transformer}).id == expected
    assert (
        detect_family({**SD3_INDEX, "_class_name": "StableDiffusion3Img2ImgPipeline"}, {"transformer": transformer}).id
        == expected
    )


def test_the_sd3_onnx_contract():
    sd3 = FAMILIES["sd3"]
    assert sd3.denoiser == "transformer" and FAMILIES["sdxl"].denoiser == "unet"
    io = {c.name: c.io(sd3.sizes) for c in sd3.components}
    assert [(t.name, t.shape) for t in io["text_encoder"][1]] == [
        ("hidden_states", ("batch", 77, 768)),
        ("text_embeds", ("batch", 768)),
    ]
    assert [(t.name, t.shape) for t in io["text_encoder_2"][1]] == [
        ("hidden_states", ("batch", 77, 1280)),
        ("text_embeds", ("batch", 1280)),
    ]
    # T5 reads the pipeline's token count (dynamic: max_sequence_length, 256 by default), not CLIP's fixed 77
    assert [(t.name, t.dtype, t.shape) for t in io["text_encoder_3"][0]] == [
        ("input_ids", "int64", ("batch", "text_length"))
    ]
    assert [(t.name, t.shape) for t in io["text_encoder_3"][1]] == [
        ("last_hidden_state", ("batch", "text_length", 4096))
    ]
    assert (
        sd3.sizes.context_for(sd3, 256) == 77 + 256 == sd3.sizes.context_tokens
        and sd3.sizes.context_for(sd3, 32) == 77 + 32
    )
    assert sd3.component("text_encoder_3").tokenizer == "t5" and sd3.component("text_encoder").tokenizer == "clip"
    assert [(t.name, t.shape) for t in io["transformer"][0]] == [
        ("hidden_states", ("batch", 16, "height", "width")),
        ("timestep", ("batch",)),
        ("encoder_hidden_states", ("batch", "context_tokens", 4096)),
        ("pooled_projections", ("batch", 2048)),
    ]
    assert [(t.name, t.shape) for t in io["transformer"][1]] == [("out_sample", ("batch", 16, "height", "width"))]
    assert io["vae_encoder"][1][0].shape == ("batch", 32, "height", "width")
    assert sd3.component("transformer").dynamic_dims(sd3.sizes) == ("batch", "height", "width", "context_tokens")
    assert sd3.joint_text.width == ("text_encoder", "text_encoder_2") and sd3.joint_text.tokens == ("text_encoder_3",)
    assert FAMILIES["sd3.5"].components == sd3.components


def test_sd3_factors_ranges_and_precisions():
    sd3 = FAMILIES["sd3"]
    assert (
        sd3.scaling_factor(None) == 1.5305
        and sd3.shift_factor(None) == 0.0609
        and sd3.shift_factor({"shift_factor": 0.1}) == 0.1
    )
    assert FAMILIES["sd1"].shift_factor({"shift_factor": None}) == 0.0
    assert sd3.latent_range == (64, 128, 128)
    # T5's token count is dynamic (max_sequence_length, default 256); the transformer reads CLIP's 77 tokens before it
    assert profile_dims(sd3, sd3.component("transformer"), sd3.sizes) == {
        "batch": (1, 2, 2),
        "height": (64, 128, 128),
        "width": (64, 128, 128),
        "context_tokens": (93, 333, 589),
    }
    assert profile_dims(sd3, sd3.component("text_encoder_3"), sd3.sizes) == {
        "batch": (1, 2, 2),
        "text_length": (16, 256, 512),
    }
    # each encoder's ids stay in its own vocabulary (T5's 32128 rows, CLIP's 49408)
    assert input_ranges(sd3, sd3.component("text_encoder_3"), sd3.sizes, 1.5305) == {"input_ids": (0, 32127)}
    assert input_ranges(sd3, sd3.component("text_encoder"), sd3.sizes, 1.5305) == {
        "input_ids": (0, 49407),
        "added_embeds": (-0.1, 0.1),
    }
    assert input_ranges(sd3, sd3.component("transformer"), sd3.sizes, 1.5305)["timestep"] == (0, 999)
    assert (
        sd3.component("text_encoder_3").precisions == ("fp32", "bf16")
        and sd3.component("transformer").precisions is None
    )


def _configs(**changes) -> dict:
    configs = {
        "text_encoder": {"hidden_size": 32, "projection_dim": 32, "vocab_size": 1000},
        "text_encoder_2": {"hidden_size": 32, "projection_dim": 32, "vocab_size": 1000},
        "text_encoder_3": {"d_model": 64, "vocab_size": 700},
        "transformer": {"joint_attention_dim": 64, "pooled_projection_dim": 64, "in_channels": 16, "patch_size": 2},
        "vae": {"latent_channels": 16},
    }
    for folder, values in changes.items():
        configs[folder] = None if values is None else {**configs[folder], **values}
    return {k: v for k, v in configs.items() if v is not None}


def test_sizes_come_from_the_configs_and_are_checked():
    from enginefarm.export.source import read_sizes

    sizes = read_sizes(FAMILIES["sd3"], _configs())
    assert sizes.text_widths == (32, 32, 64) and sizes.cross_attention_dim == 64 and sizes.pooled_width == 64
    assert (
        sizes.projection_widths == (32, 32, 0)
        and sizes.vocab_sizes == (1000, 1000, 700)
        and sizes.context_tokens == 333
    )
    # a model shipped without T5: the pipeline feeds zeros as wide as the transformer's text input
    assert read_sizes(FAMILIES["sd3"], _configs(text_encoder_3=None)).text_widths == (32, 32, 64)
    for changes, says in (
        (dict(text_encoder_3={"d_model": 48}), "48 wide, the transformer.s joint_attention_dim is 64"),
        (dict(transformer={"pooled_projection_dim": 96}), "pooled_projection_dim is 96"),
        (dict(text_encoder={"hidden_size": 48}, transformer={"joint_attention_dim": 64}), "80 wide together"),
    ):
        with pytest.raises(ConfigError, match=says) as caught:
            read_sizes(FAMILIES["sd3"], _configs(**changes))
        assert caught.value.hint
