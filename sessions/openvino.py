"""OpenVINO's session and binding: what `enginefarm.load` opens for an openvino artifact.

Apart from the backend (backends/openvino.py) so that a warm load (runner/warm.py) opens an artifact without
importing the backend registry: this module imports numpy and, when a session is made, openvino. A session opened
from the cache keeps its compiled models there (sessions/openvino_compiled.py) and runs each request's shape on a
static compile where that was timed faster here (sessions/openvino_static.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .openvino_compiled import shape_key
from .openvino_static import (
    MAX_LIVE_STATIC,
    StaticShapes,
    compile_kept,
    device_tag,
    has_dynamic_inputs,
    static_mode,
    time_both,
)


def _log():
    import logging  # here: a warm load of an artifact that needs no warning imports no logging (runner/warm.py)

    return logging.getLogger(__name__)


_PRECISION_NAMES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}
FROM_CACHE = " (loaded from the device's compiled-model cache)"


def _ov():
    import openvino  # found by the backend's availability check, or by the remembered pick's own import

    return openvino


class _Variant:
    """A compiled model with its infer requests: the session's own, and those closed bindings gave back. OpenVINO
    2026.4's CPU plugin corrupts the heap when a second request of a dynamic-shape model is destroyed, or the memory
    its input tensors wrap is freed, while the model lives on: the session's own request then reads or writes freed
    memory (wrong values, then a crash). So every request, and what its tensors wrap, lives as long as its model."""

    def __init__(self, compiled) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.spare: list = []  # (infer request, arrays its tensors read in place) of closed bindings

    def take(self) -> tuple:
        return self.spare.pop() if self.spare else (self.compiled.create_infer_request(), {})


def _shape(value) -> tuple[int, ...]:
    return tuple(int(d) for d in (value.shape if hasattr(value, "shape") else np.shape(value)))


def _as_input(value):
    from enginefarm.hardware.tensors import DeviceTensor

    if isinstance(value, DeviceTensor) and value.backend == "openvino":
        return value.value
    return np.ascontiguousarray(np.asarray(value))


class OpenVinoSession:
    def __init__(self, compiled, how: str, held: list | None = None, static: StaticShapes | None = None) -> None:
        self._dynamic = _Variant(compiled)
        self._held = (
            held or []
        )  # arrays the model's constants share (load_with_weights): kept while a request may read them
        self.input_names = [p.get_any_name() for p in compiled.inputs]
        self.output_names = [p.get_any_name() for p in compiled.outputs]
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")
        name = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
        self.compute_precision = _PRECISION_NAMES.get(name, name)
        self.how = how
        self.reopen_plan: dict | None = None  # how runner/warm.py opens it again (set by the backend's plain load)
        self._static = static if static is not None and has_dynamic_inputs(compiled) else None
        self._variants: dict[str, _Variant] = {}  # static compiles by shape key
        self._dynamic_keys: set[str] = set()  # shapes that run on the dynamic compile

    def _variant(self, feeds: dict) -> _Variant:
        """The compiled model this request's shapes run on: a static compile where this device timed it faster
        (timing both the first time), else the dynamic one."""
        if self._static is None:
            return self._dynamic
        shapes = {name: _shape(value) for name, value in feeds.items()}
        key = shape_key(shapes)
        found = self._variants.get(key)
        if found is not None:
            return found
        if key in self._dynamic_keys or len(self._variants) >= MAX_LIVE_STATIC:
            return self._dynamic
        verdict = self._static.verdict(key)
        variant = None
        if verdict != "dynamic":
            try:
                variant = _Variant(self._static.compile(shapes, key))
            except (RuntimeError, OSError) as exc:  # a shape the reshaped graph refuses, a cache it cannot write
                # debug only: the dynamic model runs next, and a shape it refuses too gets its own one-line error
                _log().debug("openvino: no static compile for %s (%s)", shapes, str(exc).splitlines()[0][:200])
        if variant is not None and verdict is None:
            inputs = {name: _as_input(value) for name, value in feeds.items()}
            dynamic_ms, static_ms = time_both(self._dynamic.request, variant.request, inputs)
            if self._static.remember(key, shapes, dynamic_ms, static_ms) == "dynamic":
                variant = None
        if variant is None:
            self._dynamic_keys.add(key)
            return self._dynamic
        self._variants[key] = variant
        return variant

    @property
    def static_shapes(self) -> list[dict[str, list[int]]]:
        """The input shapes this session runs on static compiles (empty: all on the dynamic one)."""
        return [{p.get_any_name(): list(p.get_shape()) for p in v.compiled.inputs} for v in self._variants.values()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        variant = self._variant(feeds)
        result = variant.request.infer(feeds)
        return {
            name: np.array(result[port]) for name, port in zip(self.output_names, variant.compiled.outputs, strict=True)
        }

    def bind(self, fixed: dict[str, np.ndarray], shared: dict[str, np.ndarray] | None = None) -> OpenVinoBinding:
        """shared: inputs the request reads in place, for as long as the session lives (weights fed as inputs:
        runner/live_weights.py), not copied like `fixed`."""
        return OpenVinoBinding(self, fixed, shared or {}, self.output_names, self._held)

    def close(self) -> None:
        self._dynamic = None  # type: ignore[assignment]  # its requests hold the compiled model: all go together
        self._variants.clear()
        self._held = []  # a binding still open keeps its own reference


class OpenVinoBinding:
    """An infer request of its own whose fixed input tensors are set once, taken at the first run (when the shapes
    of every input, and so the compiled model they run on, are known). Other inputs are set as tensors over the
    caller's arrays (no copy: the request reads them during infer). The request writes its outputs into tensors it
    reuses, so a kept output is copied (device to device) into a tensor of its own."""

    name = "device"

    def __init__(self, session: OpenVinoSession, fixed: dict, shared: dict, output_names: list[str], weights) -> None:
        self._session = session
        self._fixed = {name: np.array(array, copy=True) for name, array in fixed.items()}  # as they were when bound
        self._shared = shared
        self._weights = weights  # the session's shared constants (load_with_weights): the request may outlive it
        self._outputs = output_names
        self._request: Any = None
        self._variant: _Variant | None = None
        self._shapes: tuple | None = None
        self._held: dict[str, np.ndarray] = {}  # arrays the request's tensors read in place
        self._closed = False

    def _take(self, feeds: dict) -> None:
        ov = _ov()
        self._give_back()
        variant = self._session._variant({**self._fixed, **self._shared, **feeds})
        self._request, self._held = variant.take()
        self._variant = variant
        for name, array in self._shared.items():
            self._held[name] = array
            self._request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        for name, array in self._fixed.items():
            self._request.set_tensor(name, ov.Tensor(array))  # the device's own copy

    def run(self, feeds: dict, keep: tuple[str, ...] = ()) -> dict:
        from enginefarm.hardware.tensors import DeviceTensor

        shapes = tuple(sorted((name, _shape(value)) for name, value in feeds.items()))
        if self._request is None or shapes != self._shapes:
            self._take(feeds)
            self._shapes = shapes
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

    def _give_back(self) -> None:
        if self._request is not None and self._variant is not None:
            self._variant.spare.append((self._request, self._held))  # dropped with its compiled model
        self._request = self._variant = None

    def close(self) -> None:
        self._give_back()


def open_ir(core, root: Path, plan: dict) -> OpenVinoSession:
    """A session of the artifact in `root` as `plan` says (the device, the config, the IR and a shipped blob): the
    blob imported, else the IR compiled through the device's compiled-model cache, so only the first load on this
    device (OpenVINO version, config) compiles. Raises what OpenVINO raises for a blob it cannot import."""
    dev, config = plan["device"], plan["config"]
    weights = root / (plan["ir"][: -len(".xml")] + ".bin") if "ir" in plan else root
    tag = device_tag(core, root, dev, config, weights)
    # a wrong ENGINEFARM_OPENVINO_STATIC is refused here, at load, in one line
    trial = "ir" in plan and static_mode() != "never"
    static = StaticShapes(core, root / plan["ir"], dev, config, tag) if trial else None
    if "blob" in plan:
        compiled = core.import_model((root / plan["blob"]).read_bytes(), dev, config)
        return OpenVinoSession(compiled, "imported compiled blob", static=static)
    folder = None if tag is None else tag / "dynamic"
    compiled, wrote = compile_kept(core, str(root / plan["ir"]), dev, config, folder)
    return OpenVinoSession(compiled, "compiled IR" + ("" if wrote else FROM_CACHE), static=static)


def reopen(root: Path, plan: dict) -> OpenVinoSession:
    """The session a full load opened, opened again from its plan: the compiled blob imported, or the IR compiled
    (a compiled-cache hit where this device compiled it before), with the same inference config (the backend's load
    chose both for this CPU and OpenVINO version)."""
    return open_ir(_ov().Core(), root, plan)
