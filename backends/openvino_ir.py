"""An OpenVINO IR's weights, read and patched in its files (the IR counterpart of onnx_weights.py). IR constants keep
the ONNX initializer's name among their output names, and their bytes sit at (offset, size) in the .bin. Patched
values are appended to a copy of the .bin and the constant re-pointed, so bytes OpenVINO shares between identical
constants are never overwritten. Only the standard library and numpy: no OpenVINO needed to read or patch."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

IR_DTYPES = {"f32": "<f4", "f16": "<f2"}


def _constants(tree) -> dict[str, tuple]:
    """ONNX name → (data element, element type, shape) of every float constant of the IR."""
    found = {}
    for layer in tree.getroot().iter("layer"):
        data, port = layer.find("data"), layer.find("output/port")
        if layer.get("type") != "Const" or data is None or port is None or data.get("element_type") not in IR_DTYPES:
            continue
        shape = tuple(int(d) for d in data.get("shape", "").split(",") if d.strip())
        for name in filter(None, (port.get("names") or "").split(",")):
            found[name.strip()] = (data, data.get("element_type"), shape)
    return found


def float_shapes(xml: Path) -> dict[str, tuple[int, ...]]:
    return {name: shape for name, (_, _, shape) in _constants(ET.parse(xml)).items()}


def read(xml: Path, names) -> dict[str, np.ndarray]:
    """These constants' values as stored (float16 or float32): read-only views of the .bin beside `xml`, memory-mapped,
    so a LoRA's merge reads each weight once, in chunks (runner/merge.py), instead of a float32 copy of them all."""
    consts = _constants(ET.parse(xml))
    blob = np.memmap(xml.with_suffix(".bin"), dtype=np.uint8, mode="r")
    out = {}
    for name in names:
        data, kind, shape = consts[name]
        start = int(data.get("offset"))
        out[name] = blob[start : start + int(data.get("size"))].view(IR_DTYPES[kind]).reshape(shape)
    return out


def write_patched(xml: Path, weights: dict[str, np.ndarray], outdir: Path) -> tuple[Path, Path]:
    """A copy of the IR in `outdir` with `weights` (float32, ONNX layout) in its constants: (xml, bin) written."""
    tree = ET.parse(xml)
    consts = _constants(tree)
    out_xml, out_bin = outdir / xml.name, outdir / xml.with_suffix(".bin").name
    shutil.copyfile(xml.with_suffix(".bin"), out_bin)
    with open(out_bin, "ab") as handle:
        for name, value in weights.items():
            data, kind, shape = consts[name]
            payload = np.ascontiguousarray(value.reshape(shape), dtype=IR_DTYPES[kind]).tobytes()
            handle.write(b"\0" * (-handle.tell() % 64))
            data.set("offset", str(handle.tell()))
            data.set("size", str(len(payload)))
            handle.write(payload)
    tree.write(out_xml, encoding="utf-8", xml_declaration=True)
    return out_xml, out_bin
