"""Which NVIDIA GPUs run a target's plans: an exact arch (sm_XX) or a family class from its lowest compute capability,
matched against what NVML reports here."""

from __future__ import annotations

from typing import Any

from enginefarm.hardware.device_info import nvidia_gpus


def gpu_runs(device: str, gpu: dict[str, Any], family_floors: dict[str, tuple[int, int]]) -> bool:
    """Whether a GPU (NVML description) runs plans for the device class: sm_XX exactly, or a family class from its
    floor."""
    if device.startswith("sm_"):
        return gpu["arch"] == device
    floor = family_floors.get(device)
    return floor is not None and (gpu["major"], gpu["minor"]) >= floor


def matching_gpu(device: str, family_floors: dict[str, tuple[int, int]]) -> tuple[dict[str, Any] | None, str]:
    gpus, reason = nvidia_gpus()
    if not gpus:
        return None, reason or "no NVIDIA GPU found"
    for gpu in gpus:
        if gpu_runs(device, gpu, family_floors):
            return gpu, ""
    found = ", ".join(f"{g['name']} ({g['arch']})" for g in gpus)
    return None, f"{device} needs a matching NVIDIA GPU; this machine has {found}"


def gpu_description(device: str, family_floors: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """For benchmarks: the class resolution matches against a device's bench_class (hardware.devices: nvidia-sm_XX)."""
    gpu, _ = matching_gpu(device, family_floors)
    if gpu is None:
        return {"class": f"nvidia-{device}"}
    return {"class": f"nvidia-{gpu['arch']}", "name": gpu["name"], "driver": gpu["driver"], "vram_mb": gpu["vram_mb"]}


def build_host_arch() -> str | None:
    gpus, _ = nvidia_gpus()
    return gpus[0]["arch"] if gpus else None
