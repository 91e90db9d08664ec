"""OpenVINO's session and binding: what `enginefarm.load` opens for an openvino artifact.

Apart from the backend (backends/openvino.py) so that a warm load (runner/warm.py) opens an artifact without
importing the backend registry: this module imports numpy and, when a session is made, openvino."""

from __future__ import annotations

from pathlib import Path

import numpy as np

_PRECISION_NAMES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


def _ov():
    import openvino  # found by the backend's availability check, or by the remembered pick's own import

    return openvino


class OpenVinoSession:
    def __init__(self, compiled, how: str, held: list | None = None) -> None:
        self._compiled = compiled
        self._held = (
            held or []
        )  # arrays the model's constants share (load_with_weights): kept while a request may read them
        self._request = compiled.create_infer_request()
        # (infer request, arrays its tensors read in place) of closed bindings, reused by the next. OpenVINO 2026.4's
        # CPU plugin corrupts the heap when a second request of a dynamic-shape model is destroyed, or the memory its
        # input tensors wrap is freed, while the model lives on: the session's own request then reads or writes freed
        # memory (wrong values, then a crash). Both live as long as the compiled model.
        self._spare: list = []
        self.input_names = [p.get_any_name() for p in compiled.inputs]
        self.output_names = [p.get_any_name() for p in compiled.outputs]
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
        name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        self.compute_precision = _PRECISION_NAMES.get(name, name)
        self.how = how
        self.reopen_plan: dict | None = None  # how runner/warm.py opens it again (set by the backend's plain load)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self._request.infer(feeds)
        return {
            name: np.array(result[port]) for name, port in zip(self.output_names, self._compiled.outputs, strict=True)
        }

    def bind(self, fixed: dict[str, np.ndarray], shared: dict[str, np.ndarray] | None = None) -> OpenVinoBinding:
        """shared: inputs the request reads in place, for as long as the session lives (weights fed as inputs:
        runner/live_weights.py), not copied like `fixed`."""
        request, held = self._spare.pop() if self._spare else (self._compiled.create_infer_request(), {})
        binding = OpenVinoBinding(request, held, fixed, self.output_names, self._spare.append, self._held)
        for name, array in (shared or {}).items():
            held[name] = array
            request.set_tensor(name, _ov().Tensor(array, shared_memory=True))
        return binding

    def close(self) -> None:
        self._request = self._compiled = None  # the request holds the compiled model: both go
        self._spare.clear()
        self._held = []  # a binding still open keeps its own reference


class OpenVinoBinding:
    """An infer request of its own whose fixed input tensors are set once. Other inputs are set as tensors over the
    caller's arrays (no copy: the request reads them during infer). The request writes its outputs into tensors it
    reuses, so a kept output is copied (device to device) into a tensor of its own."""

    name = "device"

    def __init__(
        self, request, held: dict, fixed: dict[str, np.ndarray], output_names: list[str], give_back, weights=()
    ) -> None:
        ov = _ov()
        self._request, self._give_back = request, give_back
        self._weights = (
            weights  # the session's shared constants (load_with_weights): the request may outlive the session
        )
        self._held: dict[str, np.ndarray] = (
            held  # arrays the request's tensors read in place, kept while it may use them
        )
        self._outputs = output_names
        for name, array in fixed.items():
            self._request.set_tensor(name, ov.Tensor(array.copy()))  # the device's own copy

    def run(self, feeds: dict, keep: tuple[str, ...] = ()) -> dict:
        from enginefarm.hardware.tensors import DeviceTensor

        ov, request = _ov(), self._request
        for name, value in feeds.items():
            if isinstance(value, DeviceTensor) and value.backend == "openvino":
                request.set_tensor(name, value.value)
            else:
                array = np.ascontiguousarray(np.asarray(value))
                self._held[name] = array  # the tensor reads it in place: it must outlive the request's use of it
                request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        request.infer()
        out: dict[str, np.ndarray | DeviceTensor] = {}
        for name in self._outputs:
            tensor = request.get_tensor(name)
            if name in keep:
                own = ov.Tensor(tensor.element_type, tensor.shape)
                tensor.copy_to(own)
                out[name] = DeviceTensor("openvino", own, tuple(own.shape), own.data.dtype, lambda t: np.array(t.data))
            else:
                out[name] = np.array(tensor.data)
        return out

    def close(self) -> None:
        if self._request is not None:
            self._give_back((self._request, self._held))  # to the session, which drops it with the compiled model
        self._request = None


def reopen(root: Path, plan: dict) -> OpenVinoSession:
    """The session a full load opened, opened again from its plan: the compiled blob imported, or the IR compiled,
    with the same inference config (the backend's load chose both for this CPU and OpenVINO version)."""
    core = _ov().Core()
    if "blob" in plan:
        return OpenVinoSession(
            core.import_model((root / plan["blob"]).read_bytes(), plan["device"], plan["config"]),
            "imported compiled blob",
        )
    compiled = core.compile_model(core.read_model(str(root / plan["ir"])), plan["device"], plan["config"])
    return OpenVinoSession(compiled, "compiled IR")
