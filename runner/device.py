"""Device detection. Each probe is fast, isolated and never raises: it reports what it found or why not."""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from enginefarm.errors import ConfigError
from enginefarm.runner.device_info import amd_gpus, measured_cpu_description, nvidia_gpus, remember_cpu

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    kind: str  # cpu | nvidia | amd | intel-gpu | intel-npu | apple
    name: str
    bench_class: str  # benchmarks measured on this class rank artifacts for this device
    targets: tuple[str, ...]  # the `backend:device` targets this device can run
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def found(cls, kind: str, name: str, bench_class: str, info: dict[str, Any]) -> Device:
        """A detected device, with the targets every registered backend says it runs (Backend.device_classes)."""
        from enginefarm.backends import targets_for

        device = cls(kind, name, bench_class, (), info)
        return replace(device, targets=targets_for(device))


@dataclass(frozen=True)
class Probe:
    name: str
    devices: tuple[Device, ...]
    reason: str | None = None  # why nothing was found


def probe_cpu() -> Probe:
    info = measured_cpu_description()  # not a remembered one: this is the probe
    return Probe("cpu", (Device.found("cpu", info["name"], info["class"], info),))


def probe_nvidia() -> Probe:
    gpus, reason = nvidia_gpus()
    devices = tuple(nvidia_device(g["name"], g["major"], g["minor"], g["driver"], g["vram_mb"], g["index"]) for g in gpus)
    return Probe("nvidia", devices, None if devices else reason)


def nvidia_device(name: str, major: int, minor: int, driver: str, vram_mb: int, index: int = 0) -> Device:
    arch = f"sm_{major}{minor}"
    # TensorRT plans are not portable across operating systems: their constraints name the OS they were built on.
    info = {"index": index, "driver": driver, "vram_mb": vram_mb, "arch": arch, "os": platform.system().lower()}
    return Device.found("nvidia", name, f"nvidia-{arch}", info)


def amd_device(name: str, gfx: str, vram_mb: int) -> Device:
    return Device.found("amd", name, f"amd-{gfx}", {"gfx": gfx, "vram_mb": vram_mb})


def apple_device(chip: str, macos: str) -> Device:
    return Device.found("apple", chip, "apple-" + chip.lower().replace("apple ", "").replace(" ", "-"), {"os": "darwin", "macos": macos})


def probe_amd() -> Probe:
    """ROCm's rocminfo lists each agent's gfx target; amdsmi would add VRAM but is rarely installed."""
    gpus, why = amd_gpus()
    return Probe("amd", tuple(amd_device(g["name"], g["gfx"], 0) for g in gpus), why)


def probe_apple() -> Probe:
    import platform
    import subprocess

    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return Probe("apple", (), "not an Apple-silicon Mac")
    try:
        chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=2).stdout.strip()
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
                found.append(Device.found(f"intel-{kind.lower()}", full, f"intel-{kind.lower()}", {"openvino_device": name}))
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


def run_probes(names: tuple[str, ...] | None = None, cached: bool = True) -> list[Probe]:
    """The probes' results, from the machine's probe cache (runner/probe_cache.py) where it has them. A probe that
    raised is reported, not remembered."""
    cache = _cache() if cached else None
    results, fresh = [], {}
    for name, probe in PROBES.items():
        if names is not None and name not in names:
            continue
        remembered = cache.get(name) if cache is not None else None
        if remembered is not None:
            try:
                results.append(_probe_from(remembered))
                if name == "cpu" and results[-1].devices:
                    remember_cpu(results[-1].devices[0].info)
                continue
            except (KeyError, TypeError, ValueError):  # an entry of another shape: probe again
                pass
        try:
            found = probe()
            fresh[name] = _probe_to(found)
            if name == "cpu" and found.devices:
                remember_cpu(found.devices[0].info)  # what this process describes the CPU as from now on
        except Exception as exc:  # a probe must never take the app down
            log.debug("probe %s failed", name, exc_info=True)
            found = Probe(name, (), f"probe failed: {type(exc).__name__}: {exc}")
        results.append(found)
    if cache is not None and fresh:
        cache.put(fresh)
    return results


def _cache():
    from enginefarm.runner.probe_cache import ProbeCache
    from enginefarm.settings import load_settings

    try:
        settings = load_settings()
        return ProbeCache(settings.home) if settings.probe_cache else None
    except Exception:  # an unusable home or a strange host: probe as if nothing were remembered
        log.debug("no device probe cache", exc_info=True)
        return None


def _probe_to(probe: Probe) -> dict[str, Any]:
    return {"name": probe.name, "reason": probe.reason,
            "devices": [{"kind": d.kind, "name": d.name, "bench_class": d.bench_class, "targets": list(d.targets), "info": d.info}
                        for d in probe.devices]}


def _probe_from(data: dict[str, Any]) -> Probe:
    devices = tuple(Device(d["kind"], d["name"], d["bench_class"], tuple(d["targets"]), dict(d["info"])) for d in data["devices"])
    return Probe(str(data["name"]), devices, data["reason"])


def detect(device: str = "auto", probes_needed: tuple[str, ...] | None = None) -> list[Device]:
    """Devices to consider. 'auto': everything found (GPUs first), or what the probes in `probes_needed` find (the
    others are not run); 'cpu', 'nvidia', 'intel', ...: that kind only."""
    if device == "auto":
        probes = run_probes(probes_needed)
    elif device in PROBES:
        probes = run_probes((device,))
    else:
        raise ConfigError(f"unknown device {device!r}", hint=f"use auto or one of: {', '.join(PROBES)}")
    found = [d for p in probes for d in p.devices]
    return sorted(found, key=lambda d: d.kind == "cpu")
