"""Generate a small SD-style decoder with onnx.helper: conv, group-norm, SiLU, one attention block, upsample.

    python recipes/make_tiny_sd.py [--out recipes/models/tiny_sd.onnx] [--unnamed-dims]

Inputs `latent` [batch, 4, height, width] (named dynamic dims; --unnamed-dims writes '?' instead, as some
exporters do) → output `sample` [batch, 3, 2*height, 2*width]. Weights are seeded, so the file is reproducible.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CHANNELS = 32
GROUPS = 8


def make_model(out: Path, *, unnamed_dims: bool = False, seed: int = 0) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits: list = []
    nodes: list = []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def conv(x: str, name: str, cin: int, cout: int, k: int = 3) -> str:
        w = rng.normal(0, 1 / np.sqrt(cin * k * k), (cout, cin, k, k)).astype(np.float32)
        b = rng.normal(0, 0.02, (cout,)).astype(np.float32)
        nodes.append(
            helper.make_node(
                "Conv", [x, const(f"{name}.w", w), const(f"{name}.b", b)], [f"{name}.out"], pads=[k // 2] * 4, name=name
            )
        )
        return f"{name}.out"

    def group_norm_silu(x: str, name: str, channels: int) -> str:
        # As torch exports GroupNorm at opset 17: reshape to [B, G, -1], InstanceNorm, reshape back, affine.
        nodes.append(helper.make_node("Shape", [x], [f"{name}.shape"]))
        nodes.append(
            helper.make_node(
                "Reshape", [x, const(f"{name}.grouped", np.array([0, GROUPS, -1], np.int64))], [f"{name}.g"]
            )
        )
        nodes.append(
            helper.make_node(
                "InstanceNormalization",
                [
                    f"{name}.g",
                    const(f"{name}.one", np.ones(GROUPS, np.float32)),
                    const(f"{name}.zero", np.zeros(GROUPS, np.float32)),
                ],
                [f"{name}.n"],
                epsilon=1e-5,
            )
        )
        nodes.append(helper.make_node("Reshape", [f"{name}.n", f"{name}.shape"], [f"{name}.r"]))
        gamma = (1 + rng.normal(0, 0.1, (1, channels, 1, 1))).astype(np.float32)
        beta = rng.normal(0, 0.1, (1, channels, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Mul", [f"{name}.r", const(f"{name}.gamma", gamma)], [f"{name}.m"]))
        nodes.append(helper.make_node("Add", [f"{name}.m", const(f"{name}.beta", beta)], [f"{name}.a"]))
        nodes.append(helper.make_node("Sigmoid", [f"{name}.a"], [f"{name}.s"]))
        nodes.append(helper.make_node("Mul", [f"{name}.a", f"{name}.s"], [f"{name}.out"]))
        return f"{name}.out"

    def attention(x: str, name: str, c: int) -> str:
        nodes.append(helper.make_node("Shape", [x], [f"{name}.shape"]))
        nodes.append(
            helper.make_node("Reshape", [x, const(f"{name}.flat", np.array([0, 0, -1], np.int64))], [f"{name}.bcn"])
        )
        nodes.append(helper.make_node("Transpose", [f"{name}.bcn"], [f"{name}.bnc"], perm=[0, 2, 1]))
        for proj in ("q", "k", "v"):
            w = rng.normal(0, 1 / np.sqrt(c), (c, c)).astype(np.float32)
            nodes.append(helper.make_node("MatMul", [f"{name}.bnc", const(f"{name}.{proj}.w", w)], [f"{name}.{proj}"]))
        nodes.append(helper.make_node("Transpose", [f"{name}.k"], [f"{name}.kt"], perm=[0, 2, 1]))
        nodes.append(helper.make_node("MatMul", [f"{name}.q", f"{name}.kt"], [f"{name}.qk"]))
        nodes.append(
            helper.make_node(
                "Mul", [f"{name}.qk", const(f"{name}.scale", np.array(1 / np.sqrt(c), np.float32))], [f"{name}.qks"]
            )
        )
        nodes.append(helper.make_node("Softmax", [f"{name}.qks"], [f"{name}.p"], axis=-1))
        nodes.append(helper.make_node("MatMul", [f"{name}.p", f"{name}.v"], [f"{name}.pv"]))
        w = rng.normal(0, 1 / np.sqrt(c), (c, c)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", [f"{name}.pv", const(f"{name}.o.w", w)], [f"{name}.o"]))
        nodes.append(helper.make_node("Transpose", [f"{name}.o"], [f"{name}.ocn"], perm=[0, 2, 1]))
        nodes.append(helper.make_node("Reshape", [f"{name}.ocn", f"{name}.shape"], [f"{name}.back"]))
        nodes.append(helper.make_node("Add", [x, f"{name}.back"], [f"{name}.out"]))
        return f"{name}.out"

    h = conv("latent", "conv_in", 4, CHANNELS)
    h = group_norm_silu(h, "norm1", CHANNELS)
    h = attention(h, "attn", CHANNELS)
    nodes.append(
        helper.make_node(
            "Resize", [h, "", const("up.scales", np.array([1, 1, 2, 2], np.float32))], ["up.out"], mode="nearest"
        )
    )
    h = conv("up.out", "conv_up", CHANNELS, 16)
    h = group_norm_silu(h, "norm2", 16)
    h = conv(h, "conv_out", 16, 3)
    nodes.append(helper.make_node("Identity", [h], ["sample"]))

    dims_in = ["?", 4, "?", "?"] if unnamed_dims else ["batch", 4, "height", "width"]
    dims_out = ["?", 3, "?", "?"] if unnamed_dims else ["batch", 3, "out_height", "out_width"]
    graph = helper.make_graph(
        nodes,
        "tiny_sd_decoder",
        [helper.make_tensor_value_info("latent", TensorProto.FLOAT, [None if d == "?" else d for d in dims_in])],
        [helper.make_tensor_value_info("sample", TensorProto.FLOAT, [None if d == "?" else d for d in dims_out])],
        inits,
    )
    # onnxruntime 1.31 reads IR version <= 13, while onnx 1.23 writes 14 by default.
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10, producer_name="enginefarm-recipes"
    )
    onnx.checker.check_model(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "models" / "tiny_sd.onnx")
    parser.add_argument("--unnamed-dims", action="store_true")
    args = parser.parse_args()
    path = make_model(args.out, unnamed_dims=args.unnamed_dims)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
