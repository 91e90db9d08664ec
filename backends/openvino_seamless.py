"""Seamless (tileable) OpenVINO models: every 2D convolution of an IR pads circularly in the chosen axes.

The same rewrite as builder/seamless_onnx.py, on OpenVINO's own graph, so an OpenVINO artifact needs no ONNX to
become seamless: each Convolution's input is wrapped with Slice + Concat along the tiled axes (x first, as sdkit
pads) and its own zero pads stay in the other axis only. The weights are not touched.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_AXES = {"x": 3, "y": 2}  # NCHW
_INT64_MAX = int(np.iinfo(np.int64).max)
_CONVOLUTIONS = ("Convolution", "GroupConvolution")


def wrap_convs(ov, model, axes: tuple[str, ...]) -> int:
    """Rewrite `model` (an ov.Model, in place) so its 2D convolutions pad circularly along `axes`; returns how many
    changed."""
    import openvino.opset13 as ops

    def const(*values: int):
        return ops.constant(np.array(values, np.int64))

    wrapped: dict[tuple, object] = {}  # (source output, axis, before, after) → the wrapped output: shared
    changed = 0
    for op in list(model.get_ordered_ops()):
        if op.get_type_name() not in _CONVOLUTIONS:
            continue
        attrs = op.get_attributes()
        begin, end = list(attrs["pads_begin"]), list(attrs["pads_end"])
        if len(begin) != 2 or attrs.get("auto_pad", "explicit") not in ("explicit", "notset"):
            continue
        source, moved = op.input_value(0), False
        for axis in axes:
            dim = _AXES[axis] - 2
            before, after = begin[dim], end[dim]
            if before == 0 and after == 0:
                continue
            memo = (source.get_node().get_name(), source.get_index(), axis, before, after)
            if memo not in wrapped:
                parts = []
                if before:
                    parts.append(ops.slice(source, const(-before), const(_INT64_MAX), const(1), const(_AXES[axis])))
                parts.append(source)
                if after:
                    parts.append(ops.slice(source, const(0), const(after), const(1), const(_AXES[axis])))
                wrapped[memo] = ops.concat(parts, _AXES[axis]).output(0)
            source, moved = wrapped[memo], True
            begin[dim] = end[dim] = 0
        if moved:
            op.input(0).replace_source_output(source)
            op.set_attribute("pads_begin", begin)
            op.set_attribute("pads_end", end)
            changed += 1
    if changed:
        model.validate_nodes_and_infer_types()
    return changed


def write_seamless(ov, xml: Path, outdir: Path, axes: tuple[str, ...]) -> int:
    """The IR at `xml` rewritten by `wrap_convs` into `outdir` (model.xml and model.bin; stored precisions kept)."""
    model = ov.Core().read_model(str(xml))
    changed = wrap_convs(ov, model, axes)
    outdir.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(outdir / "model.xml"), compress_to_fp16=False)
    return changed
