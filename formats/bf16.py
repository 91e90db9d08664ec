"""bf16 ONNX for strongly typed compilers (TensorRT-RTX): the fp16 conversion's graph, retyped to bfloat16.

The fp16 converter already decides where the precision changes (float32 inputs and outputs, Casts at the borders,
what stays fp32: see `fp16_rules`). bf16 keeps those decisions and changes only the type: every float16 tensor,
Cast and constant becomes bfloat16. Weights are rounded from the original float32 values, never from their fp16
copy: fp16 would have clipped anything beyond 65504 and flushed tiny values, which bf16 (float32's exponent range)
represents.
"""

from __future__ import annotations

import numpy as np

_FLOAT, _FLOAT16, _BFLOAT16 = 1, 10, 16
_EXTERNAL = 1  # TensorProto.EXTERNAL
_TYPE_ATTRIBUTES = ("to", "dtype")  # int attributes that name an element type (Cast, RandomNormal, EyeLike…)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = 0x7FC0
    return rounded


def bf16_tensor(values: np.ndarray, name: str):
    import onnx

    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = _BFLOAT16
    tensor.dims.extend(values.shape)
    tensor.raw_data = to_bf16_bits(values).tobytes()
    return tensor


def retype(converted, originals: dict[str, np.ndarray]) -> int:
    """Turn an fp16-converted model into bf16 in place. `originals`: the float32 initializers before conversion, by
    name. Returns how many tensors were rounded from their float32 originals."""
    return _retype_graph(converted.graph, originals)


def _retype_graph(graph, originals: dict[str, np.ndarray]) -> int:
    from onnx import AttributeProto, numpy_helper

    count = 0
    for index, init in enumerate(graph.initializer):
        if init.data_type != _FLOAT16:
            continue
        if init.data_location == _EXTERNAL:  # its bytes are still the float32 originals: written as bf16 on save
            init.data_type = _BFLOAT16
            count += 1
            continue
        source = originals.get(init.name)
        if source is not None and list(source.shape) == list(init.dims):
            count += 1
        else:  # made by the converter (or reshaped): its fp16 values are all there is
            source = numpy_helper.to_array(init).astype(np.float32)
        graph.initializer[index].CopyFrom(bf16_tensor(source, init.name))
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        tensor_type = info.type.tensor_type
        if tensor_type.elem_type == _FLOAT16:
            tensor_type.elem_type = _BFLOAT16
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.INT and attr.name in _TYPE_ATTRIBUTES and attr.i == _FLOAT16:
                attr.i = _BFLOAT16
            elif attr.type == AttributeProto.TENSOR and attr.t.data_type == _FLOAT16:
                attr.t.CopyFrom(bf16_tensor(numpy_helper.to_array(attr.t).astype(np.float32), attr.t.name))
            elif attr.type == AttributeProto.GRAPH:
                count += _retype_graph(attr.g, originals)
            elif attr.type == AttributeProto.GRAPHS:
                count += sum(_retype_graph(g, originals) for g in attr.graphs)
    return count


def float_initializers(model) -> dict[str, np.ndarray]:
    """The float32 initializers of a model held in the graph itself (its weights before any conversion), by name.
    External ones are converted from their files as the model is written (`onnx_data.write_model(to_bf16=)`)."""
    from onnx import numpy_helper

    return {
        init.name: numpy_helper.to_array(init)
        for init in model.graph.initializer
        if init.data_type == _FLOAT and init.data_location != _EXTERNAL
    }
