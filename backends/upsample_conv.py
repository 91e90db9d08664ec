"""Nearest 2x upsampling followed by a 3x3 convolution, computed as four 2x2 convolutions at the input's resolution.

Every SD-class VAE decoder (and UNet) upsamples with `interpolate(scale_factor=2, mode="nearest")` then a 3x3
convolution (diffusers' Upsample2D). Each output pixel of that convolution sees only a 2x2 window of the input before
upsampling, so output rows 2i and 2i+1 (and columns alike) are 2x2 convolutions of the input with the 3x3 kernel's
taps summed: row phase 0 takes input rows i-1, i with taps [w0, w1+w2]; phase 1 rows i, i+1 with [w0+w1, w2]. The
four phases, interleaved by DepthToSpace, are the same output from 16 multiply-adds per input pixel and channel pair
instead of 36: the same sum in another order (fp32 outputs within ~1e-5 of their size). OpenVINO's CPU plugin runs
the SD 1.5 VAE decoder's three upsampling convolutions in 0.44-0.50x their time (bench/upsample_conv.py).

The phase kernels are computed in the graph from the convolution's own weight (MatMuls with 0/1 matrices, which OpenVINO
folds when it compiles), so the artifact keeps the exported initializer under its name: the weight map,
LoRA patching and weights given at load find it as before. Reads and writes the graph only.

    X -> Resize(nearest, x2) -> Conv(W, B; 3x3, pads 1)       becomes
    X -> Conv(W_ab, B; 2x2, pads [1-a, 1-b, a, b]) for a, b in {0, 1} -> Concat -> DepthToSpace(2, DCR)
"""

from __future__ import annotations

import math

import numpy as np

# Part of the OpenVINO build key: bump when what fold_upsample_convs writes changes.
FOLD_VERSION = "1"
# Row (and column) phase -> which of the 3x3 kernel's taps each of the 2x2 kernel's taps sums.
_TAPS = {0: np.array([[1, 0, 0], [0, 1, 1]], np.float32), 1: np.array([[1, 1, 0], [0, 0, 1]], np.float32)}
_FLOAT_TYPES = frozenset({1, 10, 11, 16})  # ONNX float, float16, double, bfloat16


def fold_upsample_convs(model) -> int:
    """Rewrite each nearest-2x-Resize-then-3x3-Conv of `model` (an onnx ModelProto, weights loaded or not) in place;
    the number rewritten. A Resize whose output goes anywhere else, or a Conv with strides, dilations, groups or
    other pads, stays as it is."""
    from onnx import helper, numpy_helper

    from enginefarm.formats.onnx_data import name_maker

    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 11:  # Resize's inputs were (X, scales) before opset 11
        return 0
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    constants = _constant_values(graph)
    elem_types = _elem_types(graph)
    fresh = name_maker(graph)
    made: dict[str, str] = {}

    def taps(phase: int, transposed: bool) -> str:
        key = f"upsample_conv_taps{phase}{'T' if transposed else ''}"
        if key not in made:
            made[key] = fresh(key)
            value = _TAPS[phase].T if transposed else _TAPS[phase]
            graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), made[key]))
        return made[key]

    replaced: dict[int, list] = {}  # id of the Conv -> the nodes in its place
    dropped: set[int] = set()  # ids of the Resizes folded into them
    for resize in graph.node:
        if not _nearest_double(resize, constants) or resize.output[0] in outputs:
            continue
        users = consumers.get(resize.output[0], [])
        if len(users) != 1 or not _plain_3x3(users[0], resize.output[0]):
            continue
        conv = users[0]
        weight = conv.input[1]
        elem = elem_types.get(weight)
        if elem not in _FLOAT_TYPES:
            continue
        stem = conv.name or conv.output[0]
        nodes = []
        source = weight
        if elem != 1:  # derived in float32 where every runtime has the kernels to fold it, then cast back
            source = fresh(f"{stem}/weight_f32")
            nodes.append(helper.make_node("Cast", [weight], [source], to=1))
        phases = []
        for a in (0, 1):
            rows = fresh(f"{stem}/rows{a}")
            nodes.append(helper.make_node("MatMul", [taps(a, False), source], [rows]))
            for b in (0, 1):
                kernel = fresh(f"{stem}/kernel{a}{b}")
                nodes.append(helper.make_node("MatMul", [rows, taps(b, True)], [kernel]))
                if elem != 1:
                    cast = fresh(f"{stem}/kernel{a}{b}_cast")
                    nodes.append(helper.make_node("Cast", [kernel], [cast], to=elem))
                    kernel = cast
                phases.append(fresh(f"{stem}/phase{a}{b}"))
                inputs = [resize.input[0], kernel, *conv.input[2:3]]
                nodes.append(
                    helper.make_node(
                        "Conv",
                        inputs,
                        [phases[-1]],
                        name=f"{stem}/phase{a}{b}",
                        kernel_shape=[2, 2],
                        pads=[1 - a, 1 - b, a, b],
                    )
                )
        stacked = fresh(f"{stem}/phases")
        nodes.append(helper.make_node("Concat", phases, [stacked], axis=1))
        nodes.append(helper.make_node("DepthToSpace", [stacked], [conv.output[0]], blocksize=2, mode="DCR"))
        replaced[id(conv)] = nodes
        dropped.add(id(resize))
    if not replaced:
        return 0
    kept, orphans = [], set()
    for node in graph.node:
        if id(node) in dropped:
            orphans.update([*node.input[1:], node.output[0]])  # its scales (and roi) go with it where only it read them
            continue
        kept.extend(replaced.get(id(node), [node]))
    while True:  # the Constants (and an fp16 graph's Casts of them) that only fed the dropped Resizes
        orphans -= {name for node in kept for name in node.input} | outputs
        gone = [n for n in kept if n.op_type in ("Constant", "Cast") and n.output[0] in orphans]
        if not gone:
            break
        kept = [n for n in kept if all(n is not g for g in gone)]
        orphans |= {name for node in gone for name in node.input}
    del graph.node[:]
    graph.node.extend(kept)
    for field in (graph.initializer, graph.value_info):
        left = [entry for entry in field if entry.name not in orphans]
        del field[:]
        field.extend(left)
    return len(replaced)


def _nearest_double(node, constants: dict[str, np.ndarray]) -> bool:
    """A Resize doubling height and width by nearest neighbour, each output index i reading input i // 2."""
    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return False
    if len(node.input) > 3 and node.input[3]:  # sizes given: the factor is not known here
        return False
    scales = constants.get(node.input[2])
    if scales is None or scales.shape != (4,) or not np.array_equal(scales, [1, 1, 2, 2]):
        return False
    attrs = {a.name: a for a in node.attribute}
    text = {
        name: attrs[name].s.decode()
        for name in ("mode", "coordinate_transformation_mode", "nearest_mode")
        if name in attrs
    }
    if text.get("mode", "nearest") != "nearest":
        return False
    where = _nearest_sources(
        text.get("coordinate_transformation_mode", "half_pixel"), text.get("nearest_mode", "round_prefer_floor")
    )
    return where == [i // 2 for i in range(8)]


def _nearest_sources(transform: str, rounding: str) -> list[int] | None:
    """Which input index each of 8 output indices reads when 4 are doubled (ONNX Resize's formulas)."""
    coordinate = {
        "asymmetric": lambda i: i / 2,
        "half_pixel": lambda i: (i + 0.5) / 2 - 0.5,
        "pytorch_half_pixel": lambda i: (i + 0.5) / 2 - 0.5,
        "tf_half_pixel_for_nn": lambda i: (i + 0.5) / 2,
    }.get(transform)
    rounded = {
        "floor": math.floor,
        "ceil": math.ceil,
        "round_prefer_floor": lambda x: math.ceil(x - 0.5),
        "round_prefer_ceil": lambda x: math.floor(x + 0.5),
    }.get(rounding)
    if coordinate is None or rounded is None:
        return None
    return [min(max(rounded(coordinate(i)), 0), 3) for i in range(8)]


def _plain_3x3(node, source: str) -> bool:
    """A 2D Conv of `source` with a 3x3 kernel, pads 1 on every side, stride 1, no dilation, one group."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2 or node.input[0] != source:
        return False
    attrs = {a.name: a for a in node.attribute}
    ints = {name: list(attrs[name].ints) for name in ("kernel_shape", "pads", "strides", "dilations") if name in attrs}
    return (
        ints.get("kernel_shape") == [3, 3]
        and ints.get("pads") == [1, 1, 1, 1]
        and ints.get("strides", [1, 1]) == [1, 1]
        and ints.get("dilations", [1, 1]) == [1, 1]
        and (attrs["group"].i if "group" in attrs else 1) == 1
        and (attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET") in ("NOTSET", "")
    )


def _constant_values(graph) -> dict[str, np.ndarray]:
    """The small constant tensors (initializers, Constant nodes and their Casts) by name: a Resize's scales."""
    from onnx import numpy_helper

    found = {}
    for init in graph.initializer:
        if init.data_location != 1 and math.prod(init.dims) <= 16:  # 1: external data, never a Resize's scales
            found[init.name] = numpy_helper.to_array(init)
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Cast" and node.input[0] in found:  # an fp16 graph's scales, cast back to float
            found[node.output[0]] = found[node.input[0]].astype(np.float64)
    return found


def _elem_types(graph) -> dict[str, int]:
    """The element type of every initializer and Cast output: what a Conv's weight can be here."""
    found = {init.name: init.data_type for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Cast":
            found[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    return found
