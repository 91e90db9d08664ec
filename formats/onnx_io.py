"""Reading ONNX files safely: header-only loads, I/O signatures, and the external-data escape check."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from enginefarm.errors import ModelError

# ONNX TensorProto elem_type → numpy dtype name.
_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    dims: tuple[int | str | None, ...]  # int: fixed; str: named dynamic; None: unnamed dynamic ('?', -1)

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.dims)}


def load_header(path: Path, *, external: bool = True):
    """The model graph without external weights. Raises ModelError for anything that is not ONNX, or (`external`)
    whose external data files are missing or outside its folder."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise ModelError(f"{path}: file not found") from None
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning or plain Exception depending on damage
        raise ModelError(
            f"{path}: not a valid ONNX file ({type(exc).__name__})", hint="re-export or re-download the model"
        ) from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path}: not a valid ONNX file (empty graph)", hint="re-export or re-download the model")
    if external:
        check_external_data(model, path)
    return model


def external_locations(model) -> list[str]:
    """The external data files a graph's tensors name, as written (relative to the model's folder), each once."""
    from onnx.external_data_helper import _get_all_tensors

    found = {}
    for tensor in _get_all_tensors(model):
        if tensor.data_location == 1:  # EXTERNAL
            found[next((e.value for e in tensor.external_data if e.key == "location"), "")] = tensor.name
    return list(found)


def check_external_locations(locations: list[str], path: Path) -> None:
    """Refuse, before anything is fetched or read, a location that would leave the model's folder."""
    for location in locations:
        parts = Path(location).parts
        if not location or Path(location).is_absolute() or ".." in parts or "\\" in location or ":" in location:
            raise ModelError(
                f"{path}: external data location {location!r} is outside the model's folder",
                hint="keep external data files next to the .onnx file",
            )


def check_external_data(model, path: Path) -> list[Path]:
    """Refuse external-data locations that leave the model's folder (absolute, '..', or symlinks out)."""
    from onnx.external_data_helper import _get_all_tensors

    base = path.resolve().parent
    found: list[Path] = []
    for tensor in _get_all_tensors(model):
        if tensor.data_location != 1:  # EXTERNAL
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        candidate = Path(location)
        resolved = (base / candidate).resolve()
        if candidate.is_absolute() or os.path.commonpath([base, resolved]) != str(base):
            raise ModelError(
                f"{path}: tensor {tensor.name!r} points at external data outside the model's folder ({location})",
                hint="keep external data files next to the .onnx file",
            )
        if not resolved.is_file():
            raise ModelError(f"{path}: external data file {location} is missing")
        found.append(resolved)
    return sorted(set(found))


def opset_of(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _tensor_info(value) -> TensorInfo:
    ttype = value.type.tensor_type
    dims: list[int | str | None] = []
    for dim in ttype.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param and dim.dim_param != "?":
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return TensorInfo(value.name, _DTYPES.get(ttype.elem_type, f"onnx:{ttype.elem_type}"), tuple(dims))


def io_of(model) -> tuple[list[TensorInfo], list[TensorInfo]]:
    initializers = {init.name for init in model.graph.initializer}
    inputs = [_tensor_info(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_tensor_info(v) for v in model.graph.output]
    return inputs, outputs


# What TensorRT-RTX compiles as a GEMM (probed on 1.7: MatMul, Gemm, and Einsum of two or more operands, even
# element-wise; a one-operand Einsum, Conv and ConvTranspose are not).
_GEMM_OPS = ("MatMul", "Gemm")
_FLOAT32 = 1
_FLOAT_TYPES = (1, 10, 11, 16)  # float32, float16, float64, bfloat16


def float32_gemms(path: Path) -> list[str]:
    """Names of the nodes that multiply matrices in float32, in the graph and its subgraphs: what TensorRT-RTX
    refuses to compile for Turing (SM75). Weights are not read; element types come from the graph, or from
    shape inference where the graph does not say."""
    stat = Path(path).stat()
    return list(_float32_gemms(str(path), stat.st_size, stat.st_mtime_ns))


@lru_cache(maxsize=8)
def _float32_gemms(path: str, size: int, mtime_ns: int) -> tuple[str, ...]:
    model = load_header(Path(path))
    nodes = [
        node
        for graph in _graphs(model.graph)
        for node in graph.node
        if node.domain in ("", "ai.onnx")
        and (node.op_type in _GEMM_OPS or (node.op_type == "Einsum" and len(node.input) >= 2))
    ]
    if not nodes:
        return ()
    types = _elem_types(model)
    if any(node.input[0] not in types for node in nodes):
        import onnx

        for init in model.graph.initializer:  # types need no weight values, and inference copies the whole model
            if init.data_type in _FLOAT_TYPES:
                init.ClearField("raw_data")
                init.ClearField("float_data")
        try:
            types = _elem_types(onnx.shape_inference.infer_shapes(model))
        except Exception:  # an exotic graph: judge by what the graph says, counting the unknown as float32
            pass
    return tuple(
        node.name or f"{node.op_type}({node.output[0]})"
        for node in nodes
        if types.get(node.input[0], _FLOAT32) == _FLOAT32
    )


def _graphs(graph):
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _graphs(sub)


def _elem_types(model) -> dict[str, int]:
    types: dict[str, int] = {}
    for graph in _graphs(model.graph):
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:  # 0: not known
                types[value.name] = value.type.tensor_type.elem_type
        types.update({init.name: init.data_type for init in graph.initializer})
        for node in graph.node:
            if node.op_type == "Constant":
                for attribute in node.attribute:
                    if attribute.name == "value":
                        types[node.output[0]] = attribute.t.data_type
    return types
