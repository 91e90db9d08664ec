"""Apple Core ML: ML program packages (.mlpackage) for Apple silicon."""

import re

from ._pending import available, build, constraints, load, versions  # noqa: F401

NAME = "coreml"
DEVICES = re.compile(r"^(apple|apple-m[1-9])$")
DEVICE_HINT = "apple (any Apple-silicon Mac) or apple-mN"
ONNX_PRECISION = "fp32"
