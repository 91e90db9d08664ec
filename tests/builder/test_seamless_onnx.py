"""The seamless rewrite of an ONNX graph (builder/seamless_onnx.py) against torch's own circular padding: a small
graph of 2D convolutions (padded, strided, unpadded, two reading one input) exported by torch, rewritten per axis
setting, run by ONNX Runtime and OpenVINO, and compared with the same module whose Conv2d pad circularly in those axes
(sdkit's way: F.pad circular per tiled axis, zeros in the other)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import builds

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from enginefarm.builder.seamless_onnx import parse_axes, wrap_convs, write_seamless  # noqa: E402

F = torch.nn.functional


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.b = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1)  # a downsampler
        self.c = torch.nn.Conv2d(4, 4, (3, 5), padding=(1, 2))  # asymmetric kernel
        self.d = torch.nn.Conv2d(4, 4, 1)  # no padding: unchanged
        self.e = torch.nn.Conv2d(4, 4, 3, padding=1)  # reads the same input as d

    def forward(self, x):
        y = self.b(self.a(x))
        y = self.c(y)
        return self.d(y) + self.e(y)


def circular(module: torch.nn.Module, tiling: str) -> None:
    """Every Conv2d of `module` pads circularly along `tiling`'s axes, zeros along the other (the reference)."""
    for conv in module.modules():
        if isinstance(conv, torch.nn.Conv2d):
            ph, pw = conv.padding

            def forward(x, conv=conv, ph=ph, pw=pw):
                x = F.pad(x, (pw, pw, 0, 0), mode="circular" if "x" in tiling else "constant")
                x = F.pad(x, (0, 0, ph, ph), mode="circular" if "y" in tiling else "constant")
                return F.conv2d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)

            conv.forward = forward


@pytest.fixture(scope="module")
@builds
def exported(tmp_path_factory):
    torch.manual_seed(0)
    net = _Net().eval()
    path = tmp_path_factory.mktemp("seamless") / "model.onnx"
    torch.onnx.export(
        net,
        (torch.zeros(1, 3, 16, 24),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "b", 2: "h", 3: "w"}},
        opset_version=17,
        dynamo=False,
    )
    return net, path


@pytest.mark.parametrize("tiling", ["x", "y", "xy"])
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino", "openvino-ir"])
def test_rewritten_graph_matches_torch_circular_padding(exported, tmp_path, tiling, runtime):
    """ONNX rewritten, run by ONNX Runtime and by OpenVINO; and OpenVINO's own IR rewritten
    (backends/openvino_seamless.py), as an OpenVINO artifact is."""
    net, path = exported
    if runtime == "openvino-ir":
        ov = pytest.importorskip("openvino")
        from enginefarm.backends.openvino_seamless import write_seamless as write_ir

        ov.save_model(ov.Core().read_model(str(path)), str(tmp_path / "plain.xml"), compress_to_fp16=False)
        changed = write_ir(ov, tmp_path / "plain.xml", tmp_path, parse_axes(tiling))
        model = tmp_path / "model.xml"
    else:
        changed = write_seamless(path, tmp_path, tiling)
        model = tmp_path / "model.onnx"
    assert changed == 4  # a, b, c, e; d has no padding
    x = np.random.default_rng(0).standard_normal((2, 3, 20, 28)).astype(np.float32)  # not the export's size
    got = _run(runtime, model, x)
    reference_net = _Net().eval()
    reference_net.load_state_dict(net.state_dict())
    circular(reference_net, tiling)
    with torch.no_grad():
        want = reference_net(torch.from_numpy(x)).numpy()
        plain = net(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() < 1e-5
    assert np.abs(plain - want).max() > 1e-2  # the wrap changed the result: the comparison can fail


def _run(runtime: str, path, x: np.ndarray) -> np.ndarray:
    if runtime == "onnxruntime":
        import onnxruntime as ort

        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled({"x": x})[compiled.output(0)]


def test_shifting_the_input_shifts_the_output(exported, tmp_path):
    """The tiled axis has no edge any more: a periodic input's output is periodic (np.roll commutes with the model)."""
    import onnxruntime as ort

    _, path = exported
    write_seamless(path, tmp_path, "x")
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 32)).astype(np.float32)
    y = session.run(None, {"x": x})[0]
    rolled = session.run(None, {"x": np.roll(x, 8, axis=3)})[0]  # 8 input pixels = 4 output pixels (stride 2)
    assert np.abs(rolled - np.roll(y, 4, axis=3)).max() < 1e-5
    # along y it still has edges: rolling there does not commute
    rolled_y = session.run(None, {"x": np.roll(x, 8, axis=2)})[0]
    assert np.abs(rolled_y - np.roll(y, 4, axis=2)).max() > 1e-2


def test_axes_are_checked():
    assert parse_axes("yx") == ("x", "y")
    for bad in ("", "z", "xx", "xyz"):
        with pytest.raises(ValueError):
            parse_axes(bad)


def test_external_weights_are_linked_not_copied(tmp_path):
    """A model whose weights are in an external file: the rewrite writes the graph only and links the file."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((2, 2, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(model, str(src / "model.onnx"), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    assert write_seamless(src / "model.onnx", tmp_path / "out", "xy") == 1
    assert (tmp_path / "out" / "model.onnx.data").stat().st_ino == (src / "model.onnx.data").stat().st_ino
    import onnxruntime as ort

    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    y = ort.InferenceSession(str(tmp_path / "out" / "model.onnx")).run(None, {"x": x})[0]
    summed = x.sum(1)[0]
    torus = sum(np.roll(summed, (dy, dx), axis=(0, 1)) for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    assert np.allclose(y[0, 0], torus, rtol=1e-5)  # a 3x3 box sum over a torus


def test_an_in_memory_model_counts_what_it_changed():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[0, 0, 0, 0])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
    )
    assert wrap_convs(helper.make_model(graph), "xy") == 0
