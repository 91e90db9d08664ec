"""Fake cuda-python runtime bindings for tests: 'device memory' is host memory, so data really moves.

The GPU has FAKE_CUDA_MEMORY bytes (default 24 GiB, as the fake NVML says); what is allocated on it (cudaMalloc, and
what the fake TensorRT reserves for an engine's weights and a context's activations) is counted in USED, its high-water
mark in PEAK, and past the capacity an allocation fails as the real one does. Allocations over 64 MiB get no host
memory behind them (tests of the accounting use real-size numbers; nothing copies into such buffers).
"""

import ctypes
import enum
import os

MEMORY: dict[int, bytearray] = {}
_NEXT = [0x10000]
USED = [0]
PEAK = [0]
_SIZES: dict[int, int] = {}
_BACKED = 64 << 20


def capacity() -> int:
    return int(os.environ.get("FAKE_CUDA_MEMORY", str(24 << 30)))


def reserve(nbytes: int) -> bool:
    """Take `nbytes` of the GPU (False, taking nothing, when they do not fit)."""
    if USED[0] + nbytes > capacity():
        return False
    USED[0] += nbytes
    PEAK[0] = max(PEAK[0], USED[0])
    return True


def release(nbytes: int) -> None:
    USED[0] -= nbytes


def reset_peak() -> None:
    PEAK[0] = USED[0]


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2


def cudaGetDeviceCount():
    """As the real bindings answer: the GPUs of FAKE_NVML_GPUS, or (cudaErrorInsufficientDriver, None) without a
    driver."""
    count = len([g for g in os.environ.get("FAKE_NVML_GPUS", "").split(";") if g])
    return (cudaError_t.cudaSuccess, count) if count else (cudaError_t.cudaErrorInsufficientDriver, None)


def cudaSetDevice(index):
    return (cudaError_t.cudaSuccess,)


def cudaStreamCreate():
    return cudaError_t.cudaSuccess, 7


def cudaStreamDestroy(stream):
    return (cudaError_t.cudaSuccess,)


def cudaStreamSynchronize(stream):
    return (cudaError_t.cudaSuccess,)


def cudaMalloc(size):
    if not reserve(size):
        return cudaError_t.cudaErrorMemoryAllocation, 0
    pointer = _NEXT[0]
    _NEXT[0] += size + 4096
    MEMORY[pointer] = bytearray(size) if size <= _BACKED else bytearray(0)
    _SIZES[pointer] = size
    return cudaError_t.cudaSuccess, pointer


def cudaFree(pointer):
    MEMORY.pop(pointer, None)
    release(_SIZES.pop(pointer, 0))
    return (cudaError_t.cudaSuccess,)


def cudaMemGetInfo():
    """(status, free, total) of the current device."""
    return cudaError_t.cudaSuccess, capacity() - USED[0], capacity()


def allocation_size(pointer) -> int:
    """What cudaMalloc gave at `pointer` (0: not an allocation): for the fake TensorRT's checks."""
    return _SIZES.get(pointer, 0)


def cudaMemcpyAsync(dst, src, count, kind, stream):
    if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
        MEMORY[dst][:count] = ctypes.string_at(src, count)
    else:
        ctypes.memmove(dst, bytes(MEMORY[src][:count]), count)
    return (cudaError_t.cudaSuccess,)
