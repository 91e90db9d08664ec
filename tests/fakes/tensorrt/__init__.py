"""Fake `tensorrt` for tests (see tests/fakes/_fake_nvidia.py)."""

import os

from _fake_nvidia import make_sdk

make_sdk(globals(), "tensorrt", os.environ.get("FAKE_TRT_VERSION", "10.13.0.35"), rtx=False)
