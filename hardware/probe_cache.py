"""Device probes remembered per machine: `$ENGINEFARM_HOME/device-probes.json` holds each probe's result under a key
of everything that can change it (kernel, CPU model, device nodes, GPU driver versions, the installed SDK packages and
enginefarm's own probe code). Any change of the key probes again; a missing, corrupt or unwritable file is the same
as no cache (never an error), and writes are atomic (a temp file, then os.replace).

The key is cheap on purpose: a few stats and small /proc and /sys reads, no SDK import (the probes it saves cost
~150 ms: psutil, the backend table, OpenVINO's device list)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

FILE = "device-probes.json"
SDK_PREFIXES = ("onnxruntime", "openvino", "tensorrt", "nvidia_ml_py", "pynvml", "coremltools", "migraphx", "psutil")
_DEVICE_DIRS = ("/dev", "/dev/dri", "/dev/accel")
_DEVICE_PREFIXES = ("nvidia", "kfd", "dri", "accel", "card", "render")


def _read(path: str, limit: int = 4096) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return ""


def _cpu_model() -> str:
    from .device_info import _linux_cpuinfo  # empty where there is no /proc (macOS, Windows)

    return _linux_cpuinfo()[0] or platform.processor()


def _linux_driver_versions() -> dict[str, str]:
    """The GPU drivers' version files that exist here (none outside Linux)."""
    files = (
        "/proc/driver/nvidia/version",
        "/sys/module/amdgpu/version",
        "/sys/module/nvidia/version",
        "/sys/module/i915/version",
        "/sys/module/xe/version",
        "/sys/module/intel_vpu/version",
    )
    return {p: _read(p, 512) for p in files if os.path.exists(p)}


def _memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX
        return 0


def _sdk_packages() -> list[str]:
    """name-version of the installed distributions that probes or availability depend on (their dist-info folders)."""
    found: set[str] = set()
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        found.update(n for n in names if n.endswith(".dist-info") and n.lower().startswith(SDK_PREFIXES))
    return sorted(found)


def _devices() -> list[str]:
    found = []
    for folder in _DEVICE_DIRS:
        try:
            found += [f"{folder}/{n}" for n in os.listdir(folder) if n.startswith(_DEVICE_PREFIXES)]
        except OSError:
            continue
    return sorted(found)


def _own_code(files: tuple[Path, ...]) -> list[int]:
    """enginefarm's probe code changes what a probe reports (an editable install keeps its version): its files'
    mtimes."""
    return [f.stat().st_mtime_ns if f.exists() else 0 for f in files]


def probe_code() -> tuple[Path, ...]:
    """The code that changes what a remembered probe says: the probes, the runtime's detection and the backend table
    that gives the targets (by path: a warm load imports no backend it does not use)."""
    root = Path(__file__).resolve().parents[1]  # the package's root, where hardware/, runner/ and backends/ live
    return (
        root / "hardware" / "devices.py",
        root / "hardware" / "device_info.py",
        root / "runner" / "detect.py",
        root / "backends" / "__init__.py",
    )


def machine_key(code: tuple[Path, ...] = ()) -> str:
    """`code`: the files whose code shapes what is remembered (the caller's: the probes, and what adds to them)."""
    import hashlib  # here: a remembered pick (runner/warm.py) compares machine_state() without hashing it

    return hashlib.sha256(json.dumps(machine_state(code), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def machine_state(code: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Everything a probe's result depends on, as JSON-able values."""
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory": _memory(),
        "python": [sys.executable, *sys.version_info[:2]],
        "path": sys.path,
        "sdks": _sdk_packages(),
        "devices": _devices(),
        "drivers": _linux_driver_versions(),
        "code": _own_code(code),
        "env": {
            k: os.environ.get(k, "") for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
        },
    }


class ProbeCache:
    def __init__(self, home: Path, code: tuple[Path, ...] = ()) -> None:
        self.path = Path(home) / FILE
        self.key = machine_key(code)
        self._entries: dict[str, Any] = self._read()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("key") != self.key or not isinstance(data.get("probes"), dict):
            return {}  # another machine state (or a file we did not write): probe again
        return data["probes"]

    def get(self, name: str) -> Any | None:
        return self._entries.get(name)

    def put(self, found: dict[str, Any]) -> None:
        self._entries.update(found)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            import tempfile  # here: a warm load reads the cache and writes nothing (tempfile costs it ~1.5 ms)

            fd, tmp = tempfile.mkstemp(prefix=FILE + ".", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump({"key": self.key, "probes": self._entries}, handle, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:  # a read-only home: we probe each time, as before
            import logging

            logging.getLogger(__name__).debug("device probes not cached (%s)", exc)
