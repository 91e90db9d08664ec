"""`Pipeline.set_loras` and `embeddings_dir` on the tiny SD 1.5 that `enginefarm export` and `build` made (the session's
`built` fixture), fp32: a stack set on a loaded pipeline gives a fresh load's latent, a strength change reads no file
again and opens no session, no LoRA gives the base latent back, a bad file leaves the previous stack in use, and a
load parses each LoRA file once."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from enginefarm.errors import ConfigError, WeightsError
from tests.models import write_safetensors
from tests.weights.lora_reference import lora_pair

pytestmark = pytest.mark.slow

PROMPT = "a lighthouse on a cliff at dawn"
STEPS = 2


@pytest.fixture(scope="module")
def sd1(built):
    return built("sd1")


def load(sd1, target, **kwargs):
    from enginefarm.diffusion import Pipeline

    _, out, store = sd1
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return Pipeline.load(
        name, store=str(store), precision="fp32", target=target, device="cpu", assets=out / "assets", **kwargs
    )


@pytest.fixture
def parses(monkeypatch) -> Counter:
    """file → how many times its safetensors header was parsed: the real reader, counted."""
    from enginefarm.formats import safetensors_io

    counted: Counter = Counter()
    real = safetensors_io._read_header

    def counting(path):
        counted[Path(path).resolve()] += 1
        return real(path)

    monkeypatch.setattr(safetensors_io, "_read_header", counting)
    return counted


def latent(pipe, prompt=PROMPT) -> np.ndarray:
    size = pipe.assets.native_pixels // pipe.vae_scale_factor
    start = np.random.default_rng(0).standard_normal((1, pipe.latent_channels, size, size)).astype(np.float32)
    return pipe(prompt, steps=STEPS, latents=start, guidance_scale=6.0, output_type="latent")


def shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    found = {}
    for part in ("unet", "text_encoder"):
        (file,) = (folder / part).glob("*.safetensors")
        with safe_open(str(file), "np") as f:
            found.update({f"{part}/{k}": tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return found


def kohya_lora(path: Path, sd1, seed: int, suffixes: tuple[str, ...]) -> Path:
    """A kohya file with a rank-2 layer on the first UNet weight ending in each suffix (Linear or conv, taken
    from the model's own checkpoint) and on the text encoder's first q_proj."""
    rng = np.random.default_rng(seed)
    tensors = {}
    known = shapes(sd1[0])
    for suffix in suffixes:
        name, shape = next((k, s) for k, s in sorted(known.items()) if k.endswith(suffix + ".weight"))
        part, module = name.split("/")
        module = module.removesuffix(".weight")
        if part == "text_encoder":  # kohya spells the encoder's modules with transformers' `text_model.`
            module = "text_model." + module.removeprefix("text_model.")
        prefix = f"lora_{'unet' if part == 'unet' else 'te'}_{module.replace('.', '_')}"
        tensors |= lora_pair(rng, prefix, shape[0], shape[1], 2, scale=0.3, alpha=2.0, kernel=tuple(shape[2:]))
    return write_safetensors(path, tensors)


SUFFIXES = ("attn1.to_q", "attn2.to_k", "resnets.0.conv1", "proj_in", "self_attn.q_proj")


@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_set_loras_is_a_fresh_load_and_a_strength_change_reads_nothing_again(sd1, tmp_path, target, parses):
    a = kohya_lora(tmp_path / "a.safetensors", sd1, 1, SUFFIXES)
    b = kohya_lora(tmp_path / "b.safetensors", sd1, 2, SUFFIXES[:2])
    pipe = load(sd1, target)
    base = latent(pipe)
    pipe.set_loras([(a, 0.8), (b, -0.5)])
    assert "set_loras merge" in pipe.timings
    first = latent(pipe)
    fresh = load(sd1, target, loras=[(a, 0.8), (b, -0.5)])
    assert np.array_equal(latent(fresh), first)  # the same graph, the same values
    assert np.abs(first - base).max() > 1e-2  # it changed something

    reads, unet = dict(parses), fresh.sessions["unet"]
    fresh.set_loras([(a, 0.3), (b, -0.5)])  # strengths only: nothing is read or opened again
    assert parses == reads
    assert fresh.sessions["unet"] is unet and "as inputs" in unet.explain()
    changed = latent(fresh)
    assert np.array_equal(changed, latent(load(sd1, target, loras=[(a, 0.3), (b, -0.5)])))
    assert np.abs(changed - first).max() > 1e-3

    fresh.set_loras([])  # no LoRA: the base weights fed back
    back = latent(fresh)
    assert np.abs(back - base).max() <= 1e-4 * np.ptp(base), np.abs(back - base).max()


def test_a_load_parses_each_lora_file_once(sd1, tmp_path, parses):
    """Pipeline.load reads each file once and deals the parsed layers to the UNet and the text encoder; a component
    loaded by itself with a stack (`enginefarm.load`, the way a custom-weights or seamless component loads) reads
    each once too, its cache key hashing the file's bytes without parsing it again."""
    import enginefarm

    a = kohya_lora(tmp_path / "a.safetensors", sd1, 1, SUFFIXES)
    b = kohya_lora(tmp_path / "b.safetensors", sd1, 2, SUFFIXES[:2])
    pipe = load(sd1, "onnxruntime:cpu", loras=[(a, 0.8), (b, -0.5)])
    assert (parses[a.resolve()], parses[b.resolve()]) == (1, 1)
    dealt = {c: [f.name for f, _ in files] for c, files in pipe._loras.dealt.items()}
    assert dealt == {"unet": ["a.safetensors", "b.safetensors"], "text_encoder": ["a.safetensors"]}

    _, out, store = sd1
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    unet = enginefarm.load(
        f"{name}/unet",
        precision="fp32",
        device="cpu",
        store=str(store),
        target="onnxruntime:cpu",
        loras=[(a, 0.8), (b, -0.5)],
    )
    assert (parses[a.resolve()], parses[b.resolve()]) == (2, 2)
    assert "weights: applied in memory at load" in unet.explain()
    assert unet.artifact.options["stack"]["loras"] == [[str(a), 0.8], [str(b), -0.5]]
    unet.close()


def test_a_bad_file_is_one_line_and_keeps_the_previous_stack(sd1, tmp_path):
    target = "onnxruntime:cpu"
    a = kohya_lora(tmp_path / "a.safetensors", sd1, 1, SUFFIXES)
    pipe = load(sd1, target, loras=[(a, 0.8)])
    before = latent(pipe)
    unet = pipe.sessions["unet"]
    nan = write_safetensors(
        tmp_path / "nan.safetensors",
        {
            k: np.full_like(v, np.nan)
            for k, v in lora_pair(np.random.default_rng(0), "lora_unet_x", 4, 4, 2, scale=1).items()
        },
    )
    stranger = kohya_lora(tmp_path / "other.safetensors", sd1, 3, SUFFIXES[:1])
    renamed = {k.replace("to_q", "to_z"): v for k, v in _tensors(stranger).items()}
    unknown = write_safetensors(tmp_path / "unknown.safetensors", renamed)
    for bad, error in [(nan, WeightsError), (unknown, WeightsError), (tmp_path / "missing.safetensors", Exception)]:
        with pytest.raises(error) as caught:
            pipe.set_loras([(a, 0.2), (bad, 1.0)])
        assert "\n" not in str(caught.value), str(caught.value)
        assert pipe.sessions["unet"] is unet
    with pytest.raises(ConfigError):
        pipe.set_loras([(a, float("nan"))])
    assert np.array_equal(latent(pipe), before)  # still the stack it had


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def test_embeddings_dir_loads_what_a_prompt_names(sd1, tmp_path):
    folder = tmp_path / "embeddings"
    folder.mkdir()
    vectors = (np.random.default_rng(4).standard_normal((2, 768)) * 0.05).astype(np.float32)
    write_safetensors(folder / "lhstyle.safetensors", {"emb_params": vectors})
    write_safetensors(folder / "broken.safetensors", {"emb_params": np.full((1, 768), np.inf, np.float32)})
    (folder / "pickled.pt").write_bytes(b"\x80\x04not read")
    with pytest.raises(ConfigError) as missing:
        load(sd1, "onnxruntime:cpu", embeddings_dir=tmp_path / "nowhere")
    assert "\n" not in str(missing.value)

    pipe = load(sd1, "onnxruntime:cpu", embeddings_dir=folder)
    plain = pipe.prompts.encode([PROMPT]).hidden
    latent(pipe, "a lhstyleish house")  # names nothing (a longer word)
    assert pipe.prompts.embeddings == []
    named = latent(pipe, "a house in lhstyle")
    assert [e.word for e in pipe.prompts.embeddings] == ["lhstyle"]
    given = load(sd1, "onnxruntime:cpu", embeddings=[folder / "lhstyle.safetensors"])
    assert np.array_equal(named, latent(given, "a house in lhstyle"))
    assert np.array_equal(pipe.prompts.encode([PROMPT]).hidden, plain)
    for word, error in [("broken", WeightsError), ("pickled", WeightsError)]:
        with pytest.raises(error) as caught:
            latent(pipe, f"a house, {word}")
        assert "\n" not in str(caught.value) and word in str(caught.value)
    assert [e.word for e in pipe.prompts.embeddings] == ["lhstyle"]
