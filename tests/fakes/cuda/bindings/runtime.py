"""Fake cuda-python runtime bindings for tests: 'device memory' is host memory, so data really moves."""

import ctypes
import enum
import os

MEMORY: dict[int, bytearray] = {}
_NEXT = [0x10000]


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
    pointer = _NEXT[0]
    _NEXT[0] += size + 4096
    MEMORY[pointer] = bytearray(size)
    return cudaError_t.cudaSuccess, pointer


def cudaFree(pointer):
    MEMORY.pop(pointer, None)
    return (cudaError_t.cudaSuccess,)


def cudaMemcpyAsync(dst, src, count, kind, stream):
    if kind == cudaMemcpyKind.cudaMemcpyHostToDevice:
        MEMORY[dst][:count] = ctypes.string_at(src, count)
    else:
        ctypes.memmove(dst, bytes(MEMORY[src][:count]), count)
    return (cudaError_t.cudaSuccess,)
