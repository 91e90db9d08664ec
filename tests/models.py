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
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["p2o.DynamicDimension.0", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, 4]),
        ],
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
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [weight],
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
        nodes,
        "shared_scales",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 16, 16])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


# A small net in the shape of a torch export, for custom weights and LoRA: Conv 3×3 (`conv_in.weight`, named as
# torch keeps it), Conv 1×1 over an anonymous initializer (`onnx::Conv_7`), then tokens through two nn.Linear
# layers, exported as MatMul over anonymous *transposed* initializers (`onnx::MatMul_11`, `onnx::MatMul_12`).
# to_k and to_v come fused, as onnxsim leaves parallel MatMuls: one [8, 32] weight (`onnx::MatMul_kv`, k then v,
# transposed) and one [32] bias (`onnx::Add_kv`), then a Split.
# A norm's scale `norm.weight` [8] sits in the graph reshaped to [8, 1, 1] (`onnx::Mul_9`), as GroupNorm exports;
# a Relu keeps onnxsim from folding it into the 1×1 Conv's weights (which it does, and the map then reports).
# Its checkpoint uses torch names and layouts; `extra.weight` is a buffer the graph never uses (unmatched).
LORA_NET_SHAPES = {
    "conv_in.weight": (8, 4, 3, 3),
    "conv_in.bias": (8,),
    "mid.conv.weight": (8, 8, 1, 1),
    "mid.conv.bias": (8,),
    "norm.weight": (8,),
    "attn.to_q.weight": (16, 8),
    "attn.to_q.bias": (16,),
    "attn.to_k.weight": (16, 8),
    "attn.to_k.bias": (16,),
    "attn.to_v.weight": (16, 8),
    "attn.to_v.bias": (16,),
    "attn.to_out.weight": (8, 16),
    "attn.to_out.bias": (8,),
    "extra.weight": (3,),
}


def lora_net_checkpoint(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.3, shape).astype(np.float32) for name, shape in LORA_NET_SHAPES.items()}


def lora_net(path: Path, weights: dict[str, np.ndarray] | None = None, *, prefix: str = "") -> Path:
    """x [batch, 4, 8, 8] → y [batch, 64, 8], with `weights` (torch names and layouts; default: the seed-0 checkpoint).
    `prefix` ("vae.") names the kept initializers as a wrapper module's export does."""
    from onnx import TensorProto, helper, numpy_helper

    w = weights or lora_net_checkpoint()
    inits = {
        "conv_in.weight": w["conv_in.weight"],
        "conv_in.bias": w["conv_in.bias"],
        "onnx::Conv_7": w["mid.conv.weight"],
        "mid.conv.bias": w["mid.conv.bias"],
        "onnx::Mul_9": w["norm.weight"].reshape(8, 1, 1),
        "onnx::MatMul_11": w["attn.to_q.weight"].T,
        "attn.to_q.bias": w["attn.to_q.bias"],
        "onnx::MatMul_12": w["attn.to_out.weight"].T,
        "attn.to_out.bias": w["attn.to_out.bias"],
        "onnx::MatMul_kv": np.concatenate([w["attn.to_k.weight"].T, w["attn.to_v.weight"].T], axis=1),
        "onnx::Add_kv": np.concatenate([w["attn.to_k.bias"], w["attn.to_v.bias"]]),
        "split": np.array([16, 16], np.int64),
        "shape": np.array([0, 8, 64], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "conv_in.weight", "conv_in.bias"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "onnx::Conv_7", "mid.conv.bias"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Mul", ["r2", "onnx::Mul_9"], ["n"]),
        helper.make_node("Reshape", ["n", "shape"], ["flat"]),
        helper.make_node("Transpose", ["flat"], ["tokens"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["tokens", "onnx::MatMul_11"], ["q0"]),
        helper.make_node("Add", ["q0", "attn.to_q.bias"], ["q"]),
        helper.make_node("MatMul", ["tokens", "onnx::MatMul_kv"], ["kv0"]),
        helper.make_node("Add", ["kv0", "onnx::Add_kv"], ["kv"]),
        helper.make_node("Split", ["kv", "split"], ["k", "v"], axis=-1),
        helper.make_node("Mul", ["k", "v"], ["kxv"]),
        helper.make_node("Add", ["q", "kxv"], ["qkv"]),
        helper.make_node("Tanh", ["qkv"], ["t"]),
        helper.make_node("MatMul", ["t", "onnx::MatMul_12"], ["o0"]),
        helper.make_node("Add", ["o0", "attn.to_out.bias"], ["y"]),
    ]
    if prefix:
        renamed = {k: prefix + k for k in inits if not k.startswith("onnx::") and k not in ("shape", "split")}
        inits = {renamed.get(k, k): v for k, v in inits.items()}
        for node in nodes:
            node.input[:] = [renamed.get(i, i) for i in node.input]
    graph = helper.make_graph(
        nodes,
        "lora_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64, 8])],
        [numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in inits.items()],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


def lora_pair(shape: tuple[int, ...], rank: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(up, down) for a layer whose weight has `shape` (torch layout): Linear [out, in] or Conv [out, in, k, k]."""
    rng = np.random.default_rng(seed)
    if len(shape) == 2:
        return rng.normal(0, 0.2, (shape[0], rank)).astype(np.float32), rng.normal(0, 0.2, (rank, shape[1])).astype(
            np.float32
        )
    out, cin, kh, kw = shape
    return rng.normal(0, 0.2, (out, rank, 1, 1)).astype(np.float32), rng.normal(0, 0.2, (rank, cin, kh, kw)).astype(
        np.float32
    )


def lora_file(path: Path, layers: dict[str, tuple[np.ndarray, np.ndarray, float | None]], style: str) -> Path:
    """A LoRA file for `layers` (module name → (up, down, alpha)) in `style`: "peft" (module.lora_A/lora_B.weight,
    alpha as module.alpha when given) or "kohya" (lora_unet_<module with _>.lora_down/lora_up.weight + .alpha)."""
    tensors = {}
    for module, (up, down, alpha) in layers.items():
        if style == "peft":
            tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"] = down, up
            prefix = module
        else:
            prefix = "lora_unet_" + module.replace(".", "_")
            tensors[f"{prefix}.lora_down.weight"], tensors[f"{prefix}.lora_up.weight"] = down, up
        if alpha is not None:
            tensors[f"{prefix}.alpha"] = np.array(alpha, np.float32)
    return write_safetensors(path, tensors)


def merged(weights: dict[str, np.ndarray], loras: list[tuple[dict, float]]) -> dict[str, np.ndarray]:
    """numpy's merge, the reference: W' = W + strength · (alpha / rank) · up @ down, in fp32."""
    out = {k: v.astype(np.float32).copy() for k, v in weights.items()}
    for layers, strength in loras:
        for module, (up, down, alpha) in layers.items():
            rank = down.shape[0]
            scale = strength * ((alpha if alpha is not None else rank) / rank)
            target = out[f"{module}.weight"]
            delta = up.reshape(up.shape[0], rank) @ down.reshape(rank, -1)
            out[f"{module}.weight"] = target + scale * delta.reshape(target.shape)
    return out


def reduce_mean_18(path: Path, *, dynamic_axes: bool = False) -> Path:
    """y = x - mean(x, axis 1) at opset 18, where ReduceMean takes its axes as an input (onnx2torch knows only
    the older attribute form). `dynamic_axes` computes the axes at run time, which has no attribute form."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    if dynamic_axes:
        nodes.insert(0, helper.make_node("Shape", ["x"], ["s"], start=1, end=2))
        nodes.insert(1, helper.make_node("Sub", ["s", "seven"], ["axes"]))  # 8 - 7 = axis 1
        inits = [numpy_helper.from_array(np.array([7], np.int64), "seven")]
    graph = helper.make_graph(
        nodes,
        "reduce_mean_18",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        inits,
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def shrink(path: Path) -> Path:
    """y = Shrink(x), x [batch, 8]: an op ONNX Runtime runs and onnx2torch has no converter for."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Shrink", ["x"], ["y"], lambd=0.5)],
        "shrink",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def strided(path: Path) -> Path:
    """y = x + upsample(conv_stride2(x)), x [1, 1, 'h', 'w']: runs only where h and w are even (the skip and the
    upsampled path must line up), like every encoder-decoder with a stride."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.full((1, 1, 2, 2), 0.25, np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["down"], strides=[2, 2]),
            helper.make_node("Resize", ["down", "", "scales"], ["up"], mode="nearest"),
            helper.make_node("Add", ["x", "up"], ["y"]),
        ],
        "strided",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def top_k(path: Path, k: int = 5000) -> Path:
    """values, indices = TopK(x, k), x [batch, 100000]: ONNX Runtime runs it; TensorRT-RTX refuses k > 3840 at
    build time, in its log only (a real SDK failure that no plan-time check knows about)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"])],
        "top_k",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 100000])],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["batch", k]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["batch", k]),
        ],
        [numpy_helper.from_array(np.array([k], np.int64), "k")],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def big_intermediate(path: Path, *, gain: float = 2e4) -> Path:
    """y = ((x * gain) @ W) / gain, x [batch, 64] in -1..1: the middle tensor reaches ~1e5, past fp16's 65504, while
    the output is ordinary. Converted naively to fp16 it overflows; kept fp32 where it is large, it does not."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(3).normal(0, 1, (64, 16)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "gain"], ["scaled"]),
            helper.make_node("MatMul", ["scaled", "w"], ["big"]),
            helper.make_node("Div", ["big", "gain"], ["y"]),
        ],
        "big_intermediate",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(np.array(gain, np.float32), "gain"), numpy_helper.from_array(weight, "w")],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def dynamic_quantized(path: Path) -> Path:
    """A dynamically quantized conv, as onnxruntime.quantization writes one: DynamicQuantizeLinear → ConvInteger →
    Cast to float → Mul by the scales. Its int32 accumulator reaches ~2e5, which fp16 cannot hold."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    weight = rng.integers(-127, 128, (4, 8, 3, 3)).astype(np.int8)
    graph = helper.make_graph(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
            helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1]),
            helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["xs", "ws"], ["scale"]),
            helper.make_node("Mul", ["accf", "scale"], ["conv"]),
            helper.make_node("Relu", ["conv"], ["y"]),
        ],
        "dynamic_quantized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "h", "w"])],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array(0, np.int8), "wz"),
            numpy_helper.from_array(np.array(0.01, np.float32), "ws"),
        ],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def convs(path: Path) -> Path:
    """y = Conv(Relu(Conv(x))), x [batch, 4, h, w]: weights but no GEMM, so TensorRT-RTX builds it in fp32 for Turing
    too."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
        ],
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "h", "w"])],
        [
            numpy_helper.from_array(rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "w2"),
        ],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)


def large_gather(path: Path, rows: int = 1 << 19, width: int = 1024, *, tile_rows: int = 64) -> Path:
    """y = Gather(table, ids): ids int64 [batch] → y float32 [batch, width]; `table` [rows, width] float32 in
    external data. The default is 2^31 bytes, over protobuf's 2 GB limit, with one op so it builds fast.
    The table is a seeded random block of `tile_rows` rows repeated, written a block at a time (the test process
    never holds it), so compressed blobs stay small; each row of the block differs, so a wrong row shows."""
    from onnx import TensorProto, helper

    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.with_name(path.name + ".data")
    block = np.random.default_rng(7).normal(0, 1, (tile_rows, width)).astype(np.float32).tobytes()
    with open(data, "wb") as out:
        for _ in range(rows // tile_rows):
            out.write(block)
    table = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[rows, width])
    table.data_location = TensorProto.EXTERNAL
    for key, value in (("location", data.name), ("offset", "0"), ("length", str(rows * width * 4))):
        entry = table.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        "large_gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path.write_bytes(model.SerializeToString())  # the graph only: the table is external
    return path


def large_gather_row(index: int, width: int = 1024, *, tile_rows: int = 64) -> np.ndarray:
    """Row `index` of large_gather's table."""
    block = np.random.default_rng(7).normal(0, 1, (tile_rows, width)).astype(np.float32)
    return block[index % tile_rows]


def failing_checker(path: Path) -> Path:
    """A model ONNX loads but its checker refuses: an op no opset defines."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "bad_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
