"""Weighted prompts, long prompts and clip_skip on the tiny SD 1.x and SDXL, exported and built once for the session
(ONNX Runtime, fp32), against references computed with transformers' CLIP:

- compel syntax: the compel package itself (its defaults, truncate_long_prompts=False for long prompts);
- A1111 syntax: A1111's emphasis re-computed here from its description (each fragment tokenized alone; chunks of 75
  tokens, cut after a comma within the last 20; each chunk's hidden states times each token's weight, then scaled
  so their mean is the unweighted mean; SDXL's pooled output is the first chunk's);
- clip_skip: diffusers' meaning computed with transformers (output_hidden_states=True): SD 1.x hidden_states
  [-(clip_skip + 1)] through final_layer_norm, SDXL hidden_states[-(clip_skip + 2)] raw. (diffusers 0.42.1's own SD 1.x
  path raises AttributeError 'CLIPTextModel' object has no attribute 'text_model' under transformers 5; its SDXL path
  runs and is compared whole.)
One whole-pipeline run per feature compares the final latent with diffusers' fed the reference's embeddings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginefarm.errors import ConfigError

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
compel = pytest.importorskip("compel")  # compel 2.5.1 imports and runs with transformers 5 / diffusers 0.42

pytestmark = pytest.mark.slow
TARGET = "onnxruntime:cpu"
STEPS = 4
# The whole-pipeline runs compare text conditionings: with a scheduler whose loop matches diffusers' to 1e-6 here (the
# tiny UNets' schedulers are checked on their own in test_pipeline_matches_diffusers)
SCHEDULER = "dpmpp_2m"
# a long prompt: 180 tokens with the tiny tokenizer (3 chunks), with sentences and commas for both chunkers to cut at
LONG = " ".join(f"a tower number {i} of stone, with ivy and moss. " for i in range(5))


def _ours(built_family):
    import tomllib

    from enginefarm.diffusion import Pipeline

    _, out, store = built_family
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return Pipeline.load(name, store=str(store), precision="fp32", target=TARGET, device="cpu", assets=out / "assets")


def _encoders(source: Path, family: str):
    names = [("tokenizer", "text_encoder")] + ([("tokenizer_2", "text_encoder_2")] if family == "sdxl" else [])
    loaded = []
    for tok, enc in names:
        cls = transformers.CLIPTextModelWithProjection if enc == "text_encoder_2" else transformers.CLIPTextModel
        tokenizer = transformers.CLIPTokenizer.from_pretrained(source / tok)
        loaded.append((tokenizer, cls.from_pretrained(source / enc).eval()))
    return loaded


def _compel(source: Path, family: str):
    tokenizers, encoders = zip(*_encoders(source, family), strict=True)
    if family == "sdxl":
        return compel.Compel(
            tokenizer=list(tokenizers),
            text_encoder=list(encoders),
            returned_embeddings_type=compel.ReturnedEmbeddingsType.PENULTIMATE_HIDDEN_STATES_NON_NORMALIZED,
            requires_pooled=[False, True],
            truncate_long_prompts=False,
        )
    return compel.Compel(tokenizer=tokenizers[0], text_encoder=encoders[0], truncate_long_prompts=False)


def _max(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# -- A1111's emphasis, from its description


def _a1111_chunks(tokenizer, fragments):
    comma = tokenizer.convert_tokens_to_ids(",</w>")
    chunks, ids, weights, last_comma = [], [], [], -1
    for text, weight in fragments:
        for token in tokenizer(text, add_special_tokens=False).input_ids:
            if token == comma:
                last_comma = len(ids)
            elif len(ids) == 75 and last_comma != -1 and len(ids) - last_comma <= 20:
                chunks.append((ids[: last_comma + 1], weights[: last_comma + 1]))
                ids, weights, last_comma = ids[last_comma + 1 :], weights[last_comma + 1 :], -1
            if len(ids) == 75:
                chunks.append((ids, weights))
                ids, weights, last_comma = [], [], -1
            ids.append(token)
            weights.append(weight)
    if ids or not chunks:
        chunks.append((ids, weights))
    return chunks


def _a1111(source: Path, family: str, fragments):
    """(hidden [1, chunks·77, width], pooled or None) as A1111 computes them."""
    hidden, pooled = [], None
    with torch.no_grad():
        for tokenizer, encoder in _encoders(source, family):
            per_chunk = []
            for ids, weights in _a1111_chunks(tokenizer, fragments):
                row = [tokenizer.bos_token_id, *ids, tokenizer.eos_token_id]
                row += [tokenizer.pad_token_id] * (77 - len(row))
                w = torch.tensor([1.0, *weights] + [1.0] * (76 - len(weights)))
                out = encoder(torch.tensor([row]), output_hidden_states=True)
                z = out.hidden_states[-2] if family == "sdxl" else out.last_hidden_state
                before = z.mean()
                z = z * w[None, :, None]
                per_chunk.append(z * (before / z.mean()))
                if pooled is None and hasattr(out, "text_embeds"):
                    pooled = out.text_embeds.numpy()
            hidden.append(torch.cat(per_chunk, dim=1))
    return torch.cat(hidden, dim=-1).numpy(), pooled


A1111_FRAGMENTS = {
    "a (red:1.3) lighthouse, [foggy] (sea)": [("a ", 1.0), ("red", 1.3), (" lighthouse, ", 1.0), ("foggy", 1 / 1.1)]
    + [(" ", 1.0), ("sea", 1.1)],
    LONG + " (gold:1.4)": [(LONG + " ", 1.0), ("gold", 1.4)],
}


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_a1111_emphasis_matches_its_recomputation(built, family):
    source, _, _ = built(family)
    pipe = _ours(built(family))
    for prompt, fragments in A1111_FRAGMENTS.items():
        ours = pipe.prompts.encode([prompt], "a1111")
        hidden, pooled = _a1111(source, family, fragments)
        assert ours.hidden.shape == hidden.shape
        assert _max(ours.hidden, hidden) < 2e-5, (prompt[:20], _max(ours.hidden, hidden))
        if family == "sdxl":
            assert _max(ours.pooled, pooled) < 2e-5
    # the weights do something, and an unweighted short prompt is diffusers' own encoding
    plain = pipe.prompts.encode(["a red lighthouse, foggy sea"], "a1111").hidden
    assert _max(plain, pipe.prompts.encode(["a (red:1.3) lighthouse, [foggy] (sea)"], "a1111").hidden) > 1e-3
    assert np.array_equal(plain, pipe.prompts.encode(["a red lighthouse, foggy sea"], "none").hidden)


COMPEL_PROMPTS = ["a red+ lighthouse on a (stormy sea)1.3", "a lighthouse, fog-- and (rain)0.5", LONG + " gold++ ivy-"]


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_compel_syntax_matches_compel(built, family):
    source, _, _ = built(family)
    pipe = _ours(built(family))
    reference = _compel(source, family)
    for prompt in COMPEL_PROMPTS:
        ours = pipe.prompts.encode([prompt], "compel")
        with torch.no_grad():
            theirs = reference([prompt])
        hidden = theirs[0] if family == "sdxl" else theirs
        assert ours.hidden.shape == tuple(hidden.shape), prompt[:20]
        assert _max(ours.hidden, hidden) < 2e-5, (prompt[:20], _max(ours.hidden, hidden))
        if family == "sdxl":
            assert _max(ours.pooled, theirs[1]) < 2e-5
    assert pipe.prompts.encode([COMPEL_PROMPTS[-1]], "compel").hidden.shape[1] == 3 * 77


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_clip_skip_reads_diffusers_layer(built, family):
    source, _, _ = built(family)
    pipe = _ours(built(family))
    prompt = "a lighthouse on a cliff"
    for skip in (1, 2) if family == "sd1" else (1,):  # the tiny encoders have 2 layers: SDXL's skip 1 is the last
        want = []
        with torch.no_grad():
            for tokenizer, encoder in _encoders(source, family):
                ids = tokenizer([prompt], padding="max_length", max_length=77, return_tensors="pt").input_ids
                states = encoder(ids, output_hidden_states=True).hidden_states
                if family == "sdxl":
                    want.append(states[-(skip + 2)])
                else:
                    want.append(encoder.final_layer_norm(states[-(skip + 1)]))
        ours = pipe.prompts.encode([prompt], "none", clip_skip=skip).hidden
        assert _max(ours, torch.cat(want, dim=-1)) < 2e-5
    assert _max(pipe.prompts.encode([prompt], "none", clip_skip=1).hidden, pipe.prompts.encode([prompt]).hidden) > 1e-3
    with pytest.raises(ConfigError, match="clip_skip=3 is past text_encoder's 2 layers"):
        pipe(prompt, clip_skip=3, steps=1)


def test_embeddings_work_inside_weighted_and_long_prompts(built, tmp_path):
    from tests import models

    source, out, store = built("sd1")
    vector = (np.random.default_rng(3).standard_normal((1, 768)) * 0.05).astype(np.float32)
    path = models.write_safetensors(tmp_path / "learned_embeds.safetensors", {"<cat-toy>": vector})
    import tomllib

    from enginefarm.diffusion import Pipeline

    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    pipe = Pipeline.load(
        name, store=str(store), precision="fp32", target=TARGET, device="cpu", assets=out / "assets", embeddings=[path]
    )
    theirs = diffusers.DiffusionPipeline.from_pretrained(source)
    theirs.load_textual_inversion(str(path), token="<cat-toy>")
    reference = compel.Compel(tokenizer=theirs.tokenizer, text_encoder=theirs.text_encoder, truncate_long_prompts=False)
    prompt = LONG + " a (<cat-toy> on a rock)1.3 and sky-"
    with torch.no_grad():
        want = reference([prompt])
    assert _max(pipe.prompts.encode([prompt], "compel").hidden, want) < 2e-5
    plain = pipe.prompts.encode([prompt.replace("<cat-toy>", "cat")], "compel").hidden
    assert _max(plain, want) > 1e-3


# -- whole pipelines


def _theirs(source: Path):
    from enginefarm.diffusion import ALIASES

    pipe = diffusers.DiffusionPipeline.from_pretrained(source)
    pipe.set_progress_bar_config(disable=True)
    cls, overrides = ALIASES[SCHEDULER]
    pipe.scheduler = getattr(diffusers, cls).from_config(pipe.scheduler.config, **overrides)
    return pipe


def _latents(pipe, seed: int = 0) -> np.ndarray:
    size = pipe.assets.native_pixels // pipe.vae_scale_factor
    return np.random.default_rng(seed).standard_normal((1, pipe.latent_channels, size, size)).astype(np.float32)


def _relative(ours, theirs) -> float:
    return float(np.abs(ours - theirs).max() / (theirs.max() - theirs.min()))


def _run_both(ours, theirs, prompt, negative, **kwargs):
    latents = _latents(ours)
    size = ours.assets.native_pixels
    got = ours(
        prompt,
        negative,
        steps=STEPS,
        latents=latents,
        output_type="latent",
        width=size,
        height=size,
        scheduler=SCHEDULER,
        **kwargs,
    )
    return got, latents, size


def test_pipeline_with_a1111_weights_matches_diffusers(built):
    source, _, _ = built("sd1")
    ours, theirs = _ours(built("sd1")), _theirs(source)
    prompt = "a (red:1.3) lighthouse, [foggy] (sea)"
    got, latents, size = _run_both(ours, theirs, prompt, "blurry")
    positive, _ = _a1111(source, "sd1", A1111_FRAGMENTS[prompt])
    negative, _ = _a1111(source, "sd1", [("blurry", 1.0)])
    with torch.no_grad():
        want = theirs(
            prompt_embeds=torch.from_numpy(positive),
            negative_prompt_embeds=torch.from_numpy(negative),
            num_inference_steps=STEPS,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            output_type="latent",
        ).images.numpy()
    assert _relative(got, want) < 1e-4


def test_pipeline_with_a_long_compel_prompt_matches_diffusers(built):
    """The positive prompt is 3 chunks, the negative 1: padded with the empty prompt's chunk as compel pads it."""
    source, _, _ = built("sd1")
    ours, theirs = _ours(built("sd1")), _theirs(source)
    prompt = LONG + " gold++ ivy-"
    got, latents, size = _run_both(ours, theirs, prompt, "blurry, dark", prompt_syntax="compel")
    reference = _compel(source, "sd1")
    with torch.no_grad():
        positive, negative = reference.pad_conditioning_tensors_to_same_length(
            [reference([prompt]), reference(["blurry, dark"])]
        )
        assert positive.shape[1] == 3 * 77
        want = theirs(
            prompt_embeds=positive,
            negative_prompt_embeds=negative,
            num_inference_steps=STEPS,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            output_type="latent",
        ).images.numpy()
    assert _relative(got, want) < 1e-4


def test_pipeline_with_clip_skip_matches_diffusers_sdxl(built):
    """No negative prompt: SDXL's are zeros. (diffusers 0.42.1 reads a negative prompt at the default layer whatever
    clip_skip is; ours skips it as the positive, as A1111 and compel do.)"""
    source, _, _ = built("sdxl")
    ours, theirs = _ours(built("sdxl")), _theirs(source)
    got, latents, size = _run_both(ours, theirs, "a lighthouse", None, clip_skip=1)
    with torch.no_grad():
        want = theirs(
            "a lighthouse",
            clip_skip=1,
            num_inference_steps=STEPS,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            output_type="latent",
        ).images.numpy()
    assert _relative(got, want) < 1e-4
    plain, _, _ = _run_both(ours, theirs, "a lighthouse", None)
    assert _relative(plain, want) > 1e-3  # clip_skip changed the image


def test_a_prompt_past_the_unets_profile_is_one_line(built):
    ours = _ours(built("sd1"))
    with pytest.raises(ConfigError, match=r"the prompt is 6 chunks of 77 tokens; .* built for 4 \(308 tokens\)"):
        ours(LONG * 2, steps=1)
