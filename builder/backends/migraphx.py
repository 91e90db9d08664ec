"""AMD MIGraphX: compiled .mxr programs per gfx target."""

import re

from ._pending import available, build, constraints, load, versions  # noqa: F401

NAME = "migraphx"
DEVICES = re.compile(r"^gfx[0-9a-f]{3,4}$")
DEVICE_HINT = "a gfx target such as gfx1100, gfx1030, gfx90a"
ONNX_PRECISION = "fp32"
