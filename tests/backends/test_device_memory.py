"""What components hold on their device, as the SDKs report it (backends/device_memory.py)."""

from __future__ import annotations

import pytest

from enginefarm.backends.device_memory import DeviceMemory, openvino_gpu_bytes, peak_bytes


def test_shared_activations_count_once_at_their_largest_own_ones_each():
    text, unet, vae = DeviceMemory(200, 10, True, 1), DeviceMemory(5000, 1300, True, 2), DeviceMemory(100, 3000, True)
    assert peak_bytes([text, unet, vae]) == 5300 + 3 + 3000
    assert peak_bytes([text, unet]) == 5200 + 3 + 1300
    assert peak_bytes([text, DeviceMemory(50, 70)]) == 200 + 1 + 50 + 70 + 10  # one with its own activations
    assert peak_bytes([]) == 0


def test_openvino_gpu_memory_statistics_without_and_with_an_intel_gpu():
    ov = pytest.importorskip("openvino")
    core = ov.Core()
    # no Intel GPU here (the GPU plugin cannot even load without libOpenCL), and the CPU has no such property
    assert "GPU" not in core.available_devices
    assert openvino_gpu_bytes(core, "GPU") is None and openvino_gpu_bytes(core, "CPU") is None

    class IntelGpuCore:  # what the GPU plugin answers (ov::intel_gpu::memory_statistics: bytes by allocation type)
        def get_property(self, device, name):
            assert (device, name) == ("GPU.0", "GPU_MEMORY_STATISTICS")
            return {"cl_mem": 1000, "usm_device": 20000, "usm_host": 300000, "usm_shared": 4}

    assert openvino_gpu_bytes(IntelGpuCore(), "GPU.0") == 21004  # usm_host is the host's memory
