"""The backend registry: one table maps each name to its module and install hint. There is no second registry."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from enginefarm.cache.manifest import Target
from enginefarm.errors import BackendUnavailable

from .base import Availability, BackendSession, BuiltFile


@dataclass(frozen=True)
class BackendEntry:
    module: str
    install: str


BACKENDS: dict[str, BackendEntry] = {
    "onnxruntime": BackendEntry("enginefarm.backends.onnxruntime", "pip install 'enginefarm[onnxruntime]'"),
    "openvino": BackendEntry("enginefarm.backends.openvino", "pip install 'enginefarm[openvino]'"),
    "tensorrt": BackendEntry("enginefarm.backends.tensorrt", "pip install 'enginefarm[tensorrt]'"),
    "tensorrt-rtx": BackendEntry("enginefarm.backends.tensorrt_rtx", "pip install 'enginefarm[tensorrt-rtx]'"),
    "migraphx": BackendEntry("enginefarm.backends.migraphx", "install ROCm's MIGraphX: apt install migraphx, from ROCm's apt repository (the PyPI 'migraphx' is a placeholder)"),
    "coreml": BackendEntry("enginefarm.backends.coreml", "pip install 'enginefarm[coreml]'"),
}


def get_backend(name: str) -> ModuleType:
    entry = BACKENDS.get(name)
    if entry is None:
        raise BackendUnavailable(f"unknown backend {name!r}", hint=f"known backends: {', '.join(BACKENDS)}")
    return importlib.import_module(entry.module)


def availability(target: Target) -> Availability:
    """Whether `target` can be built and loaded here. Never raises: a broken SDK is reported, not crashed on."""
    try:
        backend = get_backend(target.backend)
        return backend.available(target.device)
    except BackendUnavailable as exc:
        return Availability.missing(str(exc))
    except Exception as exc:  # a half-installed SDK can fail in any way; show why, keep going
        return Availability.missing(f"{type(exc).__name__}: {exc}")


def job_availability(job) -> Availability:
    """`availability(job.target)`, narrowed by what this job's options need of the build host (a backend's
    optional `check_job(job)` says why not, e.g. TensorRT-RTX weight stripping without a GPU)."""
    here = availability(job.target)
    check = getattr(get_backend(job.target.backend), "check_job", None) if here.can_build else None
    why = check(job) if check is not None else ""
    return Availability(False, False, why) if why else here


def job_refusal(job) -> tuple[str, str] | None:
    """(why, fix) when the backend's SDK would refuse this job on any host (its optional `refusal(job)`)."""
    refusal = getattr(get_backend(job.target.backend), "refusal", None)
    return refusal(job) if refusal is not None else None


def gpu_build_reason(job) -> tuple[str, str] | None:
    """(why, fix) when this job needs a GPU on the build host, for backends that otherwise build on a CPU (their
    optional `gpu_build_reason(job)`). Backends without it build where their target's device is."""
    reason = getattr(get_backend(job.target.backend), "gpu_build_reason", None)
    return reason(job) if reason is not None else None


def builds_on_cpu(job) -> bool:
    """Whether a runner without a GPU builds this job: CPU targets, and backends that build without their device
    (TensorRT-RTX) unless an option needs one."""
    if job.target.device == "cpu":
        return True
    return hasattr(get_backend(job.target.backend), "gpu_build_reason") and gpu_build_reason(job) is None


def precision_refusal(target: Target, precision: str) -> str | None:
    """Why `target`'s device class never computes in `precision` natively (None: it does). A backend module says so
    with `precision_refusal(precision, device)`; without one, it builds fp32 and fp16 only. Refused jobs are never
    built: an artifact labelled bf16 that computes in fp32 would be a lie, and one that does not load a waste."""
    try:
        check = getattr(get_backend(target.backend), "precision_refusal", None)
    except BackendUnavailable:
        return None
    if check is not None:
        return check(precision, target.device)
    if precision == "bf16":
        return f"{target.backend} artifacts are built in fp32 or fp16 only (bf16 is built for openvino:cpu and tensorrt-rtx)"
    return None


def job_options(target: Target, written: dict[str, dict]) -> dict:
    """The options a job of `target` is built with: the backend's defaults (a tuple's first choice), overridden by
    what the recipe wrote. All go into the build key, so changing one rebuilds; backends without options give {}."""
    declared = getattr(get_backend(target.backend), "OPTIONS", None) or {}
    defaults = {name: d[0] if isinstance(d, tuple) else d for name, d in declared.items()}
    return {**defaults, **written.get(target.backend, {})}


def validate_target(target: Target) -> tuple[str, str] | None:
    """(reason, hint) if the recipe names a backend or device class that does not exist."""
    if target.backend not in BACKENDS:
        return f"unknown backend {target.backend!r} in {target}", f"known backends: {', '.join(BACKENDS)}"
    backend = get_backend(target.backend)
    if not backend.DEVICES.fullmatch(target.device):
        return f"{target.backend} has no device class {target.device!r}", f"{target.backend} devices: {backend.DEVICE_HINT}"
    return None


__all__ = ["BACKENDS", "Availability", "BackendSession", "BuiltFile", "availability", "builds_on_cpu", "get_backend", "gpu_build_reason",
           "job_availability", "job_options", "job_refusal", "precision_refusal", "validate_target"]
