"""Timing a session honestly: repeated until the spread is small or the time is up; median, spread, repetitions.

The spread is the interquartile range over the median (IQR / median): the middle half of the runs lies within it.
Resolution treats two numbers as tied when their middle halves overlap (`tied`), so a difference smaller than the
measurements' own noise never decides which artifact a device gets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

SPREAD_TARGET = 0.05  # stop repeating once IQR / median is at most this
MIN_RUNS = 5
MAX_RUNS = 200
TIME_BUDGET_S = 20.0  # per artifact at build time; a slow model stops here, with the spread it reached


@dataclass
class Timing:
    times_ms: list[float]
    stopped: str  # why the repetitions ended: "spread", "time cap", "max runs" ("clear winner" when timed side by side)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times_ms))

    @property
    def iqr_ms(self) -> float:
        low, high = np.percentile(self.times_ms, [25, 75])
        return float(high - low)

    @property
    def spread(self) -> float:
        return spread(self.times_ms)

    def record(self) -> dict[str, Any]:
        """The benchmark record's timing fields (a manifest's `benchmarks` entry, an on-device measurement)."""
        return {
            "p50_ms": round(self.median_ms, 3),
            "p90_ms": round(float(np.percentile(self.times_ms, 90)), 3),
            "runs": len(self.times_ms),
            "spread": round(self.spread, 4),
            "iqr_ms": round(self.iqr_ms, 3),
            "stopped": self.stopped,
        }


def spread(times_ms: list[float]) -> float:
    """IQR / median; infinite for fewer than two runs (nothing is known about the noise)."""
    if len(times_ms) < 2:
        return float("inf")
    median = float(np.median(times_ms))
    low, high = np.percentile(times_ms, [25, 75])
    return float(high - low) / median if median > 0 else 0.0


def time_runs(
    run: Callable[[], object],
    *,
    min_runs: int = MIN_RUNS,
    max_runs: int = MAX_RUNS,
    budget_s: float = TIME_BUDGET_S,
    target: float = SPREAD_TARGET,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Call `run` until at least `min_runs` calls have a spread of at most `target`, or `budget_s` or `max_runs` is
    reached (whichever comes first after `min_runs`). The caller warms the session up first. `clock`: seconds."""
    times: list[float] = []
    deadline = clock() + budget_s
    while True:
        start = clock()
        run()
        times.append((clock() - start) * 1000)
        if len(times) < min_runs:
            continue
        if spread(times) <= target:
            return Timing(times, "spread")
        if len(times) >= max_runs:
            return Timing(times, "max runs")
        if clock() > deadline:
            return Timing(times, "time cap")


def time_interleaved(
    runs: dict[str, Callable[[], object]],
    *,
    min_rounds: int,
    max_rounds: int,
    budget_s: float,
    target: float = SPREAD_TARGET,
    on_round: Callable[[int, dict[str, Timing]], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time several sessions round-robin, so machine noise hits them alike. Stops after `min_rounds` once the
    fastest is clear of the others (not tied) or every spread is at most `target`; else at `max_rounds` or
    `budget_s`."""
    times: dict[str, list[float]] = {key: [] for key in runs}
    deadline = clock() + budget_s
    rounds = 0
    while True:
        for key, run in runs.items():
            start = clock()
            run()
            times[key].append((clock() - start) * 1000)
        rounds += 1
        done = {key: Timing(list(ts), "") for key, ts in times.items()}
        if on_round is not None:
            on_round(rounds, done)
        if rounds < min_rounds:
            continue
        stopped = (
            "clear winner"
            if _clear_winner(done)
            else "spread"
            if all(t.spread <= target for t in done.values())
            else "max runs"
            if rounds >= max_rounds
            else "time cap"
            if clock() > deadline
            else ""
        )
        if stopped:
            for timing in done.values():
                timing.stopped = stopped
            return done


def within_noise(median_a: float, iqr_a: float, median_b: float, iqr_b: float) -> bool:
    """Two timings are tied when their middle halves (median ± IQR/2) overlap: the one rule for a device's own runs
    and for stored benchmark records (cache/records.py Benchmark.tied)."""
    return abs(median_a - median_b) <= (iqr_a + iqr_b) / 2


def _clear_winner(timings: dict[str, Timing]) -> bool:
    ordered = sorted(timings.values(), key=lambda t: t.median_ms)
    if len(ordered) < 2:
        return True
    first, second = ordered[:2]
    return not within_noise(first.median_ms, first.iqr_ms, second.median_ms, second.iqr_ms)
