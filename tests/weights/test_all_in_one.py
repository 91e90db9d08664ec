"""Chroma's transformer file as lodestones ship it (Flux.1's blocks without their modulation, plus the
`distilled_guidance_layer` approximator: `layers.0.in_layer`, `norms.0.scale`), bare or under `model.diffusion_model.`,
and ComfyUI's all-in-one Flux file: the transformer under `model.diffusion_model.`, CLIP-L and T5 in transformers'
names under `text_encoders.clip_l.transformer.` / `text_encoders.t5xxl.transformer.`, the VAE in the original layout
under `vae.`; and SD3's file with its encoders.

diffusers' Chroma converter fixes the real widths (3072), so it runs on a real-width file of one block each whose
tensors are one column wide (as for Flux in test_transformer_files.py). The all-in-one file's text encoders and VAE
are checked against FluxPipeline.from_single_file value for value (its transformer: the tiny width again, checked
against the folder it was written from). Using either: Pipeline.load(weights=FILE) on the built tiny model gives
diffusers' latent with the same weights."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.weights import layouts
from enginefarm.weights.single_file import LAYOUTS, Section, component_part, open_file
from tests.weights.originals import SUBFOLDERS, diffusers_tensors, original_tensors, to_original, write_file

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

_HALVES = {"vae_decoder": ("decoder.", "post_quant_conv."), "vae_encoder": ("encoder.", "quant_conv.")}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # config= is a local folder: nothing may be fetched


def _part(path, component: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    view = component_part(path, component, f"m/{component}", {k: v.shape for k, v in tensors.items()}, tensors)
    assert view is not None
    return {name: view.array(name) for name in view.names}


def _component_tensors(folder, component: str) -> dict[str, np.ndarray]:
    tensors = diffusers_tensors(folder, SUBFOLDERS[component])
    return {k: v for k, v in tensors.items() if k.startswith(_HALVES.get(component, ""))}


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_chroma_layout_is_what_diffusers_converter_gives_at_real_width(tmp_path, prefix):
    from diffusers import ChromaTransformer2DModel
    from diffusers.loaders.single_file_utils import convert_chroma_transformer_checkpoint_to_diffusers

    with torch.device("meta"):
        model = ChromaTransformer2DModel(num_layers=1, num_single_layers=1, approximator_layers=2)
    rng = np.random.default_rng(0)
    narrow = {
        k: rng.standard_normal((v.shape[0], 1) if v.ndim > 1 else v.shape).astype(np.float32)
        for k, v in model.state_dict().items()
    }
    original = to_original(Section(layouts.CHROMA, prefix), narrow)
    assert (
        f"{prefix}distilled_guidance_layer.layers.1.out_layer.weight" in original
        and f"{prefix}distilled_guidance_layer.norms.0.scale" in original
    )
    converted = convert_chroma_transformer_checkpoint_to_diffusers(
        {k: torch.from_numpy(v) for k, v in original.items()}
    )
    path = write_file(tmp_path / "chroma.safetensors", original)
    assert open_file(path).layout.id == ("chroma-ldm" if prefix else "chroma")
    ours = _part(path, "transformer", narrow)
    assert set(ours) == set(converted) == set(narrow)
    assert all(np.array_equal(ours[k], converted[k].numpy()) for k in ours)


def test_comfyui_flux_file_parts_are_what_diffusers_reads(tiny, tmp_path):
    """Each component's part equals diffusers' reading of the same file (its transformer: the folder's own values);
    Pipeline.load routes the file to all five components, and a Chroma model refuses it naming both families."""
    from enginefarm.errors import WeightsError
    from enginefarm.families import FAMILIES
    from enginefarm.weights.routing import route

    folder = tiny("flux")
    extra = {
        "text_encoders.clip_l.logit_scale": np.ones((), np.float32),  # ComfyUI keeps these; no model reads them
        "text_encoders.clip_l.transformer.text_projection.weight": np.eye(32, dtype=np.float32),
    }
    path = write_file(tmp_path / "flux1-dev-fp8-comfy.safetensors", original_tensors(folder, "flux-ldm", extra))
    assert open_file(path).layout.id == "flux-ldm"
    transformer = diffusers.FluxTransformer2DModel.from_pretrained(folder, subfolder="transformer")
    theirs = diffusers.FluxPipeline.from_single_file(str(path), config=str(folder), transformer=transformer)
    modules = {
        "text_encoder": theirs.text_encoder,
        "text_encoder_2": theirs.text_encoder_2,
        "transformer": transformer,
        "vae_decoder": theirs.vae,
        "vae_encoder": theirs.vae,
    }
    for component, module in modules.items():
        base = _component_tensors(folder, component)
        ours = _part(path, component, base)
        # diffusers leaves T5's tied `encoder.embed_tokens` on the meta device; its `shared.weight` is compared
        reference = {k: v.numpy() for k, v in module.state_dict().items() if not v.is_meta and k in base}
        assert set(ours) == set(base) and set(reference) <= set(ours) and len(reference) >= len(ours) - 1, component
        assert max(float(np.abs(ours[k] - reference[k]).max()) for k in reference) == 0.0, component
    everything = [c.name for c in FAMILIES["flux"].components]
    assert route(FAMILIES["flux"], everything, path, None) == {c: path for c in modules}
    with pytest.raises(WeightsError) as caught:
        route(FAMILIES["chroma"], [c.name for c in FAMILIES["chroma"].components], path, None)
    assert (
        "\n" not in str(caught.value)
        and path.name in str(caught.value)
        and "Flux.1" in str(caught.value)
        and "chroma" in str(caught.value)
    )


def test_sd3_file_with_its_encoders_parts_are_what_diffusers_reads(tiny, tmp_path):
    """SD3's all-in-one file (Stability's "incl_clips" and ComfyUI's): MMDiT, CLIP-L, CLIP-G and T5 under
    `text_encoders.*.transformer.`, the VAE under `first_stage_model.`. The transformer, T5 and VAE parts equal
    StableDiffusion3Pipeline.from_single_file's; the CLIPs equal diffusers' `convert_ldm_clip_checkpoint` with each
    prefix (at tiny sizes from_single_file tells CLIP-L from CLIP-G by width, 32 for both, and reads CLIP-L twice)."""
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint
    from safetensors.torch import load_file

    folder = tiny("sd3")
    path = write_file(tmp_path / "sd3_medium_incl_clips_t5xxlfp16.safetensors", original_tensors(folder, "sd3"), "fp16")
    assert open_file(path).layout.id == "sd3" and len(open_file(path).components()) == 6
    theirs = diffusers.StableDiffusion3Pipeline.from_single_file(
        str(path), config=str(folder), torch_dtype=torch.float32
    )
    checkpoint = load_file(str(path))
    clips = {"text_encoder": "text_encoders.clip_l.transformer.", "text_encoder_2": "text_encoders.clip_g.transformer."}
    modules = {
        "text_encoder_3": theirs.text_encoder_3,
        "transformer": theirs.transformer,
        "vae_decoder": theirs.vae,
        "vae_encoder": theirs.vae,
    }
    for component in (*clips, *modules):
        base = _component_tensors(folder, component)
        ours = _part(path, component, base)
        if component in clips:
            reference = {
                k: v.float().numpy()
                for k, v in convert_ldm_clip_checkpoint(dict(checkpoint), clips[component]).items()
                if k in base
            }
        else:
            reference = {
                k: v.float().numpy() for k, v in modules[component].state_dict().items() if not v.is_meta and k in base
            }
        assert set(ours) == set(base) and set(reference) <= set(ours) and len(reference) >= len(ours) - 1, component
        assert max(float(np.abs(ours[k] - reference[k]).max()) for k in reference) == 0.0, component


def _perturbed(pipe, seed: int, modules) -> None:
    """Moves every tensor of `modules` that is not constant (norm scales of ones, zero biases: the export keeps one
    initializer for equal constants, which a file cannot change one at a time) by 5%, as a fine-tune would. T5's
    relative attention bias is left alone: the export folds it with the fixed positions into a constant no file can
    change (a file that changes it is refused, naming the tensor; the T5 in all-in-one files is the stock one)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in modules:
            for name, p in module.named_parameters():
                if p.numel() > 1 and float(p.std()) > 0 and "relative_attention_bias" not in name:
                    p.add_(0.05 * torch.randn(p.shape, generator=generator))


def _load(built_model, **kwargs):
    import tomllib

    from enginefarm.diffusion import Pipeline

    _, out, store = built_model
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return Pipeline.load(
        name,
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        **kwargs,
    )


@pytest.mark.slow
def test_pipeline_with_a_comfyui_flux_file_matches_diffusers(built, tmp_path):
    """A fine-tune of every component of the tiny Flux, in one ComfyUI file, through Pipeline.load(weights=)."""
    from tests.weights.test_flux_lora import compare

    source = built("flux")[0]
    reference = diffusers.FluxPipeline.from_pretrained(source)
    reference.set_progress_bar_config(disable=True)
    _perturbed(reference, 3, (reference.text_encoder, reference.text_encoder_2, reference.transformer, reference.vae))
    tuned = tmp_path / "tuned"
    reference.save_pretrained(tuned)
    path = write_file(tmp_path / "flux1-dev-comfy.safetensors", original_tensors(tuned, "flux-ldm"))
    ours = _load(built("flux"), weights=path)
    assert all(
        "stack" in ours.sessions[c].artifact.options
        for c in ("text_encoder", "text_encoder_2", "transformer", "vae_decoder")
    )
    diff, _ = compare(ours, reference)
    stock = diffusers.FluxPipeline.from_pretrained(source)
    stock.set_progress_bar_config(disable=True)
    moved, _ = compare(ours, stock)
    print(
        f"comfyui flux all-in-one: {diff:.2e} of the latent's range off diffusers; the fine-tune moves it by "
        f"{moved:.3f}"
    )
    assert diff < 1e-4 and moved > 100 * max(diff, 1e-6), (diff, moved)


@pytest.mark.slow
def test_pipeline_with_a_chroma_file_matches_diffusers(built, tmp_path):
    """A fine-tune of the tiny Chroma's transformer in lodestones' layout (bf16), through Pipeline.load(weights=),
    against diffusers' ChromaPipeline with the same weights (true CFG with a negative prompt)."""
    source = built("chroma")[0]
    reference = diffusers.ChromaPipeline.from_pretrained(source)
    reference.set_progress_bar_config(disable=True)
    _perturbed(reference, 4, (reference.transformer,))
    with torch.no_grad():
        for p in reference.transformer.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    tuned = {k: v.numpy() for k, v in reference.transformer.state_dict().items()}
    path = write_file(
        tmp_path / "chroma-tuned.safetensors", to_original(LAYOUTS["chroma"].components["transformer"], tuned), "bf16"
    )
    ours = _load(built("chroma"), weights=path)
    size = 64
    latents = np.random.default_rng(0).standard_normal((1, 16, size // 8, size // 8)).astype(np.float32)

    def run(pipe):
        packed = diffusers.FluxPipeline._pack_latents(torch.from_numpy(latents), *latents.shape)
        out = pipe(
            "a lighthouse",
            negative_prompt="blurry",
            num_inference_steps=2,
            latents=packed,
            height=size,
            width=size,
            guidance_scale=4.0,
            max_sequence_length=512,
            output_type="latent",
        ).images
        return diffusers.FluxPipeline._unpack_latents(out, size, size, 8).numpy()

    want = run(reference)
    got = ours(
        "a lighthouse",
        "blurry",
        steps=2,
        latents=latents,
        guidance_scale=4.0,
        height=size,
        width=size,
        output_type="latent",
    )
    stock = diffusers.ChromaPipeline.from_pretrained(source)
    stock.set_progress_bar_config(disable=True)
    span = float(want.max() - want.min())
    diff, moved = float(np.abs(got - want).max()) / span, float(np.abs(run(stock) - want).max()) / span
    print(
        f"chroma transformer file: {diff:.2e} of the latent's range off diffusers; the fine-tune moves it by "
        f"{moved:.3f}"
    )
    assert diff < 1e-4 and moved > 100 * max(diff, 1e-6), (diff, moved)
