"""The build process of the NVIDIA backends: `python -m enginefarm.backends.nvidia.build_process SPEC RESULT
PARENT_PID`.

It imports the SDK itself and writes RESULT (JSON: notes, or the error). If the SDK kills it instead (segfault,
abort, out of memory), RESULT is missing and the parent reports how the process died.

The SDK explains a failure only in its log (build_serialized_network just returns None), so the build hands it an
ILogger that keeps every error: the job's failure line carries the last one in the SDK's own words, and the result
keeps them all. Where the SDK has a progress monitor, the phases of the build go to SPEC's progress file as JSON
lines, for the parent to draw.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from enginefarm.cache.atomic import atomic_writer, write_bytes_atomic
from enginefarm.hardware import rss

from .build import BuildSpec, die_with_parent
from .sdk import KEPT_ERRORS, SdkError, capturing_logger


def progress_monitor(trt, path: str):
    """Writes the top-level build phase's steps ({done, total, phase}) as JSON lines; None where the SDK has no
    monitor."""
    base: Any = getattr(trt, "IProgressMonitor", None)  # the SDK's class (TensorRT ships no types)
    if base is None:
        return None

    class Monitor(base):
        def __init__(self) -> None:
            base.__init__(self)
            self.top: str | None = None
            self.total, self.done, self.phase = 0, 0, ""

        def phase_start(self, phase_name, parent_phase, num_steps) -> None:
            if parent_phase is None and self.top is None:
                self.top, self.total = phase_name, int(num_steps)
            elif parent_phase == self.top:
                self.phase = phase_name
            self._write()

        def step_complete(self, phase_name, step) -> bool:
            if phase_name == self.top:
                self.done = int(step) + 1
                self._write()
            return True  # False would cancel the build

        def phase_finish(self, phase_name) -> None:
            if phase_name == self.top:
                self.done = self.total
                self._write()

        def _write(self) -> None:
            with open(path, "a") as handle:
                handle.write(
                    json.dumps({"done": self.done, "total": self.total, "phase": self.phase or self.top or ""}) + "\n"
                )

    return Monitor()


# Without strong typing (TensorRT before 10.12) the builder flag that allows a reduced precision's kernels.
_WEAKLY_TYPED_FLAGS = {"fp16": "FP16", "bf16": "BF16"}


def build_plan(trt, spec: BuildSpec, logger) -> dict[str, Any]:
    """The SDK calls of one build. Returns notes for the manifest; raises SdkError with the SDK's words."""
    builder = trt.Builder(logger)
    # Networks are always explicit-batch in TensorRT 10+. Strongly typed: the prepared ONNX carries the
    # precision (fp16 weights and math, float32 I/O), which is how TensorRT 10.12+ wants fp16 (11 has no FP16 flag).
    typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    network = builder.create_network(1 << int(typed) if typed is not None else 0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(spec.onnx):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise SdkError("the ONNX parser failed: " + ("; ".join(errors) or logger.last_error()))
    config = builder.create_builder_config()
    for shapes in (spec.profile, *spec.extra_profiles):
        _add_profile(builder, network, config, shapes, logger)
    if typed is None and spec.precision in _WEAKLY_TYPED_FLAGS:
        config.set_flag(getattr(trt.BuilderFlag, _WEAKLY_TYPED_FLAGS[spec.precision]))
    if spec.strip_weights:
        config.set_flag(trt.BuilderFlag.STRIP_PLAN)
    if spec.refittable:
        config.set_flag(trt.BuilderFlag.REFIT)
    elif spec.strip_weights:
        config.set_flag(trt.BuilderFlag.REFIT_IDENTICAL)  # refit only with the build's own weights: faster kernels
    if spec.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if spec.weight_streaming:  # needs a strongly typed network, which every build here is
        config.set_flag(trt.BuilderFlag.WEIGHT_STREAMING)
    if spec.hardware_compatible:
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    if spec.compute_capabilities:
        config.num_compute_capabilities = len(spec.compute_capabilities)
        for index, name in enumerate(spec.compute_capabilities):
            # TensorRT-RTX answers False (and logs why) instead of raising; building on would target the wrong GPUs.
            if not config.set_compute_capability(getattr(trt.ComputeCapability, name), index):
                raise logger.refused(f"set_compute_capability({name}, {index}) was refused")
    if spec.progress is not None:
        monitor = progress_monitor(trt, spec.progress)
        if monitor is not None:
            config.progress_monitor = monitor
    notes: dict[str, Any] = {"optimization_profiles": 1 + len(spec.extra_profiles)}
    if spec.timing_cache_out is not None:
        notes.update(_use_timing_cache(config, spec.timing_caches))
    _write_plan(trt, builder, network, config, Path(spec.plan), logger)
    if spec.timing_cache_out is not None:
        write_bytes_atomic(Path(spec.timing_cache_out), bytes(config.get_timing_cache().serialize()))
    return notes


def _add_profile(builder, network, config, shapes: dict[str, dict[str, list[int]]], logger) -> None:
    """One optimization profile of min/opt/max per input. The SDK answers -1 (and logs why) for a profile it finds
    invalid, such as an opt outside min..max; the build stops there rather than build without it."""
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        name = network.get_input(index).name
        bounds = shapes.get(name)
        if bounds is None:
            raise SdkError(f"the profile has no shapes for input {name!r}")
        profile.set_shape(name, tuple(bounds["min"]), tuple(bounds["opt"]), tuple(bounds["max"]))
    if config.add_optimization_profile(profile) < 0:
        opts = {name: bounds["opt"] for name, bounds in shapes.items()}
        raise logger.refused(f"add_optimization_profile(opt {opts}) was refused")


def _write_plan(trt, builder, network, config, plan: Path, logger) -> None:
    """The plan goes to its file as the SDK writes it (`build_serialized_network_to_stream`, TensorRT 10.11+ and
    TensorRT-RTX): never whole in host memory, where an SD UNet's is 3.4 GB. Older SDKs hand back a buffer."""
    with atomic_writer(plan) as out:
        if hasattr(builder, "build_serialized_network_to_stream"):

            class _ToFile(trt.IStreamWriter):
                def write(self, data) -> int:
                    return out.write(data)

            if not builder.build_serialized_network_to_stream(network, config, _ToFile()):
                raise logger.refused("build_serialized_network failed")
            return
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise logger.refused("build_serialized_network failed")
        out.write(memoryview(serialized))  # the SDK's buffer itself: a bytes() copy would hold the plan twice


def _use_timing_cache(config, paths: list[str]) -> dict[str, Any]:
    cache = config.create_timing_cache(b"")
    merged = 0
    for path in paths:
        other = config.create_timing_cache(Path(path).read_bytes())
        # ignore_mismatch=False: a cache measured on another device is refused, not trusted.
        if other is not None and cache.combine(other, False):
            merged += 1
    if not config.set_timing_cache(cache, False):
        return {"timing_caches_merged": 0, "timing_cache": "refused"}
    return {"timing_caches_merged": merged}


def main(spec_path: str, result_path: str, parent: str) -> int:
    die_with_parent(int(parent))
    spec = BuildSpec(**json.loads(Path(spec_path).read_text()))
    trt = importlib.import_module(spec.sdk)
    logger = capturing_logger(trt)
    try:
        notes = build_plan(trt, spec, logger)
    except Exception as exc:  # the SDK's own errors: the job's failure, in full
        text = str(exc).strip()
        error = text if isinstance(exc, SdkError) else f"{type(exc).__name__}: {text}"
        last = logger.last_error()
        if last and last not in error:
            error += f" (the SDK's last error: {last})"
        write_bytes_atomic(
            Path(result_path), json.dumps({"error": error, "sdk_errors": logger.errors[-KEPT_ERRORS:]}).encode()
        )
        return 1
    # The build's own peak (this process's VmHWM), which the job's "compile" stage adds to its own memory.
    notes["build_process_peak_rss_mb"] = rss.mb(rss.peak_bytes())
    write_bytes_atomic(Path(result_path), json.dumps({"notes": notes}).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
