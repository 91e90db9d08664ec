"""Time and peak memory of each stage of one build job, measured inside the processes that do the work.

A stage's peak is this process's own (its VmHWM, reset when the stage starts: see rss.py) or, while a
subprocess works for it (the reference run, the benchmark, an SDK's build process), this process's resident
memory plus the subprocess's own peak, whichever is higher. The job's peak is the highest of its stages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from enginefarm.hardware import rss


class Probe:
    """Handed to a stage, so the stage can add what its subprocesses measured about themselves."""

    def __init__(self) -> None:
        self.beside = 0  # this process's RSS plus a subprocess's peak
        self.subprocess_peak = 0

    def subprocess(self, peak_bytes: int | None) -> None:
        if peak_bytes:
            self.subprocess_peak = max(self.subprocess_peak, int(peak_bytes))
            self.beside = max(self.beside, rss.current_bytes() + int(peak_bytes))


class Stages:
    def __init__(self, records: list[dict[str, Any]] | None = None) -> None:
        self.records: list[dict[str, Any]] = [dict(r) for r in records or ()]

    @contextmanager
    def stage(self, name: str) -> Iterator[Probe]:
        reset = rss.reset_peak()
        probe = Probe()
        started = time.perf_counter()
        try:
            yield probe
        finally:
            self._add(
                name, time.perf_counter() - started, max(rss.peak_bytes(), probe.beside), probe.subprocess_peak, reset
            )

    def _add(self, name: str, seconds: float, peak: int, subprocess_peak: int, reset: bool) -> None:
        record = next((r for r in self.records if r["stage"] == name), None)
        if record is None:
            record = {"stage": name, "seconds": 0.0, "peak_rss_mb": 0.0}
            self.records.append(record)
        record["seconds"] = round(record["seconds"] + seconds, 2)
        record["peak_rss_mb"] = max(record["peak_rss_mb"], rss.mb(peak))
        if subprocess_peak:
            record["subprocess_peak_rss_mb"] = max(record.get("subprocess_peak_rss_mb", 0.0), rss.mb(subprocess_peak))
        if not reset:  # no per-stage reset here (not Linux): the peak is the process's since it started
            record["peak_since_process_start"] = True

    @property
    def peak_rss_mb(self) -> float:
        return max((r["peak_rss_mb"] for r in self.records), default=0.0)
