"""Fake `tensorrt_rtx` for tests (see tests/fakes/_fake_nvidia.py)."""

import os

from _fake_nvidia import make_sdk

make_sdk(globals(), "tensorrt_rtx", os.environ.get("FAKE_TRT_RTX_VERSION", "1.7.1.116"), rtx=True)
