"""enginefarm.hardware: the machine, below every other layer. What it has (devices and their probes, CPU and GPU
descriptions, the probe cache's machine key), how long things take on it (timing), where a tensor lives (a
backend's device tensor) and this process's memory (resident set, peak, freed heap given back). It imports only
the standard library, numpy, psutil (and, inside the probes, the vendor SDKs they ask) and enginefarm's leaves
(errors, settings); runner, backends and builder import it, never the reverse (tests/test_import_graph.py). A
device's `targets` (which backends run it) are the runner's to fill in (runner/detect.py): they are the backends'
knowledge, not the machine's.

- `devices`: `Device`, `Probe`, one probe per vendor (`PROBES`), `run_probe`.
- `device_info`: the CPU's description (class, ISA level, flags), NVIDIA GPUs from NVML, AMD GPUs from rocminfo.
- `probe_cache`: probes remembered per machine, under a key of everything that can change them.
- `timing`: repeated timing until the spread is small; ties within noise.
- `tensors`: `DeviceTensor`, an output kept where the backend computed it.
- `rss`: this process's resident and peak memory (VmHWM, resettable per stage); `give_back_memory` (malloc_trim).
"""
