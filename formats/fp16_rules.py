"""What stays fp32 when a model is converted to fp16.

- Ops ONNX Runtime has no fp16 kernel for (the converter's own default list).
- Quantize/dequantize islands: quantization ops take and give float32 scales and fp32 activations.
- Integer paths: a Cast from an integer tensor to float (an int32 accumulator, say) and the multiply or divide that
  scales it right after; in fp16 that value overflows long before it is scaled back.
- Ops of other domains (com.microsoft contrib ops…): their fp16 support is unknown.
- What the recipe adds (`fp16_keep_fp32`): op types, node names, scopes (a node-name prefix ending in `/`,
  as the exporters name nodes: `/model/time_text_embed/time_proj/`), with the Constants only they read; OpenVINO's
  fp16 builds keep the same nodes (`backends/openvino_precise.py`), and input paths too (`input:timestep`: the
  arithmetic a graph input goes through before the first layer with weights, as `input_path` finds it), which the
  ONNX conversion leaves alone (see `fp16_blocked`).
"""

from __future__ import annotations

from collections.abc import Sequence

# ONNX's quantization op types: they take and give float32 scales, so they and their islands stay fp32.
QUANTIZE_OPS = {
    "DynamicQuantizeLinear",
    "QuantizeLinear",
    "DequantizeLinear",
    "ConvInteger",
    "MatMulInteger",
    "QLinearConv",
    "QLinearMatMul",
    "QLinearAdd",
    "QLinearMul",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
}

_FLOAT = 1
_FLOATS = {1, 10, 11, 16}  # float, float16, double, bfloat16
_SCALING = {"Mul", "Div"}


INPUT_PATH = "input:"
# What an input path goes through: elementwise arithmetic, casts and reshapes (a timestep's scaling, its sinusoidal
# embedding, the copies per batch row). It stops at anything else: the first layer with weights (MatMul, Gemm) runs
# at the precision asked for.
_PATH_OPS = {
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Neg",
    "Exp",
    "Sin",
    "Cos",
    "Cast",
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Flatten",
    "Expand",
    "Tile",
    "Slice",
    "Identity",
}


def input_path(nodes, inputs: tuple[str, ...]) -> set[str]:
    """The names of the nodes a graph input reaches through `_PATH_OPS` alone. A timestep of 0…1000 is the case: in
    fp16 (spacing 0.5 at 1000) it is off by up to 0.25 before sin(t · f) turns that into a quarter radian, and
    scaling it (Flux feeds t / 1000, the model multiplies it back) loses as much again."""
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    found: set[str] = set()
    frontier = list(inputs)
    while frontier:
        for node in readers.get(frontier.pop(), []):
            if node.op_type in _PATH_OPS and node.name and node.name not in found:
                found.add(node.name)
                frontier.extend(node.output)
    return found


def kept_nodes(model, keep: Sequence[str]) -> tuple[set[str], set[str]]:
    """(op types, node names) the recipe's keep entries name: op types, node names, scopes and input paths, with
    the Constant nodes only kept nodes read."""
    nodes = list(model.graph.node)
    names = {n.name for n in nodes if n.name}
    scopes = tuple(k for k in keep if k.endswith("/"))
    paths = tuple(k.removeprefix(INPUT_PATH) for k in keep if k.startswith(INPUT_PATH))
    ops = {k for k in keep if k not in names and not k.endswith("/") and not k.startswith(INPUT_PATH)}
    kept = (
        {k for k in keep if k in names}
        | {n for n in names if scopes and n.startswith(scopes)}
        | input_path(nodes, paths)
    )
    return ops, kept | _constants_of(nodes, kept)


def fp16_blocked(model, keep: tuple[str, ...] = ()) -> tuple[set[str], set[str]]:
    """(op types, node names) that stay fp32. Unnamed nodes on an integer path are given names so they can be kept."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    nodes = list(model.graph.node)
    ops = set(DEFAULT_OP_BLOCK_LIST) | QUANTIZE_OPS
    ops |= {n.op_type for n in nodes if n.domain not in ("", "ai.onnx")}
    # Input paths are OpenVINO's (backends/openvino_precise.py), whose CPU plugin computes them in f16 otherwise. ONNX
    # Runtime's CPU kernels run such fp16 arithmetic through casts to fp32 already, and kept here the converter's
    # Casts between the path and the kept embedding round the timestep to fp16 after all: the tiny Chroma
    # transformer's fp16 output went from 3.3e-4 to 1.3e-2 off fp32 (measured), so the ONNX conversion skips them.
    keep_ops, kept = kept_nodes(model, tuple(k for k in keep if not k.startswith(INPUT_PATH)))
    ops |= keep_ops
    integer = _integer_tensors(model)
    consumers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for index, node in enumerate(nodes):
        if node.op_type == "Cast" and _cast_to(node) == _FLOAT and node.input and node.input[0] in integer:
            for member in [node] + [c for c in consumers.get(node.output[0], []) if c.op_type in _SCALING]:
                if not member.name:
                    member.name = f"enginefarm_fp32_{index}_{member.op_type}_{len(kept)}"
                kept.add(member.name)
    return ops, kept


def _constants_of(nodes, kept: set[str]) -> set[str]:
    """The Constant nodes that only kept nodes read: converted, they would round what the kept nodes compute with
    (a sinusoidal embedding's frequencies, say) before the kept nodes cast them back."""
    readers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return {
        n.name
        for n in nodes
        if n.op_type == "Constant"
        and n.name
        and readers.get(n.output[0])
        and all(r.name in kept for r in readers[n.output[0]])
    }


def _cast_to(node) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _integer_tensors(model) -> set[str]:
    """Tensors known to hold integers: typed so in the graph, integer initializers, or produced by integer ops."""
    found = {
        v.name
        for v in list(model.graph.value_info) + list(model.graph.input)
        if v.type.tensor_type.elem_type and v.type.tensor_type.elem_type not in _FLOATS
    }
    found |= {i.name for i in model.graph.initializer if i.data_type not in _FLOATS}
    for node in model.graph.node:  # in topological order, so producers come first
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            found.update(node.output)
        elif node.op_type == "Cast":
            if _cast_to(node) not in _FLOATS:
                found.update(node.output)
        elif (
            node.op_type in ("Add", "Sub", "Reshape", "Squeeze", "Unsqueeze", "Transpose")
            and node.input
            and node.input[0] in found
        ):
            found.update(node.output)
    return found


def elide_round_trips(graph) -> int:
    """The converter casts every fp32 output of a kept node to fp16 and back to fp32 before the next kept node, which
    overflows exactly the values kept fp32 for their size. A Cast to fp16 whose readers are Casts back to fp32 is
    dropped with them, and their readers read the fp32 tensor. Returns how many pairs were removed. A pair whose
    tensors an If branch or Loop body reads from this scope stays: renaming reaches only this graph's nodes."""
    outputs = {o.name for o in graph.output} | _read_by_subgraphs(graph)  # names a branch or loop body reads stay
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    drop: set[int] = set()
    rename: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "Cast" or _cast_to(node) != 10 or node.output[0] in outputs:
            continue
        back = readers.get(node.output[0], [])
        if not back or any(b.op_type != "Cast" or _cast_to(b) != _FLOAT or b.output[0] in outputs for b in back):
            continue
        drop.add(id(node))
        for b in back:
            drop.add(id(b))
            rename[b.output[0]] = node.input[0]
    if not drop:
        return 0
    kept = [n for n in graph.node if id(n) not in drop]
    for node in kept:
        node.input[:] = [rename.get(i, i) for i in node.input]
    removed = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(kept)
    return removed // 2


def _read_by_subgraphs(graph) -> set[str]:
    """Every tensor name read by a node of any subgraph (If branches, Loop and Scan bodies, nested at any depth):
    a superset of what they capture from the outer scopes, which is all the caller needs to keep."""
    found: set[str] = set()
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                found.update(name for inner in sub.node for name in inner.input)
                found |= _read_by_subgraphs(sub)
    return found
