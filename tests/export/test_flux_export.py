"""Flux.1 dev and Chroma through `enginefarm export`: the transformer's ONNX file packs latents, builds position ids
and (Chroma) extends the text mask inside the graph, and runs at shapes other than its export shape, against
diffusers' transformer called as FluxPipeline and ChromaPipeline call it (their own packing and ids)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from enginefarm.families import FAMILIES

TOKENS = 512  # the family table's default T5 token count (the profile's opt; the dim itself is dynamic)


def _dims(value) -> list:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _diffusers_transformer(source, family: str, x: np.ndarray, t: float, hidden: np.ndarray, extra: dict) -> np.ndarray:
    """The transformer's prediction as the diffusers pipeline computes it, unpacked back to the latent's shape."""
    import torch
    from diffusers import ChromaTransformer2DModel, FluxPipeline, FluxTransformer2DModel

    cls = ChromaTransformer2DModel if family == "chroma" else FluxTransformer2DModel
    model = cls.from_pretrained(source / "transformer").eval()
    batch, channels, height, width = x.shape
    packed = FluxPipeline._pack_latents(torch.from_numpy(x), batch, channels, height, width)
    image_ids = FluxPipeline._prepare_latent_image_ids(batch, height // 2, width // 2, "cpu", torch.float32)
    args = dict(
        hidden_states=packed,
        encoder_hidden_states=torch.from_numpy(hidden),
        timestep=torch.full((batch,), t) / 1000,
        img_ids=image_ids,
        txt_ids=torch.zeros(hidden.shape[1], 3),
    )
    if family == "chroma":  # ChromaPipeline._prepare_attention_mask: the text mask, then every image token
        args["attention_mask"] = torch.cat(
            [torch.from_numpy(extra["attention_mask"]), torch.ones(batch, packed.shape[1], dtype=torch.bool)], 1
        )
    else:
        args["pooled_projections"] = torch.from_numpy(extra["pooled_projections"])
        args["guidance"] = torch.from_numpy(extra["guidance"])
    with torch.no_grad():
        out = model(**args, return_dict=False)[0]
    return FluxPipeline._unpack_latents(out, height * 8, width * 8, 8).numpy()


@pytest.mark.parametrize("family", ["flux", "chroma"])
def test_the_transformer_is_dynamic_in_batch_height_width_and_text_tokens(tiny, exported, family):
    import onnxruntime as ort

    source = tiny(family)
    export = exported(source)
    assert export.family_json["family"] == family and export.family_json["latent_multiple"] == 2
    graph = onnx.load(str(export.out / "transformer.onnx")).graph
    dims = {v.name: _dims(v) for v in graph.input}
    assert dims["hidden_states"] == ["batch", 16, "height", "width"] and dims["timestep"] == ["batch"]
    assert dims["encoder_hidden_states"] == ["batch", "context_tokens", 32]
    assert (
        {"pooled_projections", "guidance"} <= set(dims)
        if family == "flux"
        else dims["attention_mask"] == ["batch", "context_tokens"]
    )
    t5 = "text_encoder" if family == "chroma" else "text_encoder_2"
    assert _dims(onnx.load(str(export.out / f"{t5}.onnx"), load_external_data=False).graph.input[0]) == [
        "batch",
        "text_length",
    ]
    assert _dims(graph.output[0]) == ["batch", 16, "height", "width"]

    session = ort.InferenceSession(str(export.out / "transformer.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    # neither is an export check shape (2x8x8 at 512 tokens, 1x6x10 at 256)
    for batch, height, width, tokens in ((3, 6, 10, 40), (1, 12, 4, TOKENS)):
        x = rng.standard_normal((batch, 16, height, width), dtype=np.float32)
        hidden = rng.standard_normal((batch, tokens, 32), dtype=np.float32)
        if family == "chroma":
            mask = (np.arange(tokens)[None, :] <= np.array([[5], [9], [0]])[:batch]).astype(np.float32)
            extra = {"attention_mask": mask}
        else:
            extra = {
                "pooled_projections": rng.standard_normal((batch, 32), dtype=np.float32),
                "guidance": np.full((batch,), 3.5, np.float32),
            }
        ours = session.run(
            None,
            {
                "hidden_states": x,
                "timestep": np.full((batch,), 812.5, np.float32),
                "encoder_hidden_states": hidden,
                **extra,
            },
        )[0]
        reference = _diffusers_transformer(source, family, x, 812.5, hidden, extra)
        assert ours.shape == (batch, 16, height, width)
        assert np.abs(ours - reference).max() < 1e-4


def test_the_export_patches_are_undone_afterwards():
    from diffusers.models.transformers import transformer_chroma, transformer_flux

    from enginefarm.export.flux import traceable_flux

    rotary, embed = (
        transformer_flux.apply_rotary_emb,
        transformer_chroma.ChromaCombinedTimestepTextProjEmbeddings.forward,
    )
    with traceable_flux():
        assert transformer_flux.apply_rotary_emb is not rotary
    assert (
        transformer_flux.apply_rotary_emb is rotary
        and transformer_chroma.ChromaCombinedTimestepTextProjEmbeddings.forward is embed
    )


def test_fp16_keeps_the_timestep_and_guidance_embeddings_fp32(tiny, exported):
    """What cost Flux its fp16 accuracy: the sinusoidal embeddings of t·1000 and guidance·1000, whose frequencies the
    fp16 conversion rounds (as Constants) before sin/cos. The family's keep scopes hold them, and their Constants,
    fp32."""
    import onnxruntime as ort

    from enginefarm.builder.prep import _to_fp16

    path = exported(tiny("flux")).out / "transformer.onnx"
    rng = np.random.default_rng(5)
    feeds = {
        "hidden_states": rng.standard_normal((1, 16, 8, 8), dtype=np.float32),
        "timestep": np.array([873.4], np.float32),
        "encoder_hidden_states": rng.standard_normal((1, TOKENS, 32), dtype=np.float32),
        "pooled_projections": rng.standard_normal((1, 32), dtype=np.float32),
        "guidance": np.array([3.5], np.float32),
    }

    def run(model):
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    fp32 = run(onnx.load(str(path)))
    keep = FAMILIES["flux"].component("transformer").fp16_keep_fp32
    notes: list[str] = []
    plain = np.abs(run(_to_fp16(onnx.load(str(path)), [], ())) - fp32).max()
    kept = np.abs(run(_to_fp16(onnx.load(str(path)), notes, keep)) - fp32).max()
    assert "kept fp32" in notes[0]
    assert kept < plain / 4 and kept < 3e-3, (plain, kept)
