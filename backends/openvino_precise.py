"""The recipe's fp16 keep-list on OpenVINO: the nodes it names are marked `precise` in the IR before its weights are
compressed to fp16, so OpenVINO keeps them and their constants fp32 and its CPU plugin computes them in f32 even
at INFERENCE_PRECISION_HINT f16 (checked: the compiled model's runtime precision of each marked node is f32).

Why: an fp16 artifact computes in f16 on a CPU that can (AVX512-FP16 here), and that, not the weights' compression,
is where the transformers lose most (docs/benchmarks.md, "Measurements behind the code"): OpenVINO keeps sin/cos f32
itself, but not their argument t · f, nor the timestep's scaling before it (t / 1000, then · 1000 in the model).

The mark is the runtime attribute OpenVINO's `disable_fp16_compression` sets (named `precise`, version 0, in the
IR). Python cannot create it (setting that rt_info key from Python stores a plain string, which every transformation
ignores: tried), but the IR reader does from the XML, so the build writes the IR, adds the attribute to the layers
and reads it back.

That staging IR holds the graph, not the weights: each constant of 64 KiB or more that the keep-list does not name
is a Parameter of its type and shape there, and the marked model gets the original constant node back (its data
shared, not copied), so a large model's job holds no full uncompressed copy on disk; the final IR is byte for byte
the one such a copy gives (tests/backends).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .openvino_disk import placeheld

ATTRIBUTE = {"name": "precise", "version": "0"}
_PLACEHOLDER = "enginefarm.weight."


def precise_names(onnx_path: Path, keep: Sequence[str]) -> set[str]:
    """The OpenVINO layer names of what `keep` names in the ONNX file (fp16_rules.kept_nodes: op types, node names,
    scopes, input paths): the nodes, and the constants only they read (a Constant node is named by its output, an
    initializer by its own name)."""
    import onnx

    from enginefarm.formats.fp16_rules import kept_nodes

    model = onnx.load(str(onnx_path), load_external_data=False)
    ops, kept = kept_nodes(model, keep)
    nodes = list(model.graph.node)
    kept |= {n.name for n in nodes if n.op_type in ops and n.name}
    names = set(kept) | {o for n in nodes if n.name in kept and n.op_type == "Constant" for o in n.output}
    readers: dict[str, set[str]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name)
    names |= {i.name for i in model.graph.initializer if readers.get(i.name) and readers[i.name] <= kept}
    return names


def mark_precise(xml: Path, names: set[str]) -> int:
    """Add the `precise` attribute to each layer of the IR at `xml` whose name is in `names`; how many were marked."""
    import xml.etree.ElementTree as ET

    tree = ET.parse(xml)
    marked = 0
    for layer in tree.getroot().iter("layer"):
        if layer.get("name") not in names:
            continue
        info = layer.find("rt_info")
        if info is None:
            info = ET.Element("rt_info")
            layer.insert(0, info)
        if not any(a.get("name") == ATTRIBUTE["name"] for a in info.findall("attribute")):
            ET.SubElement(info, "attribute", ATTRIBUTE)
            marked += 1
    tree.write(xml, encoding="utf-8", xml_declaration=True)
    return marked


def keep_fp32(ov, core, model, names: set[str], workdir: Path):
    """`model` with the layers in `names` marked precise (through a weightless IR in `workdir`); the count, and the
    staging files (the caller removes them once the final IR is saved). `model` itself is left as it was."""
    weights = [op for op in model.get_ops() if placeheld(op, names)]
    stand_ins = []
    for i, constant in enumerate(weights):
        stand_in = ov.op.Parameter(constant.get_output_element_type(0), constant.get_output_partial_shape(0))
        stand_in.set_friendly_name(f"{_PLACEHOLDER}{i}")
        constant.output(0).replace(stand_in.output(0))
        stand_ins.append(stand_in)
    model.add_parameters(stand_ins)
    staging = workdir / "unmarked.xml"
    try:
        ov.save_model(model, str(staging), compress_to_fp16=False)
    finally:  # the caller's model gets its constants back
        _restore(model, stand_ins, weights)
    marked = mark_precise(staging, names)
    marked_model = core.read_model(str(staging))
    read_back = {p.get_friendly_name(): p for p in marked_model.get_parameters()}
    missing = [f"{_PLACEHOLDER}{i}" for i in range(len(weights)) if f"{_PLACEHOLDER}{i}" not in read_back]
    if missing:  # an enginefarm bug, not the user's: the IR reader renamed what the build wrote
        raise RuntimeError(f"the staging IR lost its placeholders {missing[:3]}")
    _restore(marked_model, [read_back[f"{_PLACEHOLDER}{i}"] for i in range(len(weights))], weights)
    return marked_model, marked, (staging, staging.with_suffix(".bin"))


def _restore(model, stand_ins, weights) -> None:
    """Each placeholder's readers read its constant again, and the placeholders leave the model's inputs."""
    for stand_in, constant in zip(stand_ins, weights, strict=True):
        stand_in.output(0).replace(constant.output(0))
        model.remove_parameter(stand_in)
    model.validate_nodes_and_infer_types()
