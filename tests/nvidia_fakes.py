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


PROFILE = {"latent": {"min": [1, 4, 8, 8], "opt": [1, 4, 16, 16], "max": [2, 4, 32, 32]}}


def fake_plans(fake_nvidia, onnx: Path, folder: Path, sizes: dict[str, tuple[int, int]], sdk: str) -> dict[str, bytes]:
    """A fake plan per name, each of `onnx` (a tiny graph that really runs) but recording the device memory `sizes`
    gives it ((weights, activations) bytes: real-size numbers, FAKE_TRT_DEVICE_MEMORY), built in this process."""
    import shutil

    from enginefarm.backends.nvidia.build import BuildSpec
    from enginefarm.backends.nvidia.build_process import build_plan
    from enginefarm.backends.nvidia.sdk import capturing_logger

    fake_nvidia.set(FAKE_TRT_DEVICE_MEMORY=json.dumps({f"/{n}.onnx": list(s) for n, s in sizes.items()}))
    trt = importlib.import_module(sdk)
    folder.mkdir(parents=True, exist_ok=True)
    plans = {}
    for name in sizes:
        shutil.copy(onnx, folder / f"{name}.onnx")
        plan = folder / f"{name}.plan"
        spec = dict(onnx=str(folder / f"{name}.onnx"), plan=str(plan), profile=PROFILE, precision="fp32")
        build_plan(trt, BuildSpec(sdk=sdk, strip_weights=False, refittable=False, **spec), capturing_logger(trt))
        plans[name] = plan.read_bytes()
    return plans


def open_fake_session(trt, plan: bytes):
    """A TrtSession of a fake plan, made as the backends make theirs: sharing the activation buffer of the pool
    `sharing(...)` names around it, else with its own."""
    from enginefarm.backends.nvidia.activations import new_context
    from enginefarm.backends.nvidia.sdk import capturing_logger
    from enginefarm.backends.nvidia.session import TrtSession

    engine = trt.Runtime(capturing_logger(trt)).deserialize_cuda_engine(plan)
    config = engine.create_runtime_config() if hasattr(engine, "create_runtime_config") else None
    context, shared = new_context(trt, engine, config)
    return TrtSession(trt, engine, context, "fp32", shared=shared, plan_bytes=len(plan))
