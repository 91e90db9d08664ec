"""The devices this machine has. Each probe is fast, isolated and never raises: it reports what it found or why not.

A probe's devices carry no targets: which `backend:device-class` targets a device runs is the backends' knowledge,
filled in by the runner (runner/detect.py: `with_targets`), which also remembers probes per machine."""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .device_info import amd_gpus, measured_cpu_description, nvidia_gpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    kind: str  # cpu | nvidia | amd | intel-gpu | intel-npu | apple
    name: str
    bench_class: str  # benchmarks measured on this class rank artifacts for this device
    targets: tuple[str, ...]  # the `backend:device` targets this device can run (runner/detect.py fills them in)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    name: str
    devices: tuple[Device, ...]
    reason: str | None = None  # why nothing was found
    failed: bool = False  # the probe raised (run_probe): its reason is reported, never remembered


def _found(kind: str, name: str, bench_class: str, info: dict[str, Any]) -> Device:
    return Device(kind, name, bench_class, (), info)


def probe_cpu() -> Probe:
    info = measured_cpu_description()  # not a remembered one: this is the probe
    return Probe("cpu", (_found("cpu", info["name"], info["class"], info),))


def probe_nvidia() -> Probe:
    gpus, reason = nvidia_gpus()
    devices = tuple(
        nvidia_device(g["name"], g["major"], g["minor"], g["driver"], g["vram_mb"], g["index"]) for g in gpus
    )
    return Probe("nvidia", devices, None if devices else reason)


def nvidia_device(name: str, major: int, minor: int, driver: str, vram_mb: int, index: int = 0) -> Device:
    arch = f"sm_{major}{minor}"
    # TensorRT plans are not portable across operating systems: their constraints name the OS they were built on.
    info = {"index": index, "driver": driver, "vram_mb": vram_mb, "arch": arch, "os": platform.system().lower()}
    return _found("nvidia", name, f"nvidia-{arch}", info)


def amd_device(name: str, gfx: str, vram_mb: int) -> Device:
    return _found("amd", name, f"amd-{gfx}", {"gfx": gfx, "vram_mb": vram_mb})


def apple_device(chip: str, macos: str) -> Device:
    return _found(
        "apple", chip, "apple-" + chip.lower().replace("apple ", "").replace(" ", "-"), {"os": "darwin", "macos": macos}
    )


def probe_amd() -> Probe:
    """ROCm's rocminfo lists each agent's gfx target; amdsmi would add VRAM but is rarely installed."""
    gpus, why = amd_gpus()
    return Probe("amd", tuple(amd_device(g["name"], g["gfx"], 0) for g in gpus), why)


def probe_apple() -> Probe:
    import subprocess

    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return Probe("apple", (), "not an Apple-silicon Mac")
    try:
        chip = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return Probe("apple", (), f"sysctl failed: {exc}")
    return Probe("apple", (apple_device(chip or "Apple silicon", platform.mac_ver()[0]),))


def probe_openvino_gpu() -> Probe:
    try:
        import openvino
    except ImportError:
        return Probe("intel", (), "openvino is not installed, so Intel GPUs/NPUs are not probed")
    try:
        core = openvino.Core()
        found = []
        for name in core.available_devices:
            kind = name.split(".")[0]
            if kind in ("GPU", "NPU"):
                full = core.get_property(name, "FULL_DEVICE_NAME")
                found.append(_found(f"intel-{kind.lower()}", full, f"intel-{kind.lower()}", {"openvino_device": name}))
    except Exception as exc:
        return Probe("intel", (), f"OpenVINO could not list devices: {exc}")
    return Probe("intel", tuple(found), None if found else "OpenVINO sees no GPU or NPU")


PROBES: dict[str, Callable[[], Probe]] = {
    "cpu": probe_cpu,
    "nvidia": probe_nvidia,
    "intel": probe_openvino_gpu,
    "amd": probe_amd,
    "apple": probe_apple,
}


def run_probe(name: str, each: Callable[[Device], Device] | None = None) -> Probe:
    """One probe's result, `each` applied to its devices (the runner adds their targets); a probe that raised, or an
    `each` that did, is reported as its reason: a probe must never take the app down."""
    try:
        found = PROBES[name]()
        return replace(found, devices=tuple(each(d) for d in found.devices)) if each is not None else found
    except Exception as exc:
        log.debug("probe %s failed", name, exc_info=True)
        return Probe(name, (), f"probe failed: {type(exc).__name__}: {exc}", failed=True)
