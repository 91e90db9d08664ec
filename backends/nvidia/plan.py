"""Opening a plan. A plan is executable code: only bytes read from the verified artifact folder, hashed again here
against the manifest, are ever deserialized, and the SDK's own validity check (where it has one) runs first.
Weight-stripped plans are refitted from the ONNX shipped beside them; `refit_engine` replaces chosen weights."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.errors import BackendUnavailable, IntegrityError

from .devices import matching_gpu
from .sdk import capturing_logger

log = logging.getLogger(__name__)


def verified_file(artifact_dir: Path, manifest, path: str) -> Path:
    """A manifest file's path, refused if it leaves the artifact folder (symlinks included)."""
    root = Path(artifact_dir).resolve()
    entry = next((f for f in manifest.files if f.path == path), None)
    if entry is None:
        raise IntegrityError(f"{manifest.ref}: the manifest lists no {path}")
    candidate = root / entry.path
    if candidate.is_symlink() or not candidate.resolve().is_relative_to(root):
        raise IntegrityError(f"{manifest.ref}: {path} points outside its artifact folder; refusing it")
    return candidate


def read_plan(artifact_dir: Path, manifest) -> bytes:
    """The plan's bytes, read once from the artifact folder and hashed here against the manifest: these exact
    bytes, and no others, are what gets deserialized."""
    entry = next((f for f in manifest.files if f.role == "engine"), None)
    if entry is None:
        raise IntegrityError(f"{manifest.ref}: the manifest lists no engine")
    data = verified_file(artifact_dir, manifest, entry.path).read_bytes()
    if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise IntegrityError(
            f"{manifest.ref}: {entry.path} does not match its manifest; refusing to deserialize it",
            hint="`enginefarm cache verify` evicts damaged artifacts",
        )
    return data


def check_validity(trt, runtime, data: bytes, what: str) -> str:
    """The SDK's header check before deserializing. TensorRT-RTX has `Runtime.get_engine_validity`; a TensorRT
    without it is reported as unchecked and deserialization itself is the check."""
    check = getattr(runtime, "get_engine_validity", None)
    if check is None:
        return "unchecked (this SDK has no get_engine_validity)"
    size = getattr(runtime, "engine_header_size", None)
    answer = check(memoryview(data)[:size] if size else memoryview(data))
    validity, diagnostics = answer if isinstance(answer, tuple) else (answer, 0)
    if validity == trt.EngineValidity.INVALID:
        raise BackendUnavailable(
            f"{what}: the plan is not valid on this system ({_diagnostics(trt, diagnostics)})",
            hint="rebuild it for this GPU and SDK version, or use another artifact",
        )
    if validity == getattr(trt.EngineValidity, "SUBOPTIMAL", None):
        log.warning("%s: the plan is valid here but may run slower (%s)", what, _diagnostics(trt, diagnostics))
        return "suboptimal"
    return "valid"


def _diagnostics(trt, bits) -> str:
    kinds = getattr(trt, "EngineInvalidityDiagnostics", None) or getattr(trt, "EngineValidityDiagnostics", None)
    value = int(getattr(bits, "value", bits) or 0)
    if kinds is None or not value:
        return f"diagnostics {value}"
    names = [
        name
        for name, member in getattr(kinds, "__members__", {}).items()
        if value & int(getattr(member, "value", member))
    ]
    return ", ".join(names) or f"diagnostics {value}"


def precheck(trt, manifest, family_floors: dict[str, tuple[int, int]], what: str) -> dict[str, Any]:
    """Before any byte reaches the SDK: the runtime version the plan needs, and a GPU of its arch or class (returned).
    This is also the only check before deserializing on TensorRT versions without get_engine_validity."""
    from ..base import version_in_range

    name = manifest.parsed_target.backend
    wanted = manifest.constraints.get("runtime", {}).get(name)
    if wanted and not version_in_range(trt.__version__, wanted):
        raise BackendUnavailable(
            f"{what}: the plan needs {name} {wanted}, this is {trt.__version__}", hint="rebuild it for this version"
        )
    gpu, why = matching_gpu(manifest.parsed_target.device, family_floors)
    if gpu is None:
        raise BackendUnavailable(f"{what}: {why}")
    return gpu


def deserialize(trt, data: bytes, what: str, *, host_code: bool = False):
    logger = capturing_logger(trt)
    runtime = trt.Runtime(logger)
    if host_code:
        # Version-compatible plans embed the lean runtime, which is host code the runtime must be allowed to run.
        runtime.engine_host_code_allowed = True
    validity = check_validity(trt, runtime, data, what)
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise BackendUnavailable(
            f"{what}: {trt.__name__} could not deserialize the plan (validity: {validity}): "
            f"{logger.last_error() or 'no error logged'}"
        )
    return engine, logger


def refit_engine(
    trt, engine, logger, what: str, onnx_path: Path | None = None, weights: dict[str, np.ndarray] | None = None
) -> None:
    """One refit: the weights of the shipped ONNX (a stripped plan has none of its own), then the named weights on
    top (ONNX initializer names, float32 in ONNX layout, each cast to the plan's dtype)."""
    from enginefarm.errors import ConfigError

    refitter = trt.Refitter(engine, logger)
    if onnx_path is not None:
        parser = trt.OnnxParserRefitter(refitter, logger)
        if not parser.refit_from_file(str(onnx_path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise IntegrityError(
                f"{what}: the ONNX weights do not fit the plan: {'; '.join(errors[:3]) or 'refit failed'}"
            )
    kept = []  # TensorRT reads the arrays when refitting, so they must outlive set_named_weights
    if weights:
        known = set(refitter.get_all_weights())
        unknown = sorted(set(weights) - known)
        if unknown:
            raise ConfigError(
                f"{what}: the plan has no refittable weights {unknown[:5]}", hint=f"{len(known)} weights are refittable"
            )
        for name, value in weights.items():
            prototype = refitter.get_weights_prototype(name)
            array = np.ascontiguousarray(value, dtype=trt.nptype(prototype.dtype))
            if array.size != prototype.size:
                raise ConfigError(f"{what}: weight {name} has {array.size} values, the plan expects {prototype.size}")
            kept.append(array)
            if not refitter.set_named_weights(name, trt.Weights(array)):
                raise ConfigError(f"{what}: TensorRT refused new values for {name}")
    if not refitter.refit_cuda_engine():
        raise IntegrityError(
            f"{what}: refitting the plan failed (missing weights: {list(refitter.get_missing_weights())[:5]})"
        )


def require_refittable(manifest, defaults: dict[str, Any], what: str) -> None:
    """New weights need a plan built with REFIT: a stripped plan (REFIT_IDENTICAL) takes only the build's own."""
    from enginefarm.errors import ConfigError

    if not {**defaults, **manifest.options}["refittable"]:
        backend = manifest.parsed_target.backend
        raise ConfigError(
            f"{manifest.ref} {manifest.target}: this {what} was not built refittable, so it cannot take custom "
            "weights or LoRAs",
            hint=f"set refittable = true in [components.{manifest.component}.options.{backend}] and rebuild",
        )


def open_engine(
    trt,
    artifact_dir: Path,
    manifest,
    options: dict[str, Any],
    family_floors: dict[str, tuple[int, int]],
    noun: str,
    weights: dict[str, np.ndarray] | None,
):
    """(engine, gpu, how) from the verified plan: checked, deserialized, and refitted from the shipped weights
    (a stripped plan has none of its own) plus `weights` on top. Both backends open plans this one way."""
    what = f"{manifest.ref} {manifest.target} [{manifest.build_key[:12]}]"
    gpu = precheck(trt, manifest, family_floors, what)
    engine, logger = deserialize(
        trt, read_plan(artifact_dir, manifest), what, host_code=options.get("version_compatible", False)
    )
    how, onnx = noun, None
    if options["strip_weights"]:
        onnx = weights_onnx(artifact_dir, manifest)
        if onnx is None:
            raise IntegrityError(f"{what}: a weight-stripped {noun} without its weights")
        how = f"weight-stripped {noun}, refitted from weights.onnx"
    if onnx is not None or weights:
        refit_engine(trt, engine, logger, what, onnx, weights)
        how += f", {len(weights)} weights replaced" if weights else ""
    if options.get("weight_streaming"):
        how += stream_weights(engine, streaming_budget())
    return engine, gpu, how


STREAMING_ENV = "ENGINEFARM_WEIGHT_STREAMING_BUDGET"


def streaming_budget() -> int | None:
    """The GPU bytes a streamable plan may keep its weights in (ENGINEFARM_WEIGHT_STREAMING_BUDGET: bytes, a size
    such as 4G, or "auto": the SDK's own choice for the free memory); None: all of them on the GPU."""
    raw = os.environ.get(STREAMING_ENV, "").strip()
    if not raw or raw == "auto":
        return None if not raw else -1
    from enginefarm.settings import parse_size

    return parse_size(STREAMING_ENV, raw)


def stream_weights(engine, budget: int | None) -> str:
    """Set the engine's weight-streaming budget before its execution context is made (the SDK reads it then)."""
    if budget is None:
        return ", streamable (every weight on the GPU)"
    total = int(engine.streamable_weights_size)
    chosen = int(engine.get_weight_streaming_automatic_budget()) if budget < 0 else min(budget, total)
    engine.weight_streaming_budget_v2 = chosen
    return f", streaming weights: {chosen >> 20} of {total >> 20} MiB on the GPU"


def weights_onnx(artifact_dir: Path, manifest) -> Path | None:
    entry = next((f for f in manifest.files if f.role == "weights" and f.path.endswith(".onnx")), None)
    return None if entry is None else verified_file(artifact_dir, manifest, entry.path)
