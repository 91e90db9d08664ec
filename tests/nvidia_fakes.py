"""The fake NVIDIA SDK (tests/fakes) for tests of our code around TensorRT / TensorRT-RTX calls, and the real
TensorRT-RTX where a test needs it. The fixtures `fake_nvidia` and `real_rtx` (tests/conftest.py) are made from
these."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parent / "fakes"
_FAKE_MODULES = {"tensorrt", "tensorrt_rtx", "pynvml", "cuda", "_fake_nvidia"}


class FakeNvidia:
    """Controls the fakes and reads what they recorded (from every process, the build subprocess included)."""

    def __init__(self, log: Path, monkeypatch) -> None:
        self.log = log
        self.monkeypatch = monkeypatch

    def calls(self, call: str | None = None, sdk: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [r for r in rows if (call is None or r["call"] == call) and (sdk is None or r["sdk"] == sdk)]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)

    def set(self, **env: str | None) -> None:
        """Change a switch (FAKE_TRT_CRASH, FAKE_NVML_GPUS, ...) and re-import the fakes so they see it."""
        for name, value in env.items():
            if value is None:
                self.monkeypatch.delenv(name, raising=False)
            else:
                self.monkeypatch.setenv(name, value)
        forget_fakes()


def install_fakes(monkeypatch, log: Path) -> FakeNvidia:
    """An RTX 4090 with the fake SDKs installed; CLI subprocesses and build processes see them through PYTHONPATH."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("FAKE_TRT_LOG", str(log))
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA GeForce RTX 4090:8.9")
    for name in (
        "FAKE_TRT_CRASH",
        "FAKE_TRT_CRASH_IF",
        "FAKE_TRT_PIDFILE",
        "FAKE_TRT_INVALID",
        "FAKE_TRT_NO_VALIDITY",
        "FAKE_TRT_VERSION",
        "FAKE_TRT_RTX_VERSION",
    ):
        monkeypatch.delenv(name, raising=False)
    forget_fakes()
    return FakeNvidia(log, monkeypatch)


def forget_fakes() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in _FAKE_MODULES:
            del sys.modules[name]


def require_real_rtx(env=os.environ):
    """The real TensorRT-RTX SDK (the test extra installs it; it builds without a GPU). Skips without it, except in
    CI (CI=true), where a missing SDK must fail, not skip."""
    forget_fakes()
    spec = importlib.util.find_spec("tensorrt_rtx")
    if spec is not None and FAKES not in Path(spec.origin or "").parents:
        return importlib.import_module("tensorrt_rtx")
    if env.get("CI", "").lower() == "true":
        pytest.fail("CI=true but tensorrt-rtx is not installed: the test extra must bring it")
    pytest.skip("tensorrt-rtx is not installed (pip install 'enginefarm[tensorrt-rtx]')")
