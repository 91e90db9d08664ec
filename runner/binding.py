"""Tensors that stay on the device between calls: `Session.bind(fixed)` places the inputs that do not change from one
call to the next (a prompt's text states in a denoising loop) on the device once, and each `run` of the binding copies
in only what changed. Outputs named in `keep=` come back as `DeviceTensor` handles (hardware/tensors.py) that a later
run (of this binding or another session of the same backend) takes as an input without a copy through numpy.

    with unet.bind({"encoder_hidden_states": text}) as step:
        for t in timesteps:
            noise = step.run({"sample": x, "timestep": t})["out_sample"]      # numpy, as Session.run gives

Backends that can do it implement `bind(fixed)` on their session (ONNX Runtime: an I/O binding of OrtValues;
OpenVINO: an infer request of its own whose input tensors are set once); the others get `HostBinding`, which keeps
the fixed inputs as checked numpy arrays and calls `run`: the same results, without the saving.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from enginefarm.hardware.tensors import DeviceTensor, host_tensor


class HostBinding:
    """The fallback for backends without device-resident inputs: the fixed inputs are kept and passed to every run."""

    name = "host"

    def __init__(self, backend_session, fixed: dict[str, np.ndarray]) -> None:
        self._session = backend_session
        self._fixed = fixed

    def run(self, feeds: dict[str, Any], keep: tuple[str, ...] = ()) -> dict[str, Any]:
        arrays = {name: value.numpy() if isinstance(value, DeviceTensor) else value for name, value in feeds.items()}
        out = self._session.run({**self._fixed, **arrays})
        return {name: host_tensor(value) if name in keep else value for name, value in out.items()}

    def close(self) -> None:
        self._session, self._fixed = None, {}
