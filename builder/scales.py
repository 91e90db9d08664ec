"""How much numerical error a correct artifact may show, from what the computation really carries.

A correct implementation differs from the reference by rounding: about the precision's epsilon times the
magnitude of the values being rounded. At an output those are not always the output's own values: a sigmoid
probability map of ~1e-8 is computed from logits of ~20, and an error of eps × 20 in the logits is the honest noise
of any correct kernel. So each output's *carried magnitude* is the largest of its own values and of the values
feeding it, found by walking back through the ops that squash or move data (sigmoid, softmax, clip, reshape…)
to the first op that computes. The reference run reports those feeding tensors too.

Quantized graphs carry 8-bit activations wherever they quantize: one step of an 8-bit range that spans both signs
is 2/255 of the magnitude, and two correct implementations may round a value to neighbouring steps. Their epsilon
is at least 2^-7. Each precision's own epsilon is in the precision table (cache/precision_table.py).
"""

from __future__ import annotations

from pathlib import Path

from enginefarm.formats.fp16_rules import QUANTIZE_OPS

# Ops whose output is bounded by (or is a rearrangement of) their first input: errors pass through them no larger.
PASS_THROUGH = {
    "Sigmoid",
    "Softmax",
    "LogSoftmax",
    "Tanh",
    "HardSigmoid",
    "HardSwish",
    "Clip",
    "Relu",
    "LeakyRelu",
    "Cast",
    "Identity",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Slice",
    "Gather",
    "Concat",
    "Split",
    "Dropout",
    "Pad",
    "DepthToSpace",
    "SpaceToDepth",
    "Expand",
    "Tile",
    "Max",
    "Min",
}
_MAX_WALK = 64


def is_quantized(model) -> bool:
    return any(node.op_type in QUANTIZE_OPS for node in model.graph.node)


def feeding_tensors(model) -> dict[str, list[str]]:
    """For each graph output, the tensors that feed it through pass-through ops only (empty when it is computed
    directly). Concat and Max/Min fan out to every input; the rest follow their first input."""
    producer = {out: node for node in model.graph.node for out in node.output if out}
    constants = {i.name for i in model.graph.initializer} | {
        n.output[0] for n in model.graph.node if n.op_type == "Constant"
    }
    found: dict[str, list[str]] = {}
    for output in model.graph.output:
        feeding: list[str] = []
        frontier, seen = [output.name], {output.name}
        while frontier and len(seen) < _MAX_WALK:
            name = frontier.pop()
            node = producer.get(name)
            if node is not None and _subgraphs(node):
                # Control flow: what happens inside cannot be read out; what goes in is the next best measure.
                outer = set(producer) | {i.name for i in model.graph.input}
                feeding += [n for n in _outer_names(node) if n in outer and n not in constants and n not in seen]
                seen.update(feeding)
                continue
            if node is None or node.op_type not in PASS_THROUGH:
                if name != output.name and name not in constants:
                    feeding.append(name)
                continue
            sources = node.input if node.op_type in ("Concat", "Max", "Min") else node.input[:1]
            for source in sources:
                if source and source not in seen and source not in constants:
                    seen.add(source)
                    frontier.append(source)
        found[output.name] = feeding
    return found


def _subgraphs(node) -> list:
    import onnx

    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def _outer_names(node) -> list[str]:
    """The node's inputs and every name its subgraphs read without producing it: the values it is fed."""
    names = [i for i in node.input if i]
    for graph in _subgraphs(node):
        local = (
            {i.name for i in graph.input}
            | {i.name for i in graph.initializer}
            | {o for n in graph.node for o in n.output}
        )
        for inner in graph.node:
            names += [i for i in inner.input if i and i not in local]
            names += [n for n in _outer_names(inner) if n not in local]
    return list(dict.fromkeys(names))


def session_with_extra_outputs(model_path: Path, names: list[str], options):
    """An ONNX Runtime CPU session on the model's graph that also outputs `names`.

    The graph goes to ONNX Runtime as bytes, with the model's own folder named as where its external data lives
    (`session.model_external_initializers_file_folder_path`, ONNX Runtime's documented way for in-memory models): no
    link, copy or temporary folder, so external data is never reached through a path that leaves the model's
    folder (ONNX Runtime 1.32 refuses that), and the weights are never copied whatever the model's size."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path), load_external_data=False)
    present = {o.name for o in model.graph.output}
    missing = [name for name in names if name not in present]
    if not missing:
        return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    for name in missing:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    from enginefarm.formats.onnx_io import check_external_data

    if check_external_data(model, model_path):
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(model_path.parent))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
