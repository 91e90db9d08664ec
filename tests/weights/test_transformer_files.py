"""Transformer-only single files as their publishers ship them: SD3/SD3.5 in Stability's MMDiT layout
(`model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight`) and Flux.1 in Black Forest Labs' layout
(`double_blocks.0.img_attn.qkv.weight`, bare or under `model.diffusion_model.`), written from the tiny models by
`tests/weights/originals.py` (the layouts run backwards).

Reading is checked against diffusers: SD3's `from_single_file` (config= the tiny folder) value for value. diffusers'
Flux converter fixes Flux.1's real widths (3072, MLP 12288) to cut `linear1`, so it cannot read the tiny file; it is
run instead on a Flux.1-wide file of one block each whose tensors are one column wide (the converter only cuts and
joins rows), and our reading of that file must equal its output row for row. Using: Pipeline.load(weights=FILE) on
the built tiny Flux gives diffusers' latent with the same weights."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from enginefarm.errors import WeightsError
from enginefarm.weights import layouts
from enginefarm.weights.single_file import LAYOUTS, Section, component_part, open_file
from tests.weights.originals import diffusers_tensors, original_tensors, to_original, write_file

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # config= is a local folder: nothing may be fetched


def _part(path: Path, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    view = component_part(path, "transformer", "m/transformer", {k: v.shape for k, v in tensors.items()}, tensors)
    assert view is not None
    return {name: view.array(name) for name in view.names}


@pytest.mark.parametrize("family, dtype", [("sd3", "fp16"), ("sd3.5", "bf16")])
def test_sd3_transformer_file_is_what_diffusers_reads(tiny, tmp_path, family, dtype):
    """SD3.5's tiny transformer has q/k norms and a second attention in its first block; the last block's context
    half is pre-only, its adaLN (shift, scale) where diffusers holds (scale, shift)."""
    folder = tiny(family)
    path = write_file(tmp_path / f"{family}.safetensors", original_tensors(folder, "sd3", only=("transformer",)), dtype)
    assert open_file(path).layout.id == "sd3"
    theirs = diffusers.SD3Transformer2DModel.from_single_file(
        str(path), config=str(folder), subfolder="transformer", torch_dtype=torch.float32
    )
    reference = {k: v.float().numpy() for k, v in theirs.state_dict().items()}
    ours = _part(path, diffusers_tensors(folder, "transformer"))
    assert set(ours) == set(reference)
    assert max(float(np.abs(ours[k] - reference[k]).max()) for k in ours) == 0.0


def test_flux_layout_is_what_diffusers_converter_gives_at_real_width(tmp_path):
    """Flux.1 dev's real widths (3072, 24 heads, MLP 12288), one block of each kind, every tensor one column wide:
    diffusers' converter and ours cut the same rows into the same names."""
    from diffusers import FluxTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    with torch.device("meta"):
        model = FluxTransformer2DModel(num_layers=1, num_single_layers=1, guidance_embeds=True)
    rng = np.random.default_rng(0)
    narrow = {
        k: rng.standard_normal((v.shape[0], 1) if v.ndim > 1 else v.shape).astype(np.float32)
        for k, v in model.state_dict().items()
    }
    original = to_original(Section(layouts.FLUX, ""), narrow)
    assert (
        "single_blocks.0.linear1.weight" in original
        and original["single_blocks.0.linear1.weight"].shape[0] == 3 * 3072 + 12288
    )
    converted = convert_flux_transformer_checkpoint_to_diffusers({k: torch.from_numpy(v) for k, v in original.items()})
    path = write_file(tmp_path / "flux1-wide.safetensors", original)
    ours = _part(path, narrow)
    assert set(ours) == set(converted) == set(narrow)
    assert all(np.array_equal(ours[k], converted[k].numpy()) for k in ours)


def test_flux_files_bare_and_prefixed_read_back_exactly(tiny, tmp_path, caplog):
    """BFL's bare file and a repack under `model.diffusion_model.` with an extra tensor: the same part; the extra is
    named once, in one line; a Flux file offered to SD3 names the file and both families. (In the bare layout every
    key is the transformer's: one it has no place for is an error naming it.)"""
    from enginefarm.families import FAMILIES
    from enginefarm.weights.routing import route

    folder = tiny("flux")
    tensors = diffusers_tensors(folder, "transformer")
    bare = write_file(tmp_path / "flux1-dev.safetensors", original_tensors(folder, "flux"), "bf16")
    extra = {"clip_vision.visual_projection.weight": np.ones((4, 4), np.float32)}  # a part no component takes
    prefixed = write_file(
        tmp_path / "flux1-repack.safetensors",
        original_tensors(folder, "flux-ldm", extra, only=("transformer",)),
        "bf16",
    )
    with caplog.at_level(logging.WARNING):
        assert [open_file(p).layout.id for p in (bare, prefixed)] == ["flux", "flux-ldm"]
    strays = [r.getMessage() for r in caplog.records if "no component takes" in r.getMessage()]
    assert len(strays) == 1 and "clip_vision.visual_projection.weight" in strays[0] and "\n" not in strays[0]
    rounded = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in tensors.items()}
    for path in (bare, prefixed):
        ours = _part(path, tensors)
        assert set(ours) == set(tensors) and all(np.array_equal(ours[k], rounded[k]) for k in ours)
    assert route(FAMILIES["flux"], ["text_encoder", "transformer", "vae_decoder"], bare, None) == {"transformer": bare}
    with pytest.raises(WeightsError) as caught:
        route(FAMILIES["sd3"], ["text_encoder", "transformer", "vae_decoder"], bare, None)
    assert (
        "\n" not in str(caught.value)
        and "flux1-dev.safetensors" in str(caught.value)
        and "Flux.1" in str(caught.value)
        and "sd3" in str(caught.value)
    )
    assert LAYOUTS["sd3"].families == ("sd3", "sd3.5")


@pytest.mark.slow
def test_pipeline_with_a_flux_transformer_file_matches_diffusers(built, tmp_path):
    """A fine-tune of the tiny Flux's transformer shipped in BFL's layout at bf16, through Pipeline.load(weights=)."""
    import tomllib

    from enginefarm.diffusion import Pipeline
    from tests.weights.test_flux_lora import compare

    source, out, store = built("flux")
    reference = diffusers.FluxPipeline.from_pretrained(source)
    reference.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in reference.transformer.named_parameters():
            if ".norm_" in name:  # the random model's RMSNorm scales are all ones: the export keeps one initializer
                continue  # for them all, which a file cannot change one at a time (it says so)
            p.add_(0.05 * torch.randn(p.shape, generator=generator)).copy_(p.to(torch.bfloat16).float())
    tuned = {k: v.numpy() for k, v in reference.transformer.state_dict().items()}
    weights = write_file(
        tmp_path / "flux1-tuned.safetensors", to_original(LAYOUTS["flux"].components["transformer"], tuned), "bf16"
    )
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    ours = Pipeline.load(
        name,
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        weights=weights,
    )
    assert (
        "stack" in ours.sessions["transformer"].artifact.options
        and "stack" not in ours.sessions["text_encoder"].artifact.options
    )
    diff, got = compare(ours, reference)
    stock = diffusers.FluxPipeline.from_pretrained(source)
    stock.set_progress_bar_config(disable=True)
    moved, _ = compare(ours, stock)
    print(
        f"flux transformer file: {diff:.2e} of the latent's range off diffusers; the fine-tune moves it by {moved:.3f}"
    )
    assert diff < 1e-4 and moved > 100 * max(diff, 1e-6), (diff, moved)


@pytest.mark.slow
def test_pipeline_with_an_sd35_transformer_file_matches_diffusers(built, tmp_path):
    """A fine-tune of the tiny SD3.5's transformer in Stability's layout (fp16 file), through Pipeline.load(weights=)
    on its narrow build (ONNX Runtime fp32), against diffusers' StableDiffusion3Pipeline with the same weights."""
    import tomllib

    from enginefarm.diffusion import Pipeline

    source, out, store = built("sd3.5")
    reference = diffusers.StableDiffusion3Pipeline.from_pretrained(source)
    reference.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in reference.transformer.named_parameters():
            if ".norm_" in name:  # RMSNorm scales all ones in the random model: one shared initializer (see above)
                continue
            p.add_(0.05 * torch.randn(p.shape, generator=generator)).copy_(p.half().float())
    tuned = {k: v.numpy() for k, v in reference.transformer.state_dict().items()}
    weights = write_file(
        tmp_path / "sd3.5-tuned.safetensors", to_original(LAYOUTS["sd3"].components["transformer"], tuned), "fp16"
    )
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    ours = Pipeline.load(
        name,
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        weights=weights,
    )
    size = ours.assets.native_pixels
    latents = np.random.default_rng(0).standard_normal((1, 16, size // 8, size // 8)).astype(np.float32)

    def run(pipe):
        return pipe(
            "a red bicycle",
            negative_prompt="blurry",
            num_inference_steps=2,
            latents=torch.from_numpy(latents),
            height=size,
            width=size,
            guidance_scale=6.0,
            output_type="latent",
        ).images.numpy()

    want = run(reference)
    got = ours("a red bicycle", "blurry", steps=2, latents=latents, guidance_scale=6.0, output_type="latent")
    stock = diffusers.StableDiffusion3Pipeline.from_pretrained(source)
    stock.set_progress_bar_config(disable=True)
    span = float(want.max() - want.min())
    diff, moved = float(np.abs(got - want).max()) / span, float(np.abs(run(stock) - want).max()) / span
    print(
        f"sd3.5 transformer file: {diff:.2e} of the latent's range off diffusers; the fine-tune moves it by {moved:.3f}"
    )
    assert diff < 1e-4 and moved > 100 * max(diff, 1e-6), (diff, moved)


def test_export_stages_a_flux_transformer_file_over_its_base(tiny, tmp_path):
    """`enginefarm export flux1-dev.safetensors --base FOLDER`: the staged folder's transformer is the file's, read
    back by diffusers' own from_pretrained; the other components stay the base's."""
    from diffusers import FluxTransformer2DModel

    from enginefarm.export.single_file import stage

    folder = tiny("flux")
    tensors = diffusers_tensors(folder, "transformer")
    rng = np.random.default_rng(5)
    moved = {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in tensors.items()}
    path = write_file(
        tmp_path / "flux1-tuned.safetensors", to_original(LAYOUTS["flux"].components["transformer"], moved)
    )
    staged = stage(path, folder, tmp_path / "staged")
    model = FluxTransformer2DModel.from_pretrained(staged / "transformer")
    assert all(np.array_equal(v.numpy(), moved[k]) for k, v in model.state_dict().items())
    assert (staged / "vae").is_symlink() and (staged / "text_encoder").is_symlink()


def test_flux_vae_as_bfl_ships_it(tiny, tmp_path):
    """Flux.1's `ae.safetensors` is a VAE in the original (LDM) layout with 16 latent channels and no quant convs:
    each half equals AutoencoderKL.from_single_file's, and Pipeline.load(vae=) routes it on a Flux model; an SD VAE
    of 4 channels given to Flux is refused, naming the file."""
    from enginefarm.families import FAMILIES
    from enginefarm.weights.routing import route

    folder = tiny("flux")
    path = write_file(tmp_path / "ae.safetensors", original_tensors(folder, "vae"))
    theirs = diffusers.AutoencoderKL.from_single_file(str(path), config=str(folder), subfolder="vae")
    reference = {k: v.numpy() for k, v in theirs.state_dict().items()}
    tensors = diffusers_tensors(folder, "vae")
    for component, half in (
        ("vae_decoder", ("decoder.", "post_quant_conv.")),
        ("vae_encoder", ("encoder.", "quant_conv.")),
    ):
        own = {k: v for k, v in tensors.items() if k.startswith(half)}
        view = component_part(path, component, f"m/{component}", {k: v.shape for k, v in own.items()}, own)
        assert set(view.names) == set(own) and all(np.array_equal(view.array(k), reference[k]) for k in own)
    assert route(FAMILIES["flux"], ["transformer", "vae_decoder", "vae_encoder"], None, path) == {
        "vae_decoder": path,
        "vae_encoder": path,
    }
    sd_vae = write_file(tmp_path / "sd-vae.safetensors", original_tensors(tiny("sd1"), "vae"))
    flux_decoder = {k: v for k, v in tensors.items() if k.startswith("decoder.")}
    with pytest.raises(WeightsError) as caught:
        component_part(
            sd_vae, "vae_decoder", "m/vae_decoder", {k: v.shape for k, v in flux_decoder.items()}, flux_decoder
        )
    assert (
        "\n" not in str(caught.value)
        and "sd-vae.safetensors" in str(caught.value)
        and "differ in shape" in str(caught.value)
    )
