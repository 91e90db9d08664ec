"""`enginefarm export` on the tiny SD3 and SD3.5 pipelines, through the real CLI: the detected family, every ONNX
file against the family table and against diffusers/transformers on ONNX Runtime at two shapes it was not traced
at, the checkpoints, the assets a runtime needs (T5 tokenizer, shift factor), and a model shipped without T5."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from enginefarm.families import FAMILIES, Sizes

from .references import deviation, vae_reference

pytestmark = pytest.mark.slow

# batch, latent height, width, T5 tokens: the exporter traced at (2, 8, 8, 256) and checked (1, 6, 10, 128)
SHAPES = ((1, 8, 12, 40), (3, 10, 6, 512))


def _feeds(session, batch: int, height: int, width: int, tokens: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dims = {
        "batch": batch,
        "height": height,
        "width": width,
        "image_height": 8 * height,
        "image_width": 8 * width,
        "text_length": tokens,
        "context_tokens": 77 + tokens,
    }
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in arg.shape]
        if arg.name == "input_ids":
            feeds[arg.name] = rng.integers(0, vocab, size=shape).astype(np.int64)
        elif arg.name == "timestep":
            feeds[arg.name] = rng.uniform(0, 1000, size=shape).astype(np.float32)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _reference(pipeline, component: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What diffusers' SD3 pipeline computes from each component, written from the public APIs."""
    import torch
    from diffusers import SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    with torch.no_grad():
        if component == "text_encoder_3":
            result = {
                "last_hidden_state": T5EncoderModel.from_pretrained(pipeline / component).eval()(t["input_ids"])[0]
            }
        elif component.startswith("text_encoder"):
            out = CLIPTextModelWithProjection.from_pretrained(pipeline / component).eval()(
                t["input_ids"], output_hidden_states=True
            )
            result = {"hidden_states": out.hidden_states[-2], "text_embeds": out[0]}
        elif component == "transformer":
            model = SD3Transformer2DModel.from_pretrained(pipeline / "transformer").eval()
            result = {
                "out_sample": model(
                    hidden_states=t["hidden_states"],
                    timestep=t["timestep"],
                    encoder_hidden_states=t["encoder_hidden_states"],
                    pooled_projections=t["pooled_projections"],
                ).sample
            }
        else:
            result = vae_reference(pipeline, component, t)
    return {k: v.numpy() for k, v in result.items()}


@pytest.mark.parametrize("family", ["sd3", "sd3.5"])
def test_each_component_matches_diffusers_at_two_shapes(family, tiny, exported):
    import onnxruntime as ort

    pipeline, export = tiny(family), exported(tiny(family))
    assert export.family_json["family"] == family and f"{family} (" in export.proc.stdout
    assert tuple(export.family_json["components"]) == FAMILIES[family].component_names
    sizes = Sizes.from_json(export.family_json["sizes"])
    assert sizes.text_lengths == (77, 77, 256) and sizes.context_tokens == 333 and sizes.cross_attention_dim == 64
    worst = {}
    for name in export.family_json["components"]:
        component = FAMILIES[family].component(name)
        inputs, outputs = component.io(sizes)
        session = ort.InferenceSession(str(export.out / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        assert [(i.name, list(i.shape)) for i in session.get_inputs()] == [(t.name, list(t.shape)) for t in inputs]
        assert [(o.name, list(o.shape)) for o in session.get_outputs()] == [(t.name, list(t.shape)) for t in outputs]
        vocab = sizes.vocab_sizes[component.text_index]
        for seed, (batch, height, width, tokens) in enumerate(SHAPES):
            feeds = _feeds(session, batch, height, width, tokens, vocab, seed)
            got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
            want = _reference(pipeline, name, feeds)
            for output, value in got.items():
                assert value.shape == want[output].shape and value.shape[0] == batch, (name, output)
                worst[name] = max(worst.get(name, 0.0), deviation(want[output], value))
        assert worst[name] <= 1e-4, (name, worst[name])
    print(family, {k: f"{v:.1e}" for k, v in worst.items()})


def test_checkpoints_assets_and_recipe(tiny, exported):
    import torch
    from diffusers import SD3Transformer2DModel
    from safetensors.torch import load_file
    from transformers import T5EncoderModel

    pipeline, export = tiny("sd3"), exported(tiny("sd3"))
    # T5's tied embedding (shared.weight = encoder.embed_tokens.weight) is written under both names
    for name, state in (
        ("text_encoder_3", T5EncoderModel.from_pretrained(pipeline / "text_encoder_3").state_dict()),
        ("transformer", SD3Transformer2DModel.from_pretrained(pipeline / "transformer").state_dict()),
    ):
        written = load_file(export.out / f"{name}.safetensors")
        assert sorted(written) == sorted(state), name
        assert all(torch.equal(written[k], v) for k, v in state.items()), name
    assets = export.out / "assets"
    for tokenizer in ("tokenizer", "tokenizer_2", "tokenizer_3"):
        assert (assets / tokenizer / "tokenizer.json").read_bytes() == (
            pipeline / tokenizer / "tokenizer.json"
        ).read_bytes()
    assert json.loads((assets / "transformer" / "config.json").read_text())["patch_size"] == 2
    described = export.family_json
    assert (
        described["vae_scaling_factor"] == 1.5305
        and described["vae_shift_factor"] == 0.0609
        and described["latent_multiple"] == 2
    )
    recipe = (export.out / "recipe.toml").read_text()
    t5 = recipe.split("[components.text_encoder_3]")[1].split("[components.transformer]")[0]
    assert 'precisions = ["fp32"]' in t5 and "high = 690" in t5  # fp32 only; ids within T5's own vocabulary
    assert "height = [8, 8, 16]" in recipe.split("[components.transformer.profiles.default]")[1]
    from enginefarm.builder.recipe import load_recipe

    heads = {
        name: c.resources.attention_heads for name, c in load_recipe(export.out / "recipe.toml").components.items()
    }
    config = json.loads((pipeline / "transformer" / "config.json").read_text())
    assert heads.pop("transformer") == config["num_attention_heads"]
    # the VAE's mid-block attends with one head over the latent pixels; the text encoders' attention is not counted
    assert {name: n for name, n in heads.items() if n} == {"vae_decoder": 1, "vae_encoder": 1}


def test_a_model_without_t5_exports_without_it_and_a_mismatched_encoder_is_a_one_line_error(tiny, tmp_path, cli):
    from enginefarm.export.source import read_source

    folder = shutil.copytree(
        tiny("sd3"), tmp_path / "no-t5", ignore=shutil.ignore_patterns("text_encoder_3", "tokenizer_3")
    )
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder_3"] = index["tokenizer_3"] = [None, None]
    (folder / "model_index.json").write_text(json.dumps(index))
    found = read_source(folder)
    assert found.components == ("text_encoder", "text_encoder_2", "transformer", "vae_decoder", "vae_encoder")
    assert found.sizes.context_tokens == 333 and found.sizes.text_widths[2] == 64  # zeros of T5's shape take its place

    broken = shutil.copytree(tiny("sd3"), tmp_path / "broken")
    config = json.loads((broken / "text_encoder_3" / "config.json").read_text())
    (broken / "text_encoder_3" / "config.json").write_text(json.dumps({**config, "d_model": 48}))
    proc = cli("export", str(broken), "--out", str(tmp_path / "out"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "text_encoder_3 is 48 wide, the transformer's joint_attention_dim is 64" in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists()


def test_the_default_profile_stays_inside_sd3s_position_embedding(tiny):
    """An SD3 whose pos_embed_max_size is 32 failed at export with diffusers' raw `ValueError: Height (64) cannot be
    greater than pos_embed_max_size: 32`: the default profile (up to 1024 px) went past it. The tiny SD3's is 16
    patches of 2: 32 latent pixels, 256 px; the default stops there, a --latent past it is one line."""
    from enginefarm.errors import ConfigError
    from enginefarm.export.run import check_shapes, model_latent_range
    from enginefarm.export.source import read_source

    found = read_source(tiny("sd3"))
    assert found.configs["transformer"]["pos_embed_max_size"] == 16
    assert model_latent_range(found, None) == (32, 32, 32)
    assert all(max(s.height, s.width) <= 32 for s in check_shapes(found, (32, 32, 32)))
    assert model_latent_range(found, (8, 8, 16)) == (8, 8, 16)
    with pytest.raises(ConfigError, match=r"goes past 32 latent pixels \(256 px\)") as caught:
        model_latent_range(found, (8, 16, 64))
    assert "--latent 8,16,32" in caught.value.hint
