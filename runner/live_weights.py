"""Sessions whose LoRA-touched weights are inputs of the compiled graph, so that a new value is a copy into memory,
not a new session: what `Pipeline.set_loras` changes between calls (`enginefarm.diffusion.live_loras`).

Opening a session is what a LoRA load spends its time on (OpenVINO compiles the IR where a stock load imports a
blob; ONNX Runtime optimizes the graph). Here the named initializers become graph inputs once, when a component
first takes a stack that touches them (OpenVINO: each Constant replaced by a Parameter of its own type and shape;
ONNX Runtime: each initializer also listed as a graph input, ONNX's "overridable initializer", the model given to
ONNX Runtime as bytes with its external data read from the artifact's folder, nothing written). The values live in
arrays this module owns and feeds with every run; `FedSession.update` writes new ones into them in place.
Measured: the same outputs as the merged constants (bitwise on the tests' models), the step time within noise
(docs/weights.md, "Changing a stack").
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from enginefarm.backends.manifest_files import role_file
from enginefarm.backends.onnx_weights import FLOAT_TYPES, _fields, initializer_kinds
from enginefarm.errors import IntegrityError

LIVE_BACKENDS = ("onnxruntime", "openvino")  # the backends whose sessions take weights as inputs here
_GRAPH, _GRAPH_INPUT = 7, 11  # ModelProto.graph, GraphProto.input


class FedSession:
    """A backend session with weight inputs: callers see the component's own inputs; every run (and every binding)
    is given the weights too."""

    def __init__(self, inner, values: dict[str, np.ndarray], how: str) -> None:
        self._inner = inner
        self.values = values  # initializer name → the array fed for it, updated in place
        self.input_names = [n for n in inner.input_names if n not in values]
        self.output_names = inner.output_names
        self.compute_precision = inner.compute_precision
        self.how = how

    def update(self, values: dict[str, np.ndarray]) -> None:
        """New values for some of the weight inputs (ONNX layout, any float dtype), copied into the fed arrays."""
        for name, value in values.items():
            target = self.values[name]
            np.copyto(target, np.asarray(value).reshape(target.shape), casting="unsafe")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._inner.run({**feeds, **self.values})

    def bind(self, fixed: dict[str, np.ndarray]):
        # the weights are bound over the fed arrays, not copied: an update between calls is seen by a binding kept
        return self._inner.bind(fixed, shared=self.values)

    def close(self) -> None:
        self._inner.close()


def open_fed(backend_name: str, artifact_dir: Path, manifest, values: dict[str, np.ndarray]) -> FedSession:
    """A session of the artifact with the initializers named by `values` turned into inputs, fed those arrays
    (cast here to each initializer's own dtype and shape; the returned session owns the copies)."""
    if backend_name == "openvino":
        return _openvino(artifact_dir, manifest, values)
    if backend_name == "onnxruntime":
        return _onnxruntime(artifact_dir, manifest, values)
    raise ValueError(f"{backend_name} sessions take no weight inputs")


def _openvino(artifact_dir: Path, manifest, values: dict[str, np.ndarray]) -> FedSession:
    import openvino as ov

    from enginefarm.backends.openvino import inference_config
    from enginefarm.sessions.openvino import OpenVinoSession

    core = ov.Core()
    device = manifest.parsed_target.device.upper()
    model = core.read_model(str(Path(artifact_dir) / role_file(manifest, "ir")))
    left, fed, added = dict(values), {}, []
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Constant":
            continue
        names = node.output(0).get_names()
        hit = next((n for n in sorted(names) if n in left), None)
        if hit is None:
            continue
        kind = node.get_output_element_type(0)
        shape = tuple(node.get_output_shape(0))
        fed[hit] = np.array(left.pop(hit).reshape(shape), np.float16 if kind == ov.Type.f16 else np.float32, order="C")
        parameter = ov.op.Parameter(kind, ov.PartialShape(list(shape)))
        parameter.output(0).set_names({hit})
        parameter.set_friendly_name(f"weight:{hit}")
        node.output(0).replace(parameter.output(0))
        added.append(parameter)
    if left:
        raise IntegrityError(
            f"{manifest.ref} [{manifest.build_key[:12]}]: no constant of the IR holds {sorted(left)[:5]}"
        )
    model.add_parameters(added)
    compiled = core.compile_model(model, device, inference_config(core, device, manifest.precision))
    # the session holds the arrays as long as the compiled model: OpenVINO 2026.4 must not outlive memory it read
    inner = OpenVinoSession(compiled, "compiled IR, LoRA weights as inputs", list(fed.values()))
    return FedSession(inner, fed, inner.how)


def _onnxruntime(artifact_dir: Path, manifest, values: dict[str, np.ndarray]) -> FedSession:
    from enginefarm.sessions.onnxruntime import OrtSession

    model = Path(artifact_dir) / role_file(manifest, "model")
    kinds = initializer_kinds(model)
    unknown = sorted(n for n in values if kinds.get(n, (0,))[0] not in FLOAT_TYPES)
    if unknown:
        raise IntegrityError(f"{manifest.ref} [{manifest.build_key[:12]}]: no float initializer is named {unknown[:5]}")
    fed = {
        name: np.array(np.asarray(value).reshape(kinds[name][1]), FLOAT_TYPES[kinds[name][0]], order="C")
        for name, value in values.items()
    }
    graph = with_graph_inputs(model, {name: kinds[name] for name in fed})
    inner = OrtSession(model, manifest.parsed_target.device, manifest.precision, model_bytes=graph)
    return FedSession(inner, fed, "ONNX Runtime, LoRA weights as inputs")


def with_graph_inputs(model: Path, inputs: dict[str, tuple[int, tuple[int, ...]]]) -> bytes:
    """The ONNX model's bytes with these initializers (name → (ONNX element type, dims)) also listed as graph
    inputs, written in the protobuf wire format (no `onnx` import; a model with external data stays small)."""
    extra = b"".join(_field(_GRAPH_INPUT, _value_info(name, *kind)) for name, kind in inputs.items())
    with open(model, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for number, wire, value in _fields(buf, 0, len(buf)):
            if number == _GRAPH and wire == 2:
                start, end = value
                head = _key_start(buf, start)
                return bytes(buf[:head]) + _field(_GRAPH, bytes(buf[start:end]) + extra) + bytes(buf[end:])
    raise IntegrityError(f"{model.name} has no graph")


def _key_start(buf, start: int) -> int:
    """Where the graph field's key begins: its value starts at `start`, after the key and the length varints."""
    at = start - 1  # the length's last byte (< 0x80)
    while at > 0 and buf[at - 1] >= 0x80:  # the length's earlier bytes
        at -= 1
    at -= 1  # the key, one byte for field 7 (0x3A)
    return at


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _value_info(name: str, elem_type: int, dims: tuple[int, ...]) -> bytes:
    shape = b"".join(_field(1, _varint(1 << 3) + _varint(d)) for d in dims)  # Dimension.dim_value
    tensor = _varint(1 << 3) + _varint(elem_type) + _field(2, shape)  # elem_type, shape
    return _field(1, name.encode()) + _field(2, _field(1, tensor))  # name, type.tensor_type
