"""OpenVINO's session and binding: what `enginefarm.load` opens for an openvino artifact.

Apart from the backend (backends/openvino.py) so that a warm load (runner/warm.py) opens an artifact without
importing the backend registry: this module imports numpy and, when a session is made, openvino. A session opened
from the cache keeps its compiled models there (sessions/openvino_compiled.py) and runs each request's shape on a
static compile where that ran faster here, tried on the caller's own calls (sessions/openvino_static.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .openvino_compiled import shape_key
from .openvino_static import (
    MAX_LIVE_STATIC,
    StaticShapes,
    Trial,
    device_tag,
    has_dynamic_inputs,
    open_dynamic,
    static_mode,
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
    memory (wrong values, then a crash). So every request, and what its tensors wrap, lives as long as its model, and
    a session lets a compile go only whole (this object, with no request lent to a binding)."""

    def __init__(self, compiled) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.spare: list = []  # (infer request, arrays its tensors read in place) of closed bindings
        self.lent = 0  # requests bindings hold now

    def take(self) -> tuple:
        self.lent += 1
        return self.spare.pop() if self.spare else (self.compiled.create_infer_request(), {})

    def give_back(self, request, held: dict) -> None:
        self.lent -= 1
        self.spare.append((request, held))  # dropped with its compiled model


def _shape(value) -> tuple[int, ...]:
    return tuple(int(d) for d in (value.shape if hasattr(value, "shape") else np.shape(value)))


class _Route(NamedTuple):
    """Where one call runs: the variant, and for a call of a shape's trial, its key, which compile it tries and
    whether it is timed."""

    variant: _Variant
    key: str | None = None
    label: str | None = None
    timed: bool = False


class OpenVinoSession:
    def __init__(self, compiled, how: str, held: list | None = None, static: StaticShapes | None = None) -> None:
        self._dynamic: _Variant | None = _Variant(compiled)
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
        self._trials: dict[str, Trial] = {}  # shapes being tried, static against dynamic
        self._drop_dynamic = False  # a shape runs static: let the dynamic compile go once nothing holds its requests

    def _route(self, feeds: dict) -> _Route:
        """The compiled model this call runs on: a static compile where this device found it faster, the dynamic
        one where it did not, and for a new shape the turn of its trial (sessions/openvino_static.py `Trial`)."""
        if self._static is None:
            return _Route(self._dynamic_variant())
        shapes = {name: _shape(value) for name, value in feeds.items()}
        key = shape_key(shapes)
        found = self._variants.get(key)
        if found is not None:
            return _Route(found)
        trial = self._trials.get(key)
        if trial is None:
            if key in self._dynamic_keys or len(self._variants) + len(self._trials) >= MAX_LIVE_STATIC:
                return _Route(self._dynamic_variant())
            verdict = self._static.verdict(key)
            if verdict == "static":
                self._drop_dynamic = True
                self._settle()  # before the static compile loads: the peak holds one compile, not two
                variant = self._compile_static(shapes, key)
                if variant is None:
                    self._dynamic_keys.add(key)
                    return _Route(self._dynamic_variant())
                self._variants[key] = variant
                return _Route(variant)
            if verdict == "dynamic":
                self._dynamic_keys.add(key)
                return _Route(self._dynamic_variant())
            trial = self._trials[key] = Trial(shapes, self._static.progress(key))
        label, timed = trial.turn()
        if label == "static" and trial.static is None:
            trial.static = self._compile_static(shapes, key)
            if trial.static is None:
                del self._trials[key]
                self._dynamic_keys.add(key)
                return _Route(self._dynamic_variant())
        variant = trial.static if label == "static" else self._dynamic_variant()
        return _Route(variant, key, label, timed)

    def _ran(self, route: _Route, ms: float) -> None:
        """Feed a trial's call to it; at its end, remember the verdict and run the shape on the winner."""
        if route.label is None or route.key not in self._trials:
            return
        trial = self._trials[route.key]
        trial.ran(route.label, ms if route.timed else None)
        assert self._static is not None
        if not trial.done:
            if route.timed:
                self._static.note(route.key, trial.shapes, trial.times)
            return
        del self._trials[route.key]
        dynamic_ms, static_ms = trial.times["dynamic"], trial.times["static"]
        if self._static.remember(route.key, trial.shapes, dynamic_ms, static_ms) == "static":
            self._variants[route.key] = trial.static
            self._drop_dynamic = True
        else:
            self._dynamic_keys.add(route.key)
        self._settle()

    def _compile_static(self, shapes: dict, key: str) -> _Variant | None:
        assert self._static is not None
        try:
            return _Variant(self._static.compile(shapes, key))
        except (RuntimeError, OSError) as exc:  # a shape the reshaped graph refuses, a cache it cannot write
            # debug only: the dynamic model runs next, and a shape it refuses too gets its own one-line error
            _log().debug("openvino: no static compile for %s (%s)", shapes, str(exc).splitlines()[0][:200])
            return None

    def _dynamic_variant(self) -> _Variant:
        if self._dynamic is None:  # let go after a static verdict; a shape needs it again
            assert self._static is not None
            self._dynamic = _Variant(self._static.open_dynamic())
            self._drop_dynamic = False
        return self._dynamic

    def _settle(self) -> None:
        """Let the dynamic compile go (the whole variant: its model and every request together) where a shape's
        verdict asked for it and no binding holds one of its requests and no trial needs it."""
        dynamic = self._dynamic
        if self._drop_dynamic and dynamic is not None and dynamic.lent == 0 and not self._trials:
            self._dynamic = None
            self._drop_dynamic = False
            del dynamic
            from enginefarm.hardware.rss import give_back_memory

            give_back_memory()

    @property
    def static_shapes(self) -> list[dict[str, list[int]]]:
        """The input shapes this session runs on static compiles (empty: all on the dynamic one)."""
        return [{p.get_any_name(): list(p.get_shape()) for p in v.compiled.inputs} for v in self._variants.values()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        route = self._route(feeds)
        variant = route.variant
        start = time.perf_counter()
        result = variant.request.infer(feeds)
        ms = (time.perf_counter() - start) * 1000
        out = {
            name: np.array(result[port]) for name, port in zip(self.output_names, variant.compiled.outputs, strict=True)
        }
        self._ran(route, ms)  # after the copy: a verdict may let this compile go
        return out

    def bind(self, fixed: dict[str, np.ndarray], shared: dict[str, np.ndarray] | None = None) -> OpenVinoBinding:
        """shared: inputs the request reads in place, for as long as the session lives (weights fed as inputs:
        runner/live_weights.py), not copied like `fixed`."""
        return OpenVinoBinding(self, fixed, shared or {}, self.output_names, self._held)

    def close(self) -> None:
        self._dynamic = None  # its requests hold the compiled model: all go together
        self._variants.clear()
        self._trials.clear()
        self._held = []  # a binding still open keeps its own reference


class OpenVinoBinding:
    """Infer requests of its own whose fixed input tensors are set once, taken at the first run (when the shapes of
    every input, and so the compiled model they run on, are known): one, or during a shape's trial one on each
    compile, the call switching between them as the trial says. Other inputs are set as tensors over the caller's
    arrays (no copy: the request reads them during infer). The request writes its outputs into tensors it reuses,
    so a kept output is copied (device to device) into a tensor of its own."""

    name = "device"

    def __init__(self, session: OpenVinoSession, fixed: dict, shared: dict, output_names: list[str], weights) -> None:
        self._session = session
        self._fixed = {name: np.array(array, copy=True) for name, array in fixed.items()}  # as they were when bound
        self._shared = shared
        self._weights = weights  # the session's shared constants (load_with_weights): the request may outlive it
        self._outputs = output_names
        self._taken: dict[int, tuple[_Variant, Any, dict]] = {}  # id(variant) → (variant, request, held arrays)
        self._settled: _Variant | None = None  # what this shape runs on once no trial switches it
        self._shapes: tuple | None = None
        self._closed = False

    def _request(self, variant: _Variant) -> tuple[Any, dict]:
        found = self._taken.get(id(variant))
        if found is not None:
            return found[1], found[2]
        ov = _ov()
        request, held = variant.take()
        self._taken[id(variant)] = (variant, request, held)
        for name, array in self._shared.items():
            held[name] = array
            request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        for name, array in self._fixed.items():
            request.set_tensor(name, ov.Tensor(array))  # the device's own copy
        return request, held

    def _route(self, feeds: dict) -> _Route:
        if self._settled is not None:
            return _Route(self._settled)
        route = self._session._route({**self._fixed, **self._shared, **feeds})
        if route.label is None:  # no trial: this shape runs here until its shapes change
            self._settled = route.variant
            self._give_back(keep=route.variant)
        return route

    def run(self, feeds: dict, keep: tuple[str, ...] = ()) -> dict:
        from enginefarm.hardware.tensors import DeviceTensor

        shapes = tuple(sorted((name, _shape(value)) for name, value in feeds.items()))
        if shapes != self._shapes:
            self._give_back()
            self._shapes = shapes
        route = self._route(feeds)
        ov = _ov()
        request, held = self._request(route.variant)
        for name, value in feeds.items():
            if isinstance(value, DeviceTensor) and value.backend == "openvino":
                request.set_tensor(name, value.value)
            else:
                array = np.ascontiguousarray(np.asarray(value))
                held[name] = array  # the tensor reads it in place: it must outlive the request's use of it
                request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        start = time.perf_counter()
        request.infer()
        ms = (time.perf_counter() - start) * 1000
        out: dict[str, np.ndarray | DeviceTensor] = {}
        for name in self._outputs:
            tensor = request.get_tensor(name)
            if name in keep:
                own = ov.Tensor(tensor.element_type, tensor.shape)
                tensor.copy_to(own)
                out[name] = DeviceTensor("openvino", own, tuple(own.shape), own.data.dtype, lambda t: np.array(t.data))
            else:
                out[name] = np.array(tensor.data)
        if route.label is not None:
            self._session._ran(route, ms)
            if route.key not in self._session._trials:  # the trial ended: the loser's request goes back now
                self._route(feeds)
        return out

    def _give_back(self, keep: _Variant | None = None) -> None:
        """Give back the requests taken (but `keep`'s), each to its compiled model, which may then be let go."""
        for ident, (variant, request, held) in list(self._taken.items()):
            if variant is not keep:
                del self._taken[ident]
                variant.give_back(request, held)
        if keep is None:
            self._settled = None
        self._session._settle()

    def close(self) -> None:
        self._give_back()


def open_ir(core, root: Path, plan: dict) -> OpenVinoSession:
    """A session of the artifact in `root` as `plan` says (the device, the config, the IR and a shipped blob): the
    blob imported, else the IR compiled through the device's compiled-model cache, so only the first load on this
    device (OpenVINO version, config) compiles. Raises what OpenVINO raises for a blob it cannot import."""
    dev, config = plan["device"], plan["config"]
    xml = root / plan["ir"] if "ir" in plan else root  # a plan of a blob alone (the blob is all it opens)
    tag = device_tag(core, root, dev, config, xml.with_suffix(".bin") if "ir" in plan else root)
    # a wrong ENGINEFARM_OPENVINO_STATIC is refused here, at load, in one line
    trial = "ir" in plan and static_mode() != "never"
    blob = root / plan["blob"] if "blob" in plan else None
    static = StaticShapes(core, xml, dev, config, tag, blob) if trial else None
    compiled, wrote = open_dynamic(core, xml, dev, config, tag, blob)
    how = "imported compiled blob" if blob is not None else "compiled IR" + ("" if wrote else FROM_CACHE)
    return OpenVinoSession(compiled, how, static=static)


def reopen(root: Path, plan: dict) -> OpenVinoSession:
    """The session a full load opened, opened again from its plan: the compiled blob imported, or the IR compiled
    (a compiled-cache hit where this device compiled it before), with the same inference config (the backend's load
    chose both for this CPU and OpenVINO version)."""
    return open_ir(_ov().Core(), root, plan)
