"""Compiling an OpenVINO IR with its compiled model kept on the device (sessions/openvino_compiled.py), and the
static-shape variants of a session: the IR reshaped to one request's input shapes and compiled static, used where
timing both on this device found it faster than the dynamic compile.

OpenVINO plans a static model's memory and picks its kernels once, for one shape; a model dynamic within its profile
does that per call. Which wins depends on the model, the shape and the device, so the first call of a new shape on
a device times both (alternating, the best of two calls each) and the verdict is kept with the compiled blobs: the
second image of that size, in this process or the next, pays nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import openvino_compiled as kept


def _log():
    import logging  # here: a warm load of an artifact that needs no warning imports no logging (runner/warm.py)

    return logging.getLogger(__name__)


KEEP_COMPILED = True  # False: compile at every load, keep nothing (what loads did before; benchmarks compare)
# ENGINEFARM_OPENVINO_STATIC: "never" (the default), "auto" (static where timed faster here) or "always". Off by
# default: at 512 px the narrow SD 1.5 UNet ran 0.99x dynamic on this CPU, while the first call of each new size paid
# a static compile and the timing (a first decode ~5x a later one) and a session held both compiles (peak RSS 1.38x).
STATIC: str | None = None  # set by tests and benchmarks; None reads the environment
STATIC_MODES = ("never", "auto", "always")
STATIC_MIN_GAIN = 0.98  # static is picked when its call takes under 98% of the dynamic one's
MAX_LIVE_STATIC = 2  # static variants one session holds compiled at once (each holds its own compiled weights)
TIMED_CALLS = 2  # calls of each, alternating, on the first request of a new shape


def device_tag(core, artifact: Path, device: str, config: dict[str, str], weights: Path) -> Path | None:
    """The folder of this artifact's compiled models for this OpenVINO, device and config; None where the cache
    cannot keep them (read-only, or too little room on its disk for a compiled copy of `weights`)."""
    import openvino

    if not KEEP_COMPILED:
        return None
    identity = {
        "name": str(core.get_property(device, "FULL_DEVICE_NAME")),
        "capabilities": [str(c) for c in core.get_property(device, "OPTIMIZATION_CAPABILITIES")],
    }
    tag = kept.tag_dir(artifact, openvino.get_version().split("-")[0], device, identity, config)
    return tag if kept.usable(tag) and kept.room_for(tag, weights) else None


def compile_kept(core, model: Any, device: str, config: dict[str, str], folder: Path | None):
    """`core.compile_model` with OpenVINO's model cache in `folder` (its blobs checked and recorded as the device
    cache's files are); without a folder, a plain compile. Returns (compiled model, whether it compiled)."""
    if folder is None:
        return core.compile_model(model, device, config), True
    before = kept.before_compile(folder)
    # Whole blobs (weights included). OpenVINO 2026.4.1's weightless CPU blobs (CACHE_MODE=OPTIMIZE_SIZE) came back
    # wrong from the cache (a tiny RetinaFace: outputs off by 10, dynamic or reshaped alike), so never those.
    caching = (
        {"CACHE_DIR": str(folder), "CACHE_MODE": "OPTIMIZE_SPEED"} if device == "CPU" else {"CACHE_DIR": str(folder)}
    )
    try:
        compiled = core.compile_model(model, device, {**config, **caching})
    except RuntimeError as exc:  # the cache itself (a full disk, a blob OpenVINO chokes on): compile without it
        _log().warning("openvino: compiling without the compiled-model cache (%s)", str(exc).splitlines()[0][:200])
        return core.compile_model(model, device, config), True
    return compiled, kept.after_compile(folder, before)


def static_mode() -> str:
    """`STATIC`, else ENGINEFARM_OPENVINO_STATIC, else "never"; a value outside STATIC_MODES is a ConfigError."""
    import os

    from enginefarm.errors import ConfigError

    mode = STATIC or os.environ.get("ENGINEFARM_OPENVINO_STATIC", "").strip().lower() or "never"
    if mode not in STATIC_MODES:
        raise ConfigError(
            f"ENGINEFARM_OPENVINO_STATIC={mode!r}",
            hint=f"use one of {', '.join(STATIC_MODES)} (or leave it unset: never)",
        )
    return mode


def has_dynamic_inputs(compiled) -> bool:
    return any(port.get_partial_shape().is_dynamic for port in compiled.inputs)


class StaticShapes:
    """The static variants of one artifact's IR on one device: compiled per input shapes, with the verdict of timing
    each against the dynamic compile kept in the tag folder."""

    def __init__(self, core, xml: Path, device: str, config: dict[str, str], tag: Path | None) -> None:
        self._core, self._xml, self._device, self._config, self._tag = core, Path(xml), device, config, tag

    def verdict(self, key: str) -> str | None:
        """ "static", "dynamic", or None where this device has not timed the shape yet."""
        mode = static_mode()
        if mode != "auto":
            return "static" if mode == "always" else "dynamic"
        if self._tag is None:
            return None
        entry = kept.choices(self._tag).get(key)
        return entry.get("pick") if isinstance(entry, dict) else None

    def compile(self, shapes: dict[str, tuple[int, ...]], key: str):
        model = self._core.read_model(str(self._xml))
        model.reshape({port.get_any_name(): list(shapes[port.get_any_name()]) for port in model.inputs})
        folder = None if self._tag is None else kept.static_dir(self._tag, key)
        start = time.perf_counter()
        compiled, wrote = compile_kept(self._core, model, self._device, self._config, folder)
        _log().info(
            "openvino: static %s %s in %.0f ms",
            {n: list(s) for n, s in shapes.items()},
            "compiled" if wrote else "loaded from the compiled cache",
            (time.perf_counter() - start) * 1000,
        )
        return compiled

    def remember(self, key: str, shapes: dict[str, tuple[int, ...]], dynamic_ms: float, static_ms: float) -> str:
        pick = "static" if static_ms < STATIC_MIN_GAIN * dynamic_ms else "dynamic"
        _log().info("openvino: %s: static %.1f ms, dynamic %.1f ms a call → %s", key, static_ms, dynamic_ms, pick)
        if self._tag is not None:
            entry = {
                "shape": {n: list(s) for n, s in shapes.items()},
                "pick": pick,
                "static_ms": round(static_ms, 2),
                "dynamic_ms": round(dynamic_ms, 2),
            }
            kept.remember(self._tag, key, entry)
        return pick


def time_both(dynamic_request, static_request, feeds: dict) -> tuple[float, float]:
    """The best of TIMED_CALLS calls of each request on the same inputs, alternating (ms): a first call's own
    costs and a loaded machine's drift fall on both."""
    best = {"dynamic": float("inf"), "static": float("inf")}
    for _ in range(TIMED_CALLS):
        for name, request in (("dynamic", dynamic_request), ("static", static_request)):
            start = time.perf_counter()
            request.infer(feeds)
            best[name] = min(best[name], (time.perf_counter() - start) * 1000)
    return best["dynamic"], best["static"]
