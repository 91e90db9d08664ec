"""Flux LoRAs in the formats common trainers write, through Pipeline.load(loras=…) on the tiny Flux.1 dev that
`enginefarm export` and `enginefarm build` made (the session's `built` fixture), against diffusers' FluxPipeline with
`load_lora_weights`, or a merge by hand (torch) where diffusers cannot read the file: a two-step generation's final
latent, ONNX Runtime fp32, within 1e-4 of its range.

Formats: diffusers/PEFT and ai-toolkit (`transformer.<diffusers module>.lora_A/B`, `text_encoder.` for CLIP), kohya /
sd-scripts (`lora_unet_double_blocks_0_img_attn_qkv`, alpha, `lora_te1_` for CLIP; fused q/k/v in Black Forest Labs'
layout, the up matrix split by rows onto diffusers' to_q/to_k/to_v), and the original layout dotted
(`diffusion_model.double_blocks.0.img_attn.qkv.lora_A`, as ComfyUI and musubi write it), which diffusers does not read.
The tiny transformer: 1 double and 1 single block, 16 wide (2 heads × 8), MLP 64; CLIP 32 wide."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import WeightsError
from tests.models import write_safetensors
from tests.weights.lora_reference import diffusers_with_loras, lora_pair

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

pytestmark = pytest.mark.slow

PROMPT = "a lighthouse on a cliff at dawn"
STEPS, SIZE, GUIDANCE, STRENGTH = 2, 64, 3.5, 0.8
WIDTH, MLP, CLIP = 16, 64, 32
TE_Q = "text_model.encoder.layers.0.self_attn.q_proj"  # CLIP Linear 32→32


def rand(rng, *shape, scale=0.2):
    return rng.normal(0, scale, shape).astype(np.float32)


def pair(rng, prefix, out, inner, rank=4, alpha=None, kohya=False, scale=0.2):
    names = {} if kohya else {"down": "lora_A.weight", "up": "lora_B.weight"}
    return lora_pair(rng, prefix, out, inner, rank, scale=scale, alpha=alpha, **names)


@pytest.fixture(scope="module")
def flux(built):
    return built("flux")


def ours(flux, loras):
    import tomllib

    from enginefarm.diffusion import Pipeline

    _, out, store = flux
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return Pipeline.load(
        name,
        store=str(store),
        precision="fp32",
        target="onnxruntime:cpu",
        device="cpu",
        assets=out / "assets",
        loras=loras,
    )


def theirs(flux, *loras, merge=None):
    return diffusers_with_loras(diffusers.FluxPipeline, flux[0], loras, STRENGTH, merge)


def compare(got_pipe, reference_pipe) -> tuple[float, np.ndarray]:
    """max |ours - diffusers| over diffusers' range, and our latent."""
    start = np.random.default_rng(0).standard_normal((1, 16, SIZE // 8, SIZE // 8)).astype(np.float32)
    packed = diffusers.FluxPipeline._pack_latents(torch.from_numpy(start), *start.shape)
    reference = reference_pipe(
        PROMPT,
        num_inference_steps=STEPS,
        latents=packed,
        height=SIZE,
        width=SIZE,
        guidance_scale=GUIDANCE,
        max_sequence_length=512,
        output_type="latent",
    ).images
    reference = diffusers.FluxPipeline._unpack_latents(reference, SIZE, SIZE, 8).numpy()
    got = got_pipe(
        PROMPT, steps=STEPS, latents=start, guidance_scale=GUIDANCE, height=SIZE, width=SIZE, output_type="latent"
    )
    return float(np.abs(got - reference).max() / (reference.max() - reference.min())), got


@pytest.fixture(scope="module")
def base(flux):
    return compare(ours(flux, ()), theirs(flux))[1]


def test_peft_and_ai_toolkit_names_match_diffusers(flux, tmp_path, base):
    """diffusers' own names with `transformer.` / `text_encoder.` prefixes and lora_A/lora_B (what ai-toolkit and
    diffusers' trainers write), for both block kinds, the embedders and CLIP."""
    rng = np.random.default_rng(1)
    t = {
        **pair(rng, "transformer.transformer_blocks.0.attn.to_q", WIDTH, WIDTH),
        **pair(rng, "transformer.transformer_blocks.0.attn.add_v_proj", WIDTH, WIDTH),
        **pair(rng, "transformer.transformer_blocks.0.ff.net.0.proj", MLP, WIDTH),
        **pair(rng, "transformer.single_transformer_blocks.0.proj_mlp", MLP, WIDTH),
        **pair(rng, "transformer.single_transformer_blocks.0.attn.to_k", WIDTH, WIDTH),
        **pair(rng, "transformer.context_embedder", WIDTH, 32),
        **pair(rng, "transformer.norm_out.linear", 2 * WIDTH, WIDTH),
        **pair(rng, f"text_encoder.{TE_Q}", CLIP, CLIP, scale=1.0),
    }
    path = write_safetensors(tmp_path / "peft.safetensors", t)
    pipe = ours(flux, [(path, STRENGTH)])
    assert (
        "stack" in pipe.sessions["transformer"].artifact.options
        and "stack" in pipe.sessions["text_encoder"].artifact.options
    )
    diff, got = compare(pipe, theirs(flux, path))
    print(f"flux peft: {diff:.1e} of the latent's range off diffusers")
    assert diff < 1e-4, diff
    assert np.abs(got - base).max() > 1e-2  # it changed something


def kohya_file(rng) -> dict[str, np.ndarray]:
    """sd-scripts' Flux names: the original layout's modules, fused q/k/v, one alpha per module."""
    t = {}
    for module, out, inner in (
        ("double_blocks_0_img_attn_qkv", 3 * WIDTH, WIDTH),
        ("double_blocks_0_txt_attn_qkv", 3 * WIDTH, WIDTH),
        ("double_blocks_0_img_attn_proj", WIDTH, WIDTH),
        ("double_blocks_0_txt_mlp_0", MLP, WIDTH),
        ("double_blocks_0_img_mod_lin", 6 * WIDTH, WIDTH),
        ("single_blocks_0_linear2", WIDTH, WIDTH + MLP),
        ("single_blocks_0_modulation_lin", 3 * WIDTH, WIDTH),
    ):
        t.update(pair(rng, f"lora_unet_{module}", out, inner, alpha=2.0, kohya=True))
    return t


def test_kohya_names_with_fused_qkv_match_diffusers(flux, tmp_path, base, caplog):
    """sd-scripts' file with CLIP layers (`lora_te1_`) and T5 layers (`lora_te3_`), which Flux's T5 does not take
    here: named once, in one line."""
    rng = np.random.default_rng(2)
    t = kohya_file(rng)
    te = pair(
        rng, "lora_te1_" + TE_Q.replace(".", "_"), CLIP, CLIP, alpha=2.0, kohya=True, scale=1.0
    )  # large: it must show in the latent
    t5 = pair(rng, "lora_te3_encoder_block_0_layer_0_SelfAttention_q", 32, 32, kohya=True)
    shipped = write_safetensors(tmp_path / "kohya_te3.safetensors", {**t, **te, **t5})
    with caplog.at_level("WARNING"):
        pipe = ours(flux, [(shipped, STRENGTH)])
    assert pipe.notes == [
        "ignored, no component of this pipeline takes them: kohya_te3.safetensors: 1 text_encoder_3 layer(s)"
    ]
    assert sum("text_encoder_3" in r.getMessage() for r in caplog.records) == 1
    # diffusers 0.42 raises on kohya T5 layers and drops kohya CLIP layers with transformers 5: it gets the
    # transformer's part as shipped and the CLIP layer in PEFT's names, as a second adapter at the same weight
    transformer_part = write_safetensors(tmp_path / "kohya.safetensors", t)
    scale = 2.0 / 4  # kohya's alpha / rank; PEFT's file has no alpha: its up matrix carries the scale
    te_part = write_safetensors(
        tmp_path / "te.safetensors",
        {
            f"text_encoder.{TE_Q}.{'lora_A' if 'down' in k else 'lora_B'}.weight": v * (1.0 if "down" in k else scale)
            for k, v in te.items()
            if not k.endswith("alpha")
        },
    )
    diff, got = compare(pipe, theirs(flux, transformer_part, te_part))
    print(f"flux kohya: {diff:.1e} of the latent's range off diffusers")
    assert diff < 1e-4, diff
    assert np.abs(got - base).max() > 1e-2


def hand_merge(tensors: dict[str, np.ndarray], strength: float):
    """Black Forest Labs' fused modules merged by hand into diffusers' split ones: ΔW = scale · B @ A over the fused
    rows, cut as the original layout stacks them (qkv: q, k, v; linear1: q, k, v, then the MLP)."""
    splits = {
        "double_blocks.0.img_attn.qkv": [("transformer_blocks.0.attn.to_" + x, WIDTH) for x in "qkv"],
        "double_blocks.0.txt_attn.qkv": [(f"transformer_blocks.0.attn.add_{x}_proj", WIDTH) for x in "qkv"],
        "single_blocks.0.linear1": [(f"single_transformer_blocks.0.attn.to_{x}", WIDTH) for x in "qkv"]
        + [("single_transformer_blocks.0.proj_mlp", MLP)],
        "single_blocks.0.linear2": [("single_transformer_blocks.0.proj_out", WIDTH)],
        # the original's final adaLN holds (shift, scale), diffusers' (scale, shift)
        "final_layer.adaLN_modulation.1": [("norm_out.linear", -WIDTH)],
        "txt_in": [("context_embedder", WIDTH)],
    }

    def merge(pipe):
        weights = dict(pipe.transformer.named_parameters())
        for original, targets in splits.items():
            for key in (f"diffusion_model.{original}", "lora_unet_" + original.replace(".", "_")):
                a, b = (
                    (f"{key}.lora_A.weight", f"{key}.lora_B.weight")
                    if key.startswith("diffusion")
                    else (f"{key}.lora_down.weight", f"{key}.lora_up.weight")
                )
                if a not in tensors:
                    continue
                scale = float(tensors[f"{key}.alpha"]) / tensors[a].shape[0] if f"{key}.alpha" in tensors else 1.0
                delta = strength * scale * torch.from_numpy(tensors[b]) @ torch.from_numpy(tensors[a])
                row = 0
                for name, rows in targets:
                    if rows < 0:  # halves swapped
                        weights[f"{name}.weight"] += torch.cat([delta[-rows:], delta[:-rows]])
                        break
                    weights[f"{name}.weight"] += delta[row : row + rows]
                    row += rows
                assert row in (0, delta.shape[0])

    return merge


def test_original_layout_dotted_and_kohya_linear1_match_a_hand_merge(flux, tmp_path, base):
    """The original layout with dots (ComfyUI, musubi: `diffusion_model.` and lora_A/B) and kohya's single-block
    `linear1` (q, k, v and the MLP in one module, 3·16 + 64 rows), final adaLN (halves swapped) and `txt_in`:
    diffusers 0.42 reads none of them right (its kohya converter fixes Flux.1's real widths for linear1, ignores the
    final layer's alpha and drops the embedders' layers), so the merge is by hand, with kohya's alpha / rank."""
    rng = np.random.default_rng(3)
    t = {
        **pair(rng, "diffusion_model.double_blocks.0.img_attn.qkv", 3 * WIDTH, WIDTH),
        **pair(rng, "diffusion_model.double_blocks.0.txt_attn.qkv", 3 * WIDTH, WIDTH),
        **pair(rng, "diffusion_model.single_blocks.0.linear2", WIDTH, WIDTH + MLP),
    }
    k = {
        **pair(rng, "lora_unet_single_blocks_0_linear1", 3 * WIDTH + MLP, WIDTH, alpha=8.0, kohya=True),
        **pair(rng, "lora_unet_final_layer_adaLN_modulation_1", 2 * WIDTH, WIDTH, alpha=2.0, kohya=True),
        **pair(rng, "lora_unet_txt_in", WIDTH, 32, alpha=2.0, kohya=True),
    }
    dotted, kohya = (
        write_safetensors(tmp_path / "comfy.safetensors", t),
        write_safetensors(tmp_path / "linear1.safetensors", k),
    )
    reference = theirs(flux, merge=hand_merge({**t, **k}, STRENGTH))
    diff, got = compare(ours(flux, [(dotted, STRENGTH), (kohya, STRENGTH)]), reference)
    print(f"flux dotted original + kohya linear1: {diff:.1e} of the latent's range off a hand merge")
    assert diff < 1e-4, diff
    assert np.abs(got - base).max() > 1e-2


def test_a_lora_of_another_family_is_one_line(flux, tmp_path):
    """A Flux LoRA on an SD model, an SD one on Flux: one line naming the file and both families, before anything
    loads."""
    from enginefarm.families import FAMILIES
    from enginefarm.weights.lora import deal, read

    rng = np.random.default_rng(4)
    flux_lora = write_safetensors(tmp_path / "flux_style.safetensors", kohya_file(rng))
    sd_lora = write_safetensors(
        tmp_path / "sd_style.safetensors",
        pair(rng, "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q", 64, 64, kohya=True),
    )
    with pytest.raises(WeightsError) as info:
        deal([(read(flux_lora), 1.0)], ["text_encoder", "unet", "vae_decoder"], FAMILIES["sd1"])
    assert (
        "flux_style.safetensors" in str(info.value) and "a Flux LoRA" in str(info.value) and "(sd1)" in str(info.value)
    )
    with pytest.raises(WeightsError) as info:
        ours(flux, [(sd_lora, 1.0)])
    text = str(info.value)
    assert (
        "\n" not in text
        and "sd_style.safetensors" in text
        and "UNet (SD 1.x/2.x/SDXL) LoRA" in text
        and "(flux)" in text
    )
    assert read(flux_lora).layers  # the file itself is fine: only the family differs
