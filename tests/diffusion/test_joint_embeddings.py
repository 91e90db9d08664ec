"""Textual inversion for the transformer families' CLIP encoders, with no rebuild: Flux.1's CLIP-L (one tensor or
`clip_l`) against diffusers' FluxPipeline.load_textual_inversion; SD3's CLIP-L + CLIP-G pair (`clip_l`, `clip_g`,
which diffusers' SD3 pipeline cannot load) against a hand reference: diffusers' StableDiffusion3Pipeline whose
tokenizers and CLIP tables are grown by hand, with the CLIP prompts expanded as `maybe_convert_prompt` does and T5
reading the raw prompt (as FluxPipeline's T5 does). T5 vectors, and Chroma (T5 alone), are refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginefarm.errors import WeightsError
from tests import models
from tests.diffusion.test_embeddings import _ours, _vectors

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

CLIP = 32  # the tiny CLIP encoders' width (Flux's CLIP-L, SD3's CLIP-L and CLIP-G)


def _close(ours: np.ndarray, theirs: np.ndarray) -> float:
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    return float(np.abs(ours - theirs).max())


@pytest.mark.slow
def test_flux_clip_embeddings_match_diffusers_load_textual_inversion(built, tmp_path):
    """An A1111 file (emb_params, 2 vectors, the file's name is the word) and a `clip_l` one at once: the pooled CLIP
    output and T5's states (which read the words as text) equal diffusers'."""
    source = built("flux")[0]
    a1111 = models.write_safetensors(tmp_path / "lhstyle.safetensors", {"emb_params": _vectors(1, 2, CLIP)})
    clip_l = models.write_safetensors(tmp_path / "cattoy.safetensors", {"clip_l": _vectors(2, 1, CLIP)})
    prompt = "a cattoy in lhstyle on a cliff"
    pipe = _ours(built("flux"), embeddings=[a1111, clip_l])
    ours = pipe.prompts.encode([prompt])
    theirs = diffusers.FluxPipeline.from_pretrained(source)
    theirs.load_textual_inversion(str(a1111), token="lhstyle")
    theirs.load_textual_inversion(str(clip_l), token="cattoy")
    with torch.no_grad():
        hidden, pooled, _ = theirs.encode_prompt(prompt, None, device="cpu", max_sequence_length=512)
    plain = _ours(built("flux")).prompts.encode([prompt])
    pooled_diff, hidden_diff = _close(ours.pooled, pooled.numpy()), _close(ours.hidden, hidden.numpy())
    print(f"flux clip embeddings: pooled {pooled_diff:.1e}, T5 states {hidden_diff:.1e} off diffusers")
    assert (
        pooled_diff < 2e-5 and hidden_diff < 5e-5
    )  # T5's states: ONNX Runtime vs torch on the same text (measured 1.5e-5)
    assert np.abs(plain.pooled - ours.pooled).max() > 100 * max(pooled_diff, 1e-6)  # the words moved the pooled output


def _grown_sd3(source: Path, word: str, vectors: dict[str, np.ndarray]):
    """diffusers' SD3 with `word`, `word_1`… added to CLIP-L's and CLIP-G's tokenizers and tables by hand."""
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(source)
    words = [word] + [f"{word}_{i}" for i in range(1, len(vectors["clip_l"]))]
    for tokenizer, encoder, key in (
        (pipe.tokenizer, pipe.text_encoder, "clip_l"),
        (pipe.tokenizer_2, pipe.text_encoder_2, "clip_g"),
    ):
        tokenizer.add_tokens(words)
        encoder.resize_token_embeddings(len(tokenizer))
        with torch.no_grad():
            table = encoder.get_input_embeddings().weight
            for token, row in zip(tokenizer.convert_tokens_to_ids(words), vectors[key], strict=True):
                table[token] = torch.from_numpy(row)
    return pipe, " ".join(words)


def test_sd3_clip_pair_matches_a_hand_grown_diffusers_pipeline(built, tmp_path):
    source = built("sd3")[0]
    vectors = {"clip_l": _vectors(3, 2, CLIP), "clip_g": _vectors(4, 2, CLIP)}
    path = models.write_safetensors(tmp_path / "sd3style.safetensors", vectors)
    prompt = "a lighthouse in sd3style"
    ours = _ours(built("sd3"), embeddings=[path]).prompts.encode([prompt])
    theirs, expanded = _grown_sd3(source, "sd3style", vectors)
    clip_prompt = prompt.replace("sd3style", expanded)
    with torch.no_grad():
        hidden, _, pooled, _ = theirs.encode_prompt(
            clip_prompt, clip_prompt, prompt, device="cpu", do_classifier_free_guidance=False
        )
    plain = _ours(built("sd3")).prompts.encode([prompt])
    hidden_diff, pooled_diff = _close(ours.hidden, hidden.numpy()), _close(ours.pooled, pooled.numpy())
    print(f"sd3 clip pair: hidden {hidden_diff:.1e}, pooled {pooled_diff:.1e} off the hand reference")
    assert hidden_diff < 2e-5 and pooled_diff < 2e-5
    assert np.abs(plain.pooled - ours.pooled).max() > 100 * max(pooled_diff, 1e-6)


def test_t5_vectors_and_chroma_are_refused_in_one_line(built, tmp_path):
    """SD3 with a `t5xxl` tensor beside its CLIP pair, and Chroma (T5 is its only text encoder): one WeightsError
    naming the file, before anything is fetched or loaded."""
    from enginefarm.diffusion.embeddings import read_embedding

    with_t5 = models.write_safetensors(
        tmp_path / "t5style.safetensors",
        {"clip_l": _vectors(1, 1, CLIP), "clip_g": _vectors(2, 1, CLIP), "t5xxl": _vectors(3, 1, 64)},
    )
    home = Path(__import__("os").environ["ENGINEFARM_HOME"])
    with pytest.raises(WeightsError, match=r"vectors for T5 \(t5xxl\)") as caught:
        _ours(built("sd3"), embeddings=[with_t5])
    assert "\n" not in str(caught.value) and str(with_t5) in str(caught.value)
    assert not (home / "artifacts").exists() or not any((home / "artifacts").iterdir())  # nothing was fetched
    one = models.write_safetensors(tmp_path / "style.safetensors", {"emb_params": _vectors(1, 1, 4096)})
    with pytest.raises(WeightsError, match="only text encoder is T5") as caught:
        read_embedding(one, {}, ("text_encoder",))
    assert "\n" not in str(caught.value) and str(one) in str(caught.value)
