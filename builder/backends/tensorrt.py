"""NVIDIA TensorRT: per-architecture plans (sm_XX) or hardware-compatible plans (ampere+)."""

import re

from ._pending import available, build, constraints, load, versions  # noqa: F401

NAME = "tensorrt"
DEVICES = re.compile(r"^(sm_\d{2,3}|ampere\+)$")
DEVICE_HINT = "sm_XX for one GPU architecture (sm_86, sm_89, sm_120) or ampere+ for hardware-compatible plans"
ONNX_PRECISION = "fp32"
