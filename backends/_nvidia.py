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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.runner.device_info import nvidia_gpus
from enginefarm.errors import BackendUnavailable, BuildError, IntegrityError

from .base import Availability, Backend, Built, BuiltFile, import_sdk

log = logging.getLogger(__name__)

INDEX_NOTE = "its wheels download from NVIDIA's package index, which must be reachable from where you install"
_CHILD = "enginefarm.backends._nvidia_build"


def sdk(module: str, extra: str, note: str = INDEX_NOTE):
    return import_sdk(module, f"pip install 'enginefarm[{extra}]' ({note})")


def sdk_missing(exc: BackendUnavailable, gpu_why: str = "", note: str = INDEX_NOTE) -> Availability:
    """Why a backend is unavailable when its SDK is not installed (`note`: where its wheels come from), plus
    (where building needs one) the GPU story."""
    return Availability.missing(f"{exc} — {note}" + (f"; and {gpu_why}" if gpu_why else ""))


# The SDK's generic follow-up to an error it has already logged in its own words; never the one to report.
_ECHOES = ("catchCudaError",)
KEPT_ERRORS = 20  # of the SDK's errors, kept in a failed build's result


class SdkError(RuntimeError):
    """The SDK refused a call; the message is its own last error."""


def capturing_logger(trt):
    """An ILogger subclass of this SDK that keeps its latest errors and passes warnings and worse to logging."""

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg) -> None:
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(str(msg))
                del self.errors[:-KEPT_ERRORS]
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                log.warning("[%s] %s", trt.__name__, msg)

        def last_error(self) -> str:
            specific = [e for e in self.errors if not any(echo in e for echo in _ECHOES)]
            return (specific or self.errors or [""])[-1]

        def refused(self, what: str) -> SdkError:
            last = self.last_error()
            return SdkError(f"{what}: {last}" if last else f"{what}, and the SDK logged no error")

    return CapturingLogger()



# Devices -------------------------------------------------------------------------------------------------
def gpu_runs(device: str, gpu: dict[str, Any], family_floors: dict[str, tuple[int, int]]) -> bool:
    """Whether a GPU (NVML description) runs plans for the device class: sm_XX exactly, or a family class from its floor."""
    if device.startswith("sm_"):
        return gpu["arch"] == device
    floor = family_floors.get(device)
    return floor is not None and (gpu["major"], gpu["minor"]) >= floor


class NvidiaBackend(Backend, abstract=True):
    """What TensorRT and TensorRT-RTX share: NVIDIA GPUs matched by compute capability, farm runners labelled nvidia,
    builds that hold the weights about three times (builder/memory.py)."""
    probes = ("nvidia",)

    vendor_label = "nvidia"
    onnx_precision = "same"  # strongly typed: the prepared ONNX says fp16 or fp32
    build_memory_factor = 3.0
    example_device = "ampere+"
    family_floors: dict[str, tuple[int, int]] = {}  # family class -> lowest compute capability it covers
    left_out: frozenset[int] = frozenset()  # capabilities (major*10+minor) this backend does not run at all

    def device_classes(self, device) -> tuple[str, ...]:
        """The GPU's exact arch, then every family class whose floor it reaches."""
        digits = str(device.info.get("arch", "")).removeprefix("sm_")
        if device.kind != "nvidia" or not digits.isdigit() or len(digits) < 2 or int(digits) in self.left_out:
            return ()
        capability = (int(digits[:-1]), int(digits[-1]))
        return (f"sm_{digits}", *[name for name, floor in self.family_floors.items() if capability >= floor])

    artifact_noun = "plan"  # what errors call the artifact: TensorRT's plan, TensorRT-RTX's engine

    def bench_device(self, manifest) -> dict:
        return gpu_description(manifest.parsed_target.device, self.family_floors)

    def open(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray] | None) -> "TrtSession":
        """The artifact's engine, refitted with `weights` when given."""
        raise NotImplementedError

    def load(self, artifact_dir: Path, manifest, device: str = "") -> "TrtSession":
        return self.open(Path(artifact_dir), manifest, None)

    def refit(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], device: str = "") -> "TrtSession":
        """Load like `load`, then replace the named weights (ONNX initializer names, float32 in ONNX layout; cast to the
        engine's dtype). Every call starts from the artifact's own weights, so nothing of an earlier refit remains."""
        self.check_refit(manifest)
        return self.open(Path(artifact_dir), manifest, weights)

    def check_refit(self, manifest) -> None:
        require_refittable(manifest, self.options, self.artifact_noun)


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
    weight_streaming: bool = False  # streamable plan: the runtime keeps only a budget of its weights on the GPU
    version_compatible: bool = False
    hardware_compatible: bool = False  # TensorRT's ampere+ level
    compute_capabilities: list[str] = field(default_factory=list)  # TensorRT-RTX: ComputeCapability member names
    timing_caches: list[str] = field(default_factory=list)  # serialized caches to merge before building
    timing_cache_out: str | None = None
    progress: str | None = None  # where the build process appends its phases (JSON lines), when someone watches


# (done, total, phase) of the engine build, as the SDK's progress monitor reports it.
BuildProgress = Callable[[int, int, str], None]


def build_in_subprocess(spec: BuildSpec, workdir: Path, what: str, *, hints: dict[str, str] | None = None,
                        progress: BuildProgress | None = None) -> dict[str, Any]:
    """Run the SDK build in a fresh Python process and return its notes. Its crash, abort or OOM kill becomes a
    BuildError; so does the SDK's refusal, in its own words. `hints`: text in the SDK's error → the fix to suggest.
    `progress` receives the build's phases while it runs."""
    spec_path = workdir.parent / "build-spec.json"
    result_path = workdir.parent / "build-result.json"
    progress_path = workdir.parent / "build-progress.jsonl"
    result_path.unlink(missing_ok=True)
    progress_path.unlink(missing_ok=True)
    if progress is not None:
        spec = replace(spec, progress=str(progress_path))
    write_bytes_atomic(spec_path, json.dumps(asdict(spec)).encode())
    env = dict(os.environ)
    # The child imports exactly what this process can: same interpreter, same module path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    process = subprocess.Popen([sys.executable, "-m", _CHILD, str(spec_path), str(result_path), str(os.getpid())], env=env)
    read = 0
    try:
        while True:
            try:
                code = process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                code = None
            if progress is not None:
                read = _forward_progress(progress_path, read, progress)
            if code is not None:
                break
    except BaseException:
        process.kill()
        process.wait()
        raise
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if result and result.get("error"):
        error = result["error"]
        hint = next((fix for text, fix in (hints or {}).items() if text in error), None)
        raise BuildError(f"{what}: {error}", hint=hint, sdk_errors=result.get("sdk_errors", []))
    if code != 0 or not result:
        raise BuildError(f"{what}: the build process died ({describe_exit(code)})", hint="a crash or out-of-memory in the SDK; the other jobs go on")
    return result.get("notes", {})


def _forward_progress(path: Path, offset: int, progress: BuildProgress) -> int:
    """Reports the complete lines the build process appended since `offset`; returns the new offset."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return offset
    complete = chunk[: chunk.rfind(b"\n") + 1]
    for line in complete.splitlines():
        try:
            step = json.loads(line)
            progress(int(step["done"]), int(step["total"]), str(step["phase"]))
        except (ValueError, KeyError, TypeError):
            continue
        except Exception:  # the watcher's own failure never fails the build
            log.debug("build progress callback failed", exc_info=True)
    return offset + len(complete)


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


def build_engine(sdk: str, prepared_onnx: Path, job, workdir: Path, options: dict[str, Any], *, hints: dict[str, str] | None = None,
                 progress: BuildProgress | None = None, **sdk_fields) -> Built:
    """What both SDKs' builds share: the job's profile and precision, weight stripping and refit, run in the build
    process; `sdk_fields` are the BuildSpec fields only one of them sets."""
    spec = BuildSpec(sdk=sdk, onnx=str(prepared_onnx), plan=str(workdir / "model.plan"), profile=job.profile, precision=job.precision,
                     strip_weights=options["strip_weights"], refittable=options["refittable"],
                     weight_streaming=options.get("weight_streaming", False), **sdk_fields)
    notes = build_in_subprocess(spec, workdir, f"{job.label}: {job.target.backend}", hints=hints, progress=progress)
    return Built(stripped_files(prepared_onnx, workdir, options["strip_weights"]), notes)


def stripped_files(prepared_onnx: Path, workdir: Path, strip_weights: bool) -> list[BuiltFile]:
    """The plan, plus the ONNX its weights are refitted from when it is weight-stripped."""
    files = [BuiltFile("model.plan", "engine")]
    if strip_weights:
        from enginefarm.builder.onnx_data import link_or_copy  # the prepared files are never rewritten: a link is a copy for free

        link_or_copy(prepared_onnx, workdir / "weights.onnx")
        files.append(BuiltFile("weights.onnx", "weights"))
        data = prepared_onnx.with_name(prepared_onnx.name + ".data")
        if data.exists():  # external data keeps the file name the ONNX graph refers to
            link_or_copy(data, workdir / data.name)
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
    logger = capturing_logger(trt)
    runtime = trt.Runtime(logger)
    if host_code:
        # Version-compatible plans embed the lean runtime, which is host code the runtime must be allowed to run.
        runtime.engine_host_code_allowed = True
    validity = check_validity(trt, runtime, data, what)
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise BackendUnavailable(f"{what}: {trt.__name__} could not deserialize the plan (validity: {validity}): {logger.last_error() or 'no error logged'}")
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


def cuda_devices() -> int:
    """GPUs the CUDA runtime can use here (0 without a driver). Building weight-stripped or refittable TensorRT-RTX
    engines needs one; NVML seeing a GPU is not enough."""
    try:
        status, *rest = cudart().cudaGetDeviceCount()
    except Exception:  # no bindings, or bindings that cannot load the runtime
        return 0
    return int(rest[0] or 0) if int(status) == 0 and rest else 0


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

    def close(self) -> None:
        """The device buffers and stream first, then the context before the engine that made it."""
        cuda, self._cuda = getattr(self, "_cuda", None), None
        if cuda is not None:
            cuda.close()
        self._context = self._engine = None

    def __del__(self) -> None:
        cuda = getattr(self, "_cuda", None)
        if cuda is not None:
            try:
                cuda.close()
            except Exception:
                pass
