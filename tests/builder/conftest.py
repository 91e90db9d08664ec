"""The fake NVIDIA SDK (tests/fakes) for tests of our code around TensorRT / TensorRT-RTX calls."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[1] / "fakes"
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


def forget_fakes() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in _FAKE_MODULES:
            del sys.modules[name]


@pytest.fixture
def fake_nvidia(monkeypatch, tmp_path):
    """An RTX 4090 with the fake SDKs installed; the CLI subprocesses see them through PYTHONPATH."""
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("FAKE_TRT_LOG", str(tmp_path / "fake-nvidia-calls.jsonl"))
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA GeForce RTX 4090:8.9")
    for name in ("FAKE_TRT_CRASH", "FAKE_TRT_CRASH_IF", "FAKE_TRT_PIDFILE", "FAKE_TRT_INVALID", "FAKE_TRT_NO_VALIDITY", "FAKE_TRT_VERSION", "FAKE_TRT_RTX_VERSION"):
        monkeypatch.delenv(name, raising=False)
    forget_fakes()
    yield FakeNvidia(tmp_path / "fake-nvidia-calls.jsonl", monkeypatch)
    forget_fakes()


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


@pytest.fixture
def real_rtx():
    """The real TensorRT-RTX module; every test that builds an RTX engine builds it with this."""
    return require_real_rtx()
