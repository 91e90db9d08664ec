"""Repeating until the spread is small or the time is up, on a simulated clock (no test depends on real time)."""

from __future__ import annotations

import itertools

import pytest

from enginefarm.cache.records import noise_ms, tied
from enginefarm.hardware.timing import spread, time_interleaved, time_runs


class Clock:
    """A clock that a simulated run advances by the durations given (ms), cycling through them."""

    def __init__(self, *durations_ms: float) -> None:
        self.now = 0.0
        self.durations = itertools.cycle(durations_ms)

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.now += next(self.durations) / 1000


def test_steady_runs_stop_once_the_spread_is_small():
    clock = Clock(100, 101, 99, 100, 100.5)
    timing = time_runs(clock.run, clock=clock)
    assert timing.stopped == "spread" and len(timing.times_ms) == 5
    assert timing.record()["p50_ms"] == pytest.approx(100) and timing.record()["spread"] <= 0.05


def test_noisy_runs_repeat_until_the_time_cap():
    clock = Clock(50, 110)  # every other run disturbed: the spread never settles
    timing = time_runs(clock.run, clock=clock, budget_s=2.0)
    assert timing.stopped == "time cap"
    assert 2.0 <= sum(timing.times_ms) / 1000 <= 2.0 + 0.11 and timing.record()["spread"] > 0.05


def test_fast_noisy_runs_stop_at_the_repetition_cap():
    clock = Clock(0.1, 0.3)
    timing = time_runs(clock.run, clock=clock, max_runs=40)
    assert timing.stopped == "max runs" and len(timing.times_ms) == 40


def test_the_record_keeps_median_spread_and_repetitions():
    clock = Clock(10, 12, 11, 30, 11, 10, 12)
    record = time_runs(clock.run, clock=clock, min_runs=7, max_runs=7).record()
    assert record["p50_ms"] == pytest.approx(11) and record["runs"] == 7 and record["stopped"] == "max runs"
    assert record["iqr_ms"] == pytest.approx(1.5) and record["spread"] == pytest.approx(1.5 / 11, abs=1e-4)
    assert record["p90_ms"] >= record["p50_ms"]


def test_spread_of_too_few_runs_is_unknown():
    assert spread([5.0]) == float("inf") and spread([5.0, 5.0]) == 0.0


def test_ties_are_overlapping_middle_halves():
    a = {"p50_ms": 100.0, "iqr_ms": 8.0}
    assert noise_ms(a) == 4.0 and noise_ms({"p50_ms": 100.0, "spread": 0.1}) == 5.0 and noise_ms({"p50_ms": 1.0}) == 0.0
    assert tied(a, {"p50_ms": 106.0, "iqr_ms": 4.0}) and not tied(a, {"p50_ms": 106.1, "iqr_ms": 4.0})
    assert not tied({"p50_ms": 1.0}, {"p50_ms": 1.0001})


def test_side_by_side_timing_stops_early_on_a_clear_winner():
    clock = Clock(10, 50)  # a then b, each round
    runs = {"a": clock.run, "b": clock.run}
    seen = []
    timings = time_interleaved(
        runs, min_rounds=3, max_rounds=10, budget_s=100, clock=clock, on_round=lambda n, t: seen.append(n)
    )
    assert seen == [1, 2, 3] and {t.stopped for t in timings.values()} == {"clear winner"}
    assert timings["a"].median_ms == pytest.approx(10) and timings["b"].median_ms == pytest.approx(50)


def test_side_by_side_timing_of_a_close_race_runs_to_its_cap():
    clock = Clock(10, 11, 12, 9)  # a: 10, 12, 10, 12...; b: 11, 9, 11, 9...: overlapping
    timings = time_interleaved({"a": clock.run, "b": clock.run}, min_rounds=3, max_rounds=6, budget_s=100, clock=clock)
    assert {t.stopped for t in timings.values()} == {"max runs"} and all(len(t.times_ms) == 6 for t in timings.values())


class Seconds:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_cpu_benchmark_disturbed_by_other_programs_is_measured_again(monkeypatch):
    """Other processes busy on the cores while it ran (what the host lock cannot stop): pause, measure again, keep
    the least disturbed attempt and say how contended it was."""
    from enginefarm.builder import bench
    from enginefarm.hardware import timing

    busy = iter([0.0, 50.0, 50.0, 50.2])  # the machine's busy CPU seconds around each attempt: heavy, then quiet
    monkeypatch.setattr(bench, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(bench, "_cpu_seconds", lambda: 0.0)
    monkeypatch.setattr(bench, "time", Seconds())  # each reading of the clock one second later
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    attempts = iter([timing.Timing([9.0] * 5, "spread"), timing.Timing([5.0] * 5, "spread")])
    monkeypatch.setattr(timing, "time_runs", lambda run: next(attempts))
    best, contention, made = bench._least_contended(lambda: None, on_cpu=True)
    assert made == 2 and best.median_ms == 5.0 and contention["others_share"] < bench.OTHERS_MAX
    busy = iter([0.0, 50.0])
    monkeypatch.setattr(bench, "_busy_seconds", lambda: next(busy))
    attempts = iter([timing.Timing([9.0] * 5, "spread")])
    assert bench._least_contended(lambda: None, on_cpu=False)[2] == 1  # a GPU's numbers do not depend on the CPU's load
