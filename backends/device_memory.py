"""What a loaded component holds in its device's memory, as its SDK reports it, for a memory budget
(`enginefarm.diffusion.budget`) that counts the memory which runs out on a GPU rather than the host's.

Reported here: TensorRT and TensorRT-RTX (the engine's weights, `get_engine_stat(TOTAL_WEIGHTS_SIZE)`, and its
activations, `device_memory_size_v2`, which a pipeline's engines share: `nvidia/activations.py`), and OpenVINO on an
Intel GPU (the plugin's `GPU_MEMORY_STATISTICS`, for the whole device). MIGraphX and Core ML report no per-model
figure through their Python APIs; their components are counted by what the process's resident memory grew by.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceMemory:
    """A loaded component's bytes on its device. `activations` live in a buffer its pipeline's engines share when
    `shared` (only the largest counts), else in its own. `io`: its input and output buffers."""

    weights: int
    activations: int
    shared: bool = False
    io: int = 0

    @property
    def own(self) -> int:
        """What closing it gives back, whatever else stays loaded (a shared buffer shrinks only past the largest)."""
        return self.weights + self.io + (0 if self.shared else self.activations)


def peak_bytes(held: list[DeviceMemory]) -> int:
    """The device memory of components loaded together: their own bytes plus the largest shared activations (one
    buffer, sized to the largest of the engines that use it, since they never run at the same time)."""
    return sum(m.own for m in held) + max((m.activations for m in held if m.shared), default=0)


def openvino_gpu_bytes(core, device: str = "GPU") -> int | None:
    """The bytes OpenVINO's GPU plugin holds on `device` now (its GPU_MEMORY_STATISTICS, by allocation type: cl_mem,
    usm_device, usm_shared; not usm_host, which is host memory), or None where the device has no such property (the
    CPU, or no Intel GPU here)."""
    if not device.upper().startswith("GPU"):
        return None
    try:
        statistics = core.get_property(device, "GPU_MEMORY_STATISTICS")
    except Exception:  # no GPU plugin or no such device: OpenVINO raises RuntimeError
        return None
    return int(sum(int(v) for kind, v in dict(statistics).items() if kind != "usm_host"))
