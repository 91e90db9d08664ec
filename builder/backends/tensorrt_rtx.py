"""NVIDIA TensorRT-RTX: CPU-only ahead-of-time builds, specialized on the device at first run."""

import re

from ._pending import available, build, constraints, load, versions  # noqa: F401

NAME = "tensorrt-rtx"
DEVICES = re.compile(r"^(sm_\d{2,3}|ampere\+|turing\+|ada\+|blackwell\+)$")
DEVICE_HINT = "sm_XX or a family class: turing+, ampere+, ada+, blackwell+"
ONNX_PRECISION = "fp32"
