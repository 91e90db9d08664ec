"""The backend contract. Each vendor SDK lives in one module of this package that provides these names:

    NAME: str                      the backend's name in targets ("openvino")
    DEVICES: re.Pattern            device classes it understands ("cpu", "sm_89", ...)
    DEVICE_HINT: str               what to write instead, for errors
    ONNX_PRECISION: "fp32"|"same"  which prepared ONNX `build` wants: always fp32, or the job's precision
    available(device) -> Availability
    versions() -> dict[str, str]   every version that goes into the build key
    constraints(job) -> dict        what a device needs to load the artifact (runtime range, ISA, driver...)
    build(prepared_onnx, job, workdir) -> list[BuiltFile]
    load(artifact_dir, manifest, device) -> BackendSession

Optional:
    OPTIONS: dict                  build options a recipe may set in [components.X.<backend>], with defaults (in the key)
    refit(artifact_dir, manifest, weights, device) -> BackendSession   load, then replace named weights
    check_refit(manifest)          raises (ConfigError with a hint) when this artifact cannot be refitted
    before_build(store, job, workdir) / after_build(store, job, workdir)   fetch / publish shared build caches
    bench_device(manifest) -> dict  the device class benchmarks were measured on (GPU backends)
    validation_session(artifact_dir, manifest, device) -> (BackendSession | None, note: dict)
                                   where the artifact may not run on the build host: its session, a stand-in, or None
                                   (published unvalidated: passed None, executed False); `note` joins the record

The SDK is imported inside those functions only, so importing a backend module is cheap and always works.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import numpy as np

from enginefarm.errors import BackendUnavailable


def import_sdk(module: str, install: str) -> ModuleType:
    """Import a vendor SDK on first use; a missing SDK is a BackendUnavailable naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailable(f"{module} is not installed ({exc})", hint=install) from None


@dataclass(frozen=True)
class Availability:
    can_build: bool
    can_load: bool
    reason: str | None = None  # why not, when either is False

    @classmethod
    def missing(cls, reason: str) -> "Availability":
        return cls(False, False, reason)


@dataclass(frozen=True)
class BuiltFile:
    path: str  # relative to the build's workdir
    role: str  # engine | weights | ir | model


class BackendSession(Protocol):
    input_names: list[str]
    output_names: list[str]
    compute_precision: str  # what it really computes in: "fp32", "fp16", "bf16"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def version_in_range(version: str, spec: str) -> bool:
    def as_tuple(text: str) -> tuple[int, ...]:
        out = []
        for part in text.split("+")[0].split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit())
            out.append(int(digits or 0))
        return tuple(out + [0] * (3 - len(out)))

    have = as_tuple(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        if clause.startswith(">=") and not have >= as_tuple(clause[2:]):
            return False
        if clause.startswith("<") and not clause.startswith("<=") and not have < as_tuple(clause[1:]):
            return False
        if clause.startswith("==") and have != as_tuple(clause[2:]):
            return False
    return True
