"""Resident memory of this process, measured honestly: its own peak, resettable per stage, and freed heap given back.

`getrusage().ru_maxrss` cannot be trusted in a child: Linux carries the parent's peak into a child across
fork/vfork + exec, so a benchmark process started from a large build reports the build's peak. /proc/self/status's
VmHWM belongs to the process's own address space (new at exec), and writing "5" to /proc/self/clear_refs
resets it, so each stage of a build measures its own peak. Elsewhere (macOS) ru_maxrss is what there is: it is
the process's peak since it started, and `reset_peak` says it could not reset it; on Windows, psutil's peak
working set.
"""

from __future__ import annotations

import functools
import sys


def _linux_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _linux_clear_refs() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def peak_bytes() -> int:
    """The highest resident set size of this process since it started or since the last `reset_peak`."""
    kb = _linux_status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return getattr(info, "peak_wset", info.rss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_bytes() -> int:
    kb = _linux_status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # no /proc and no psutil: the peak is the best upper bound left
        return peak_bytes()


def reset_peak() -> bool:
    """Start a new peak at the current RSS (Linux ≥ 4.0). False where the peak cannot be reset."""
    return _linux_clear_refs() and _linux_status_kb("VmHWM") is not None


def give_back_memory() -> None:
    """Return freed heap to the system now: glibc keeps freed pages resident until asked (malloc_trim), so an app
    that closes a 3 GB UNet would otherwise still show it in its RSS. The weight codec's decode scratch (16 MiB kept
    between fetches) goes too."""
    import gc

    codec = sys.modules.get("enginefarm.cache.weight_codec")  # only if a fetch decoded something: no import here
    if codec is not None:
        codec.drop_scratch()
    gc.collect()
    if sys.platform.startswith("linux"):
        trim = _malloc_trim()
        if trim is not None:
            trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once (a CDLL per call leaves a ctypes class behind each time); None elsewhere."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl): nothing to ask
        return None


def mb(value: int | float) -> float:
    return round(value / 2**20, 1)
