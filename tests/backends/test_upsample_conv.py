"""The nearest-2x-then-3x3 fold (backends/upsample_conv.py) against torch: diffusers' own Upsample2D, exported by torch,
folded, run by ONNX Runtime and OpenVINO at another size than the export's; its weights keep their names and a new
value given by name reaches the output; seamless tiling of the folded graph is torch's circular padding of the plain
module; what is not that pattern stays as it was; the rounding rules it accepts are those ONNX Runtime's Resize
applies."""

from __future__ import annotations

import numpy as np
import pytest

from tests.builder.test_seamless_onnx import _run, circular
from tests.conftest import builds

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from enginefarm.backends.upsample_conv import _nearest_sources, fold_upsample_convs  # noqa: E402
from enginefarm.builder.seamless_onnx import parse_axes, write_seamless  # noqa: E402

F = torch.nn.functional


class _Net(torch.nn.Module):
    """Two diffusers Upsample2D (the fold's pattern), and two that are not: a nearest 2x read by a convolution and
    by an addition, and a bilinear 2x before a convolution."""

    def __init__(self) -> None:
        from diffusers.models.upsampling import Upsample2D

        super().__init__()
        self.inp = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up1 = Upsample2D(8, use_conv=True, out_channels=6)
        self.up2 = Upsample2D(6, use_conv=True)
        self.shared = torch.nn.Conv2d(6, 6, 3, padding=1)
        self.smooth = torch.nn.Conv2d(6, 4, 3, padding=1)

    def forward(self, x):
        y = self.up2(self.up1(self.inp(x)))
        z = F.interpolate(y, scale_factor=2.0, mode="nearest")
        y = self.shared(z) + z  # the upsampled tensor is read twice: not folded
        return self.smooth(F.interpolate(y, scale_factor=2.0, mode="bilinear"))


@pytest.fixture(scope="module")
@builds
def exported(tmp_path_factory):
    torch.manual_seed(0)
    net = _Net().eval()
    folder = tmp_path_factory.mktemp("upsample")
    torch.onnx.export(
        net,
        (torch.zeros(1, 3, 6, 8),),
        str(folder / "model.onnx"),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "b", 2: "h", 3: "w"}},
        opset_version=17,
        dynamo=False,
    )
    return net, folder / "model.onnx"


def _folded(path, outdir):
    from enginefarm.formats.onnx_data import write_rewritten

    return write_rewritten(path, outdir, fold_upsample_convs, keep_unchanged=False), outdir / path.name


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_folded_graph_computes_what_torch_does(exported, tmp_path, runtime):
    net, path = exported
    folded, model = _folded(path, tmp_path)
    assert folded == 2
    plain_ops, folded_ops = _ops(path), _ops(model)
    assert plain_ops.count("Resize") == 4 and folded_ops.count("Resize") == 2  # the shared and the bilinear stay
    assert folded_ops.count("DepthToSpace") == 2 and folded_ops.count("Conv") == plain_ops.count("Conv") + 2 * 3
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 5)).astype(np.float32)  # odd sizes, not the export's
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    got = _run(runtime, model, x)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5 * max(1.0, float(np.abs(want).max()))


def test_weights_keep_their_names_and_values(exported, tmp_path):
    """The weight map, LoRA patching and weights given at load address initializers by name: every weight the
    export wrote is still there, byte for byte, and the folded convolutions' weights are still read."""
    _, path = exported
    _, model = _folded(path, tmp_path)
    before = {i.name: i.raw_data for i in onnx.load(str(path)).graph.initializer}
    after = {i.name: i.raw_data for i in onnx.load(str(model)).graph.initializer}
    weights = {name for name in before if "weight" in name or "bias" in name}
    assert {"up1.conv.weight", "up2.conv.weight"} <= weights
    assert all(after[name] == before[name] for name in weights)
    read = {name for node in onnx.load(str(model)).graph.node for name in node.input}
    assert weights <= read


@pytest.mark.parametrize("how", ["constant", "input"])
def test_a_weight_replaced_by_name_reaches_the_output(exported, tmp_path, how):
    """What OpenVINO's load_with_weights does (a Constant replaced by name in the read IR, then compiled: the compile
    folds the new value into the four phase kernels) and what a live LoRA session does (runner/live_weights.py: the
    Constant becomes an input fed with every call): either way the output is torch's with the new weight."""
    ov = pytest.importorskip("openvino")
    from openvino.utils import replace_node

    net, path = exported
    _, model = _folded(path, tmp_path)
    ov.save_model(ov.Core().read_model(str(model)), str(tmp_path / "model.xml"), compress_to_fp16=False)
    read = ov.Core().read_model(str(tmp_path / "model.xml"))
    new = (np.random.default_rng(3).standard_normal(tuple(net.up1.conv.weight.shape)) * 0.3).astype(np.float32)
    hits = [op for op in read.get_ordered_ops() if "up1.conv.weight" in op.output(0).get_names()]
    assert len(hits) == 1 and hits[0].get_type_name() == "Constant"  # the IR keeps the named weight, unfolded
    feeds = {}
    if how == "constant":
        fresh = ov.op.Constant(new)
        fresh.output(0).set_names(hits[0].output(0).get_names())
        replace_node(hits[0], fresh)
    else:
        parameter = ov.op.Parameter(ov.Type.f32, ov.PartialShape(list(new.shape)))
        parameter.output(0).set_names({"up1.conv.weight"})
        hits[0].output(0).replace(parameter.output(0))
        read.add_parameters([parameter])
        feeds["up1.conv.weight"] = new
    compiled = ov.Core().compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    with torch.no_grad():
        old = net(torch.from_numpy(x)).numpy()
        net.up1.conv.weight.copy_(torch.from_numpy(new))
        try:
            want = net(torch.from_numpy(x)).numpy()
        finally:
            net.up1.conv.weight.copy_(torch.from_numpy(_initializer(path, "up1.conv.weight").copy()))
    got = compiled({"x": x, **feeds})[compiled.output(0)]
    assert np.abs(got - want).max() < 1e-5 * max(1.0, float(np.abs(want).max()))
    assert np.abs(old - want).max() > 1e-2  # the new weight changed the output: the comparison can fail


def _initializer(path, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer if i.name == name)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-ir"])
def test_seamless_tiling_of_the_folded_graph_wraps_like_torch(exported, tmp_path, runtime):
    """The folded convolutions pad asymmetrically; wrapped circularly at the input's resolution they give what the
    plain module gives with every Conv2d padding circularly at the upsampled one."""
    net, path = exported
    _, model = _folded(path, tmp_path / "folded")
    if runtime == "openvino-ir":
        ov = pytest.importorskip("openvino")
        from enginefarm.backends.openvino_seamless import write_seamless as write_ir

        ov.save_model(ov.Core().read_model(str(model)), str(tmp_path / "plain.xml"), compress_to_fp16=False)
        write_ir(ov, tmp_path / "plain.xml", tmp_path / "tiled", parse_axes("xy"))
        tiled = tmp_path / "tiled" / "model.xml"
    else:
        write_seamless(model, tmp_path / "tiled", "xy")
        tiled = tmp_path / "tiled" / "model.onnx"
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 7)).astype(np.float32)
    reference = _Net().eval()
    reference.load_state_dict(net.state_dict())
    circular(reference, "xy")
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
        plain = net(torch.from_numpy(x)).numpy()
    got = _run("openvino" if runtime == "openvino-ir" else runtime, tiled, x)
    assert np.abs(got - want).max() < 1e-5 * max(1.0, float(np.abs(want).max()))
    assert np.abs(plain - want).max() > 1e-2


def test_half_precision_weights_are_folded_in_float32_and_cast_back(exported, tmp_path):
    """An fp16 graph (ONNX Runtime's float16 converter, as prep writes it): the phase kernels are summed in float32
    (every runtime folds Cast and float MatMul) and cast back to the weight's type."""
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    _, path = exported
    half = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
    onnx.save(half, str(tmp_path / "half.onnx"))
    folded = onnx.load(str(tmp_path / "half.onnx"))
    assert fold_upsample_convs(folded) == 2
    left = {name for node in folded.graph.node for name in node.output}
    assert not {"/up1/Constant_output_0", "/up1/Constant_output_0_cast_to_fp32"} & left  # the scales went too
    onnx.save(folded, str(tmp_path / "folded.onnx"))
    casts = [n for n in folded.graph.node if n.op_type == "Cast" and "/kernel" in n.output[0]]
    assert len(casts) == 8 and {next(a.i for a in n.attribute if a.name == "to") for n in casts} == {
        TensorProto.FLOAT16
    }
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    runs = [
        ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        for name in ("half.onnx", "folded.onnx")
    ]
    assert np.abs(runs[0] - runs[1]).max() < 1e-2 * max(1.0, float(np.abs(runs[0]).max()))


def _pattern(*, scales=(1, 1, 2, 2), resize=None, conv=None, shared=False, sizes=False):
    """x -> Resize -> Conv (and, shared, the Resize's output also a graph output), as a model file."""
    resize = {
        "mode": "nearest",
        "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor",
        **(resize or {}),
    }
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], **(conv or {})}
    inputs = ["x", "", "", "sizes"] if sizes else ["x", "", "scales"]
    nodes = [helper.make_node("Resize", inputs, ["u"], **resize), helper.make_node("Conv", ["u", "w"], ["y"], **conv)]
    groups = conv.get("group", 1)
    inits = [
        numpy_helper.from_array(np.array(scales, np.float32), "scales"),
        numpy_helper.from_array(np.array([1, 4, 8, 8], np.int64), "sizes"),
        numpy_helper.from_array(np.ones((4, 4 // groups, 3, 3), np.float32), "w"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared:
        outputs.append(helper.make_tensor_value_info("u", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])], outputs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "change",
    [
        {"scales": (1, 1, 3, 3)},
        {"scales": (1, 1, 2, 1)},
        {"sizes": True},
        {"resize": {"mode": "linear"}},
        {"resize": {"coordinate_transformation_mode": "half_pixel"}},  # with floor: 1 -> 0, 2 -> 0, 3 -> 1
        {"resize": {"nearest_mode": "round_prefer_ceil"}},
        {"conv": {"strides": [2, 2]}},
        {"conv": {"pads": [0, 0, 0, 0]}},
        {"conv": {"dilations": [2, 2], "pads": [2, 2, 2, 2]}},
        {"conv": {"group": 2}},
        {"shared": True},
    ],
)
def test_what_is_not_the_pattern_stays_as_it_was(tmp_path, change):
    model = _pattern(**change)
    before = model.SerializeToString()
    assert fold_upsample_convs(model) == 0
    assert model.SerializeToString() == before


def test_the_pattern_itself_folds_and_its_scales_go(tmp_path):
    model = _pattern()
    assert fold_upsample_convs(model) == 1
    assert "scales" not in {i.name for i in model.graph.initializer}  # only the Resize read it
    assert "w" in {i.name for i in model.graph.initializer}


@pytest.mark.parametrize("transform", ["asymmetric", "half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("rounding", ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"])
def test_the_index_rules_are_onnx_runtimes(transform, rounding):
    """Which input index each output index reads, as _nearest_sources computes it, is what ONNX Runtime's Resize
    reads: so the fold takes exactly the Resizes that double by repeating each pixel."""
    import onnxruntime as ort

    node = helper.make_node(
        "Resize",
        ["x", "", "scales"],
        ["y"],
        mode="nearest",
        coordinate_transformation_mode=transform,
        nearest_mode=rounding,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 8])],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    read = session.run(None, {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)})[0][0, 0, 0]
    assert _nearest_sources(transform, rounding) == [int(v) for v in read]
