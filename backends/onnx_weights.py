"""An ONNX model's weights are its float initializers, by name. This one module reads and patches them for every
caller: ONNX Runtime's custom weights (read, write a patched copy, or hand new values to the session), and the
base weights the runner reads from the `weights.onnx` that weight-stripped TensorRT plans ship (runner/custom.py).

`initializer_kinds` reads just the initializers' names, element types and shapes from the protobuf wire format,
skipping their bytes, so loading an ONNX Runtime session with new weights imports no `onnx` (an app bundle ships
ONNX Runtime without it). Reading values and writing a copy use `onnx` (the export extra's dependency).
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from enginefarm.errors import IntegrityError

# ONNX TensorProto.DataType codes of the float weights custom weights may replace, as numpy dtypes.
FLOAT_TYPES: dict[int, np.dtype] = {1: np.dtype(np.float32), 10: np.dtype(np.float16)}  # ONNX data type → numpy's
_GRAPH, _INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
_DIMS, _DATA_TYPE, _NAME = 1, 2, 8  # TensorProto fields


def _varint(buf, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, value) of each field of the message in buf[start:end]; a length-delimited value is
    its (start, end), never a copy, so a model's inline weights are skipped over, not read."""
    at = start
    while at < end:
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        value: int | tuple[int, int] | None
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 2:
            size, at = _varint(buf, at)
            value, at = (at, at + size), at + size
        elif wire in (1, 5):
            value, at = None, at + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _tensor_kind(buf, start: int, end: int) -> tuple[str, int, tuple[int, ...]]:
    name, dtype, dims = "", 0, []
    for number, wire, value in _fields(buf, start, end):
        if number == _NAME:
            name = bytes(buf[value[0] : value[1]]).decode()
        elif number == _DATA_TYPE:
            dtype = value
        elif number == _DIMS and wire == 0:
            dims.append(value)
        elif number == _DIMS:  # packed
            at = value[0]
            while at < value[1]:
                dim, at = _varint(buf, at)
                dims.append(dim)
    return name, dtype, tuple(dims)


def initializer_kinds(model: Path) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Every initializer's name → (ONNX element type, dims), read from the file's protobuf without `onnx`."""
    found = {}
    try:
        with open(model, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            for number, wire, graph in _fields(buf, 0, len(buf)):
                if number != _GRAPH or wire != 2:
                    continue
                for field_number, field_wire, tensor in _fields(buf, *graph):
                    if field_number == _INITIALIZER and field_wire == 2:
                        name, dtype, dims = _tensor_kind(buf, *tensor)
                        found[name] = (dtype, dims)
    except (ValueError, IndexError) as exc:
        raise IntegrityError(f"{model.name} is not a readable ONNX model ({exc})") from None
    return found


def float_shapes(model: Path) -> dict[str, tuple[int, ...]]:
    """Every float (fp32 or fp16) initializer's shape: the weights custom weights may replace."""
    return {name: dims for name, (dtype, dims) in initializer_kinds(model).items() if dtype in FLOAT_TYPES}


def as_overrides(model: Path, weights: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
    """`weights` (float32, ONNX layout) reshaped and cast to the initializers' own shapes and element types, ready to
    replace them (ONNX Runtime's SessionOptions.add_initializer). `what` names the artifact in the error."""
    kinds = initializer_kinds(model)
    unknown = sorted(name for name in weights if kinds.get(name, (0,))[0] not in FLOAT_TYPES)
    if unknown:
        raise IntegrityError(f"{what}: no float initializer of {model.name} is named {unknown[:5]}")
    return {
        name: np.ascontiguousarray(value.reshape(kinds[name][1]), dtype=FLOAT_TYPES[kinds[name][0]])
        for name, value in weights.items()
    }


def read(model: Path, names) -> dict[str, np.ndarray]:
    """The current values of these initializers, in their own float dtype (only their external data is read)."""
    from onnx import numpy_helper

    from enginefarm.formats.onnx_data import load_model

    wanted = set(names)
    loaded = load_model(model, only=wanted)
    return {i.name: numpy_helper.to_array(i) for i in loaded.graph.initializer if i.name in wanted}


def write_patched(model: Path, weights: dict[str, np.ndarray], outdir: Path, data_file: str | None) -> list[str]:
    """A copy of `model` in `outdir` with `weights` (float32, ONNX layout) cast into the initializers' own dtypes; its
    weights go to `data_file` beside it when the source kept them outside (large models). The names it wrote."""
    import onnx
    from onnx import numpy_helper

    from enginefarm.formats.onnx_data import load_model

    loaded = load_model(model)
    for init in loaded.graph.initializer:
        if init.name in weights:
            current = numpy_helper.to_array(init)
            init.CopyFrom(
                numpy_helper.from_array(weights[init.name].astype(current.dtype).reshape(current.shape), init.name)
            )
    if data_file:
        onnx.save(loaded, str(outdir / model.name), save_as_external_data=True, location=data_file)
        return [model.name, data_file]
    onnx.save(loaded, str(outdir / model.name))
    return [model.name]
