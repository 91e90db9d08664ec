"""Fake nvidia-ml-py for tests: the GPUs come from FAKE_NVML_GPUS ("NAME:MAJOR.MINOR;..."), none if unset."""

import os


class NVMLError(Exception):
    pass


def _gpus():
    return [item.rsplit(":", 1) for item in os.environ.get("FAKE_NVML_GPUS", "").split(";") if item]


def nvmlInit():
    if not _gpus():
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown():
    pass


def nvmlSystemGetDriverVersion():
    return os.environ.get("FAKE_NVML_DRIVER", "550.54.14")


def nvmlDeviceGetCount():
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetName(handle):
    return _gpus()[handle][0]


def nvmlDeviceGetCudaComputeCapability(handle):
    major, minor = _gpus()[handle][1].split(".")
    return int(major), int(minor)


class _Memory:
    total = 24 << 30


def nvmlDeviceGetMemoryInfo(handle):
    return _Memory()
