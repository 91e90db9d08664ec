"""Single-file checkpoints and VAE files as model sites ship them, read by `enginefarm.weights` against diffusers.

Files are written from the tiny pipelines in the original LDM / SGM layouts (tests/weights/originals.py). Reading:
each component's part equals what diffusers' `from_single_file` reads from the same file (given the tiny folder as
`config=`, nothing downloaded), value for value, in fp32, fp16 and bf16 files. Using: `Pipeline.load(weights=…,
vae=…)` on a built tiny model gives diffusers' image with the same weights."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from enginefarm.errors import WeightsError
from enginefarm.weights.single_file import component_part, open_file
from tests.weights.originals import SUBFOLDERS, diffusers_tensors, original_tensors, write_file

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

LAYOUT = {"sd1": "sd1", "sd2": "sd2", "sdxl": "sdxl"}
PIPELINES = {"sd1": "StableDiffusionPipeline", "sd2": "StableDiffusionPipeline", "sdxl": "StableDiffusionXLPipeline"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # config= is a local folder: nothing may be fetched


def _part(path: Path, component: str, folder: Path) -> dict[str, np.ndarray]:
    tensors = diffusers_tensors(folder, SUBFOLDERS[component])
    if component.startswith("vae_"):
        tensors = {
            k: v
            for k, v in tensors.items()
            if k.startswith(
                ("decoder.", "post_quant_conv.") if component == "vae_decoder" else ("encoder.", "quant_conv.")
            )
        }
    view = component_part(path, component, f"m/{component}", {k: v.shape for k, v in tensors.items()}, tensors)
    assert view is not None
    return {name: view.array(name) for name in view.names}


def _state(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def _same(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], what: str, unread: str = "$^") -> float:
    """`unread`: a pattern of the names the part leaves out by design (layers the graph never reads)."""
    import re

    missing = sorted(set(theirs) - set(ours) - {k for k in theirs if k.endswith("position_ids")})
    assert all(re.match(unread, k) for k in missing), (what, missing[:5])
    worst = max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours)
    assert worst == 0.0, what
    return worst


@pytest.mark.parametrize("family, dtype", [("sd1", "fp16"), ("sd2", "fp32"), ("sdxl", "bf16")])
def test_each_part_is_what_diffusers_reads(tiny, tmp_path, family, dtype):
    folder = tiny(family)
    path = write_file(tmp_path / f"{family}.safetensors", original_tensors(folder, LAYOUT[family]), dtype)
    assert open_file(path).layout.id == LAYOUT[family]
    pipe = getattr(diffusers, PIPELINES[family]).from_single_file(
        str(path), config=str(folder), torch_dtype=torch.float32
    )
    theirs = {"unet": _state(pipe.unet), "text_encoder": _state(pipe.text_encoder), "vae": _state(pipe.vae)}
    if family == "sdxl":
        # At tiny sizes both SDXL encoders are 32 wide, and from_single_file takes the second for the first kind; its
        # OpenCLIP conversion is called on the second encoder's section directly.
        from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint, load_single_file_checkpoint

        checkpoint = {k: v.float() for k, v in load_single_file_checkpoint(str(path)).items()}
        converted = convert_open_clip_checkpoint(
            pipe.text_encoder_2, checkpoint, prefix="conditioner.embedders.1.model."
        )
        theirs["text_encoder_2"] = {k: v.numpy() for k, v in converted.items()}
    for component in ("unet", "text_encoder", "text_encoder_2", "vae_decoder", "vae_encoder"):
        if component == "text_encoder_2" and family != "sdxl":
            continue
        ours = _part(path, component, folder)
        reference = theirs["vae" if component.startswith("vae_") else component]
        if component.startswith("vae_"):
            reference = {
                k: v for k, v in reference.items() if k in ours or k.startswith(next(iter(ours)).split(".")[0])
            }
        # SDXL's first encoder is read at its penultimate layer: its last layer and final norm are not offered
        unread = (
            r"^(text_model\.)?(encoder\.layers\.1\.|final_layer_norm\.)"
            if (family, component) == ("sdxl", "text_encoder")
            else "$^"
        )
        _same(
            ours,
            {k: reference[k] for k in reference if k in ours or not k.startswith("vae")},
            f"{family} {component}",
            unread,
        )


def test_vae_files_each_half_takes_its_part(tiny, tmp_path):
    folder = tiny("sd1")
    vae = original_tensors(folder, "vae")
    original = write_file(tmp_path / "vae-original.safetensors", vae, "fp16")
    full = write_file(tmp_path / "vae-diffusers.safetensors", diffusers_tensors(folder, "vae"))
    assert open_file(original).layout.id == "vae" and open_file(full).layout.id == "vae-diffusers"
    theirs = _state(
        diffusers.AutoencoderKL.from_single_file(str(original), config=str(folder / "vae"), torch_dtype=torch.float32)
    )
    for path, reference in ((original, theirs), (full, diffusers_tensors(folder, "vae"))):
        decoder, encoder = _part(path, "vae_decoder", folder), _part(path, "vae_encoder", folder)
        assert set(decoder) | set(encoder) == set(reference) and not set(decoder) & set(encoder)
        _same({**decoder, **encoder}, reference, path.name)


def test_sd2_penultimate_layer_and_extras(tiny, tmp_path, caplog):
    """SD 2.x files carry OpenCLIP's last block (diffusers reads the penultimate layer) and the text projection; files
    from model sites carry scheduler buffers and EMA copies. None of them is an error; a key no component takes is
    named once, in one line."""
    folder = tiny("sd2")
    tensors = original_tensors(folder, "sd2")
    layers = {k.split(".")[4] for k in tensors if ".resblocks." in k}
    extra = {
        k.replace(f"resblocks.{max(layers)}.", f"resblocks.{len(layers)}."): v
        for k, v in tensors.items()
        if f"resblocks.{max(layers)}." in k
    }
    extra |= {
        "cond_stage_model.model.text_projection": np.eye(1024, dtype=np.float32),
        "alphas_cumprod": np.ones(10, np.float32),
        "model_ema.decay": np.ones((), np.float32),
        "cond_stage_model.model.logit_scale": np.ones((), np.float32),
        "embedding_manager.embedder.weight": np.ones(4, np.float32),
    }
    path = write_file(tmp_path / "sd2-extras.safetensors", {**tensors, **extra})
    with caplog.at_level(logging.WARNING, logger="enginefarm.weights.single_file"):
        part = _part(path, "text_encoder", folder)
        _part(path, "unet", folder)
    assert not any(f"layers.{len(layers)}." in k for k in part)
    warned = [r.getMessage() for r in caplog.records]
    assert (
        len(warned) == 1
        and "1 tensor(s) no component takes" in warned[0]
        and "embedding_manager.embedder.weight" in warned[0]
    )


def test_a_part_that_does_not_fit_names_the_file_and_what_it_is(tiny, tmp_path):
    sdxl = write_file(tmp_path / "sdxl.safetensors", original_tensors(tiny("sdxl"), "sdxl"))
    with pytest.raises(WeightsError) as caught:
        _part(sdxl, "unet", tiny("sd1"))
    text = str(caught.value)
    assert "\n" not in text and str(sdxl) in text and "Stable Diffusion XL single-file checkpoint (SGM layout)" in text
    assert "have no place" in text or "differ in shape" in text
    sd1 = write_file(tmp_path / "sd1.safetensors", original_tensors(tiny("sd1"), "sd1"))
    with pytest.raises(WeightsError, match="has no part for m/text_encoder_2"):
        _part(sd1, "text_encoder_2", tiny("sdxl"))


# -- whole pipelines: the tiny model built once per session, a fine-tune of it as a single file


def _tuned(source: Path, out: Path, seed: int, vae_only: bool = False) -> Path:
    """A copy of the pipeline at `source` with every weight (or the VAE's) moved by seeded noise, as a diffusers
    folder."""
    pipe = diffusers.DiffusionPipeline.from_pretrained(source)
    generator = torch.Generator().manual_seed(seed)
    modules = [pipe.vae] if vae_only else [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]
    with torch.no_grad():
        for module in modules:
            for name, p in module.named_parameters():
                if "position_embedding" in name:  # the build folds it into a constant: issue 27's text-encoder part
                    continue
                p.add_(torch.randn(p.shape, generator=generator) * 0.02 * (float(p.std()) if p.numel() > 1 else 1.0))
    pipe.save_pretrained(out)
    return out


def _image(pipe_or_ours, latents: np.ndarray, size: int, ours: bool) -> np.ndarray:
    if ours:
        return pipe_or_ours("a red bicycle", "blurry", steps=3, latents=latents, guidance_scale=6.0)
    pipe_or_ours.set_progress_bar_config(disable=True)
    out = pipe_or_ours(
        "a red bicycle",
        negative_prompt="blurry",
        num_inference_steps=3,
        latents=torch.from_numpy(latents),
        height=size,
        width=size,
        guidance_scale=6.0,
        output_type="np",
    ).images
    return np.asarray(out)[0]


def _model_name(out: Path) -> str:
    import tomllib

    return tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_pipeline_with_a_single_file_matches_diffusers(built, tmp_path, family):
    from enginefarm.diffusion import Pipeline

    source, out, store = built(family)
    started = time.perf_counter()  # the shared build above is not this test's cost
    tuned = _tuned(source, tmp_path / "tuned", seed=1)
    weights = write_file(
        tmp_path / "model.safetensors", original_tensors(tuned, family), "fp16" if family == "sd1" else "bf16"
    )
    vae = None
    if family == "sd1":  # and a VAE as shipped, over the checkpoint's own
        tuned_vae = _tuned(tuned, tmp_path / "tuned-vae", seed=2, vae_only=True)
        vae = write_file(tmp_path / "vae.safetensors", original_tensors(tuned_vae, "vae"))
    reference = diffusers.DiffusionPipeline.from_pretrained(tuned_vae if vae else tuned)
    for module in reference.components.values():  # the file holds fp16/bf16 values: the reference uses the same
        if (
            isinstance(module, torch.nn.Module)
            and module is not getattr(reference, "vae", None)
            or (module is reference.vae and vae is None)
        ):
            module.to({"sd1": torch.float16, "sdxl": torch.bfloat16}[family]).float()
    ours = Pipeline.load(
        _model_name(out),
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        weights=weights,
        vae=vae,
    )
    size = ours.assets.native_pixels
    latents = np.random.default_rng(0).standard_normal((1, 4, size // 8, size // 8)).astype(np.float32)
    got, want = _image(ours, latents, size, True), _image(reference, latents, size, False)
    stock = _image(diffusers.DiffusionPipeline.from_pretrained(source), latents, size, False)
    error = float(np.abs(got - want).max())
    cosine = float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want))
    print(
        f"{family}: max abs {error:.2e}, cosine {cosine:.8f}, stock differs by "
        f"{float(np.abs(stock - want).max()):.3f}; {time.perf_counter() - started:.1f} s after the shared build"
    )
    assert float(np.abs(stock - want).max()) > 20 * max(
        error, 1e-4
    )  # the fine-tune changes the image: the check can fail
    assert (
        error < 5e-4 and cosine > 0.99999
    )  # measured: SD1 1.1e-5, SDXL 1.4e-4 (the fine-tune moves the image by 0.04-0.09)


def test_pipeline_refuses_a_file_of_another_family_before_loading(built, tmp_path, tiny):
    from enginefarm.diffusion import Pipeline

    _, out, store = built("sd1")
    sdxl = write_file(tmp_path / "sdxl.safetensors", original_tensors(tiny("sdxl"), "sdxl"))
    home = Path(os.environ["ENGINEFARM_HOME"])
    with pytest.raises(WeightsError) as caught:
        Pipeline.load(
            _model_name(out),
            store=str(store),
            target="onnxruntime:cpu",
            device="cpu",
            assets=out / "assets",
            weights=sdxl,
        )
    assert "\n" not in str(caught.value) and str(sdxl) in str(caught.value) and "this model is sd1" in str(caught.value)
    assert not (home / "artifacts").exists() or not any((home / "artifacts").iterdir())  # nothing fetched or compiled


def test_export_stages_a_single_file_over_its_base(tiny, tmp_path, cli):
    """`enginefarm export FILE --base DIR` exports the folder `stage` writes: the base's configs and tokenizers with
    the file's weights; diffusers loads that folder as the fine-tune itself."""
    from enginefarm.export.single_file import stage

    source = tiny("sd1")
    tuned = _tuned(source, tmp_path / "tuned", seed=3)
    weights = write_file(tmp_path / "model.safetensors", original_tensors(tuned, "sd1"))
    staged = stage(weights, source, tmp_path / "staged")
    ours, theirs = (
        diffusers.DiffusionPipeline.from_pretrained(staged),
        diffusers.DiffusionPipeline.from_pretrained(tuned),
    )
    for name in ("unet", "vae", "text_encoder"):
        _same(_state(getattr(ours, name)), _state(getattr(theirs, name)), name)
    assert (staged / "tokenizer").resolve() == (source / "tokenizer").resolve()
    refused = cli("export", str(weights), "--out", str(tmp_path / "out"))
    assert refused.returncode != 0 and "--base" in refused.stderr and "Traceback" not in refused.stderr
    other = cli("export", str(weights), "--base", str(tiny("sdxl")), "--out", str(tmp_path / "out"))
    assert other.returncode != 0 and "this model is sdxl" in other.stderr and "Traceback" not in other.stderr
    assert not (tmp_path / "out").exists()


def test_routing_gives_each_component_its_file(tiny, tmp_path):
    """Pipeline.load's routing, from the headers alone: a checkpoint to every component it has a part for, vae= over the
    checkpoint's own VAE, and one-line errors for a checkpoint given as vae= or a file for another family."""
    from enginefarm.families import FAMILIES
    from enginefarm.weights.routing import route

    sd1 = write_file(tmp_path / "sd1.safetensors", original_tensors(tiny("sd1"), "sd1"))
    vae = write_file(tmp_path / "vae.safetensors", original_tensors(tiny("sd1"), "vae"))
    family = FAMILIES["sd1"]
    components = list(family.component_names)
    assert route(family, components, sd1, None) == {c: sd1 for c in components}
    assert route(family, components, sd1, vae) == {
        "text_encoder": sd1,
        "unet": sd1,
        "vae_decoder": vae,
        "vae_encoder": vae,
    }
    assert route(family, components, None, vae) == {"vae_decoder": vae, "vae_encoder": vae}
    with pytest.raises(WeightsError, match="not a VAE") as caught:
        route(family, components, None, sd1)
    assert "\n" not in str(caught.value)
    with pytest.raises(WeightsError, match="this model is sd2"):
        route(FAMILIES["sd2"], list(FAMILIES["sd2"].component_names), sd1, None)
