"""Models whose weights live in external data beside the .onnx (every SD UNet, anything over 2 GB) build and load
through the whole path: reference run, scales, validation, each backend, the device cache. ONNX Runtime 1.32 refuses
external data reached through a link that leaves the model's folder, so nothing may link or copy it elsewhere."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import enginefarm


def matmul_tanh_chain(path, layers: int, width: int, reshape_to: list[int] | None = None):
    """`layers` × (MatMul(width × width) + Tanh), every weight in one external file `<name>.data` beside the model;
    `batch` dynamic. `reshape_to`: end with a Reshape that fails at run time (a model ONNX Runtime cannot run)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(
            numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{i}")
        )
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]), helper.make_node("Tanh", [f"m{i}"], [f"t{i}"])]
        x = f"t{i}"
    if reshape_to is not None:
        inits.append(numpy_helper.from_array(np.array(reshape_to, np.int64), "bad_shape"))
        nodes.append(helper.make_node("Reshape", [x, "bad_shape"], ["y"]))
        x = "y"
    out_shape = reshape_to if reshape_to is not None else ["batch", width]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, out_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=0,
    )
    return path


RECIPE = """
[model]
name = "chain"
version = "1"

[defaults]
precisions = ["fp16"]
targets = ["openvino:cpu", "onnxruntime:cpu"]

[components.chain]
source = "{source}"

[components.chain.profiles.default]
batch = [1, 1, 4]
"""


def test_a_model_with_external_data_beside_it_builds_and_loads_on_every_backend(tmp_path, cli):
    source = matmul_tanh_chain(tmp_path / "models" / "chain.onnx", layers=6, width=512)
    assert sorted(p.name for p in source.parent.iterdir()) == ["chain.onnx", "chain.onnx.data"]
    recipe_dir = tmp_path / "recipes"
    recipe_dir.mkdir()
    recipe = recipe_dir / "chain.toml"
    recipe.write_text(RECIPE.format(source=os.path.relpath(source, recipe_dir)))
    before = {p.name: p.stat().st_mtime_ns for p in source.parent.iterdir()}

    proc = cli("build", str(recipe), "-j", "1", "--no-bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 built, 0 failed" in proc.stdout

    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for target in ("openvino:cpu", "onnxruntime:cpu"):
        out = next(iter(enginefarm.load("chain/chain", target=target, precision="fp16").run({"x": x}).values()))
        assert np.abs(out - reference).max() < 5e-3, target
    # The source folder is left exactly as it was: nothing written, linked or touched beside the model.
    assert {p.name: p.stat().st_mtime_ns for p in source.parent.iterdir()} == before


def test_the_reference_run_reads_external_data_from_the_models_own_folder(tmp_path):
    """Extra outputs (the tensors feeding each output, for the scale-aware gate) without linking the data anywhere."""
    from enginefarm.builder.scales import session_with_extra_outputs

    source = matmul_tanh_chain(tmp_path / "m" / "chain.onnx", layers=3, width=64)
    session = session_with_extra_outputs(source, ["m1", "t0"], ort.SessionOptions())
    names = [o.name for o in session.get_outputs()]
    assert names == ["t2", "m1", "t0"]
    x = np.ones((2, 64), np.float32)
    t2, m1, t0 = session.run(names, {"x": x})
    w = {
        i.name: numpy_helper.to_array(i, base_dir=str(source.parent)) for i in onnx.load(str(source)).graph.initializer
    }
    np.testing.assert_allclose(t0, np.tanh(x @ w["w0"]), atol=1e-5)
    np.testing.assert_allclose(m1, t0 @ w["w1"], atol=1e-5)
    assert sorted(p.name for p in source.parent.iterdir()) == ["chain.onnx", "chain.onnx.data"]


def test_a_source_that_onnx_runtime_cannot_run_is_blamed_quoting_the_sdk(tmp_path, cli):
    matmul_tanh_chain(tmp_path / "models" / "chain.onnx", layers=2, width=64, reshape_to=[7, 3])
    recipe = tmp_path / "chain.toml"
    recipe.write_text(RECIPE.format(source="models/chain.onnx").replace('"openvino:cpu", ', ""))
    proc = cli("build", str(recipe), "-j", "1", "--no-bench")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    text = proc.stdout + proc.stderr
    assert "the source model does not run on ONNX Runtime's CPU provider" in text, text
    assert "Reshape" in text or "reshape" in text, text  # ONNX Runtime's own words are quoted


@pytest.mark.parametrize(
    "report, expected",
    [
        ({"error": "Fail: boom", "bare_error": None}, "although ONNX Runtime runs the bare source model"),
        (
            {"error": "Fail: boom", "bare_error": "Fail: bad model"},
            "the source model does not run on ONNX Runtime's CPU provider: Fail: bad model",
        ),
    ],
)
def test_the_reference_failure_names_whose_fault_it_is(report, expected):
    import json
    import subprocess

    from enginefarm.builder.references import _reference_failure

    error = _reference_failure(subprocess.CompletedProcess([], 1, stdout=json.dumps(report) + "\n", stderr=""))
    assert expected in str(error)
    assert ("bug in enginefarm" in error.hint) == (report["bare_error"] is None)
