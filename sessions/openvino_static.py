"""Compiling an OpenVINO IR with its compiled model kept on the device (sessions/openvino_compiled.py), and the
static-shape variants of a session: the IR reshaped to one request's input shapes and compiled static, used where
it ran faster than the dynamic compile on this device.

OpenVINO plans a static model's memory and picks its kernels once, for one shape; a model dynamic within its profile
does that per call. Which wins depends on the model, the shape and the device, so a new shape is tried on the
caller's own calls (`Trial`): no call is made only to time. The verdict is kept with the compiled blobs: the next
image of that size, in this process or the next, runs on the winner."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import openvino_compiled as kept


def _log():
    import logging  # here: a warm load of an artifact that needs no warning imports no logging (runner/warm.py)

    return logging.getLogger(__name__)


KEEP_COMPILED = True  # False: compile at every load, keep nothing (what loads did before; benchmarks compare)
# ENGINEFARM_OPENVINO_STATIC: "auto" (the default: static where it ran faster here), "always" or "never".
STATIC: str | None = None  # set by tests and benchmarks; None reads the environment
STATIC_MODES = ("never", "auto", "always")
STATIC_MIN_GAIN = 0.98  # static is picked when its call takes under 98% of the dynamic one's
MAX_LIVE_STATIC = 2  # static variants one session holds compiled at once (each holds its own compiled weights)


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


def open_dynamic(core, xml: Path, device: str, config: dict[str, str], tag: Path | None, blob: Path | None):
    """The IR's dynamic compile: the shipped `blob` imported, else the IR compiled through the device's
    compiled-model cache in `tag`. Returns (compiled model, whether it was compiled rather than loaded)."""
    if blob is not None:
        return core.import_model(blob.read_bytes(), device, config), False
    return compile_kept(core, str(xml), device, config, None if tag is None else tag / "dynamic")


def static_mode() -> str:
    """`STATIC`, else ENGINEFARM_OPENVINO_STATIC, else "auto"; a value outside STATIC_MODES is a ConfigError."""
    import os

    from enginefarm.errors import ConfigError

    mode = STATIC or os.environ.get("ENGINEFARM_OPENVINO_STATIC", "").strip().lower() or "auto"
    if mode not in STATIC_MODES:
        raise ConfigError(
            f"ENGINEFARM_OPENVINO_STATIC={mode!r}",
            hint=f"use one of {', '.join(STATIC_MODES)} (or leave it unset: auto)",
        )
    return mode


def has_dynamic_inputs(compiled) -> bool:
    return any(port.get_partial_shape().is_dynamic for port in compiled.inputs)


class StaticShapes:
    """The static variants of one artifact's IR on one device: compiled per input shapes, with the verdict of each
    shape's trial against the dynamic compile kept in the tag folder. Also opens the dynamic compile again (from the
    device's compiled-model cache, or the shipped blob) after a session let it go."""

    def __init__(
        self, core, xml: Path, device: str, config: dict[str, str], tag: Path | None, blob: Path | None = None
    ) -> None:
        self._core, self._xml, self._device, self._config, self._tag = core, Path(xml), device, config, tag
        self._blob = blob

    def verdict(self, key: str) -> str | None:
        """ "static", "dynamic", or None where this device has not finished trying the shape."""
        mode = static_mode()
        if mode != "auto":
            return "static" if mode == "always" else "dynamic"
        entry = self._entry(key)
        return entry.get("pick") if entry else None

    def progress(self, key: str) -> dict[str, float]:
        """What an unfinished trial of the shape timed in an earlier process: {"dynamic"|"static": ms}."""
        entry = self._entry(key)
        if not entry or entry.get("pick"):
            return {}
        return {label: float(entry[f"{label}_ms"]) for label in ("dynamic", "static") if f"{label}_ms" in entry}

    def _entry(self, key: str) -> dict | None:
        if self._tag is None:
            return None
        entry = kept.choices(self._tag).get(key)
        return entry if isinstance(entry, dict) else None

    def compile(self, shapes: dict[str, tuple[int, ...]], key: str):
        """The IR compiled static at `shapes`: through the device's compiled-model cache as a file of its own
        (`kept.static_ir`), else reshaped in memory."""
        folder = None if self._tag is None else kept.static_dir(self._tag, key)
        start = time.perf_counter()
        model: Any = None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            path = kept.static_ir(self._xml, folder, shapes)
            model = None if path is None else str(path)
        if model is None:
            model = self._core.read_model(str(self._xml))
            model.reshape({port.get_any_name(): list(shapes[port.get_any_name()]) for port in model.inputs})
        compiled, wrote = compile_kept(self._core, model, self._device, self._config, folder)
        _log().info(
            "openvino: static %s %s in %.0f ms",
            {n: list(s) for n, s in shapes.items()},
            "compiled" if wrote else "loaded from the compiled cache",
            _ms(start),
        )
        return compiled

    def open_dynamic(self):
        """The dynamic compile again, as the session's load opened it (a cache hit: the load kept it)."""
        start = time.perf_counter()
        compiled, _ = open_dynamic(self._core, self._xml, self._device, self._config, self._tag, self._blob)
        _log().info("openvino: dynamic compile of %s opened again in %.0f ms", self._xml.name, _ms(start))
        return compiled

    def note(self, key: str, shapes: dict[str, tuple[int, ...]], times: dict[str, float]) -> None:
        """Keep an unfinished trial's times, so that a component called once or twice per process (a VAE decoder)
        finishes its trial in a later one."""
        if self._tag is not None:
            entry = {"shape": {n: list(s) for n, s in shapes.items()}}
            kept.remember(self._tag, key, {**entry, **{f"{k}_ms": round(v, 2) for k, v in times.items()}})

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


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


class Trial:
    """One shape's trial of the static compile against the dynamic one, run on the caller's own calls: the dynamic
    compile's first call (untimed: a first call allocates), its second (timed), then the static compile's first and
    second the same way; the verdict follows the second timed call. A time an earlier process measured (kept by
    `StaticShapes.note`) counts, so a component called twice per process finishes in the next one. `static` is the
    static compile's variant, made when its turn comes."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], earlier: dict[str, float]) -> None:
        self.shapes = shapes
        self.times = dict(earlier)  # "dynamic" | "static" → the best timed call, ms
        self.calls = {"dynamic": 0, "static": 0}  # made in this session
        self.static: Any = None

    def turn(self) -> tuple[str, bool]:
        """The variant the next call runs on, and whether that call is timed."""
        label = "dynamic" if "dynamic" not in self.times else "static"
        return label, self.calls[label] > 0

    def ran(self, label: str, ms: float | None) -> None:
        self.calls[label] += 1
        if ms is not None:
            self.times[label] = min(self.times.get(label, float("inf")), ms)

    @property
    def done(self) -> bool:
        return "dynamic" in self.times and "static" in self.times
