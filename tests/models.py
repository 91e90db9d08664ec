"""Every model the tests use, described in one place. All are generated with onnx.helper, seeded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _recipes_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_sd(path: Path, *, unnamed_dims: bool = False) -> Path:
    """The demo's SD-style decoder: latent [batch, 4, height, width] → sample [batch, 3, 2h, 2w]."""
    return _recipes_module("make_tiny_sd").make_model(path, unnamed_dims=unnamed_dims)


def _save(model, path: Path) -> Path:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def linear(path: Path, dims=("batch", 8), *, scale: float = 1.0, bias: float = 0.0) -> Path:
    """y = x @ W * scale + bias with one input `x` whose dims are `dims` (str: named, None: unnamed, int: fixed)."""
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(1).normal(0, 0.3, (8, 8)) * scale).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full(8, bias, np.float32), "b")],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def two_inputs(path: Path) -> Path:
    """z = a + b, with a [n, 4] ('p2o.DynamicDimension.0' as exported by Paddle) and b [?, 4] (unnamed)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["z"])],
        "two_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["p2o.DynamicDimension.0", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 4])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def external_data(path: Path, location: str) -> Path:
    """A linear model whose weight claims to live in external file `location` (which may escape the folder)."""
    from onnx import TensorProto, helper

    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[8, 8])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(8 * 8 * 4))):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def shared_resize_scales(path: Path) -> Path:
    """Two Resize ops sharing one scales constant, as onnxsim leaves SD's upsamplers (fp16 conversion trap)."""
    from onnx import TensorProto, helper, numpy_helper

    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Constant", [], ["s"], value=scales),
        helper.make_node("Resize", ["x", "", "s"], ["up1"], mode="nearest"),
        helper.make_node("Relu", ["up1"], ["r"]),
        helper.make_node("Resize", ["r", "", "s"], ["y"], mode="nearest"),
    ]
    graph = helper.make_graph(
        nodes, "shared_scales",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def reduce_mean_18(path: Path, *, dynamic_axes: bool = False) -> Path:
    """y = x - mean(x, axis 1) at opset 18, where ReduceMean takes its axes as an input (onnx2torch knows only
    the older attribute form). `dynamic_axes` computes the axes at run time, which has no attribute form."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1), helper.make_node("Sub", ["x", "m"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    if dynamic_axes:
        nodes.insert(0, helper.make_node("Shape", ["x"], ["s"], start=1, end=2))
        nodes.insert(1, helper.make_node("Sub", ["s", "seven"], ["axes"]))  # 8 - 7 = axis 1
        inits = [numpy_helper.from_array(np.array([7], np.int64), "seven")]
    graph = helper.make_graph(
        nodes, "reduce_mean_18",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits,
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def shrink(path: Path) -> Path:
    """y = Shrink(x), x [batch, 8]: an op ONNX Runtime runs and onnx2torch has no converter for."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Shrink", ["x"], ["y"], lambd=0.5)], "shrink",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
