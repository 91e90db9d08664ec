"""LoRAs as model sites ship them (one file for the UNet and the text encoder; LoCon, LoHa, LoKr, DoRA, full), on the
tiny SD 1.5 that `enginefarm export` and `enginefarm build` made (the session's `built` fixture), through
Pipeline.load(loras=…): a two-step generation's final latent against diffusers' own pipeline with the same LoRA
loaded by `load_lora_weights` where diffusers reads the format, else with the weights merged by hand (torch) here."""

from __future__ import annotations

import numpy as np
import pytest

from enginefarm.errors import ConfigError, WeightsError
from tests.models import write_safetensors
from tests.weights.lora_reference import diffusers_with_loras
from tests.weights.lora_reference import lora_pair as _lora_pair

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

PROMPT = "a lighthouse on a cliff at dawn"
STEPS = 2
STRENGTH = 0.8
Q = "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"  # Linear 64→64
CROSS_K = "mid_block.attentions.0.transformer_blocks.0.attn2.to_k"  # Linear 768→64
FF = "up_blocks.1.attentions.1.transformer_blocks.0.ff.net.0.proj"  # Linear 64→512
CONV3 = "up_blocks.0.resnets.0.conv1"  # Conv 3×3 128→64
CONV2 = "up_blocks.0.resnets.1.conv2"  # Conv 3×3 64→64
PROJ_IN = "mid_block.attentions.0.proj_in"  # Conv 1×1 64→64
TE_Q = "text_model.encoder.layers.0.self_attn.q_proj"  # Linear 768→768
TE_FC1 = "text_model.encoder.layers.1.mlp.fc1"  # Linear 768→64
TE_V = "text_model.encoder.layers.1.self_attn.v_proj"  # Linear 768→768


def kohya(module: str, part: str = "unet") -> str:
    return f"lora_{part}_" + module.replace(".", "_")


def rand(rng, *shape, scale=0.1):
    return (rng.normal(0, scale, shape)).astype(np.float32)


def lora_pair(
    rng, prefix, out, inner, rank, alpha=None, kernel=(), up_name="lora_up.weight", down_name="lora_down.weight"
):
    return _lora_pair(rng, prefix, out, inner, rank, scale=0.1, alpha=alpha, kernel=kernel, down=down_name, up=up_name)


@pytest.fixture(scope="module")
def sd1(built):
    return built("sd1")


def ours(sd1, target, loras):
    import tomllib

    from enginefarm.diffusion import Pipeline

    _, out, store = sd1
    name = tomllib.loads((out / "recipe.toml").read_text())["model"]["name"]
    return Pipeline.load(
        name, store=str(store), precision="fp32", target=target, device="cpu", assets=out / "assets", loras=loras
    )


def theirs(sd1, *loras, merge=None):
    return diffusers_with_loras(diffusers.StableDiffusionPipeline, sd1[0], loras, STRENGTH, merge)


def latents(pipe):
    size = pipe.assets.native_pixels // pipe.vae_scale_factor
    return np.random.default_rng(0).standard_normal((1, pipe.latent_channels, size, size)).astype(np.float32)


def compare(got_pipe, reference_pipe) -> tuple[float, np.ndarray]:
    start = latents(got_pipe)
    size = got_pipe.assets.native_pixels
    reference = reference_pipe(
        PROMPT,
        num_inference_steps=STEPS,
        latents=torch.from_numpy(start),
        height=size,
        width=size,
        guidance_scale=6.0,
        output_type="latent",
    ).images.numpy()
    got = got_pipe(PROMPT, steps=STEPS, latents=start, guidance_scale=6.0, output_type="latent")
    return float(np.abs(got - reference).max()), got


def base_latent(sd1, target):
    pipe = ours(sd1, target, ())
    return pipe(PROMPT, steps=STEPS, latents=latents(pipe), guidance_scale=6.0, output_type="latent")


@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_kohya_lora_for_unet_and_text_encoder_matches_diffusers(sd1, tmp_path, target, caplog):
    """One kohya file (LoRA on Linear layers, LoCon on 3×3 and 1×1 convs, alpha) for the UNet and the text encoder;
    ours also carries SDXL's second-encoder layers, which this pipeline names once and leaves out."""
    rng = np.random.default_rng(1)
    # kohya writes one network alpha for every module (diffusers mis-scales files that mix alphas, or leave some out)
    t = {
        **lora_pair(rng, kohya(Q), 64, 64, 4, alpha=2.0),
        **lora_pair(rng, kohya(CROSS_K), 64, 768, 8, alpha=2.0),
        **lora_pair(rng, kohya(CONV3), 64, 128, 4, alpha=2.0, kernel=(3, 3)),
        **lora_pair(rng, kohya(PROJ_IN), 64, 64, 2, alpha=2.0, kernel=(1, 1)),
    }
    te = {**lora_pair(rng, kohya(TE_Q, "te"), 768, 768, 4), **lora_pair(rng, kohya(TE_V, "te"), 768, 768, 2)}
    te = {k: v * 3 for k, v in te.items()}  # the text encoder's change must show in the latent
    shipped = write_safetensors(
        tmp_path / "with_te2.safetensors", {**t, **te, **lora_pair(rng, kohya(TE_Q, "te2"), 32, 32, 2)}
    )
    # diffusers 0.42 with transformers 5 drops kohya's text-encoder layers ("UNEXPECTED" keys): it is given them in
    # PEFT's names instead, as a second adapter at the same weight
    unet_part = write_safetensors(tmp_path / "unet_part.safetensors", t)
    te_part = write_safetensors(
        tmp_path / "te_part.safetensors",
        {
            "text_encoder."
            + (TE_Q if TE_Q.replace(".", "_") in k else TE_V)
            + (".lora_A.weight" if "down" in k else ".lora_B.weight"): v
            for k, v in te.items()
        },
    )
    with caplog.at_level("WARNING"):
        pipe = ours(sd1, target, [(shipped, STRENGTH)])
    assert pipe.notes == [
        "ignored, no component of this pipeline takes them: with_te2.safetensors: 1 text_encoder_2 layer(s)"
    ]
    assert sum("text_encoder_2" in r.getMessage() for r in caplog.records) == 1
    assert (
        "stack" in pipe.sessions["unet"].artifact.options and "stack" in pipe.sessions["text_encoder"].artifact.options
    )
    assert "stack" not in pipe.sessions["vae_decoder"].artifact.options  # nothing for it: the base artifact itself
    diff, got = compare(pipe, theirs(sd1, unet_part, te_part))
    assert diff < 1e-4, diff
    assert np.abs(got - base_latent(sd1, target)).max() > 100 * max(diff, 1e-6)  # it changed something


def test_peft_prefixed_and_dora_match_diffusers(sd1, tmp_path):
    """diffusers/PEFT names (`unet.`, `text_encoder.` prefixes, lora_A/lora_B, no alpha) and DoRA (one magnitude per
    output row) on OpenVINO."""
    rng = np.random.default_rng(2)
    peft = {
        **lora_pair(rng, f"unet.{Q}", 64, 64, 4, up_name="lora_B.weight", down_name="lora_A.weight"),
        **lora_pair(rng, f"unet.{FF}", 512, 64, 4, up_name="lora_B.weight", down_name="lora_A.weight"),
        **lora_pair(rng, f"text_encoder.{TE_Q}", 768, 768, 4, up_name="lora_B.weight", down_name="lora_A.weight"),
    }
    peft = {k: v * 3 if k.startswith("text_encoder.") else v for k, v in peft.items()}
    path = write_safetensors(tmp_path / "peft.safetensors", peft)
    diff, _ = compare(ours(sd1, "openvino:cpu", [(path, STRENGTH)]), theirs(sd1, path))
    assert diff < 1e-4, ("peft", diff)

    # DoRA: diffusers 0.42 drops kohya's `dora_scale` for SD 1.x ("not compatible"), so the check uses PEFT's own
    # names (`lora_magnitude_vector`), which it reads; both are the same magnitude, one per output row.
    base = diffusers.StableDiffusionPipeline.from_pretrained(sd1[0]).unet.state_dict()
    dora = {}
    for module in (Q, FF, CROSS_K):
        w = base[f"{module}.weight"].numpy()
        dora.update(
            lora_pair(
                rng, f"unet.{module}", w.shape[0], w.shape[1], 4, up_name="lora_B.weight", down_name="lora_A.weight"
            )
        )
        norms = np.linalg.norm(w, axis=1)
        dora[f"unet.{module}.lora_magnitude_vector"] = (norms * rng.uniform(0.5, 1.5, norms.shape)).astype(np.float32)
    path = write_safetensors(tmp_path / "dora.safetensors", dora)
    diff, got = compare(ours(sd1, "openvino:cpu", [(path, STRENGTH)]), theirs(sd1, path))
    assert diff < 1e-4, ("dora", diff)


def hand_merged(tensors: dict, strength: float):
    """The test's own merge (torch), written from the LyCORIS definitions, for formats diffusers does not read."""

    def merge(pipe):
        for key in {k.split(".", 1)[0] for k in tensors}:  # kohya module names hold no dots
            t = {k[len(key) + 1 :]: torch.from_numpy(v) for k, v in tensors.items() if k.startswith(key + ".")}
            part, module = (
                ("te", key[len("lora_te_") :]) if key.startswith("lora_te_") else ("unet", key[len("lora_unet_") :])
            )
            model = pipe.text_encoder if part == "te" else pipe.unet
            names = {n.replace(".", "_"): n for n, _ in model.named_modules()}
            layer = model.get_submodule(names.get(module) or names[module.removeprefix("text_model_")])
            w = layer.weight
            if "hada_w1_a" in t:
                rank = t["hada_w1_b"].shape[0]
                if "hada_t1" in t:
                    w1 = torch.einsum("ijkl,jr,ip->prkl", t["hada_t1"], t["hada_w1_b"], t["hada_w1_a"])
                    w2 = torch.einsum("ijkl,jr,ip->prkl", t["hada_t2"], t["hada_w2_b"], t["hada_w2_a"])
                else:
                    w1, w2 = t["hada_w1_a"] @ t["hada_w1_b"], t["hada_w2_a"] @ t["hada_w2_b"]
                delta = (w1 * w2).reshape(w.shape)
            elif "lokr_w1" in t or "lokr_w1_a" in t:
                w1 = t["lokr_w1"] if "lokr_w1" in t else t["lokr_w1_a"] @ t["lokr_w1_b"]
                w2 = t["lokr_w2"] if "lokr_w2" in t else t["lokr_w2_a"] @ t["lokr_w2_b"]
                rank = (
                    t["lokr_w1_b"].shape[0]
                    if "lokr_w1_b" in t
                    else t["lokr_w2_b"].shape[0]
                    if "lokr_w2_b" in t
                    else None
                )
                if w.ndim == 4:
                    w1, w2 = w1[:, :, None, None], w2.reshape(w2.shape[0], -1, *w.shape[2:])
                delta = torch.kron(w1, w2).reshape(w.shape)
            elif "lora_mid.weight" in t:
                down, mid, up = t["lora_down.weight"], t["lora_mid.weight"], t["lora_up.weight"]
                rank = down.shape[0]
                delta = torch.einsum("ijkl,jr,pi->prkl", mid, down.flatten(1), up.flatten(1))
            else:
                rank, delta = None, t["diff"]
            scale = float(t["alpha"]) / rank if "alpha" in t and rank else 1.0
            w += strength * scale * delta.reshape(w.shape)

    return merge


@pytest.mark.parametrize("target", ["onnxruntime:cpu", "openvino:cpu"])
def test_loha_lokr_tucker_and_full_match_a_hand_merge(sd1, tmp_path, target):
    rng = np.random.default_rng(3)
    t = {}
    t.update(
        {
            f"{kohya(Q)}.hada_w1_a": rand(rng, 64, 4),
            f"{kohya(Q)}.hada_w1_b": rand(rng, 4, 64, scale=1),
            f"{kohya(Q)}.hada_w2_a": rand(rng, 64, 4),
            f"{kohya(Q)}.hada_w2_b": rand(rng, 4, 64, scale=1),
            f"{kohya(Q)}.alpha": np.array(2.0, np.float32),
        }
    )
    c = kohya(CONV3)  # LoHa with Tucker cores on a 3×3 conv
    t.update(
        {
            f"{c}.hada_t1": rand(rng, 3, 3, 3, 3, scale=1),
            f"{c}.hada_w1_a": rand(rng, 3, 64),
            f"{c}.hada_w1_b": rand(rng, 3, 128),
            f"{c}.hada_t2": rand(rng, 3, 3, 3, 3, scale=1),
            f"{c}.hada_w2_a": rand(rng, 3, 64),
            f"{c}.hada_w2_b": rand(rng, 3, 128),
        }
    )
    f = kohya(FF)  # LoKr: w1 full [16, 8], w2 decomposed [32, 8] (512 = 16·32, 64 = 8·8)
    t.update(
        {
            f"{f}.lokr_w1": rand(rng, 16, 8, scale=1),
            f"{f}.lokr_w2_a": rand(rng, 32, 2),
            f"{f}.lokr_w2_b": rand(rng, 2, 8),
            f"{f}.alpha": np.array(1.0, np.float32),
        }
    )
    p = kohya(PROJ_IN)  # LoKr on a 1×1 conv, both factors full (scale 1)
    t.update({f"{p}.lokr_w1": rand(rng, 8, 4, scale=1), f"{p}.lokr_w2": rand(rng, 8, 16, 1, 1)})
    m = kohya(CONV2)  # LoCon with a Tucker mid on a 3×3 conv: up [64, r, 1, 1], mid [r, r, 3, 3], down [r, 64, 1, 1]
    t.update(
        {
            f"{m}.lora_down.weight": rand(rng, 4, 64, 1, 1),
            f"{m}.lora_mid.weight": rand(rng, 4, 4, 3, 3, scale=1),
            f"{m}.lora_up.weight": rand(rng, 64, 4, 1, 1),
            f"{m}.alpha": np.array(2.0, np.float32),
        }
    )
    t[f"{kohya(TE_FC1, 'te')}.diff"] = rand(rng, 64, 768)
    t.update(
        {
            f"{kohya(TE_Q, 'te')}.hada_w1_a": rand(rng, 768, 2, scale=1),
            f"{kohya(TE_Q, 'te')}.hada_w1_b": rand(rng, 2, 768),
            f"{kohya(TE_Q, 'te')}.hada_w2_a": rand(rng, 768, 2, scale=1),
            f"{kohya(TE_Q, 'te')}.hada_w2_b": rand(rng, 2, 768),
        }
    )
    path = write_safetensors(tmp_path / "lycoris.safetensors", t)
    diff, got = compare(ours(sd1, target, [(path, STRENGTH)]), theirs(sd1, merge=hand_merged(t, STRENGTH)))
    assert diff < 1e-4, diff
    assert np.abs(got - base_latent(sd1, target)).max() > 100 * max(diff, 1e-6)


def test_bad_values_and_strengths_are_one_line_before_anything_is_cached(sd1, tmp_path):
    from enginefarm.cache.device_cache import DeviceCache

    rng = np.random.default_rng(4)
    good = lora_pair(rng, kohya(Q), 64, 64, 4)
    bad = dict(good)
    bad[f"{kohya(Q)}.lora_up.weight"] = bad[f"{kohya(Q)}.lora_up.weight"].copy()
    bad[f"{kohya(Q)}.lora_up.weight"][0, 0] = np.nan
    path = write_safetensors(tmp_path / "nan.safetensors", bad)
    with pytest.raises(WeightsError, match=f"{path}: 1 problem.*{kohya(Q)}.lora_up.weight holds Inf or NaN"):
        ours(sd1, "onnxruntime:cpu", [(path, 1.0)])
    fine = write_safetensors(tmp_path / "fine.safetensors", good)
    for strength in (1e308, float("inf")):
        with pytest.raises(ConfigError, match=f"LoRA {fine}: strength"):
            ours(sd1, "onnxruntime:cpu", [(fine, strength)])
    huge = write_safetensors(tmp_path / "huge.safetensors", {k: v * 1e25 for k, v in good.items()})
    with pytest.raises(WeightsError, match="huge.safetensors: merging into .*to_q.weight gives Inf or NaN"):
        ours(sd1, "onnxruntime:cpu", [(huge, 50.0)])
    te2_only = write_safetensors(tmp_path / "te2.safetensors", lora_pair(rng, kohya(TE_Q, "te2"), 32, 32, 2))
    with pytest.raises(
        WeightsError, match="no layer of this LoRA fits this pipeline's text_encoder, unet .*text_encoder_2 \\(1\\)"
    ):
        ours(sd1, "onnxruntime:cpu", [(te2_only, 1.0)])
    cached = list(DeviceCache(tmp_path / "home").entries())
    assert not any("stack" in c.manifest.options for c in cached)


def test_kohya_names_in_the_original_layout_are_the_same_lora(sd1, tmp_path):
    """`lora_unet_input_blocks_3_1_proj_in` (LDM's names, via weights.layouts) places each layer where
    `lora_unet_down_blocks_1_attentions_0_proj_in` does: the UNet's outputs are identical."""
    import tomllib

    import enginefarm

    rng = np.random.default_rng(5)
    original = {
        Q: "input_blocks.3.1.transformer_blocks.0.attn1.to_q",
        CONV3: "output_blocks.0.0.in_layers.2",
        PROJ_IN: "middle_block.1.proj_in",
    }
    layers = {
        Q: lora_pair(rng, "x", 64, 64, 4, alpha=2.0),
        CONV3: lora_pair(rng, "x", 64, 128, 4, alpha=2.0, kernel=(3, 3)),
        PROJ_IN: lora_pair(rng, "x", 64, 64, 4, alpha=2.0, kernel=(1, 1)),
    }
    files = {}
    for style, names in (("diffusers", {m: m for m in layers}), ("original", original)):
        files[style] = write_safetensors(
            tmp_path / f"{style}.safetensors",
            {k.replace("x.", f"{kohya(names[m])}.", 1): v for m, t in layers.items() for k, v in t.items()},
        )
    name = tomllib.loads((sd1[1] / "recipe.toml").read_text())["model"]["name"]
    feeds = {
        "sample": rand(rng, 1, 4, 8, 8, scale=1),
        "timestep": np.array([10.0], np.float32),
        "encoder_hidden_states": rand(rng, 1, 77, 768, scale=1),
    }
    outs = {
        style: enginefarm.load(
            f"{name}/unet",
            precision="fp32",
            device="cpu",
            store=str(sd1[2]),
            target="onnxruntime:cpu",
            loras=[(path, STRENGTH)],
        ).run(feeds)["out_sample"]
        for style, path in files.items()
    }
    base = enginefarm.load(
        f"{name}/unet", precision="fp32", device="cpu", store=str(sd1[2]), target="onnxruntime:cpu"
    ).run(feeds)["out_sample"]
    assert np.array_equal(outs["original"], outs["diffusers"]) and not np.allclose(outs["original"], base, atol=1e-3)
