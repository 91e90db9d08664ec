"""ONNX models of any size, one tensor at a time: never the whole model as one protobuf message.

protobuf cannot serialize a message over 2 GB, so a multi-GB model only exists as a small graph (the `.onnx`,
loaded with `load_external_data=False`) plus weights in external files. `write_model` saves such a graph with
every external tensor copied into one `<name>.data` file next to it, a chunk at a time (memory: CHUNK, whatever
the model's size), and can cast float32 tensors to float16 on the way.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .safetensors_io import map_bytes

_ALIGN = 4096  # tensors start on page boundaries, so runtimes can map them instead of copying
CHUNK = 64 << 20  # bytes moved (and converted) at a time: a multiple of 4, so float32 values never split
_EXTERNAL = 1  # TensorProto.EXTERNAL


def external_tensors(model) -> list:
    """Every tensor of `model` (initializers, Constant attributes, subgraphs) whose bytes live in a file."""
    from onnx.external_data_helper import _get_all_tensors

    return [t for t in _get_all_tensors(model) if t.data_location == _EXTERNAL]


def _entry(tensor) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def load_model(path: Path, only: set[str] | None = None):
    """The model at `path` with its external data read in (`only`: just these tensors'). onnx 1.2x's own loader
    refuses data files with more than one hard link (its "hardlink attack" check), and an artifact's data file is a
    hard link to the prep cache's."""
    import onnx

    from .onnx_io import check_external_data

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    check_external_data(model, path)  # every location inside the model's folder, every file there
    for tensor in external_tensors(model):
        if only is not None and tensor.name not in only:
            continue
        tensor.raw_data = external_bytes(path, tensor)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return model


class Initializers:
    """The float initializers of the model at `path`, read one at a time: the graph is loaded without its weights,
    and an array is read from its external data file (or the inline proto) when asked for, so a caller that drops
    each array holds one tensor at a time, not the model (SDXL's UNet: 10.3 GB)."""

    FLOATS = (1, 10, 11)  # TensorProto FLOAT, FLOAT16, DOUBLE

    def __init__(self, path: Path) -> None:
        import onnx

        from .onnx_io import check_external_data

        self.path = Path(path)
        model = onnx.load(str(self.path), load_external_data=False)
        check_external_data(model, self.path)
        self._protos = {init.name: init for init in model.graph.initializer if init.data_type in self.FLOATS}
        self.shapes = {name: tuple(init.dims) for name, init in self._protos.items()}
        self._files: dict[str, Path] = {}  # external data location → its resolved path

    def read(self, name: str) -> np.ndarray:
        from onnx import helper, numpy_helper

        tensor = self._protos[name]
        if tensor.data_location != _EXTERNAL:
            return numpy_helper.to_array(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        return np.frombuffer(external_bytes(self.path, tensor), dtype=dtype).reshape(self.shapes[name])

    def view(self, name: str) -> np.ndarray:
        """`read(name)`, but an external tensor is memory-mapped from its file, not read: looking at a few values
        reads a few pages, and dropping the array unmaps it. Read-only."""
        from onnx import helper

        tensor = self._protos[name]
        if tensor.data_location != _EXTERNAL:
            return self.read(name)
        dtype, shape = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)), self.shapes[name]
        entry = _entry(tensor)
        size = int(np.prod(shape)) * dtype.itemsize
        if "length" in entry and int(entry["length"]) != size:
            raise ValueError(f"{name}: {entry['length']} bytes in its data file, {size} for its shape {list(shape)}")
        if entry["location"] not in self._files:
            self._files[entry["location"]] = (self.path.parent / entry["location"]).resolve()
        whole = map_bytes(self._files[entry["location"]], int(entry.get("offset", 0)), size)
        return whole.view(dtype).reshape(shape)


def external_bytes(model_path: Path, tensor) -> bytes:
    """The bytes of one external tensor of the model at `model_path`, read from its data file."""
    entry = _entry(tensor)
    with open((Path(model_path).parent / entry["location"]).resolve(), "rb") as handle:
        handle.seek(int(entry.get("offset", 0)))
        return handle.read(int(entry["length"])) if "length" in entry else handle.read()


def data_files(model) -> set[str]:
    return {_entry(t).get("location", "") for t in external_tensors(model)}


def rename_data_file(model, location: str) -> None:
    """Point every external tensor at `location` (same offsets): for a data file that was renamed."""
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location


def write_model(
    model, base_dir: Path, out: Path, *, to_fp16: frozenset[str] = frozenset(), to_bf16: frozenset[str] = frozenset()
) -> None:
    """Save `model` at `out`, its external tensors (read from `base_dir`) in `out.name + ".data"`.

    `to_fp16` names external tensors that were float32 in the files and are float16 in `model` (the fp16
    converter changes the type of a tensor it cannot see the data of): their values are converted here, with
    the converter's own clamping of what float16 cannot hold. `to_bf16` does the same for tensors retyped to
    bfloat16 (rounded to nearest even from float32, see formats/bf16.py). Data moves in chunks: memory stays at CHUNK
    bytes even for a single multi-GB tensor."""
    import onnx

    data_path = out.with_name(out.name + ".data")
    tensors = external_tensors(model)
    if tensors:
        readers: dict[str, BinaryIO] = {}  # external data file → its open handle
        try:
            with open(data_path, "wb") as sink:
                for tensor in tensors:
                    sink.write(b"\0" * (-sink.tell() % _ALIGN))
                    offset = sink.tell()
                    convert = None
                    if tensor.name in to_fp16 and tensor.data_type == onnx.TensorProto.FLOAT16:
                        convert = _fp16_bytes
                    elif tensor.name in to_bf16 and tensor.data_type == onnx.TensorProto.BFLOAT16:
                        convert = _bf16_bytes
                    length = _copy(readers, base_dir, _entry(tensor), sink, convert)
                    _point(tensor, data_path.name, offset, length)
        finally:
            for handle in readers.values():
                handle.close()
    onnx.save(model, str(out))  # only the graph: every tensor that is large is external by now


def _copy(readers: dict[str, BinaryIO], base_dir: Path, entry: dict[str, str], sink, convert) -> int:
    location = entry.get("location", "")
    handle = readers.get(location)
    if handle is None:
        handle = readers[location] = open(base_dir / location, "rb")
    handle.seek(int(entry.get("offset") or 0))
    left = int(entry["length"]) if entry.get("length") is not None else None
    written = 0
    while left is None or left > 0:
        chunk = handle.read(CHUNK if left is None else min(CHUNK, left))
        if not chunk:
            if left is None:
                break
            raise ValueError(f"{location} ends {left} bytes before the tensor does")
        if left is not None:
            left -= len(chunk)
        if convert is not None:
            chunk = convert(chunk)
        sink.write(chunk)
        written += len(chunk)
    return written


def _fp16_bytes(raw: bytes) -> bytes:
    from onnxruntime.transformers.float16 import convert_np_to_float16

    return convert_np_to_float16(np.frombuffer(raw, dtype=np.float32)).astype(np.float16).tobytes()


def _bf16_bytes(raw: bytes) -> bytes:
    from .bf16 import to_bf16_bits

    return to_bf16_bits(np.frombuffer(raw, dtype=np.float32)).tobytes()


def _point(tensor, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = _EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


@contextmanager
def converter_reads_no_weights():
    """onnxruntime's fp16 converter takes a converted initializer's shape from `numpy_helper.to_array(tensor).shape`,
    which reads an external tensor's whole data (relative to the working directory, and as the new dtype, so it
    fails). The shape is the tensor's `dims`: while this is active the converter reads that instead."""
    from onnx import helper
    from onnxruntime.transformers import float16

    real = float16.make_value_info_from_tensor
    float16.make_value_info_from_tensor = lambda tensor: helper.make_tensor_value_info(
        tensor.name, tensor.data_type, list(tensor.dims)
    )
    try:
        yield
    finally:
        float16.make_value_info_from_tensor = real


def link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the file system allows it (instant, no space), else a copy. For files nobody rewrites
    in place: the prep cache's outputs are written once and replaced, never edited."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def write_rewritten(source: Path, outdir: Path, change, keep_unchanged: bool = True):
    """`source`'s graph (external weights not loaded) changed in place by `change(model)`, written into `outdir`
    under the same file name, its external data files linked beside it under the names the graph gives them:
    `change`'s result. With keep_unchanged=False nothing is written where that result is falsy (nothing changed)."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    changed = change(model)
    if not changed and not keep_unchanged:
        return changed
    outdir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(outdir / source.name))
    for location in data_files(model):
        link_or_copy(source.parent / location, outdir / location)
    return changed


def name_maker(graph):
    """A function giving names no tensor of `graph` (an onnx GraphProto) has, nor any it gave before: `stem`, else
    `stem_1`, `stem_2`, ... For the nodes and initializers a rewrite adds."""
    taken = {n for node in graph.node for n in (*node.input, *node.output)} | {i.name for i in graph.initializer}

    def fresh(stem: str) -> str:
        name, k = stem, 0
        while name in taken:
            k += 1
            name = f"{stem}_{k}"
        taken.add(name)
        return name

    return fresh
