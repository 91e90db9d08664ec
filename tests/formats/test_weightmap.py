"""The weight map: checkpoint names → ONNX initializers by content (exact, transposed, reshaped); unmatched and
ambiguous tensors reported, never guessed; `checkpoint` in recipes, in the key and in the artifact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from enginefarm.builder.planner import expand
from enginefarm.builder.recipe import load_recipe
from enginefarm.errors import IntegrityError, RecipeError
from enginefarm.formats.weightmap import WeightMap, derive
from tests import models


def _derive(tmp_path, checkpoint: dict) -> WeightMap:
    onnx_path = models.lora_net(tmp_path / "net.onnx")
    ckpt = models.write_safetensors(tmp_path / "ckpt.safetensors", checkpoint)
    return derive(ckpt, "digest", onnx_path)


def test_linear_conv_and_norm_weights_are_found_by_content(tmp_path):
    found = _derive(tmp_path, models.lora_net_checkpoint())
    m = found.mapped
    assert (m["conv_in.weight"].initializer, m["conv_in.weight"].transpose) == ("conv_in.weight", False)
    assert (m["mid.conv.weight"].initializer, m["mid.conv.weight"].transpose) == ("onnx::Conv_7", False)
    assert (m["attn.to_q.weight"].initializer, m["attn.to_q.weight"].transpose) == ("onnx::MatMul_11", True)
    assert (m["attn.to_out.weight"].initializer, m["attn.to_out.weight"].transpose) == ("onnx::MatMul_12", True)
    assert (m["norm.weight"].initializer, m["norm.weight"].onnx_shape) == ("onnx::Mul_9", (8, 1, 1))
    assert (m["attn.to_k.weight"].initializer, m["attn.to_k.weight"].transpose, m["attn.to_k.weight"].block) == (
        "onnx::MatMul_kv",
        True,
        (1, 0, 16),
    )
    assert (m["attn.to_v.weight"].block, m["attn.to_v.bias"].initializer, m["attn.to_v.bias"].block) == (
        (1, 16, 32),
        "onnx::Add_kv",
        (0, 16, 32),
    )
    assert set(found.unmatched) == {"extra.weight"} and "no initializer" in found.unmatched["extra.weight"]
    assert WeightMap.from_json(found.to_json()) == found


def test_a_block_of_a_fused_weight_is_read_and_written_in_place():
    from enginefarm.formats.weightmap import Mapped

    k, v = np.arange(32, dtype=np.float32).reshape(16, 2), -np.arange(32, dtype=np.float32).reshape(16, 2)
    fused = np.concatenate([k.T, v.T], axis=1)  # [2, 32]
    m = Mapped("onnx::MatMul_kv", True, (16, 2), (2, 32), (1, 16, 32))
    assert np.array_equal(m.from_onnx(fused), v)
    m.write(fused, m.to_onnx(v + 1))
    assert np.array_equal(fused[:, 16:], (v + 1).T) and np.array_equal(fused[:, :16], k.T)


def test_layout_round_trip():
    found_w = np.arange(32, dtype=np.float32).reshape(16, 2)
    from enginefarm.formats.weightmap import Mapped

    m = Mapped("onnx::MatMul_1", True, (16, 2), (2, 16))
    assert np.array_equal(m.to_onnx(found_w), found_w.T)
    assert np.array_equal(m.from_onnx(m.to_onnx(found_w)), found_w)
    whole = np.zeros((2, 16), np.float32)
    m.write(whole, m.to_onnx(found_w))  # not a block of a fused initializer: all of it
    assert np.array_equal(whole, found_w.T)


def test_tensors_sharing_values_are_ambiguous_not_guessed(tmp_path):
    ckpt = models.lora_net_checkpoint()
    ckpt["copy.of_q"] = ckpt["attn.to_q.weight"].copy()  # same values: which one does onnx::MatMul_11 hold?
    found = _derive(tmp_path, ckpt)
    assert "attn.to_q.weight" not in found.mapped and "copy.of_q" not in found.mapped
    assert "ambiguous" in found.unmatched["attn.to_q.weight"] and "copy.of_q" in found.unmatched["attn.to_q.weight"]
    assert "onnx::MatMul_11 (transposed)" in found.unmatched["copy.of_q"]


def test_a_kept_name_breaks_a_tie(tmp_path):
    ckpt = models.lora_net_checkpoint()
    ckpt["twin.bias"] = ckpt["conv_in.bias"].copy()  # conv_in.bias kept its name in the graph, twin.bias is in no graph
    found = _derive(tmp_path, ckpt)
    assert found.mapped["conv_in.bias"].initializer == "conv_in.bias"
    assert "twin.bias" in found.unmatched


def test_a_name_kept_under_a_wrapper_prefix_breaks_a_tie(tmp_path):
    ckpt = models.lora_net_checkpoint()
    ckpt["attn.to_out.bias"] = ckpt["conv_in.bias"].copy()  # two biases with equal values, as zero-initialised ones are
    onnx_path = models.lora_net(tmp_path / "net.onnx", ckpt, prefix="vae.")
    found = derive(models.write_safetensors(tmp_path / "c.safetensors", ckpt), "d", onnx_path)
    assert found.mapped["conv_in.bias"].initializer == "vae.conv_in.bias"
    assert found.mapped["attn.to_out.bias"].initializer == "vae.attn.to_out.bias"
    assert found.mapped["attn.to_q.weight"].initializer == "onnx::MatMul_11"


def test_a_damaged_map_is_an_integrity_error():
    with pytest.raises(IntegrityError, match="weight map is malformed"):
        WeightMap.from_json(b'{"format": 1, "mapped": {"a": {}}}')
    # A fused block is (axis, start, stop): two numbers used to be read, and failed with a traceback at the merge.
    entry = {"initializer": "w", "transpose": False, "shape": [2], "onnx_shape": [4], "block": [0, 2]}
    stored = {"format": 1, "checkpoint_sha256": "0", "mapped": {"a": entry}, "unmatched": {}}
    with pytest.raises(IntegrityError, match="weight map is malformed"):
        WeightMap.from_json(json.dumps(stored).encode())
    entry["block"] = [0, 2, 4]
    assert WeightMap.from_json(json.dumps(stored).encode()).mapped["a"].block == (0, 2, 4)


RECIPE = """
[model]
name = "net"
version = "1"
[defaults]
targets = ["onnxruntime:cpu"]
[components.body]
source = "net.onnx"
{checkpoint}
[components.body.profiles.default]
batch = [1, 1, 2]
"""


def test_checkpoint_goes_into_the_key(tmp_path, write_recipe):
    models.lora_net(tmp_path / "net.onnx")
    models.write_safetensors(tmp_path / "a.safetensors", models.lora_net_checkpoint(0))
    models.write_safetensors(tmp_path / "b.safetensors", models.lora_net_checkpoint(1))
    keys = set()
    for ckpt in ("", 'checkpoint = "a.safetensors"', 'checkpoint = "b.safetensors"'):
        job = expand(load_recipe(write_recipe(RECIPE.format(checkpoint=ckpt))), tmp_path / "dl")[0]
        keys.add(job.key(job.toolchain()))
    assert len(keys) == 3


@pytest.mark.parametrize(
    "value, message",
    [
        ('"missing.safetensors"', "file not found"),
        ('"mising.ckpt"', "file not found"),  # a typo is named as one, not as the wrong format
        ('"weights.ckpt"', "must be a .safetensors file"),
        ('"https://example.com/x.safetensors"', "must be a local file"),
        ('["a.safetensors"]', "non-empty string"),
    ],
)
def test_bad_checkpoint_entries_name_the_key(tmp_path, write_recipe, value, message):
    models.lora_net(tmp_path / "net.onnx")
    (tmp_path / "weights.ckpt").write_bytes(b"x")
    with pytest.raises(RecipeError, match=rf"components\.body\.checkpoint: .*{message}"):
        load_recipe(write_recipe(RECIPE.format(checkpoint=f"checkpoint = {value}")))


def test_a_malformed_checkpoint_fails_the_plan(tmp_path, write_recipe):
    models.lora_net(tmp_path / "net.onnx")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"garbage!")
    recipe = load_recipe(write_recipe(RECIPE.format(checkpoint='checkpoint = "bad.safetensors"')))
    with pytest.raises(RecipeError, match=r"components\.body\.checkpoint: .*not a valid safetensors file"):
        expand(recipe, tmp_path / "dl")


def test_a_checkpoint_of_another_model_fails_the_job_and_stores_nothing(tmp_path, write_recipe, cli):
    models.lora_net(tmp_path / "net.onnx")
    up, down = models.lora_pair((16, 8), 4, 1)
    models.lora_file(tmp_path / "lora.safetensors", {"attn.to_q": (up, down, None)}, "peft")  # a LoRA, not the base
    recipe = write_recipe(RECIPE.format(checkpoint='checkpoint = "lora.safetensors"'))
    proc = cli("build", str(recipe))
    assert proc.returncode == 1 and "0 built, 1 failed" in proc.stdout, proc.stdout + proc.stderr
    assert "checkpoint lora.safetensors: none of its 2 tensor(s) holds a weight of this model" in proc.stdout
    assert "(hint: `checkpoint =` must be this component's own base weights" in proc.stderr  # the failure summary
    assert "Traceback" not in proc.stderr
    assert "0 artifacts" in cli("ls", check=True).stdout


def _external_onnx(path, initializers: dict[str, np.ndarray]):
    """A graph holding `initializers` in an external data file, as prep writes its fp32 models."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    inits = [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in initializers.items()]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y], inits)
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, location="w.data", size_threshold=0)
    return path


def test_a_tensor_the_fingerprint_cannot_tell_apart_is_compared_in_full(tmp_path):
    from enginefarm.formats.weightmatch import SAMPLE, _positions, fingerprint

    rng = np.random.default_rng(3)
    w, q, k, v = (rng.normal(0, 0.3, (48, 64)).astype(np.float32) for _ in range(4))
    unsampled = next(p for p in range(w.size) if p not in set(_positions(w.size).tolist()))
    assert w.size > SAMPLE
    q.reshape(-1)[unsampled] = 0.0
    onnx_path = _external_onnx(
        tmp_path / "m.onnx", {"onnx::MatMul_1": w.T, "plain": q, "onnx::MatMul_kv": np.concatenate([k.T, v.T], axis=1)}
    )
    near_w = w.copy()  # differs from onnx::MatMul_1 (transposed) at one value its fingerprint does not read
    near_w[unsampled % 48, unsampled // 48] += 1.0
    assert fingerprint(near_w, transpose=True) == fingerprint(w, transpose=True)
    near_q = q.copy()  # differs from `plain` (as is) only in a zero's sign: equal numbers, not the same weight
    near_q.reshape(-1)[unsampled] = -0.0
    assert fingerprint(near_q) == fingerprint(q) and np.array_equal(near_q, q)
    near_k = k.copy()  # differs from its block of the fused onnx::MatMul_kv at the very last value
    near_k[-1, -1] += 1.0
    ckpt = {"w": w, "near_w": near_w, "near_q": near_q, "k": k, "near_k": near_k}
    found = derive(models.write_safetensors(tmp_path / "c.safetensors", ckpt), "d", onnx_path)
    assert (found.mapped["w"].initializer, found.mapped["w"].transpose) == ("onnx::MatMul_1", True)
    assert found.mapped["k"].block == (1, 0, 48)
    for name in ("near_w", "near_q", "near_k"):
        assert "no initializer holds these values" in found.unmatched[name], name
