"""Device detection for the runtime: the machine's probes (hardware/devices.py), each device with the targets the
backends say it runs (`with_targets`), remembered per machine (hardware/probe_cache.py)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from enginefarm.errors import ConfigError
from enginefarm.hardware import device_info
from enginefarm.hardware.devices import PROBES, Device, Probe, run_probe

if TYPE_CHECKING:
    from enginefarm.settings import Settings

log = logging.getLogger(__name__)


def with_targets(device: Device) -> Device:
    """A detected device, with the targets every registered backend says it runs (Backend.device_classes)."""
    from enginefarm.backends import targets_for

    return replace(device, targets=targets_for(device))


def run_probes(
    names: tuple[str, ...] | None = None, cached: bool = True, settings: Settings | None = None
) -> list[Probe]:
    """The probes' results, with their devices' targets, from the machine's probe cache where it has them (in
    `settings`' home: the one `load(settings=...)` was given, else the environment's). A probe that raised is
    reported, not remembered."""
    cache = _cache(settings) if cached else None
    results, fresh = [], {}
    for name in PROBES:
        if names is not None and name not in names:
            continue
        remembered = cache.get(name) if cache is not None else None
        if remembered is not None:
            try:
                results.append(_probe_from(remembered))
                if name == "cpu" and results[-1].devices:
                    device_info.remember_cpu(results[-1].devices[0].info)
                continue
            except (KeyError, TypeError, ValueError):  # an entry of another shape: probe again
                pass
        found = run_probe(name, with_targets)
        if not found.failed:
            fresh[name] = _probe_to(found)
            if name == "cpu" and found.devices:
                device_info.remember_cpu(found.devices[0].info)  # what this process describes the CPU as from now on
        results.append(found)
    if cache is not None and fresh:
        cache.put(fresh)
    return results


def _cache(settings: Settings | None):
    from enginefarm.hardware.probe_cache import ProbeCache, probe_code
    from enginefarm.settings import load_settings

    try:
        settings = settings or load_settings()
        return ProbeCache(settings.home, probe_code()) if settings.probe_cache else None
    except Exception:  # an unusable home or a strange host: probe as if nothing were remembered
        log.debug("no device probe cache", exc_info=True)
        return None


def _probe_to(probe: Probe) -> dict[str, Any]:
    return {
        "name": probe.name,
        "reason": probe.reason,
        "devices": [
            {"kind": d.kind, "name": d.name, "bench_class": d.bench_class, "targets": list(d.targets), "info": d.info}
            for d in probe.devices
        ],
    }


def _probe_from(data: dict[str, Any]) -> Probe:
    """A remembered probe, every field of the type `_probe_to` wrote (a ValueError, and so a new probe, otherwise:
    a `targets` string would be read as its characters, and no device would run anything until the file went)."""

    def text(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not text")
        return value

    def device(d: Any) -> Device:
        targets, info = d["targets"], d["info"]
        if not (isinstance(targets, list) and isinstance(info, dict)):
            raise ValueError("targets must be a list, info an object")
        return Device(text(d["kind"]), text(d["name"]), text(d["bench_class"]), tuple(map(text, targets)), dict(info))

    if not isinstance(data["devices"], list) or not (data["reason"] is None or isinstance(data["reason"], str)):
        raise ValueError("devices must be a list, reason text or null")
    return Probe(text(data["name"]), tuple(device(d) for d in data["devices"]), data["reason"])


def detect(
    device: str = "auto", probes_needed: tuple[str, ...] | None = None, settings: Settings | None = None
) -> list[Device]:
    """Devices to consider. 'auto': everything found (GPUs first), or what the probes in `probes_needed` find (the
    others are not run); 'cpu', 'nvidia', 'intel', ...: that kind only. Remembered probes live in `settings`' home."""
    if device == "auto":
        probes = run_probes(probes_needed, settings=settings)
    elif device in PROBES:
        probes = run_probes((device,), settings=settings)
    else:
        raise ConfigError(f"unknown device {device!r}", hint=f"use auto or one of: {', '.join(PROBES)}")
    found = [d for p in probes for d in p.devices]
    return sorted(found, key=lambda d: d.kind == "cpu")
