"""Attention fused into ONNX Runtime's MultiHeadAttention (com.microsoft) for the onnxruntime:cpu artifacts.

The exported graphs decompose every attention into MatMul, Softmax, MatMul (torch's scaled_dot_product_attention
as the TorchScript exporter writes it), so ONNX Runtime materializes each batch x heads x tokens² score matrix:
5.4 GB a matrix for SD 1.5's UNet at batch 2 and 768 px. The CPU kernel of MultiHeadAttention (ONNX Runtime 1.19
and newer) runs float32 attention as FlashAttention, in L2-sized tiles, so no score matrix exists
(docs/backends.md, "ONNX Runtime: fused attention", has the measured peaks).

The pattern matched is the decomposed attention itself, wherever it sits (a UNet's self- and cross-attention, a
VAE's mid-block, SD3's joint attention, Flux's after its rotary embedding):

    q [B,N,S,H] -(Mul c)-+
                          MatMul -(Mul/Div c)-> Softmax -> MatMul -> (Transpose (0,2,1,3)) -> W
    kᵀ [B,N,H,L] -(Mul c)-+                                   |
    v [B,N,L,H] ----------------------------------------------+

with q, kᵀ and v followed up through their Transposes and scalar Muls to the tensors they come from. Each of those
goes to [B, S, N*H] (a Transpose where it is not already [B, S, N, H], then a Reshape, which ONNX Runtime's CPU
provider does without a copy) into one MultiHeadAttention whose scale is the product of the scalar factors; its
output is reshaped (and transposed) back to W. N and H come from shape inference or, where it left them unknown, from
the constant shape of the Reshape that split the heads. A masked attention (CLIP's causal mask, T5's position bias
added to the scores) is not this pattern and stays as exported. The nodes that only fed the old pattern are removed;
weights are untouched, so the artifact's initializers (and the weight map, LoRA patching) stay as they were. Reads the
graph only: external weights stay where they are.

fp16 graphs get an fp16 MultiHeadAttention: ONNX Runtime 1.32's fp16 CPU kernel does not materialize the scores
either (one SD 1.5-sized attention, batch 2 x 4,096 tokens x 8 heads: +63 MB peak, the fp32 kernel +31 MB; a score
matrix is 537 MB in fp16) and its UNet output is the same as with fp32 attention between Casts.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

FUSION_VERSION = "1"  # part of the onnxruntime build key: bump when what fuse_attention writes changes
MS_DOMAIN = "com.microsoft"
DECOMPOSED = ("Softmax",)  # what is left of an unfused attention: graph_attention_left counts these
_SPLIT = (0, 2, 1, 3)  # [B, S, N, H] <-> [B, N, S, H]


def fuse_attention(model) -> int:
    """Rewrite every decomposed attention of `model` (an onnx ModelProto, weights loaded or not) into one
    com.microsoft MultiHeadAttention node, in place; the number fused."""
    import onnx

    graph = model.graph
    shapes = _known_shapes(graph)
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = _inline_constants(graph)
    replaced: dict[int, list] = {}  # id of the final Transpose -> the nodes that take its place
    fused = 0
    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        found = _match(softmax, producers, consumers, constants, shapes)
        if found is None:
            continue
        parts, w, last, bnsh, scale, heads, head_size = found
        tag = f"{softmax.name or softmax.output[0]}/fused"
        replaced[id(last)] = _mha_nodes(graph, tag, parts, w, bnsh, scale, heads, head_size)
        fused += 1
    if not fused:
        return 0
    nodes = []
    for node in graph.node:
        nodes.extend(replaced.get(id(node), [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_dead(graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    return fused


def write_fused(prepared: Path, out: Path) -> tuple[int, int] | None:
    """`prepared`'s graph with its attention fused, written to `out` (external weights stay in the data file beside
    `prepared`, under the name the graph gives it): (attentions fused, Softmax nodes left), or None, with nothing
    written, where nothing could be fused or this ONNX Runtime has no MultiHeadAttention kernel for the graph's
    precision."""
    import onnx

    model = onnx.load(str(prepared), load_external_data=False)
    half = any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    if not graph_attention_left(model) or not kernel_runs(onnx.TensorProto.FLOAT16 if half else onnx.TensorProto.FLOAT):
        return None
    fused = fuse_attention(model)
    if not fused:
        return None
    onnx.save(model, str(out))
    return fused, graph_attention_left(model)


@functools.cache
def kernel_runs(elem: int) -> bool:
    """Whether this ONNX Runtime's CPU provider runs MultiHeadAttention on `elem` (an ONNX element type): the float16
    kernel came in later releases than the float32 one, and the build extra allows ONNX Runtime 1.17."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper

    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain=MS_DOMAIN, num_heads=2)
    io = [helper.make_tensor_value_info(name, elem, [1, 3, 8]) for name in ("q", "k", "v", "o")]
    graph = helper.make_graph([node], "probe", io[:3], io[3:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 8
    value = np.ones((1, 3, 8), onnx.helper.tensor_dtype_to_np_dtype(elem))
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        session.run(None, {"q": value, "k": value, "v": value})
    except Exception:  # no such kernel here: the artifact keeps the exported attention
        return False
    return True


def graph_attention_left(model) -> int:
    """Decomposed attentions still in `model`'s graph (its Softmax nodes): 0 once every attention is fused."""
    return sum(1 for n in model.graph.node if n.op_type in DECOMPOSED)


def _match(softmax, producers, consumers, constants, shapes):
    """The parts of the decomposed attention ending at `softmax`, or None where the graph is anything else:
    (q, k, v sources with the permutation taking each to [B, S, N, H], the output replaced, the node it replaces,
    whether that output is [B, N, S, H] rather than [B, S, N, H], scale, heads, head size)."""
    if _attr(softmax, "axis", -1) not in (-1, 3):
        return None
    scale = 1.0
    node = producers.get(softmax.input[0])
    while node is not None and node.op_type in ("Mul", "Div"):
        factor = _scalar_factor(node, constants)
        if factor is None:
            return None
        scale *= factor[1]
        node = producers.get(factor[0])
    users = consumers.get(softmax.output[0], [])
    if node is None or node.op_type != "MatMul" or len(users) != 1 or users[0].op_type != "MatMul":
        return None
    pv = users[0]
    if pv.input[0] != softmax.output[0]:
        return None
    # q [B,N,S,H] and v [B,N,L,H] go to [B,S,N,H] by (0,2,1,3); k comes transposed, [B,N,H,L], by (0,3,1,2)
    parts = []
    for name, to_split in ((node.input[0], _SPLIT), (node.input[1], (0, 3, 1, 2)), (pv.input[1], _SPLIT)):
        source, perm, factor = _strip(name, producers, constants)
        parts.append((source, tuple(perm[i] for i in to_split)))
        scale *= factor
    if _strip(pv.input[1], producers, constants)[2] != 1.0:
        return None  # a scaled v is not an attention's
    after = consumers.get(pv.output[0], [])
    bnsh = not (len(after) == 1 and after[0].op_type == "Transpose" and tuple(_attr(after[0], "perm", ())) == _SPLIT)
    last = pv if bnsh else after[0]
    dims = [_dims(source, producers, shapes, constants) for source, _ in parts]
    split = {(d[perm[2]], d[perm[3]]) for d, (_, perm) in zip(dims, parts, strict=True)}
    if len(split) != 1:
        return None
    heads, head_size = split.pop()
    if not all(isinstance(v, int) and v > 0 for v in (heads, head_size)):
        return None
    return parts, last.output[0], last, bnsh, scale, heads, head_size


def _strip(name, producers, constants):
    """Walk up from `name` through Transposes and scalar Muls: (the tensor before them, their composed permutation,
    the product of their factors)."""
    perm = (0, 1, 2, 3)
    scale = 1.0
    node = producers.get(name)
    while node is not None:
        if node.op_type == "Transpose" and len(_attr(node, "perm", ())) == 4:
            step = tuple(_attr(node, "perm", ()))
            perm = tuple(step[i] for i in perm)  # output axis i of both = input axis step[perm[i]]
            name = node.input[0]
        elif node.op_type == "Mul" and (factor := _scalar_factor(node, constants)) is not None:
            name, value = factor
            scale *= value
        else:
            break
        node = producers.get(name)
    return name, perm, scale


def _scalar_factor(node, constants) -> tuple[str, float] | None:
    """(the other input, the factor) where `node` multiplies by, or divides by, a scalar constant."""
    a, b = node.input[0], node.input[1]
    scalars = constants.scalars
    if b in scalars and not (node.op_type == "Div" and scalars[b] == 0):
        return a, scalars[b] if node.op_type == "Mul" else 1 / scalars[b]
    if a in scalars and node.op_type == "Mul":
        return b, scalars[a]
    return None


@dataclass
class _Constants:
    scalars: dict[str, float]  # one-element float tensors
    ints: dict[str, tuple[int, ...]]  # small integer tensors (shapes)


def _inline_constants(graph) -> _Constants:
    """The graph's small inline tensors (Constant nodes, initializers) by name: its scalars and its shapes."""
    import onnx
    from onnx import numpy_helper

    tensors = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant":
            value = next(
                (a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None
            )
            if value is not None:
                tensors.append((node.output[0], value))
    found = _Constants({}, {})
    for name, tensor in tensors:
        size = math.prod(tensor.dims)
        if size > 8 or tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if size == 1 and tensor.data_type in (
            onnx.TensorProto.FLOAT,
            onnx.TensorProto.FLOAT16,
            onnx.TensorProto.DOUBLE,
        ):
            found.scalars[name] = float(numpy_helper.to_array(tensor).reshape(()))
        elif tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            found.ints[name] = tuple(int(v) for v in numpy_helper.to_array(tensor).reshape(-1))
    return found


def _dims(name, producers, shapes, constants, depth: int = 0) -> tuple:
    """The 4 dims of a 4-D tensor, ints where known (else None): from shape inference, or, where it left them unknown
    (Reshapes to shapes computed from their inputs'), from the constant target of the Reshape that splits the heads,
    followed through Transposes, Concats and elementwise ops (norms, rotary embeddings) to it."""
    _, known = shapes.get(name, (0, ()))
    found = tuple(d if isinstance(d, int) and d > 0 else None for d in known) if len(known) == 4 else (None,) * 4
    node = producers.get(name)
    if None not in found[2:] or node is None or depth > 16:
        return found
    if node.op_type == "Reshape":
        target = producers.get(node.input[1])
        given: tuple[int, ...] = ()
        if node.input[1] in constants.ints:
            given = constants.ints[node.input[1]]
        elif target is not None and target.op_type == "Concat":  # the constant entries at its end, right-aligned
            for part in reversed(target.input):
                if part not in constants.ints:
                    break
                given = constants.ints[part] + given
        if not given or len(given) > 4:
            return found
        width = shapes.get(node.input[0], (0, ()))[1][-1:]  # [B, S, D] split into [B, S, N, H]: N x H = D
        if (
            len(given) >= 2
            and sorted(given[-2:])[0] == -1 < sorted(given[-2:])[1]
            and width
            and isinstance(width[0], int)
        ):
            given = given[:-2] + tuple(width[0] // max(given[-2:]) if d == -1 else d for d in given[-2:])
        inner = (None,) * (4 - len(given)) + tuple(d if d > 0 else None for d in given)
    elif node.op_type == "Transpose":
        perm = tuple(_attr(node, "perm", ()))
        below = _dims(node.input[0], producers, shapes, constants, depth + 1)
        inner = tuple(below[i] for i in perm) if len(perm) == 4 else (None,) * 4
    elif node.op_type in ("Concat", "Mul", "Add", "Sub", "Div", "Cast", "Neg", "Identity"):
        inner = _dims(node.input[0], producers, shapes, constants, depth + 1)
        if node.op_type == "Concat":
            axis = _attr(node, "axis", 0) % 4
            inner = tuple(None if i == axis else d for i, d in enumerate(inner))
    else:
        return found
    return tuple(f if f is not None else i for f, i in zip(found, inner, strict=True))


def _known_shapes(graph) -> dict[str, tuple[int, tuple]]:
    """name -> (element type, dims: ints where known, else names or None) from the graph's shape information."""
    found = {}
    for info in (*graph.value_info, *graph.input, *graph.output):
        kind = info.type.tensor_type
        if not kind.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in kind.shape.dim)
        found[info.name] = (kind.elem_type, dims)
    return found


def _mha_nodes(graph, tag, parts, w, bnsh, scale, heads, head_size) -> list:
    """The nodes computing `w` ([B, S, N, H], or [B, N, S, H] where `bnsh`) with one MultiHeadAttention from the
    sources of q, k and v, each transposed to [B, S, N, H] where it is not already."""
    from onnx import helper

    flat = _shape_constant(graph, "attention_fusion/bsd", (0, 0, -1))
    split = _shape_constant(graph, f"attention_fusion/bs{heads}x{head_size}", (0, 0, heads, head_size))
    nodes, fed = [], []
    for part, (source, perm) in zip("qkv", parts, strict=True):
        if perm != (0, 1, 2, 3):
            nodes.append(
                helper.make_node(
                    "Transpose", [source], [f"{tag}/{part}/bsnh"], name=f"{tag}/{part}/Transpose", perm=list(perm)
                )
            )
            source = f"{tag}/{part}/bsnh"
        nodes.append(helper.make_node("Reshape", [source, flat], [f"{tag}/{part}"], name=f"{tag}/{part}/Reshape"))
        fed.append(f"{tag}/{part}")
    out = f"{tag}/out"
    nodes.append(
        helper.make_node(
            "MultiHeadAttention",
            fed,
            [out],
            name=f"{tag}/MultiHeadAttention",
            domain=MS_DOMAIN,
            num_heads=heads,
            scale=float(scale),
        )
    )
    if bnsh:
        nodes.append(helper.make_node("Reshape", [out, split], [f"{out}/bsnh"], name=f"{tag}/Reshape"))
        nodes.append(helper.make_node("Transpose", [f"{out}/bsnh"], [w], name=f"{tag}/Transpose", perm=list(_SPLIT)))
    else:
        nodes.append(helper.make_node("Reshape", [out, split], [w], name=f"{tag}/Reshape"))
    return nodes


def _shape_constant(graph, name: str, values: tuple[int, ...]) -> str:
    from onnx import helper

    if not any(t.name == name for t in graph.initializer):
        graph.initializer.append(helper.make_tensor(name, 7, [len(values)], list(values)))  # 7: INT64
    return name


def _drop_dead(graph) -> None:
    """Remove the nodes nothing reads any more (what fed the replaced attentions), the integer constants they alone
    used, and the shape information of the tensors gone with them. Float initializers (weights) all stay."""
    import onnx

    outputs = {o.name for o in graph.output}
    while True:
        used = outputs | {i for n in graph.node for i in n.input}
        used |= {i for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for i in _outer(a.g)}
        live = [n for n in graph.node if any(o in used for o in n.output)]
        if len(live) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(live)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
    keep = [t for t in graph.initializer if t.name in used or t.data_type in floats]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
    made = {o for n in graph.node for o in n.output}
    infos = [v for v in graph.value_info if v.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _outer(subgraph) -> set[str]:
    return {i for n in subgraph.node for i in n.input}


def _attr(node, name: str, default):
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default
