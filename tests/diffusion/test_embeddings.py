"""Textual inversion with no rebuild: embedding files in the formats model sites ship (A1111's `emb_params`, diffusers'
`<token>`, SDXL's clip_l + clip_g pair) give the same text conditioning as diffusers' `load_textual_inversion` on the
tiny pipelines, exported and built once for the session (ONNX Runtime, fp32); bad files are one line each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginefarm.errors import ConfigError, WeightsError
from tests import models

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

TARGET = "onnxruntime:cpu"


def _model_name(out: Path) -> str:
    import tomllib

    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


def _ours(built_family, embeddings=(), target=TARGET):
    from enginefarm.diffusion import Pipeline

    _, out, store = built_family
    return Pipeline.load(
        _model_name(out),
        store=str(store),
        precision="fp32",
        target=target,
        device="cpu",
        assets=out / "assets",
        embeddings=embeddings,
    )


def _vectors(seed: int, count: int, width: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((count, width)) * 0.05).astype(np.float32)


def _theirs_hidden(source: Path, files: list[tuple[Path, str]], prompt: str) -> np.ndarray:
    pipe = diffusers.DiffusionPipeline.from_pretrained(source)
    for path, word in files:
        pipe.load_textual_inversion(str(path), token=word)
    with torch.no_grad():
        embeds, _ = pipe.encode_prompt(prompt, "cpu", 1, False)
    return embeds.numpy()


@pytest.mark.parametrize("target", [TARGET, "openvino:cpu"])
def test_sd1_embeddings_match_diffusers_load_textual_inversion(built, tmp_path, target):
    """A1111 (emb_params, 3 vectors, the word is the file's name) and diffusers (<token> key, 1 vector) files at
    once."""
    source, _, _ = built("sd1")
    a1111 = models.write_safetensors(tmp_path / "lhstyle.safetensors", {"emb_params": _vectors(1, 3, 768)})
    learned = models.write_safetensors(tmp_path / "learned_embeds.safetensors", {"<cat-toy>": _vectors(2, 1, 768)})
    prompt = "a <cat-toy> in lhstyle on a cliff"

    pipe = _ours(built("sd1"), embeddings=[a1111, learned], target=target)
    ours = pipe.prompts.encode([prompt]).hidden
    theirs = _theirs_hidden(source, [(a1111, "lhstyle"), (learned, "<cat-toy>")], prompt)
    plain = pipe.prompts.encode(["a cat-toy in style on a cliff"]).hidden
    assert np.abs(ours - theirs).max() < 2e-5, np.abs(ours - theirs).max()
    assert np.abs(ours - plain).max() > 1e-2  # the words changed the conditioning
    # the common case is unchanged: a prompt without the words encodes as on a pipeline without embeddings
    base = _ours(built("sd1"), target=target)
    assert np.array_equal(base.prompts.encode(["a photo"]).hidden, pipe.prompts.encode(["a photo"]).hidden)


@pytest.mark.slow
def test_sdxl_pair_matches_diffusers(built, tmp_path):
    source, _, _ = built("sdxl")
    pair = models.write_safetensors(
        tmp_path / "xlstyle.safetensors", {"clip_l": _vectors(3, 2, 32), "clip_g": _vectors(4, 2, 32)}
    )
    prompt = "a lighthouse, xlstyle"
    ours = _ours(built("sdxl"), embeddings=[pair]).prompts.encode([prompt])

    pipe = diffusers.DiffusionPipeline.from_pretrained(source)
    from safetensors.torch import load_file

    state = load_file(str(pair))  # diffusers reads the pair's halves one encoder at a time
    pipe.load_textual_inversion(
        state["clip_l"], token=["xlstyle", "xlstyle_1"], text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer
    )
    pipe.load_textual_inversion(
        state["clip_g"], token=["xlstyle", "xlstyle_1"], text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2
    )
    with torch.no_grad():
        hidden, _, pooled, _ = pipe.encode_prompt(
            prompt, device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=False
        )
    assert np.abs(ours.hidden - hidden.numpy()).max() < 2e-5
    assert np.abs(ours.pooled - pooled.numpy()).max() < 2e-5


@pytest.mark.parametrize(
    "tensors, message",
    [
        (
            {"emb_params": np.zeros((2, 1024), np.float32)},
            "is 1024 wide, this model's text_encoder is 768 wide: an embedding for another model",
        ),
        (
            {"clip_l": np.zeros((1, 768), np.float32), "clip_g": np.zeros((1, 1280), np.float32)},
            "an SDXL embedding (clip_l + clip_g), for a model",
        ),
        ({"emb_params": np.full((1, 768), np.nan, np.float32)}, "non-finite or absurd values"),
        ({"emb_params": np.full((1, 768), 1e300, np.float64)}, "non-finite or absurd values"),
        (
            {"a": np.zeros((1, 768), np.float32), "b": np.zeros((1, 768), np.float32)},
            "not a textual-inversion embedding",
        ),
    ],
)
def test_a_bad_embedding_is_one_line_before_anything_loads(built, tmp_path, tensors, message):
    _, out, store = built("sd1")
    path = models.write_safetensors(tmp_path / "bad.safetensors", tensors)
    home = Path(__import__("os").environ["ENGINEFARM_HOME"])
    with pytest.raises(WeightsError) as caught:
        _ours(built("sd1"), embeddings=[path])
    assert message in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert not (home / "artifacts").exists() or not any((home / "artifacts").iterdir())  # nothing was fetched


def test_token_ids_past_the_vocabulary_are_refused_before_running(built, tmp_path):
    pipe = _ours(built("sd1"))
    rows = pipe.prompts.added["text_encoder"]
    ids = pipe.prompts.tokenizers["text_encoder"](["a photo"])
    ids[0, 3] = rows.rows + 5  # what a tokenizer of another model would give
    with pytest.raises(ConfigError, match=r"token ids \[1005\] are outside its vocabulary of 1000"):
        rows.feeds(ids, 768, True, "text_encoder")
    with pytest.raises(ConfigError, match="already in the tokenizer"):
        pipe.prompts.add_embeddings(
            [pipe.prompts.embeddings[0]] if pipe.prompts.embeddings else [_embedding(tmp_path, "a</w>")]
        )


def _embedding(tmp_path, word):
    from enginefarm.diffusion.embeddings import read_embedding

    path = models.write_safetensors(tmp_path / "e.safetensors", {"emb_params": np.zeros((1, 768), np.float32)})
    return read_embedding((path, word), {"text_encoder": 768})
