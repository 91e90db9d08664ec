"""Describing a CPU: part of the builder/runner contract (benchmarks name the device class they ran on).

Pure Python, no dependencies beyond psutil; each probe is guarded so a strange host never crashes us.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from typing import Any

_X86_LEVELS = (
    ("v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("v3", {"avx2", "fma", "bmi2", "f16c", "movbe"}),
    ("v2", {"sse4_2", "popcnt", "ssse3"}),
)
# Flags that change what compiled CPU code may use; an exported CPU blob is only reused where these match.
NOTABLE_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "neon",
    "asimd",
    "sve",
    "i8mm",
    "bf16",
)


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _linux_cpuinfo() -> tuple[str, set[str]]:
    name, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and not name:
                    name = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name, flags


def _darwin_cpuinfo() -> tuple[str, set[str]]:
    import subprocess  # here, not at the top: a warm load answers from the probe cache and runs no tool

    def sysctl(name: str) -> str:
        try:
            return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    name = sysctl("machdep.cpu.brand_string")
    flags = {
        f.lower().replace(".", "_")
        for f in (sysctl("machdep.cpu.features") + " " + sysctl("machdep.cpu.leaf7_features")).split()
    }
    if _machine() == "aarch64":
        flags |= {"neon", "asimd"}
    return name, flags


def isa_level(machine: str, flags: set[str]) -> str:
    if machine == "x86_64":
        for level, needed in _X86_LEVELS:
            if needed <= flags:
                return level
        return "v1"
    return "base"


_remembered: dict[str, Any] | None = (
    None  # this machine's description from the device probe cache (hardware/probe_cache.py)
)


def remember_cpu(description: dict[str, Any]) -> None:
    """Take the CPU's description from the probe cache, whose key covers what it depends on: no psutil import (~50
    ms)."""
    global _remembered
    _remembered = dict(description)


def cpu_description() -> dict[str, Any]:
    return dict(_remembered) if _remembered is not None else measured_cpu_description()


@lru_cache(maxsize=1)
def measured_cpu_description() -> dict[str, Any]:
    import psutil

    machine = _machine()
    system = platform.system()
    name, flags = _darwin_cpuinfo() if system == "Darwin" else _linux_cpuinfo()
    if not name:
        name = platform.processor() or machine
    level = isa_level(machine, flags)
    return {
        "kind": "cpu",
        "class": f"cpu-{machine}-{level}",
        "name": name,
        "arch": machine,
        "os": system.lower(),
        "isa_level": level,
        "flags": sorted(flags & set(NOTABLE_FLAGS)),
        "logical_cores": os.cpu_count() or 1,
        "physical_cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        "memory_mb": psutil.virtual_memory().total // (1 << 20),
    }


def nvidia_gpus() -> tuple[list[dict[str, Any]], str | None]:
    """NVIDIA GPUs via NVML (nvidia-ml-py): name, compute capability, arch, driver, VRAM. Returns (gpus, why none).
    Never raises: the runner's probe and the TensorRT backends both ask, and a broken driver is a reason, not a
    crash."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no GPU, or a container without /dev/nvidia*
        return [], f"NVML did not start: {exc}"
    gpus: list[dict[str, Any]] = []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "major": major,
                    "minor": minor,
                    "arch": f"sm_{major}{minor}",
                    "driver": driver,
                    "vram_mb": pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1 << 20),
                }
            )
    except Exception as exc:
        return gpus, f"NVML failed: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return gpus, None if gpus else "no NVIDIA GPU found"


def amd_gpus() -> tuple[list[dict[str, str]], str | None]:
    """AMD GPU agents as ROCm's rocminfo lists them, in HIP device order: [{name, gfx}], or why none."""
    import shutil

    tool = shutil.which("rocminfo")
    if tool is None:
        return [], "rocminfo not found (no ROCm install)"
    import subprocess

    try:
        text = subprocess.run([tool], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"rocminfo failed: {exc}"
    gpus, name = [], ""
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key.strip() == "Marketing Name":
            name = value.strip()
        elif key.strip() == "Name" and value.strip().startswith("gfx"):
            gpus.append({"name": name or value.strip(), "gfx": value.strip().split(":")[0]})
    return gpus, None if gpus else "rocminfo lists no gfx agent"
