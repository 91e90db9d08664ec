"""Benchmark at build: load ms, first-inference ms, p50/p90 latency and peak RSS, in a fresh process.

A fresh process makes load time and peak RSS honest: nothing is warm, and the build's own memory is not counted
(the peak is the process's own VmHWM: ru_maxrss would carry over the peak of the build that started it).
The process runs with the host to itself (`hostlock.alone`: no build and no other benchmark meanwhile), and repeats
until the spread of its runs is small or its time is up (`timing.time_runs`); the record keeps the median, the
spread and the repetitions.
Run as `python -m enginefarm.builder.bench ARTIFACT_DIR MANIFEST_JSON FEEDS_NPZ` it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.errors import BuildError

OTHERS_MAX = 0.2  # other processes busier than this share of the cores while a CPU benchmark ran: measure again
MAX_ATTEMPTS = 3
PAUSE_S = 2.0
MIN_WINDOW_S = 1.0


def _label(manifest_path: Path) -> str:
    """What a build waiting for the host is told holds it: "benchmark of MODEL/COMPONENT PRECISION TARGET"."""
    try:
        m = json.loads(Path(manifest_path).read_text())
        return f"benchmark of {m['model']}/{m['component']} {m['precision']} {m['target']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a benchmark"


def measure_in_subprocess(
    artifact_dir: Path, manifest_path: Path, feeds: dict[str, np.ndarray], workdir: Path
) -> dict[str, Any]:
    from .hostlock import alone

    feeds_path = workdir / "bench-feeds.npz"
    np.savez(feeds_path, allow_pickle=False, **feeds)  # explicit: a feed named allow_pickle is a feed, not the flag
    try:
        with alone(what=_label(manifest_path)) as host:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "enginefarm.builder.bench",
                    str(artifact_dir),
                    str(manifest_path),
                    str(feeds_path),
                ],
                capture_output=True,
                text=True,
                timeout=3600,
            )
    except subprocess.TimeoutExpired:
        raise BuildError(
            "the benchmark process ran for more than an hour",
            hint="build with --no-bench to publish without a benchmark",
        ) from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}, no output"]
        raise BuildError(
            f"the benchmark process failed: {tail[0]}", hint="build with --no-bench to publish without a benchmark"
        )
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), **host}


def peak_rss_mb() -> float:
    """This process's own peak (not ru_maxrss, which a child started from a large build inherits: see rss.py)."""
    from enginefarm.hardware import rss

    return rss.mb(rss.peak_bytes())


def _main(artifact_dir: str, manifest_path: str, feeds_path: str) -> None:
    from enginefarm.backends import get_backend
    from enginefarm.cache.manifest import Manifest

    manifest = Manifest.from_json(Path(manifest_path).read_bytes())
    with np.load(feeds_path) as data:
        feeds = {name: data[name] for name in data.files}
    from enginefarm.hardware import rss

    backend = get_backend(manifest.parsed_target.backend)
    backend.available(manifest.parsed_target.device)  # imports the SDK: its libraries are not the artifact's memory
    before = rss.current_bytes()
    start = time.perf_counter()
    session = backend.load(Path(artifact_dir), manifest, manifest.parsed_target.device)
    load_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    session.run(feeds)
    first_ms = (time.perf_counter() - start) * 1000
    session.run(feeds)  # a second warm-up: some runtimes finish tuning on the first calls
    timing, contention, attempts = _least_contended(lambda: session.run(feeds), manifest.parsed_target.device == "cpu")
    result = {
        "device": _device(backend, manifest),
        "shape": {name: list(array.shape) for name, array in feeds.items()},
        "load_ms": round(load_ms, 2),
        "first_inference_ms": round(first_ms, 2),
        **timing.record(),
        # What the host lock cannot keep out: other programs. The shares of all cores this process and everything else
        # used while timed, and the load average before, say how contended the numbers were.
        **contention,
        "attempts": attempts,
        "peak_rss_mb": peak_rss_mb(),
        # What holding the loaded artifact costs after it ran (weights, compiled code, arenas): what a pipeline with
        # a memory budget counts (enginefarm.diffusion.budget).
        "resident_mb": rss.mb(max(0, rss.current_bytes() - before)),
        "compute_precision": getattr(session, "compute_precision", "unknown"),
    }
    print(json.dumps(result))


def _least_contended(run, on_cpu: bool):
    """Time `run`; on a CPU, again after a pause while other processes used more than OTHERS_MAX of the cores meanwhile
    (something outside the host lock ran), within twice the time budget. Returns the least contended attempt:
    (timing, {cpu_share, others_share, load_avg_1m}, attempts made)."""
    from enginefarm.hardware.timing import TIME_BUDGET_S, time_runs

    best = None
    deadline = time.perf_counter() + 2 * TIME_BUDGET_S
    attempts = 0
    for _ in range(MAX_ATTEMPTS):
        attempts += 1
        load, ours, busy, wall = _load_avg(), _cpu_seconds(), _busy_seconds(), time.perf_counter()
        timing = time_runs(run)
        elapsed = time.perf_counter() - wall
        capacity = elapsed * (os.cpu_count() or 1)
        used = _cpu_seconds() - ours
        contention = {"cpu_share": None, "others_share": None, "load_avg_1m": load}
        if elapsed >= MIN_WINDOW_S:  # CPU time is counted in kernel ticks: a short window says nothing
            contention.update(
                cpu_share=round(used / capacity, 3),
                others_share=round(max(0.0, _busy_seconds() - busy - used) / capacity, 3),
            )
        if best is None or (contention["others_share"] or 0.0) < (best[1]["others_share"] or 0.0):
            best = (timing, contention)
        if not on_cpu or (contention["others_share"] or 0.0) <= OTHERS_MAX or time.perf_counter() > deadline:
            break
        time.sleep(PAUSE_S)
    assert best is not None  # MAX_ATTEMPTS >= 1: the first attempt is always kept
    return (*best, attempts)


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (stolen by the hypervisor included), all processes."""
    import psutil

    times = psutil.cpu_times()
    return (
        sum(times)
        - times.idle
        - getattr(times, "iowait", 0.0)
        - getattr(times, "guest", 0.0)
        - getattr(times, "guest_nice", 0.0)
    )


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _load_avg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # Windows has no load average
        return None


def _device(backend, manifest) -> dict:
    """The device class the numbers were measured on: resolution ranks artifacts by it (GPU backends describe their
    GPU)."""
    return backend.bench_device(manifest)


if __name__ == "__main__":
    _main(*sys.argv[1:4])
