"""A small fake of the TensorRT / TensorRT-RTX Python API, used only by tests (the real SDKs need an NVIDIA GPU
and cannot be installed on the test machine). It implements the subset enginefarm calls, with the same names and
shapes, and records every significant call as a JSON line in $FAKE_TRT_LOG so tests can see what our code asked
for, from the build subprocess too.

Under the hood a 'plan' is a header plus the ONNX model, and 'executing' it runs ONNX Runtime on the graph with
the engine's current weights, so refits and fp16 really change the numbers.

Switches (environment): FAKE_TRT_CRASH=segfault|exit|oom|hang (hang writes its pid to FAKE_TRT_PIDFILE; in
build_serialized_network; only for ONNX paths containing FAKE_TRT_CRASH_IF when set), FAKE_TRT_INVALID=1
(get_engine_validity says INVALID), FAKE_TRT_NO_VALIDITY=1 (the Runtime has no get_engine_validity), FAKE_TRT_WRONG=1
(an engine that runs but computes wrong numbers, as a miscompiled one would).

Where the real TensorRT-RTX can be observed on a machine without a GPU, the fake behaves the same (checked by
tests/backends/test_nvidia_sdk_conformance.py against the real SDK): errors go to the ILogger the Builder or Runtime
was given, set_compute_capability returns False instead of raising, fp32 GEMMs for SM75 and weight stripping or refit
without a GPU make build_serialized_network return None, and without a GPU get_engine_validity says (INVALID, 0) and
deserialize_cuda_engine returns None. "Without a GPU" is FAKE_NVML_GPUS empty, as NVML sees it.

Device memory (the fake cudart's ledger, tests/fakes/cuda): a deserialized engine takes its weights' bytes
(get_engine_stat(TOTAL_WEIGHTS_SIZE)), a context made STATIC (the default) takes device_memory_size_v2 more, one made
USER_MANAGED takes none and refuses to run until set_device_memory gave it a buffer that large. The builder records
both sizes in the plan, as the real one does: weights are the initializers' bytes, activations a stand-in (4x the
inputs at their profile's max; the real sizes cannot be read without a GPU: even deserialize_cuda_engine returns None),
or FAKE_TRT_DEVICE_MEMORY={"<part of the ONNX path>": [weights, activations]} for real-size numbers.

Optimization profiles: a plan keeps every profile added (add_optimization_profile answers -1 and logs why for one
whose opt is outside min..max, as the real one does); a context starts in profile 0, set_optimization_profile_async
selects another (False for an index the engine lacks) and forgets the input shapes, and set_input_shape answers
False for a shape outside the selected profile. Activations are per profile; device_memory_size_v2 is the largest.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import signal
import sys

import numpy as np

MAGIC = b"FAKEPLAN"
HEADER = 8192


def record(sdk: str, call: str, **args) -> None:
    path = os.environ.get("FAKE_TRT_LOG")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"sdk": sdk, "call": call, **args}, default=str) + "\n")


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT32 = 3
    INT64 = 8


_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT32: np.int32, DataType.INT64: np.int64}
_ONNX_TO_DT = {1: DataType.FLOAT, 10: DataType.HALF, 6: DataType.INT32, 7: DataType.INT64}


def nptype(dtype):
    return _NP[DataType(dtype)]


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    BF16 = 1
    REFIT = 2
    VERSION_COMPATIBLE = 3
    STRIP_PLAN = 4
    REFIT_IDENTICAL = 5


class HardwareCompatibilityLevel(enum.IntEnum):
    NONE = 0
    AMPERE_PLUS = 1


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class EngineStat(enum.IntEnum):
    TOTAL_WEIGHTS_SIZE = 0
    STRIPPED_WEIGHTS_SIZE = 1


class ExecutionContextAllocationStrategy(enum.IntEnum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


class EngineValidity(enum.IntEnum):
    VALID = 0
    SUBOPTIMAL = 1
    INVALID = 2


class EngineInvalidityDiagnostics(enum.IntFlag):
    VERSION_MISMATCH = 1
    UNSUPPORTED_CC = 2
    OLD_CUDA_DRIVER = 4
    OLD_CUDA_RUNTIME = 8
    INSUFFICIENT_GPU_MEMORY = 16
    MALFORMED_ENGINE = 32
    CUDA_ERROR = 64


class DynamicShapesKernelSpecializationStrategy(enum.IntEnum):  # TensorRT-RTX's IRuntimeConfig
    LAZY = 0
    EAGER = 1
    NONE = 2


class ComputeCapability(enum.IntEnum):
    NONE = 0
    CURRENT = 1
    SM75 = 75
    SM80 = 80
    SM86 = 86
    SM89 = 89
    SM120 = 120
    SM121 = 121


# TensorRT-RTX's own values (it has no FP16/BF16 builder flags and no EXPLICIT_BATCH: networks are strongly typed).
class RtxNetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 0


class RtxBuilderFlag(enum.IntEnum):
    REFIT = 4
    VERSION_COMPATIBLE = 12
    STRIP_PLAN = 18
    REFIT_IDENTICAL = 19


class ILogger:
    """Subclassed by callers (who call ILogger.__init__); the SDK calls log(severity, message)."""

    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self):
        pass

    def log(self, severity, msg):
        pass


class Logger(ILogger):
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = (
        ILogger.Severity[n] for n in ("INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE")
    )

    def __init__(self, min_severity=ILogger.Severity.WARNING):
        self.min_severity = min_severity

    def log(self, severity, msg):
        if severity <= self.min_severity:
            print(f"[TRT] {msg}", file=sys.stderr)


class IProgressMonitor:
    """Subclassed by callers; the builder calls phase_start, step_complete (False cancels) and phase_finish."""

    def __init__(self):
        pass


def _report_phases(monitor) -> None:
    if monitor is None:
        return
    monitor.phase_start("Building engine", None, 2)
    monitor.phase_start("Optimizing graph", "Building engine", 1)
    monitor.phase_finish("Optimizing graph")
    for step in range(2):
        monitor.step_complete("Building engine", step)
    monitor.phase_finish("Building engine")


def _error(logger, message: str) -> None:
    if logger is not None:
        logger.log(ILogger.Severity.ERROR, message)


_NO_DRIVER = "cudaError 35: CUDA driver version is insufficient for CUDA runtime version"
GEMM_OPS = {"MatMul", "Gemm"}  # and Einsum with two or more operands: what TensorRT-RTX compiles as a GEMM


def _fp32_gemms(model) -> list[str]:
    """Nodes the real SDK refuses for SM75 ('FP32 GEMM is not supported'), named as it names them."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {
        v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info) + list(graph.output)
    }
    types.update({i.name: i.data_type for i in graph.initializer})
    found = []
    for node in graph.node:
        gemm = node.op_type in GEMM_OPS or (node.op_type == "Einsum" and len(node.input) >= 2)
        if gemm and types.get(node.input[0]) == onnx.TensorProto.FLOAT:
            found.append(f"node_of_{node.output[0]}")
    return found


class Weights:
    def __init__(self, array):
        self.array = np.asarray(array)
        self.dtype = {np.float16: DataType.HALF}.get(self.array.dtype.type, DataType.FLOAT)
        self.size = self.array.size


class _HostMemory(bytes):
    """Like IHostMemory: a buffer (bytes(), memoryview()) with nbytes."""

    @property
    def data(self) -> bytes:
        return bytes(self)

    @property
    def nbytes(self) -> int:
        return len(self)


def _has_gpu() -> bool:
    return bool([g for g in os.environ.get("FAKE_NVML_GPUS", "").split(";") if g])


def _gpu_arch() -> str | None:
    gpus = [g for g in os.environ.get("FAKE_NVML_GPUS", "").split(";") if g]
    if not gpus:
        return None
    major, minor = gpus[0].rsplit(":", 1)[1].split(".")
    return f"sm_{major}{minor}"


def make_sdk(namespace: dict, sdk: str, version: str, *, rtx: bool) -> None:
    """Fill a fake SDK module's namespace."""

    class _Tensor:
        def __init__(self, name):
            self.name = name

    class OnnxParser:
        def __init__(self, network, logger):
            self.network = network
            self.errors = []

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, index):
            return self.errors[index]

        def parse_from_file(self, path):
            import onnx

            try:
                model = onnx.load(path)
            except Exception as exc:
                self.errors.append(f"cannot read {path}: {exc}")
                return False
            inits = {i.name for i in model.graph.initializer}
            self.network.model, self.network.path = model, path
            self.network.inputs = [i.name for i in model.graph.input if i.name not in inits]
            record(sdk, "parse_from_file", path=path, inputs=self.network.inputs)
            return True

    flags_enum = RtxBuilderFlag if rtx else BuilderFlag
    creation_flags = RtxNetworkDefinitionCreationFlag if rtx else NetworkDefinitionCreationFlag

    class Network:
        def __init__(self, flags):
            self.strongly_typed = bool(flags & (1 << int(creation_flags.STRONGLY_TYPED)))
            self.model, self.inputs, self.path = None, [], ""

        @property
        def num_inputs(self):
            return len(self.inputs)

        def get_input(self, index):
            return _Tensor(self.inputs[index])

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            self.shapes[name] = [list(lo), list(opt), list(hi)]  # the real one checks MIN<=OPT<=MAX when added

        def __bool__(self):
            return all(
                len(lo) == len(opt) == len(hi) and all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True))
                for lo, opt, hi in self.shapes.values()
            )

    class TimingCache:
        def __init__(self, entries):
            self.entries = set(entries)

        def combine(self, other, ignore_mismatch):
            record(sdk, "timing_cache_combine", entries=sorted(other.entries), ignore_mismatch=ignore_mismatch)
            self.entries |= other.entries
            return True

        def serialize(self):
            return _HostMemory(b"FAKETIMING" + json.dumps(sorted(self.entries)).encode())

    class BuilderConfig:
        def __init__(self, logger=None):
            self.logger = logger
            self.flags, self.profiles, self.timing = set(), [], None
            self.progress_monitor = None
            self.hardware_compatibility_level = HardwareCompatibilityLevel.NONE
            if rtx:
                self.num_compute_capabilities = 0
                self.capabilities = {}

        def set_flag(self, flag):
            self.flags.add(flags_enum(flag).name)

        def add_optimization_profile(self, profile):
            if not profile:  # the real one logs why and answers -1
                _error(
                    self.logger,
                    "IBuilderConfig::addOptimizationProfile: Error Code 3: API Usage Error (Parameter check failed, "
                    "condition: profile->isValid().  In addOptimizationProfile at "
                    "/_src/optimizer/api/builderConfig.cpp:569)",
                )
                return -1
            self.profiles.append(profile)
            return len(self.profiles) - 1

        @property
        def num_optimization_profiles(self):
            return len(self.profiles)

        def set_memory_pool_limit(self, pool, size):
            pass

        def create_timing_cache(self, blob):
            blob = bytes(blob)
            if not blob:
                return TimingCache(())
            if not blob.startswith(b"FAKETIMING"):
                return None
            return TimingCache(json.loads(blob[len(b"FAKETIMING") :]))

        def set_timing_cache(self, cache, ignore_mismatch):
            self.timing = cache
            return True

        def get_timing_cache(self):
            return self.timing

        if rtx:

            def set_compute_capability(self, capability, index):
                # The real SDK logs an API usage error and returns False (it does not raise).
                if not 0 <= index < self.num_compute_capabilities:
                    _error(
                        self.logger,
                        "IBuilderConfig::setComputeCapability: Error Code 3: API Usage Error (Parameter check failed, "
                        "condition: index >= 0 && index < std::ssize(mConfig.computeCapabilities). Index of compute "
                        "capability is not in a valid range.)",
                    )
                    return False
                if ComputeCapability(capability) == ComputeCapability.NONE:
                    _error(
                        self.logger,
                        "IBuilderConfig::setComputeCapability: Error Code 3: API Usage Error (Parameter check failed, "
                        "condition: computeCapability != ComputeCapability::kNONE. Compute capability cannot be "
                        "kNONE.)",
                    )
                    return False
                self.capabilities[index] = ComputeCapability(capability).name
                return True

            def get_compute_capability(self, index):
                return ComputeCapability[self.capabilities.get(index, "NONE")]

    class Builder:
        def __init__(self, logger):
            self.logger = logger

        def create_network(self, flags=0):
            return Network(flags)

        def create_builder_config(self):
            return BuilderConfig(self.logger)

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            crash = (
                os.environ.get("FAKE_TRT_CRASH") if os.environ.get("FAKE_TRT_CRASH_IF", "") in network.path else None
            )
            if crash == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if crash == "exit":
                os._exit(3)
            if crash == "oom":  # what the kernel's OOM killer does
                os.kill(os.getpid(), signal.SIGKILL)
            if crash == "hang":  # a build that never ends: tests stop the farm around it
                with open(os.environ["FAKE_TRT_PIDFILE"], "w") as handle:
                    handle.write(str(os.getpid()))
                import time

                time.sleep(600)
            profiles = config.profiles
            if not profiles or any(set(p.shapes) != set(network.inputs) for p in profiles):
                return None
            if rtx and not _rtx_can_build(self.logger, network, config):
                return None
            _report_phases(config.progress_monitor)
            header = {
                "sdk": sdk,
                "version": version,
                "flags": sorted(config.flags),
                "strongly_typed": network.strongly_typed,
                "hardware_compatibility_level": HardwareCompatibilityLevel(config.hardware_compatibility_level).name,
                "profile": profiles[0].shapes,
                "profiles": [p.shapes for p in profiles],
                "arch": None if rtx else _gpu_arch(),
                "compute_capabilities": [config.capabilities[i] for i in sorted(config.capabilities)] if rtx else [],
                "weights": {i.name: _digest(i) for i in network.model.graph.initializer},
                "device_memory": _device_memory(network, profiles),
            }
            record(
                sdk,
                "build_serialized_network",
                **{k: v for k, v in header.items() if k != "sdk"},
                timing_cache=config.timing is not None,
            )
            if config.timing is not None:
                entry = f"{hashlib.sha256(network.model.SerializeToString()).hexdigest()[:12]}"
                record(sdk, "timing_cache_lookup", hit=entry in config.timing.entries)
                config.timing.entries.add(entry)
            model = network.model
            if "STRIP_PLAN" in config.flags:
                model = _zeroed(model)
            text = json.dumps(header).encode()
            assert len(text) < HEADER - len(MAGIC), "fake plan header too long"
            return _HostMemory(MAGIC + text.ljust(HEADER - len(MAGIC)) + model.SerializeToString())

        def build_serialized_network_to_stream(self, network, config, writer):
            """TensorRT 10.11+ and TensorRT-RTX: the plan goes to an IStreamWriter, a piece at a time; False on
            failure."""
            plan = self.build_serialized_network(network, config)
            if plan is None:
                return False
            for start in range(0, len(plan), 1 << 16):
                piece = plan[start : start + (1 << 16)]
                if writer.write(piece) != len(piece):
                    return False
            record(sdk, "plan_streamed", size=len(plan))
            return True

    class IStreamWriter:
        def write(self, data) -> int:
            raise NotImplementedError

    class Runtime:
        engine_header_size = HEADER

        def __init__(self, logger):
            self.logger = logger
            self.engine_host_code_allowed = False

        def deserialize_cuda_engine(self, data):
            data = bytes(data)
            record(
                sdk,
                "deserialize_cuda_engine",
                sha256=hashlib.sha256(data).hexdigest(),
                host_code_allowed=self.engine_host_code_allowed,
            )
            if not data.startswith(MAGIC):
                _error(
                    self.logger,
                    "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (Serialization assertion "
                    "header.magicTag == kEXPECTED_MAGIC_TAG failed.)",
                )
                return None
            if rtx and not _has_gpu():
                _error(
                    self.logger,
                    f"IRuntime::deserializeCudaEngine: Error Code 1: Cuda Runtime (In ScopedCudaStream ({_NO_DRIVER}))",
                )
                return None
            header = json.loads(data[len(MAGIC) : HEADER])
            if "VERSION_COMPATIBLE" in header["flags"] and not self.engine_host_code_allowed:
                return None
            import onnx
            from cuda.bindings import runtime as cudart

            weights = header["device_memory"]["weights"]
            if not cudart.reserve(weights):
                _error(
                    self.logger,
                    f"IRuntime::deserializeCudaEngine: Error Code 2: OutOfMemory (Requested size was {weights} bytes.)",
                )
                return None
            engine = Engine(header, onnx.load_from_string(data[HEADER:]))
            engine.gpu = cudart  # what it gives back to when freed, even at interpreter exit
            return engine

    if not os.environ.get("FAKE_TRT_NO_VALIDITY"):

        def get_engine_validity(self, header_bytes):
            data = bytes(header_bytes)
            record(sdk, "get_engine_validity", size=len(data))
            if not data.startswith(MAGIC):
                return EngineValidity.INVALID, int(EngineInvalidityDiagnostics.MALFORMED_ENGINE)
            if os.environ.get("FAKE_TRT_INVALID"):
                return EngineValidity.INVALID, int(
                    EngineInvalidityDiagnostics.VERSION_MISMATCH | EngineInvalidityDiagnostics.UNSUPPORTED_CC
                )
            if rtx and not _has_gpu():  # the real SDK cannot tell without a GPU, and says INVALID with no diagnostics
                return EngineValidity.INVALID, 0
            if rtx and not _runs_on_gpu(json.loads(data[len(MAGIC) : HEADER])["compute_capabilities"]):
                return EngineValidity.INVALID, int(EngineInvalidityDiagnostics.UNSUPPORTED_CC)
            return EngineValidity.VALID, 0

        Runtime.get_engine_validity = get_engine_validity

    class RuntimeCache:
        def __init__(self):
            self.kernels = set()

        def deserialize(self, blob):
            blob = bytes(blob)
            if not blob.startswith(b"FAKEKERNELS"):
                return False
            self.kernels = set(json.loads(blob[len(b"FAKEKERNELS") :]))
            record(sdk, "runtime_cache_deserialize", kernels=sorted(self.kernels))
            return True

        def serialize(self):
            return _HostMemory(b"FAKEKERNELS" + json.dumps(sorted(self.kernels)).encode())

    class RuntimeConfig:
        dynamic_shapes_kernel_specialization_strategy = DynamicShapesKernelSpecializationStrategy.LAZY  # the default

        def __init__(self):
            self.cache = None

        def create_runtime_cache(self):
            return RuntimeCache()

        def set_runtime_cache(self, cache):
            self.cache = cache
            return True

        def set_execution_context_allocation_strategy(self, strategy=ExecutionContextAllocationStrategy.STATIC):
            self.strategy = ExecutionContextAllocationStrategy(strategy)

        def get_execution_context_allocation_strategy(self):
            return getattr(self, "strategy", ExecutionContextAllocationStrategy.STATIC)

    class Engine:
        def __init__(self, header, model):
            self.header, self.model = header, model
            self.stripped = "STRIP_PLAN" in header["flags"]
            self.weights = {i.name: _array(i) for i in model.graph.initializer}
            self.refitted = False
            inits = set(self.weights)
            self.io = [(i.name, TensorIOMode.INPUT) for i in model.graph.input if i.name not in inits]
            self.io += [(o.name, TensorIOMode.OUTPUT) for o in model.graph.output]
            types = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)}
            self.types = {name: _ONNX_TO_DT[types[name]] for name, _ in self.io}

        @property
        def num_io_tensors(self):
            return len(self.io)

        def get_tensor_name(self, index):
            return self.io[index][0]

        def get_tensor_mode(self, name):
            return dict(self.io)[name]

        def get_tensor_dtype(self, name):
            return self.types[name]

        @property
        def device_memory_size_v2(self):  # the largest over its profiles, what a STATIC context allocates
            return self.header["device_memory"]["activations"]

        def get_device_memory_size_for_profile_v2(self, profile_index):
            return self.header["device_memory"]["per_profile"][profile_index]

        @property
        def num_optimization_profiles(self):
            return len(self.header["profiles"])

        def get_tensor_profile_shape(self, name, profile_index):
            """[min, opt, max] of an input in one profile."""
            return [tuple(dims) for dims in self.header["profiles"][profile_index][name]]

        def get_engine_stat(self, stat=EngineStat.TOTAL_WEIGHTS_SIZE):
            if EngineStat(stat) == EngineStat.STRIPPED_WEIGHTS_SIZE and not self.stripped:
                return -1
            return self.header["device_memory"]["weights"]

        gpu = None  # the fake cudart its weights were reserved in (set by deserialize_cuda_engine)

        def __del__(self):
            if self.gpu is not None:
                self.gpu.release(self.header["device_memory"]["weights"])

        def create_execution_context(self, config=None):
            """TensorRT-RTX takes a runtime config (its allocation strategy inside); TensorRT the strategy itself."""
            if isinstance(config, RuntimeConfig):
                strategy = config.get_execution_context_allocation_strategy()
                specialization = config.dynamic_shapes_kernel_specialization_strategy.name
                record(sdk, "create_execution_context", strategy=strategy.name, specialization=specialization)
            else:
                strategy, config = ExecutionContextAllocationStrategy(config or 0), None
                record(sdk, "create_execution_context", strategy=strategy.name)
            return Context(self, config, strategy)

        if rtx:

            def create_runtime_config(self):
                return RuntimeConfig()

    class Context:
        active_optimization_profile = 0  # a new context runs in profile 0

        def __init__(self, engine, config, strategy=ExecutionContextAllocationStrategy.STATIC):
            from cuda.bindings import runtime as cudart

            self.engine, self.config, self.strategy = engine, config, strategy
            self.shapes, self.addresses, self._outputs = {}, {}, None
            self.owned = (
                0 if strategy == ExecutionContextAllocationStrategy.USER_MANAGED else engine.device_memory_size_v2
            )
            self.device_memory_bound = None  # (pointer, size) given by set_device_memory
            self.gpu = cudart
            if not cudart.reserve(self.owned):
                self.owned = 0
                raise MemoryError("fake GPU: out of memory for a context's activations")

        def __del__(self):
            self.gpu.release(self.owned)

        def set_device_memory(self, memory, size):
            from cuda.bindings import runtime as cudart

            ok = size >= self.engine.device_memory_size_v2 and cudart.allocation_size(memory) >= size
            record(sdk, "set_device_memory", size=size, ok=ok)
            if ok:  # the real one logs an API usage error and keeps what it had
                self.device_memory_bound = (memory, size)

        def set_optimization_profile_async(self, profile_index, stream_handle):
            """False for an index the engine does not have (the real one logs an API usage error); a switch forgets
            the input shapes, which must be set again in the new profile."""
            if not 0 <= profile_index < self.engine.num_optimization_profiles:
                return False
            record(sdk, "set_optimization_profile_async", index=profile_index)
            self.active_optimization_profile, self.shapes = profile_index, {}
            return True

        def set_input_shape(self, name, shape):
            """False for a shape outside the active profile: the real one never moves to another profile itself."""
            lo, _, hi = self.engine.header["profiles"][self.active_optimization_profile][name]
            ok = len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True))
            if ok:
                self.shapes[name] = tuple(shape)
            return ok

        def _run(self, feeds):
            import onnxruntime as ort
            from onnx import numpy_helper

            model = self.engine.model.__class__()
            model.CopyFrom(self.engine.model)
            for init in model.graph.initializer:
                init.CopyFrom(
                    numpy_helper.from_array(
                        self.engine.weights[init.name].astype(numpy_helper.to_array(init).dtype), init.name
                    )
                )
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            return dict(zip(names, session.run(names, feeds), strict=True))

        def get_tensor_shape(self, name):
            feeds = {
                n: np.zeros(self.shapes[n], nptype(self.engine.types[n]))
                for n, mode in self.engine.io
                if mode == TensorIOMode.INPUT
            }
            return self._run(feeds)[name].shape

        def set_tensor_address(self, name, pointer):
            self.addresses[name] = pointer
            return True

        def execute_async_v3(self, stream_handle):
            from cuda.bindings import runtime as cudart

            if self.engine.stripped and not self.engine.refitted:
                record(sdk, "execute_unrefitted")
                return False
            if self.strategy == ExecutionContextAllocationStrategy.USER_MANAGED and self.device_memory_bound is None:
                record(sdk, "execute_without_device_memory")
                return False
            feeds = {}
            for name, mode in self.engine.io:
                if mode == TensorIOMode.INPUT:
                    dtype = nptype(self.engine.types[name])
                    count = int(np.prod(self.shapes[name])) * np.dtype(dtype).itemsize
                    feeds[name] = np.frombuffer(bytes(cudart.MEMORY[self.addresses[name]][:count]), dtype).reshape(
                        self.shapes[name]
                    )
            outputs = self._run(feeds)
            if os.environ.get("FAKE_TRT_WRONG"):  # a miscompiled engine: runs, but the numbers are off
                outputs = {n: (v * np.asarray(0.5, v.dtype) + np.asarray(0.25, v.dtype)) for n, v in outputs.items()}
            for name, value in outputs.items():
                raw = np.ascontiguousarray(value).tobytes()
                cudart.MEMORY[self.addresses[name]][: len(raw)] = raw
            if self.config is not None and self.config.cache is not None:
                self.config.cache.kernels.add(json.dumps({n: list(s) for n, s in sorted(self.shapes.items())}))
            record(
                sdk,
                "execute_async_v3",
                shapes={n: list(s) for n, s in self.shapes.items()},
                profile=self.active_optimization_profile,
            )
            return True

    class Refitter:
        def __init__(self, engine, logger):
            self.engine, self.pending = engine, {}
            refit_flags = {"REFIT", "REFIT_IDENTICAL"} & set(engine.header["flags"])
            self.names = list(engine.weights) if refit_flags else []

        def get_all_weights(self):
            return list(self.names)

        def get_weights_prototype(self, name):
            return Weights(self.engine.weights[name])

        def set_named_weights(self, name, weights):
            if name not in self.names:
                return False
            self.pending[name] = np.array(weights.array)
            return True

        def get_missing_weights(self):
            return (
                [n for n in self.names if n not in self.pending]
                if self.engine.stripped and not self.engine.refitted
                else []
            )

        def refit_cuda_engine(self):
            if self.get_missing_weights():
                return False
            if "REFIT" not in self.engine.header["flags"]:  # REFIT_IDENTICAL: only the build's own weights
                for name, value in self.pending.items():
                    if (
                        hashlib.sha256(value.astype(self.engine.weights[name].dtype).tobytes()).hexdigest()
                        != self.engine.header["weights"][name]
                    ):
                        record(sdk, "refit_rejected", name=name)
                        return False
            record(sdk, "refit_cuda_engine", names=sorted(self.pending))
            for name, value in self.pending.items():
                self.engine.weights[name] = value.astype(self.engine.weights[name].dtype).reshape(
                    self.engine.weights[name].shape
                )
            self.engine.refitted = True
            self.pending = {}
            return True

    class OnnxParserRefitter:
        def __init__(self, refitter, logger):
            self.refitter, self.errors = refitter, []

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, index):
            return self.errors[index]

        def refit_from_file(self, path):
            import onnx

            record(sdk, "refit_from_file", path=path)
            for init in onnx.load(path).graph.initializer:
                if not self.refitter.set_named_weights(init.name, Weights(_array(init))):
                    self.errors.append(f"weight {init.name} is not refittable")
            return not self.errors

    namespace.update(
        __version__=version,
        ILogger=ILogger,
        Logger=Logger,
        IProgressMonitor=IProgressMonitor,
        Builder=Builder,
        Runtime=Runtime,
        OnnxParser=OnnxParser,
        Refitter=Refitter,
        OnnxParserRefitter=OnnxParserRefitter,
        Weights=Weights,
        nptype=nptype,
        DataType=DataType,
        float32=DataType.FLOAT,
        TensorIOMode=TensorIOMode,
        NetworkDefinitionCreationFlag=creation_flags,
        BuilderFlag=flags_enum,
        HardwareCompatibilityLevel=HardwareCompatibilityLevel,
        MemoryPoolType=MemoryPoolType,
        EngineValidity=EngineValidity,
        EngineStat=EngineStat,
        ExecutionContextAllocationStrategy=ExecutionContextAllocationStrategy,
        EngineInvalidityDiagnostics=EngineInvalidityDiagnostics,
        IStreamWriter=IStreamWriter,
        ICudaEngine=Engine,
        IExecutionContext=Context,
        IBuilderConfig=BuilderConfig,
        IRuntimeConfig=RuntimeConfig,
    )
    if rtx:
        namespace["ComputeCapability"] = ComputeCapability
        namespace["DynamicShapesKernelSpecializationStrategy"] = DynamicShapesKernelSpecializationStrategy


def _rtx_can_build(logger, network, config) -> bool:
    """What TensorRT-RTX refuses to build, with its own words in the log."""
    capabilities = [config.capabilities[i] for i in sorted(config.capabilities)]
    if "CURRENT" in capabilities and not _has_gpu():
        _error(
            logger,
            f"IBuilder::buildSerializedNetwork: Error Code 1: Cuda Runtime (In generateForCurrent ({_NO_DRIVER}))",
        )
        return False
    if "SM75" in capabilities:
        for node in _fp32_gemms(network.model):
            _error(
                logger,
                "IBuilder::buildSerializedNetwork: Error Code 1: Myelin ([pass.cpp:337: "
                f"check_turing_op_compatibility] Cannot compile operation '{node}' for Turing (SM75): FP32 GEMM is "
                "not supported. In compileGraph)",
            )
            return False
    weights_flags = {"STRIP_PLAN", "REFIT", "REFIT_IDENTICAL"} & config.flags
    if weights_flags and network.model.graph.initializer and not _has_gpu():
        print(
            "Internal Error: MyelinCheckException: graph_jit.cpp:278: CHECK(status == CUDA_SUCCESS) failed. ",
            file=sys.stderr,
        )
        _error(
            logger,
            "IBuilder::buildSerializedNetwork: Error Code 1: Myelin ([myelin_graph.h:1295: attachExceptionMsgToGraph] "
            "MyelinCheckException: graph_jit.cpp:278: CHECK(status == CUDA_SUCCESS) failed.  In compileGraph)",
        )
        return False
    return True


def _runs_on_gpu(capabilities: list[str]) -> bool:
    """Whether this 'GPU' is one the plan was built for: its named capabilities, or 8.6 and later (the default)."""
    arch = _gpu_arch()
    here = int(arch[3:])
    return f"SM{here}" in capabilities if capabilities else here >= 86


def _device_memory(network, profiles) -> dict:
    """What the plan records of the engine's device memory (see the module's docstring): activations per profile,
    and the largest of them, which is what device_memory_size_v2 answers."""
    for part, (weights, activations) in json.loads(os.environ.get("FAKE_TRT_DEVICE_MEMORY") or "{}").items():
        if part in network.path:
            per_profile = [int(activations)] * len(profiles)
            return {"weights": int(weights), "activations": int(activations), "per_profile": per_profile}
    weights = sum(_array(i).nbytes for i in network.model.graph.initializer)
    per_profile = [4 * sum(int(np.prod(shapes[2])) * 4 for shapes in p.shapes.values()) for p in profiles]
    return {"weights": weights, "activations": max(per_profile), "per_profile": per_profile}


def _array(init):
    from onnx import numpy_helper

    return numpy_helper.to_array(init)


def _digest(init) -> str:
    return hashlib.sha256(_array(init).tobytes()).hexdigest()


def _zeroed(model):
    """A weight-stripped plan keeps the graph but not the weights."""
    from onnx import numpy_helper

    stripped = model.__class__()
    stripped.CopyFrom(model)
    for init in stripped.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(np.zeros_like(_array(init)), init.name))
    return stripped
