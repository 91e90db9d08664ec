"""Generate a tiny Stable Diffusion 1.5 with onnx.helper and numpy (no torch): the same three components, with
the same input and output names, dtypes and layouts as recipes/make_sd15.py's export, a few hundred KB each.

    python recipes/make_tiny_sd15.py [--out-dir recipes/models/tiny_sd15]

    text_encoder.onnx  input_ids int64 [batch, 77] -> last_hidden_state float32 [batch, 77, 32]
                       token + position embedding, one pre-norm transformer layer (causal self-attention, quick-GELU
                       MLP), final LayerNorm; vocabulary 49408 like CLIP's
    unet.onnx          sample [batch, 4, height, width], timestep [batch], encoder_hidden_states [batch, 77, 32]
                       -> out_sample [batch, 4, height, width]; sinusoidal time embedding, ResNet blocks with the time
                       added, cross-attention on the text, one downsample and one upsample with a skip connection
                       (height and width even)
    vae_decoder.onnx   latent [batch, 4, height, width] -> sample [batch, 3, 2 * height, 2 * width]
                       (recipes/make_tiny_sd.py's decoder)

CI builds recipes/tiny_sd15.toml from these and runs examples/txt2img.py on the artifacts. Weights are seeded.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models" / "tiny_sd15"
TOKENS = 77
VOCAB = 49408
HIDDEN = 32  # text width (768 in SD 1.5)
CHANNELS = 32  # UNet width (320 in SD 1.5)
GROUPS = 8
HEADS = 2


class Graph:
    """A little builder over onnx.helper: named nodes, seeded weights, initializers collected as it goes."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, stem: str, value) -> str:
        from onnx import numpy_helper

        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], stem: str | None = None, **attrs) -> str:
        from onnx import helper

        out = self.name(stem or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def weight(self, shape, fan_in: int, gain: float = 1.0) -> np.ndarray:
        return (self.rng.normal(0, gain / np.sqrt(fan_in), shape)).astype(np.float32)

    def linear(self, x: str, cin: int, cout: int, stem: str, gain: float = 1.0, bias: bool = True) -> str:
        y = self.op("MatMul", [x, self.const(f"{stem}.weight", self.weight((cin, cout), cin, gain))])
        return self.op("Add", [y, self.const(f"{stem}.bias", np.zeros(cout, np.float32))]) if bias else y

    def conv(self, x: str, cin: int, cout: int, stem: str, k: int = 3, stride: int = 1, gain: float = 1.0) -> str:
        w = self.const(f"{stem}.weight", self.weight((cout, cin, k, k), cin * k * k, gain))
        b = self.const(f"{stem}.bias", np.zeros(cout, np.float32))
        return self.op("Conv", [x, w, b], pads=[k // 2] * 4, strides=[stride, stride])

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    def group_norm(self, x: str, channels: int) -> str:
        """GroupNorm as torch exports it at opset 17: [B, G, -1], InstanceNormalization, back, then the affine."""
        shape = self.op("Shape", [x])
        grouped = self.op("Reshape", [x, self.const("groups", np.array([0, GROUPS, -1], np.int64))])
        normed = self.op("InstanceNormalization", [grouped, self.const("one", np.ones(GROUPS, np.float32)),
                                                    self.const("zero", np.zeros(GROUPS, np.float32))], epsilon=1e-5)
        back = self.op("Reshape", [normed, shape])
        scaled = self.op("Mul", [back, self.const("gamma", np.ones((1, channels, 1, 1), np.float32))])
        return self.op("Add", [scaled, self.const("beta", np.zeros((1, channels, 1, 1), np.float32))])

    def layer_norm(self, x: str, width: int) -> str:
        return self.op("LayerNormalization", [x, self.const("ln.weight", np.ones(width, np.float32)),
                                               self.const("ln.bias", np.zeros(width, np.float32))], axis=-1, epsilon=1e-5)

    def attention(self, q_in: str, kv_in: str, q_width: int, kv_width: int, width: int, mask: str | None = None) -> str:
        """Multi-head attention over tokens [B, N, C]: heads split as [B, heads, N, C/heads], softmax(QK^T/sqrt d) V."""
        head = width // HEADS
        split = self.const("heads", np.array([0, -1, HEADS, head], np.int64))

        def heads(x: str) -> str:
            return self.op("Transpose", [self.op("Reshape", [x, split])], perm=[0, 2, 1, 3])

        q = heads(self.linear(q_in, q_width, width, "to_q", bias=False))
        k = heads(self.linear(kv_in, kv_width, width, "to_k", bias=False))
        v = heads(self.linear(kv_in, kv_width, width, "to_v", bias=False))
        scores = self.op("Mul", [self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                                 self.const("scale", np.array(1 / np.sqrt(head), np.float32))])
        if mask is not None:
            scores = self.op("Add", [scores, mask])
        mixed = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        merged = self.op("Reshape", [self.op("Transpose", [mixed], perm=[0, 2, 1, 3]), self.const("merge", np.array([0, -1, width], np.int64))])
        return self.linear(merged, width, q_width, "to_out", gain=0.5)

    def model(self, name: str, inputs: list, outputs: list):
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10, producer_name="enginefarm-recipes")
        onnx.checker.check_model(model)
        return model


def text_encoder(seed: int = 1):
    from onnx import TensorProto, helper

    g = Graph(seed)
    tokens = g.op("Gather", [g.const("token_embedding", g.weight((VOCAB, HIDDEN), 1, 0.5)), "input_ids"])
    h = g.op("Add", [tokens, g.const("position_embedding", g.weight((TOKENS, HIDDEN), 1, 0.5))])
    causal = np.triu(np.full((TOKENS, TOKENS), -1e4, np.float32), k=1)[None, None]  # a token sees itself and before
    normed = g.layer_norm(h, HIDDEN)
    h = g.op("Add", [h, g.attention(normed, normed, HIDDEN, HIDDEN, HIDDEN, g.const("causal_mask", causal))])
    up = g.linear(g.layer_norm(h, HIDDEN), HIDDEN, 4 * HIDDEN, "fc1")
    gelu = g.op("Mul", [up, g.op("Sigmoid", [g.op("Mul", [up, g.const("quick_gelu", np.array(1.702, np.float32))])])])
    h = g.op("Add", [h, g.linear(gelu, 4 * HIDDEN, HIDDEN, "fc2", gain=0.5)])
    g.nodes.append(helper.make_node("Identity", [g.layer_norm(h, HIDDEN)], ["last_hidden_state"]))
    return g.model("tiny_sd15_text_encoder",
                   [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", TOKENS])],
                   [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", TOKENS, HIDDEN])])


def unet(seed: int = 2):
    from onnx import TensorProto, helper

    g = Graph(seed)
    c, t_width = CHANNELS, 4 * CHANNELS
    # Sinusoidal timestep embedding (flip_sin_to_cos): [cos(t f), sin(t f)], f = exp(-ln(10000) i / half).
    half = c // 2
    freqs = np.exp(-np.log(10000.0) * np.arange(half, dtype=np.float32) / half).astype(np.float32)
    angles = g.op("Mul", [g.op("Unsqueeze", ["timestep", g.const("axis1", np.array([1], np.int64))]), g.const("freqs", freqs[None])])
    t = g.op("Concat", [g.op("Cos", [angles]), g.op("Sin", [angles])], axis=1)
    temb = g.linear(g.silu(g.linear(t, c, t_width, "time_1")), t_width, t_width, "time_2")
    temb_act = g.silu(temb)
    unsqueeze = g.const("axes23", np.array([2, 3], np.int64))

    def resnet(x: str, cin: int, cout: int, stem: str) -> str:
        h = g.conv(g.silu(g.group_norm(x, cin)), cin, cout, f"{stem}.conv1")
        h = g.op("Add", [h, g.op("Unsqueeze", [g.linear(temb_act, t_width, cout, f"{stem}.time_emb_proj"), unsqueeze])])
        h = g.conv(g.silu(g.group_norm(h, cout)), cout, cout, f"{stem}.conv2", gain=0.5)
        skip = x if cin == cout else g.conv(x, cin, cout, f"{stem}.shortcut", k=1)
        return g.op("Add", [skip, h])

    def cross_attention(x: str, channels: int) -> str:
        shape = g.op("Shape", [x])
        tokens = g.op("Transpose", [g.op("Reshape", [g.group_norm(x, channels), g.const("flat", np.array([0, channels, -1], np.int64))])], perm=[0, 2, 1])
        mixed = g.attention(tokens, "encoder_hidden_states", channels, HIDDEN, channels)
        back = g.op("Reshape", [g.op("Transpose", [mixed], perm=[0, 2, 1]), shape])
        return g.op("Add", [x, back])

    h0 = g.conv("sample", 4, c, "conv_in")
    h1 = cross_attention(resnet(h0, c, c, "down0"), c)
    h2 = g.conv(h1, c, c, "downsample", stride=2)
    mid = cross_attention(resnet(h2, c, 2 * c, "mid"), 2 * c)
    up = g.op("Resize", [mid, "", g.const("scales", np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    h = resnet(g.op("Concat", [up, h1], axis=1), 3 * c, c, "up0")
    out = g.conv(g.silu(g.group_norm(h, c)), c, 4, "conv_out", gain=0.5)
    g.nodes.append(helper.make_node("Identity", [out], ["out_sample"]))
    spatial = ["batch", 4, "height", "width"]
    return g.model("tiny_sd15_unet",
                   [helper.make_tensor_value_info("sample", TensorProto.FLOAT, spatial),
                    helper.make_tensor_value_info("timestep", TensorProto.FLOAT, ["batch"]),
                    helper.make_tensor_value_info("encoder_hidden_states", TensorProto.FLOAT, ["batch", TOKENS, HIDDEN])],
                   [helper.make_tensor_value_info("out_sample", TensorProto.FLOAT, spatial)])


def make_models(out_dir: Path) -> dict[str, Path]:
    import onnx

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, make in (("text_encoder", text_encoder), ("unet", unet)):
        path = out_dir / f"{name}.onnx"
        tmp = path.with_name(path.name + ".tmp")
        onnx.save(make(), str(tmp))
        tmp.replace(path)
        paths[name] = path
    spec = importlib.util.spec_from_file_location("make_tiny_sd", HERE / "make_tiny_sd.py")
    decoder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decoder)
    paths["vae_decoder"] = decoder.make_model(out_dir / "vae_decoder.onnx", seed=3)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    for name, path in make_models(args.out_dir).items():
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
