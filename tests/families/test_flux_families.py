"""Flux.1 dev, schnell and Chroma in the family table: detection from model_index.json and the transformer config,
their ONNX contracts (guidance input, pooled CLIP state, Chroma's masks), fp16 keep scopes, and the sizes an export
reads (JSON only, no torch)."""

from __future__ import annotations

import pytest

from enginefarm.errors import ConfigError
from enginefarm.families import FAMILIES, detect_family, input_ranges, profile_dims


@pytest.mark.parametrize(
    "index, transformer, expected",
    [
        ({"_class_name": "FluxPipeline"}, {"guidance_embeds": True}, "flux"),
        ({"_class_name": "FluxPipeline"}, {"guidance_embeds": False}, "flux-schnell"),
        ({"_class_name": "FluxImg2ImgPipeline"}, {}, "flux-schnell"),
        ({"_class_name": "ChromaPipeline"}, {}, "chroma"),
    ],
)
def test_flux_and_chroma_are_detected(index, transformer, expected):
    assert detect_family(index, {"transformer": transformer}).id == expected


def _inputs(family: str) -> list[tuple[str, tuple]]:
    f = FAMILIES[family]
    return [(t.name, t.shape) for t in f.component("transformer").io(f.sizes)[0]]


def test_the_contracts():
    latent = ("batch", 16, "height", "width")
    common = [
        ("hidden_states", latent),
        ("timestep", ("batch",)),
        ("encoder_hidden_states", ("batch", "context_tokens", 4096)),
    ]
    assert _inputs("flux") == common + [("pooled_projections", ("batch", 768)), ("guidance", ("batch",))]
    assert _inputs("flux-schnell") == common + [("pooled_projections", ("batch", 768))]
    assert _inputs("chroma") == common + [("attention_mask", ("batch", "context_tokens"))]
    flux, chroma = FAMILIES["flux"], FAMILIES["chroma"]
    assert [(t.name, t.shape) for t in flux.component("text_encoder").io(flux.sizes)[1]] == [
        ("pooler_output", ("batch", 768))
    ]
    assert [t.name for t in chroma.component("text_encoder").inputs] == ["input_ids", "attention_mask"]
    assert input_ranges(chroma, chroma.component("text_encoder"), chroma.sizes, 0.3611) == {
        "input_ids": (0, 32127),
        "attention_mask": (0, 1),
    }
    # no true CFG for Flux: one latent per image is the profile's optimum; Chroma guides with a negative prompt
    assert profile_dims(flux, flux.component("transformer"), flux.sizes)["batch"] == (1, 1, 2) and not flux.true_cfg
    assert profile_dims(chroma, chroma.component("transformer"), chroma.sizes)["batch"] == (1, 2, 2) and chroma.true_cfg
    # the T5 token count is dynamic (diffusers' max_sequence_length, up to 512); the default is the profile's opt:
    # dev and Chroma 512 (diffusers' default), schnell 256 (what it was trained with); the transformer's text follows
    schnell = FAMILIES["flux-schnell"]
    assert profile_dims(flux, flux.component("text_encoder_2"), flux.sizes)["text_length"] == (16, 512, 512)
    assert profile_dims(schnell, schnell.component("text_encoder_2"), schnell.sizes)["text_length"] == (16, 256, 512)
    assert profile_dims(schnell, schnell.component("transformer"), schnell.sizes)["context_tokens"] == (16, 256, 512)
    assert profile_dims(chroma, chroma.component("transformer"), chroma.sizes, text_length=(32, 64, 128))[
        "context_tokens"
    ] == (32, 64, 128)
    assert flux.shift_factor({}) == 0.1159 and flux.scaling_factor({}) == 0.3611
    assert flux.component("transformer").fp16_keep_fp32 == (
        "/model/time_text_embed/time_proj/",
        "/model/time_text_embed/time_proj_1/",
        "input:timestep",
        "input:guidance",
    )
    assert FAMILIES["flux-schnell"].component("transformer").fp16_keep_fp32 == (
        "/model/time_text_embed/time_proj/",
        "input:timestep",
    )


def test_sizes_come_from_the_configs():
    from enginefarm.export.source import read_sizes

    configs = {
        "text_encoder": {"hidden_size": 32, "projection_dim": 512, "vocab_size": 1000},
        "text_encoder_2": {"d_model": 48, "vocab_size": 700},
        "transformer": {"joint_attention_dim": 48, "pooled_projection_dim": 32, "in_channels": 64, "patch_size": 1},
        "vae": {"latent_channels": 16},
    }
    sizes = read_sizes(FAMILIES["flux"], configs)
    # the pooled state is CLIPTextModel's pooler_output: as wide as the encoder, whatever projection_dim says
    assert (
        sizes.pooled_width == 32
        and sizes.cross_attention_dim == 48
        and sizes.context_tokens == 512
        and sizes.latent_channels == 16
    )
    with pytest.raises(ConfigError, match="pooled_projection_dim is 64") as caught:
        read_sizes(
            FAMILIES["flux"], {**configs, "transformer": {**configs["transformer"], "pooled_projection_dim": 64}}
        )
    assert caught.value.hint
    chroma = read_sizes(
        FAMILIES["chroma"], {"text_encoder": {"d_model": 48, "vocab_size": 700}, "transformer": configs["transformer"]}
    )
    assert chroma.text_widths == (48,) and chroma.pooled_width == 0 and chroma.context_tokens == 512
