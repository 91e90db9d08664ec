"""Resident memory of this process, measured honestly: its own peak, resettable per stage.

`getrusage().ru_maxrss` cannot be trusted in a child: Linux carries the parent's peak into a child across
fork/vfork + exec, so a benchmark process started from a 10 GB build reported 10 GB. /proc/self/status's
VmHWM belongs to the process's own address space (new at exec), and writing "5" to /proc/self/clear_refs
resets it, so each stage of a build measures its own peak. Elsewhere (macOS) ru_maxrss is what there is: it is
the process's peak since it started, and `reset_peak` says it could not reset it.
"""

from __future__ import annotations

import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_bytes() -> int:
    """The highest resident set size of this process since it started or since the last `reset_peak`."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_bytes() -> int:
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # no /proc and no psutil: the peak is the best upper bound left
        return peak_bytes()


def reset_peak() -> bool:
    """Start a new peak at the current RSS (Linux ≥ 4.0). False where the peak cannot be reset."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


def give_back() -> None:
    """Return freed memory to the system: glibc keeps freed heap pages resident until asked (malloc_trim)."""
    from enginefarm.hardware.heap import give_back_memory

    give_back_memory()


def mb(value: int | float) -> float:
    return round(value / 2**20, 1)
