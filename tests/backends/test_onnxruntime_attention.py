"""The onnxruntime:cpu artifacts run their attention as one MultiHeadAttention node (backends/onnxruntime_attention.py)
and compute what the unfused exported graph computes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("diffusers")

import onnx
import onnxruntime as ort

import enginefarm
from enginefarm.backends.onnxruntime_attention import graph_attention_left

pytestmark = pytest.mark.slow


def _loaded_graph(home):
    """The graph of the one artifact fetched into the device cache under `home`."""
    (path,) = [p for p in home.rglob("model.onnx") if p.is_file()]
    return onnx.load(str(path), load_external_data=False).graph


@pytest.mark.parametrize(("precision", "of_range"), [("fp32", 1e-4), ("fp16", 2e-2)])
def test_unet_attention_is_fused_and_matches_the_unfused_export(built, tmp_path, precision, of_range):
    """The tiny SD 1.x UNet (SD 1.5's layout: attention at the full latent resolution, 8 heads) built by the real
    CLI: every attention of the exported graph is one MultiHeadAttention in the artifact, and the artifact's output
    matches ONNX Runtime's run of the unfused export at the profile's largest case (batch 2), fp32 within 1e-4 of
    the output's range, fp16 within 2e-2."""
    _, out, store = built("sd1")
    exported = onnx.load(str(out / "unet.onnx"), load_external_data=False)
    attentions = graph_attention_left(exported)
    assert attentions > 0  # the export decomposes them: MatMul, Softmax, MatMul

    with enginefarm.load(
        "sd1/unet", precision=precision, device="cpu", store=str(store), target="onnxruntime:cpu"
    ) as unet:
        ops = Counter(node.op_type for node in _loaded_graph(tmp_path / "home").node)
        assert ops["MultiHeadAttention"] == attentions and ops["Softmax"] == 0
        rng = np.random.default_rng(3)
        feeds = {
            "sample": rng.standard_normal((2, 4, 16, 16)).astype(np.float32),
            "timestep": np.array([999.0, 1.0], np.float32),
            "encoder_hidden_states": rng.standard_normal((2, 77, 768)).astype(np.float32),
        }
        got = unet.run(feeds)["out_sample"]
    want = ort.InferenceSession(str(out / "unet.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(got - want).max() <= of_range * np.ptp(want)


def test_masked_attention_is_left_as_exported(built, tmp_path):
    """The text encoder's causal attention (a mask added to the scores) is not the fused pattern: its artifact keeps
    the exported graph, and the build says nothing was fused."""
    _, out, store = built("sd1")
    with enginefarm.load(
        "sd1/text_encoder", precision="fp32", device="cpu", store=str(store), target="onnxruntime:cpu"
    ) as encoder:
        assert "attention_fused" not in encoder.artifact.provenance["build_notes"]
        graph = _loaded_graph(tmp_path / "home")
    assert not any(node.op_type == "MultiHeadAttention" for node in graph.node)
    assert sum(node.op_type == "Softmax" for node in graph.node) > 0


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_transformer_joint_attention_is_fused(built, tmp_path, family):
    """SD3's joint attention (text and image tokens concatenated after the heads' split) and Flux's (rotary embedding
    applied between the split and the scores) are fused too; the build's validation against ONNX Runtime's run of the
    unfused export passed, and the artifact's inputs are the exported graph's."""
    _, out, store = built(family)
    exported = onnx.load(str(out / "transformer.onnx"), load_external_data=False)
    attentions = graph_attention_left(exported)
    assert attentions > 0
    with enginefarm.load(
        f"{family}/transformer", precision="fp32", device="cpu", store=str(store), target="onnxruntime:cpu"
    ) as transformer:
        assert all(check["passed"] for check in transformer.artifact.validation["checks"])
        assert transformer.input_names == [i.name for i in exported.graph.input]
        ops = Counter(node.op_type for node in _loaded_graph(tmp_path / "home").node)
    assert ops["MultiHeadAttention"] == attentions and ops["Softmax"] == 0
