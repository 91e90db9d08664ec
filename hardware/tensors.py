"""Where a tensor lives: `DeviceTensor`, an output a backend keeps on its device between runs (`Session.bind`,
runner/binding.py). Backends make them (ONNX Runtime's OrtValues, OpenVINO's tensors); the runner passes them on."""

from __future__ import annotations

from typing import Any

import numpy as np


class DeviceTensor:
    """An output kept where the backend computed it. `numpy()` copies it to the host; giving it as a feed to a run of
    the same backend passes it as it is."""

    def __init__(self, backend: str, value: Any, shape: tuple[int, ...], dtype: np.dtype, to_numpy) -> None:
        self.backend = backend  # the backend whose runs take `value` as it is
        self.value = value  # the backend's own tensor (an OrtValue, an openvino.Tensor, or a numpy array)
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._to_numpy = to_numpy

    def numpy(self) -> np.ndarray:
        return self._to_numpy(self.value)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # np.asarray(tensor) works wherever numpy is wanted
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceTensor({self.backend}, shape={list(self.shape)}, dtype={self.dtype})"


def host_tensor(array: np.ndarray) -> DeviceTensor:
    return DeviceTensor("host", array, array.shape, array.dtype, lambda value: value)
