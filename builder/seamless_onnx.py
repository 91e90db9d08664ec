"""Seamless (tileable) variants of an ONNX model: every 2D convolution pads circularly in the chosen axes.

What diffusers gives with `padding_mode="circular"` set per axis on every `Conv2d` (what Easy Diffusion's sdkit does:
`F.pad(x, (l, r, 0, 0), "circular")` for x, then `(0, 0, t, b)` for y, then the convolution without padding). Here
each Conv's input is wrapped explicitly (Slice + Concat: every runtime runs them, where `Pad(mode="wrap")` needs
opset 19) and the Conv keeps its own zero pads in the other axis only. Weights are not touched: the rewrite reads the
graph alone, and a model whose weights live in an external file keeps pointing at it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

AXES = {"x": 3, "y": 2}  # NCHW: width is axis 3, height axis 2
_INT64_MAX = np.iinfo(np.int64).max


def parse_axes(tiling: str) -> tuple[str, ...]:
    """ "x", "y", "xy" (or "yx") → the axes in the order they are wrapped (x first, as sdkit pads)."""
    if not isinstance(tiling, str) or not tiling or set(tiling) - set(AXES) or len(set(tiling)) != len(tiling):
        raise ValueError(f"tiling {tiling!r}: use 'x', 'y' or 'xy'")
    return tuple(a for a in ("x", "y") if a in tiling)


def wrap_convs(model, tiling: str) -> int:
    """Rewrite `model` (an onnx.ModelProto, changed in place) so that its 2D Convs pad circularly along `tiling`'s
    axes. Returns how many Convs changed (those with padding in a tiled axis)."""
    from onnx import helper, numpy_helper

    from enginefarm.formats.onnx_data import name_maker

    axes = parse_axes(tiling)
    graph = model.graph
    fresh = name_maker(graph)
    constants: dict[tuple[int, ...], str] = {}

    def constant(*values: int) -> str:
        if values not in constants:
            name = fresh("seamless_" + "_".join(str(v).replace("-", "m") for v in values))
            graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
            constants[values] = name
        return constants[values]

    wrapped: dict[tuple[str, str, int, int], str] = {}  # (input, axis, begin, end) → the wrapped tensor: shared
    nodes = []
    changed = 0
    for node in graph.node:
        pads = _pads(node)
        if pads is None:
            nodes.append(node)
            continue
        begin, end = pads[: len(pads) // 2], pads[len(pads) // 2 :]
        source = node.input[0]
        new_pads = list(pads)
        for axis in axes:
            dim = AXES[axis] - 2  # index into the spatial pads
            before, after = begin[dim], end[dim]
            if before == 0 and after == 0:
                continue
            memo = (source, axis, before, after)
            if memo not in wrapped:
                parts = []
                if before:
                    parts.append(fresh(f"{source}_wrap{axis}_head"))
                    nodes.append(
                        helper.make_node(
                            "Slice",
                            [source, constant(-before), constant(_INT64_MAX), constant(AXES[axis])],
                            [parts[-1]],
                        )
                    )
                parts.append(source)
                if after:
                    parts.append(fresh(f"{source}_wrap{axis}_tail"))
                    nodes.append(
                        helper.make_node(
                            "Slice", [source, constant(0), constant(after), constant(AXES[axis])], [parts[-1]]
                        )
                    )
                out = fresh(f"{source}_wrap{axis}")
                nodes.append(helper.make_node("Concat", parts, [out], axis=AXES[axis]))
                wrapped[memo] = out
            source = wrapped[memo]
            new_pads[dim] = new_pads[dim + len(pads) // 2] = 0
        if source != node.input[0]:
            node.input[0] = source
            for attr in node.attribute:
                if attr.name == "pads":
                    attr.CopyFrom(helper.make_attribute("pads", new_pads))
            changed += 1
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def _pads(node) -> list[int] | None:
    """A 2D Conv's explicit pads [top, left, bottom, right]; None for any other node, or a Conv without padding."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a for a in node.attribute}
    auto_pad = attrs["auto_pad"].s.decode() if "auto_pad" in attrs else "NOTSET"
    if auto_pad not in ("NOTSET", ""):
        raise ValueError(f"Conv {node.name!r} pads with auto_pad={auto_pad}: only explicit pads can be wrapped")
    pads = list(attrs["pads"].ints) if "pads" in attrs else []
    if len(pads) != 4 or not any(pads):  # a 1D/3D Conv, or none to pad: nothing wraps
        return None
    return pads


def write_seamless(source: Path, outdir: Path, tiling: str) -> int:
    """The ONNX model at `source` rewritten by `wrap_convs` into `outdir` under the same file name; its external data
    files (if any) are linked beside it unchanged, under the names the graph refers to. Returns the Convs changed."""
    from enginefarm.formats.onnx_data import write_rewritten

    parse_axes(tiling)  # a bad tiling is refused before the model is read
    return write_rewritten(source, outdir, lambda model: wrap_convs(model, tiling))
