"""What the TensorRT and TensorRT-RTX backends share: their Python APIs are the same where they overlap.

- Builds run in a separate Python process that imports the SDK itself, so a segfault, abort or out-of-memory
  kill inside the SDK fails the job with a reason instead of taking the build farm down.
- A plan is executable code: only bytes read from the verified artifact folder, hashed again here against the
  manifest, are ever deserialized, and the SDK's own validity check (where it has one) runs first.
- Weight-stripped plans are refitted from the ONNX shipped beside them; `refit_named` replaces chosen weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.cache.device_info import nvidia_gpus
from enginefarm.errors import BackendUnavailable, BuildError, IntegrityError

from .base import Availability, BuiltFile, import_sdk

log = logging.getLogger(__name__)

INDEX_NOTE = "its wheels download from NVIDIA's package index, which must be reachable from where you install"
_CHILD = "enginefarm.builder.backends._nvidia_build"


def sdk(module: str, extra: str):
    return import_sdk(module, f"pip install 'enginefarm[{extra}]' ({INDEX_NOTE})")


def sdk_missing(exc: BackendUnavailable, gpu_why: str = "") -> Availability:
    """Why a backend is unavailable when its SDK is not installed, plus (where building needs one) the GPU story."""
    return Availability.missing(f"{exc} — {INDEX_NOTE}" + (f"; and {gpu_why}" if gpu_why else ""))


# Devices -------------------------------------------------------------------------------------------------
def gpu_runs(device: str, gpu: dict[str, Any], family_floors: dict[str, tuple[int, int]]) -> bool:
    """Whether a GPU (NVML description) runs plans for the device class: sm_XX exactly, or a family class from its floor."""
    if device.startswith("sm_"):
        return gpu["arch"] == device
    floor = family_floors.get(device)
    return floor is not None and (gpu["major"], gpu["minor"]) >= floor


def matching_gpu(device: str, family_floors: dict[str, tuple[int, int]]) -> tuple[dict[str, Any] | None, str]:
    gpus, reason = nvidia_gpus()
    if not gpus:
        return None, reason or "no NVIDIA GPU found"
    for gpu in gpus:
        if gpu_runs(device, gpu, family_floors):
            return gpu, ""
    found = ", ".join(f"{g['name']} ({g['arch']})" for g in gpus)
    return None, f"{device} needs a matching NVIDIA GPU; this machine has {found}"


def gpu_description(device: str, family_floors: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """For benchmarks: the class resolution matches against a device's bench_class (runner.device: nvidia-sm_XX)."""
    gpu, _ = matching_gpu(device, family_floors)
    if gpu is None:
        return {"class": f"nvidia-{device}"}
    return {"class": f"nvidia-{gpu['arch']}", "name": gpu["name"], "driver": gpu["driver"], "vram_mb": gpu["vram_mb"]}


def build_host_arch() -> str | None:
    gpus, _ = nvidia_gpus()
    return gpus[0]["arch"] if gpus else None


# Building ------------------------------------------------------------------------------------------------
@dataclass
class BuildSpec:
    """Everything the build process needs, as plain data (it crosses a process boundary as JSON)."""

    sdk: str  # module to import: tensorrt | tensorrt_rtx
    onnx: str
    plan: str  # where the plan is written
    profile: dict[str, dict[str, list[int]]]  # input → min/opt/max
    precision: str
    strip_weights: bool
    refittable: bool
    version_compatible: bool = False
    hardware_compatible: bool = False  # TensorRT's ampere+ level
    compute_capabilities: list[str] = field(default_factory=list)  # TensorRT-RTX: ComputeCapability member names
    timing_caches: list[str] = field(default_factory=list)  # serialized caches to merge before building
    timing_cache_out: str | None = None


def build_in_subprocess(spec: BuildSpec, workdir: Path, what: str) -> dict[str, Any]:
    """Run the SDK build in a fresh Python process and return its notes. Its crash, abort or OOM kill becomes a BuildError."""
    spec_path = workdir.parent / "build-spec.json"
    result_path = workdir.parent / "build-result.json"
    result_path.unlink(missing_ok=True)
    write_bytes_atomic(spec_path, json.dumps(asdict(spec)).encode())
    env = dict(os.environ)
    # The child imports exactly what this process can: same interpreter, same module path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    process = subprocess.Popen([sys.executable, "-m", _CHILD, str(spec_path), str(result_path), str(os.getpid())], env=env)
    try:
        code = process.wait()
    except BaseException:
        process.kill()
        process.wait()
        raise
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if result and result.get("error"):
        raise BuildError(f"{what}: {result['error']}")
    if code != 0 or not result:
        raise BuildError(f"{what}: the build process died ({describe_exit(code)})", hint="a crash or out-of-memory in the SDK; the other jobs go on")
    notes = result.get("notes", {})
    write_bytes_atomic(workdir / "notes.json", json.dumps(notes).encode())  # build.py moves it into the manifest
    return notes


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (": out of memory?" if name == "SIGKILL" else "")
    return f"exit code {code}"


def die_with_parent(parent: int) -> None:
    """Linux: the build process dies with the worker that started it, so an interrupted farm leaves no orphan
    builds. Called first thing in the build process (not as a preexec_fn, which is unsafe in a threaded parent)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
    if os.getppid() != parent:  # the parent died before we asked to follow it
        os._exit(1)


def build_plan(trt, spec: BuildSpec) -> dict[str, Any]:
    """The SDK calls of one build (runs in the build process). Returns notes for the manifest."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Networks are always explicit-batch in TensorRT 10+. Strongly typed: the prepared ONNX carries the
    # precision (fp16 weights and math, float32 I/O), which is how TensorRT 10.12+ wants fp16 (11 has no FP16 flag).
    typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    network = builder.create_network(1 << int(typed) if typed is not None else 0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(spec.onnx):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError("the ONNX parser failed: " + "; ".join(errors[:3]))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        name = network.get_input(index).name
        shapes = spec.profile.get(name)
        if shapes is None:
            raise RuntimeError(f"the profile has no shapes for input {name!r}")
        profile.set_shape(name, tuple(shapes["min"]), tuple(shapes["opt"]), tuple(shapes["max"]))
    config.add_optimization_profile(profile)
    if typed is None and spec.precision in ("fp16", "bf16"):
        config.set_flag(trt.BuilderFlag.FP16 if spec.precision == "fp16" else trt.BuilderFlag.BF16)
    if spec.strip_weights:
        config.set_flag(trt.BuilderFlag.STRIP_PLAN)
    if spec.refittable:
        config.set_flag(trt.BuilderFlag.REFIT)
    elif spec.strip_weights:
        config.set_flag(trt.BuilderFlag.REFIT_IDENTICAL)  # refit only with the build's own weights: faster kernels
    if spec.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    if spec.hardware_compatible:
        config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    if spec.compute_capabilities:
        config.num_compute_capabilities = len(spec.compute_capabilities)
        for index, name in enumerate(spec.compute_capabilities):
            config.set_compute_capability(getattr(trt.ComputeCapability, name), index)
    notes: dict[str, Any] = {}
    if spec.timing_cache_out is not None:
        notes.update(_use_timing_cache(config, spec.timing_caches))
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("build_serialized_network returned nothing (the TensorRT log above says why)")
    write_bytes_atomic(Path(spec.plan), bytes(serialized))
    if spec.timing_cache_out is not None:
        write_bytes_atomic(Path(spec.timing_cache_out), bytes(config.get_timing_cache().serialize()))
    return notes


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


def stripped_files(prepared_onnx: Path, workdir: Path, strip_weights: bool) -> list[BuiltFile]:
    """The plan, plus the ONNX its weights are refitted from when it is weight-stripped."""
    files = [BuiltFile("model.plan", "engine")]
    if strip_weights:
        import shutil

        shutil.copyfile(prepared_onnx, workdir / "weights.onnx")
        files.append(BuiltFile("weights.onnx", "weights"))
        data = prepared_onnx.with_name(prepared_onnx.name + ".data")
        if data.exists():  # external data keeps the file name the ONNX graph refers to
            shutil.copyfile(data, workdir / data.name)
            files.append(BuiltFile(data.name, "weights"))
    return files


# Loading -------------------------------------------------------------------------------------------------
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
        raise IntegrityError(f"{manifest.ref}: {entry.path} does not match its manifest; refusing to deserialize it",
                             hint="`enginefarm cache verify` evicts damaged artifacts")
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
        raise BackendUnavailable(f"{what}: the plan is not valid on this system ({_diagnostics(trt, diagnostics)})",
                                 hint="rebuild it for this GPU and SDK version, or use another artifact")
    if validity == getattr(trt.EngineValidity, "SUBOPTIMAL", None):
        log.warning("%s: the plan is valid here but may run slower (%s)", what, _diagnostics(trt, diagnostics))
        return "suboptimal"
    return "valid"


def _diagnostics(trt, bits) -> str:
    kinds = getattr(trt, "EngineInvalidityDiagnostics", None) or getattr(trt, "EngineValidityDiagnostics", None)
    value = int(getattr(bits, "value", bits) or 0)
    if kinds is None or not value:
        return f"diagnostics {value}"
    names = [name for name, member in getattr(kinds, "__members__", {}).items() if value & int(getattr(member, "value", member))]
    return ", ".join(names) or f"diagnostics {value}"


def precheck(trt, manifest, family_floors: dict[str, tuple[int, int]], what: str) -> dict[str, Any]:
    """Before any byte reaches the SDK: the runtime version the plan needs, and a GPU of its arch or class (returned).
    This is also the only check before deserializing on TensorRT versions without get_engine_validity."""
    from .base import version_in_range

    name = manifest.parsed_target.backend
    wanted = manifest.constraints.get("runtime", {}).get(name)
    if wanted and not version_in_range(trt.__version__, wanted):
        raise BackendUnavailable(f"{what}: the plan needs {name} {wanted}, this is {trt.__version__}", hint="rebuild it for this version")
    gpu, why = matching_gpu(manifest.parsed_target.device, family_floors)
    if gpu is None:
        raise BackendUnavailable(f"{what}: {why}")
    return gpu


def deserialize(trt, data: bytes, what: str, *, host_code: bool = False):
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    if host_code:
        # Version-compatible plans embed the lean runtime, which is host code the runtime must be allowed to run.
        runtime.engine_host_code_allowed = True
    validity = check_validity(trt, runtime, data, what)
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise BackendUnavailable(f"{what}: TensorRT could not deserialize the plan (validity: {validity})")
    return engine, logger


def refit_engine(trt, engine, logger, what: str, onnx_path: Path | None = None, weights: dict[str, np.ndarray] | None = None) -> None:
    """One refit: the weights of the shipped ONNX (a stripped plan has none of its own), then the named weights on
    top (ONNX initializer names, float32 in ONNX layout, each cast to the plan's dtype)."""
    from enginefarm.errors import ConfigError

    refitter = trt.Refitter(engine, logger)
    if onnx_path is not None:
        parser = trt.OnnxParserRefitter(refitter, logger)
        if not parser.refit_from_file(str(onnx_path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise IntegrityError(f"{what}: the ONNX weights do not fit the plan: {'; '.join(errors[:3]) or 'refit failed'}")
    kept = []  # TensorRT reads the arrays when refitting, so they must outlive set_named_weights
    if weights:
        known = set(refitter.get_all_weights())
        unknown = sorted(set(weights) - known)
        if unknown:
            raise ConfigError(f"{what}: the plan has no refittable weights {unknown[:5]}", hint=f"{len(known)} weights are refittable")
        for name, value in weights.items():
            prototype = refitter.get_weights_prototype(name)
            array = np.ascontiguousarray(value, dtype=trt.nptype(prototype.dtype))
            if array.size != prototype.size:
                raise ConfigError(f"{what}: weight {name} has {array.size} values, the plan expects {prototype.size}")
            kept.append(array)
            if not refitter.set_named_weights(name, trt.Weights(array)):
                raise ConfigError(f"{what}: TensorRT refused new values for {name}")
    if not refitter.refit_cuda_engine():
        raise IntegrityError(f"{what}: refitting the plan failed (missing weights: {list(refitter.get_missing_weights())[:5]})")


def require_refittable(manifest, defaults: dict[str, Any], what: str) -> None:
    """New weights need a plan built with REFIT: a stripped plan (REFIT_IDENTICAL) takes only the build's own."""
    from enginefarm.errors import ConfigError

    if not {**defaults, **manifest.options}["refittable"]:
        backend = manifest.parsed_target.backend
        raise ConfigError(f"{manifest.ref} {manifest.target}: this {what} was not built refittable, so it cannot take custom weights or LoRAs",
                          hint=f"set refittable = true in [components.{manifest.component}.options.{backend}] and rebuild")


def open_engine(trt, artifact_dir: Path, manifest, options: dict[str, Any], family_floors: dict[str, tuple[int, int]], noun: str,
                weights: dict[str, np.ndarray] | None):
    """(engine, gpu, how) from the verified plan: checked, deserialized, and refitted from the shipped weights
    (a stripped plan has none of its own) plus `weights` on top. Both backends open plans this one way."""
    what = f"{manifest.ref} {manifest.target} [{manifest.build_key[:12]}]"
    gpu = precheck(trt, manifest, family_floors, what)
    engine, logger = deserialize(trt, read_plan(artifact_dir, manifest), what, host_code=options.get("version_compatible", False))
    how, onnx = noun, None
    if options["strip_weights"]:
        onnx = weights_onnx(artifact_dir, manifest)
        if onnx is None:
            raise IntegrityError(f"{what}: a weight-stripped {noun} without its weights")
        how = f"weight-stripped {noun}, refitted from weights.onnx"
    if onnx is not None or weights:
        refit_engine(trt, engine, logger, what, onnx, weights)
        how += f", {len(weights)} weights replaced" if weights else ""
    return engine, gpu, how


def weights_onnx(artifact_dir: Path, manifest) -> Path | None:
    entry = next((f for f in manifest.files if f.role == "weights" and f.path.endswith(".onnx")), None)
    return None if entry is None else verified_file(artifact_dir, manifest, entry.path)


# Running -------------------------------------------------------------------------------------------------
def cudart():
    """CUDA runtime bindings from cuda-python (`cuda.bindings.runtime`; `cuda.cudart` before 12.6)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            raise BackendUnavailable("cuda-python is not installed", hint="pip install 'enginefarm[tensorrt]'") from None
    return runtime


class _Cuda:
    def __init__(self, device_index: int) -> None:
        self.rt = cudart()
        # NVML and CUDA number GPUs alike under CUDA_DEVICE_ORDER=PCI_BUS_ID; with one GPU, as on most user machines, always.
        self.call(self.rt.cudaSetDevice(device_index))
        self.stream = self.call(self.rt.cudaStreamCreate())
        self.buffers: dict[str, tuple[int, int]] = {}  # tensor name → (device pointer, capacity in bytes)

    def call(self, result):
        status, *rest = result if isinstance(result, tuple) else (result,)
        if int(status) != 0:
            raise RuntimeError(f"CUDA call failed: {status}")
        return rest[0] if len(rest) == 1 else tuple(rest) or None

    def buffer(self, name: str, nbytes: int) -> int:
        pointer, capacity = self.buffers.get(name, (0, 0))
        if capacity < nbytes:
            if pointer:
                self.call(self.rt.cudaFree(pointer))
            pointer = int(self.call(self.rt.cudaMalloc(max(nbytes, 1))))
            self.buffers[name] = (pointer, max(nbytes, 1))
        return pointer

    def upload(self, pointer: int, array: np.ndarray) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self.call(self.rt.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, kind, self.stream))

    def download(self, array: np.ndarray, pointer: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self.call(self.rt.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, kind, self.stream))

    def sync(self) -> None:
        self.call(self.rt.cudaStreamSynchronize(self.stream))

    def close(self) -> None:
        for pointer, _ in self.buffers.values():
            self.rt.cudaFree(pointer)
        self.buffers.clear()
        if self.stream is not None:
            self.rt.cudaStreamDestroy(self.stream)
            self.stream = None


class TrtSession:
    """Runs a deserialized engine through TensorRT's tensor API (set_input_shape, set_tensor_address, execute_async_v3)."""

    def __init__(self, trt, engine, context, precision: str, *, how: str = "", after_run=None, device_index: int = 0) -> None:
        self._trt, self._engine, self._context = trt, engine, context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self.compute_precision = precision
        self.how = how
        self._after_run = after_run  # called with the input shapes after each run (RTX saves its runtime cache)
        self._cuda = _Cuda(device_index)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        context, cuda = self._context, self._cuda
        held = []
        for name in self.input_names:
            array = np.ascontiguousarray(feeds[name], dtype=self._dtypes[name])
            held.append(array)
            if not context.set_input_shape(name, tuple(array.shape)):
                raise ValueError(f"input {name} shape {array.shape} is outside the plan's profile")
            pointer = cuda.buffer(name, array.nbytes)
            cuda.upload(pointer, array)
            context.set_tensor_address(name, pointer)
        outputs = {}
        for name in self.output_names:
            array = np.empty(tuple(context.get_tensor_shape(name)), dtype=self._dtypes[name])
            outputs[name] = array
            context.set_tensor_address(name, cuda.buffer(name, array.nbytes))
        if not context.execute_async_v3(int(cuda.stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        for name, array in outputs.items():
            cuda.download(array, cuda.buffers[name][0])
        cuda.sync()
        if self._after_run is not None:
            self._after_run({n: a.shape for n, a in zip(self.input_names, held)})
        return outputs

    def __del__(self) -> None:
        cuda = getattr(self, "_cuda", None)
        if cuda is not None:
            try:
                cuda.close()
            except Exception:
                pass
