"""Running an engine: CUDA through cuda-python (device buffers, a stream) and TensorRT's tensor API."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from enginefarm.errors import BackendUnavailable, InputError, SessionClosed

from ..device_memory import DeviceMemory
from .activations import SharedActivations, engine_memory
from .profiles import ProfilePicker


def cudart():
    """CUDA runtime bindings from cuda-python (`cuda.bindings.runtime`; `cuda.cudart` before 12.6)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime
        except ImportError:
            raise BackendUnavailable(
                "cuda-python is not installed", hint="pip install 'enginefarm[tensorrt]'"
            ) from None
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
        # NVML and CUDA number GPUs alike under CUDA_DEVICE_ORDER=PCI_BUS_ID; with one GPU, as on most user machines,
        # always.
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
    """Runs a deserialized engine through TensorRT's tensor API (set_input_shape, set_tensor_address,
    execute_async_v3). An engine built with several optimization profiles runs each request in the one whose opt is
    its shape, else the nearest that holds it (profiles.py), selected with set_optimization_profile_async before its
    shapes are set. `shared`: the pipeline's activation buffer its context (made without device memory) runs in;
    `plan_bytes`: its plan's size, the weights' stand-in where the SDK cannot say."""

    def __init__(
        self,
        trt,
        engine,
        context,
        precision: str,
        *,
        how: str = "",
        after_run=None,
        device_index: int = 0,
        shared: SharedActivations | None = None,
        plan_bytes: int = 0,
    ) -> None:
        self._trt, self._engine, self._context = trt, engine, context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self.compute_precision = precision
        self.how = how
        self._after_run = after_run  # called with the input shapes after each run (RTX saves its runtime cache)
        self._cuda: _Cuda | None = _Cuda(device_index)
        self._profiles = ProfilePicker(engine, self.input_names)
        if len(self._profiles) > 1:  # what explain() says the session opened
            self.how += f", {len(self._profiles)} optimization profiles"
        self._active = 0  # a new context runs in profile 0
        self._memory = engine_memory(trt, engine, plan_bytes, shared is not None)
        self._shared = shared
        if shared is not None:
            shared.join(self, self._memory.activations)

    def device_memory(self) -> DeviceMemory | None:
        """Its bytes on the GPU (weights, activations, our input and output buffers); None once closed."""
        if self._cuda is None:
            return None
        return replace(self._memory, io=sum(capacity for _, capacity in self._cuda.buffers.values()))

    def device_free(self) -> int | None:
        """The GPU's free bytes now (cudaMemGetInfo): what a memory budget of "auto" starts from."""
        if self._cuda is None:
            return None
        free, _ = self._cuda.call(self._cuda.rt.cudaMemGetInfo())
        return int(free)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        context, cuda = self._context, self._cuda
        if cuda is None:
            raise SessionClosed("this TensorRT session is closed")
        held = [np.ascontiguousarray(feeds[name], dtype=self._dtypes[name]) for name in self.input_names]
        self._select_profile({n: tuple(a.shape) for n, a in zip(self.input_names, held, strict=True)}, cuda.stream)
        for name, array in zip(self.input_names, held, strict=True):
            if not context.set_input_shape(name, tuple(array.shape)):
                raise InputError(
                    f"input {name} shape {list(array.shape)} is outside the plan's profile",
                    hint=self._profiles.describe(self._active) if self._profiles.profiles else None,
                )
            pointer = cuda.buffer(name, array.nbytes)
            cuda.upload(pointer, array)
            context.set_tensor_address(name, pointer)
        outputs = {}
        for name in self.output_names:
            array = np.empty(tuple(context.get_tensor_shape(name)), dtype=self._dtypes[name])
            outputs[name] = array
            context.set_tensor_address(name, cuda.buffer(name, array.nbytes))
        if self._shared is not None:  # another engine may have grown or moved the buffer since this one last ran
            self._shared.bind(context, cuda.rt)
        if not context.execute_async_v3(int(cuda.stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        for name, array in outputs.items():
            cuda.download(array, cuda.buffers[name][0])
        cuda.sync()
        if self._after_run is not None:
            self._after_run({n: a.shape for n, a in zip(self.input_names, held, strict=True)})
        return outputs

    @property
    def active_profile(self) -> int:
        """The optimization profile the last run ran in."""
        return self._active

    def _select_profile(self, shapes: dict[str, tuple[int, ...]], stream) -> None:
        """Switch the context to the profile picked for `shapes`, on the session's stream (the run that follows is
        enqueued after the switch); the SDK asks for every input shape again after it."""
        index = self._profiles.pick(shapes)
        if index == self._active:
            return
        if not self._context.set_optimization_profile_async(index, int(stream)):
            raise RuntimeError(f"TensorRT refused optimization profile {index} of {len(self._profiles)}")
        self._active = index

    def close(self) -> None:
        """The device buffers and stream first, then the context before the engine that made it."""
        cuda, self._cuda = getattr(self, "_cuda", None), None
        if cuda is not None:
            cuda.close()
        self._context = self._engine = None
        shared, self._shared = getattr(self, "_shared", None), None
        if shared is not None:  # after the context: it may not outlive the buffer it was given
            shared.leave(self)

    def __del__(self) -> None:
        cuda = getattr(self, "_cuda", None)
        if cuda is not None:
            try:
                cuda.close()
            except Exception:
                pass
        shared = getattr(self, "_shared", None)
        if shared is not None:
            shared.leave(self)
