"""Timing on the device: when the top candidates are close, or their numbers come from another device class, the
first `load()` times them here, side by side, and remembers the winner.

When: the usable candidates that rank first on the first device and are of the same kind (`contenders`) number two
or more, and either the leader's farm number was measured on another device class (or not at all), or a rival is
within CLOSE of it or within its noise, or has no number for this class.

How much: ENGINEFARM_MEASURE=auto (default) times them only where the farm's own numbers say it costs under
AUTO_BUDGET_S (downloads, loads and a few runs each); `on` always (at most MAX_CANDIDATES, MAX_ROUNDS rounds, or
BUDGET_S of running); `off` never, and ignores what was remembered. The host lock keeps it from running beside a
build or another timing on the same machine (it waits at most LOCK_WAIT_S, then leaves it for another load).

Remembered: per device fingerprint (the device, its driver and the runtime versions of the backends involved) in
ENGINEFARM_HOME/device-timings/, keyed by the set of contenders; a new artifact among them, a new driver or a new
runtime is timed again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.cache import precision_table
from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.cache.build_keys import build_key
from enginefarm.cache.fields import FieldError
from enginefarm.cache.progress import Progress
from enginefarm.cache.records import benchmark
from enginefarm.hardware.devices import Device
from enginefarm.hardware.timing import Timing, time_interleaved
from enginefarm.settings import Settings

from .resolve import Candidate, Resolution, _ms

log = logging.getLogger(__name__)

CLOSE = 0.10  # farm numbers within 10% of the leader's are close enough to let this device decide
MAX_CANDIDATES = 3
AUTO_BUDGET_S = 3.0
BUDGET_S = 60.0
MIN_ROUNDS, MAX_ROUNDS = 3, 10
ASSUMED_BYTES_PER_S = 50 * 2**20  # for estimating a download in auto mode
LOCK_WAIT_S = 10.0

Opener = Callable[[Candidate], tuple[Any, Any]]  # candidate -> (manifest, backend session)
CLOCK: Callable[[], float] = time.perf_counter  # what timings are measured with (tests simulate it)


@dataclass
class Contenders:
    candidates: list[Candidate]
    why: str
    device: Device  # the one they all run on (the leader's)


def contenders(resolution: Resolution) -> Contenders | None:
    """The candidates this device should time itself, and why; None when the farm's numbers settle it."""
    ranked = [c for c in resolution.ranked if c.device is not None]
    if len(ranked) < 2:
        return None
    leader, device = ranked[0], ranked[0].device
    assert device is not None  # ranked keeps only the candidates with a device
    bucket = [c for c in ranked if c.rank[:3] == leader.rank[:3] and c.device is device]
    if len(bucket) < 2:
        return None
    leader_p50 = _farm_p50_here(leader)
    if leader_p50 is None:
        where = leader.measured_on or "no device"
        return Contenders(bucket[:MAX_CANDIDATES], f"the leader's number comes from {where}", device)
    rivals = [
        c
        for c in bucket[1:]
        if (p50 := _farm_p50_here(c)) is None or leader.is_tied_with(c) or p50 <= leader_p50 * (1 + CLOSE)
    ]
    # The closest by the farm's numbers first (a tie's precision order says nothing about which is faster here).
    rivals.sort(
        key=lambda c: (c.measured_on != "this device class", c.p50_ms if c.p50_ms is not None else float("inf"))
    )
    if not rivals:
        return None
    close = [c for c in rivals if c.measured_on == "this device class"]
    why = (
        f"within {CLOSE:.0%} or the noise of each other on the farm"
        if close
        else "a rival has no number for this device class"
    )
    return Contenders([leader] + rivals[: MAX_CANDIDATES - 1], why, device)


def _farm_p50_here(c: Candidate) -> float | None:
    """The farm's p50 measured on this device class; None where its number comes from another class or none."""
    return c.p50_ms if c.measured_on == "this device class" else None


def fingerprint(device: Device, candidates: list[Candidate]) -> dict[str, Any]:
    """What a timing is valid for: this device, its driver, and the runtime versions of the backends timed."""
    from enginefarm.backends import get_backend

    runtimes = {}
    for backend in sorted({c.target.backend for c in candidates}):
        try:
            runtimes[backend] = get_backend(backend).versions().get(backend, "unknown")
        except Exception:
            runtimes[backend] = "unknown"
    info = device.info
    return {
        "kind": device.kind,
        "name": device.name,
        "class": device.bench_class,
        "driver": info.get("driver"),
        "arch": info.get("arch") or info.get("gfx"),
        "flags": info.get("flags"),
        "cores": info.get("logical_cores"),
        "runtimes": runtimes,
    }


class Memory:
    """Remembered timings of one device fingerprint: ENGINEFARM_HOME/device-timings/<fingerprint digest>.json."""

    def __init__(self, home: Path, print_: dict[str, Any]) -> None:
        self.fingerprint = print_
        self.path = Path(home) / "device-timings" / f"{build_key(print_)[:24]}.json"

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable device timings %s (%s)", self.path, exc)
            return {}
        return data.get("results", {}) if isinstance(data, dict) and data.get("fingerprint") == self.fingerprint else {}

    def get(self, keys: list[str]) -> dict[str, Any] | None:
        found = self._read().get(_set_key(keys))
        return found if isinstance(found, dict) and found.get("winner") in keys else None

    def put(self, keys: list[str], result: dict[str, Any]) -> None:
        results = {**self._read(), _set_key(keys): result}  # re-read: another process may have added its own
        try:
            write_bytes_atomic(
                self.path,
                json.dumps({"fingerprint": self.fingerprint, "results": results}, indent=1, sort_keys=True).encode(),
            )
        except OSError as exc:  # remembering only saves the next load's timing
            log.warning("could not remember the timing in %s: %s", self.path, exc)


def _set_key(keys: list[str]) -> str:
    return ",".join(sorted(keys))


def decide(
    resolution: Resolution, settings: Settings, report: Progress, opener: Opener | None
) -> dict[str, tuple[Any, Any]]:
    """Apply a remembered timing or, where allowed, time the contenders now (`opener` loads one; None: only
    remembered timings count, as in `fetch`). Returns the sessions opened for timing, by build key, so the winner is
    not loaded twice."""
    if settings.measure == "off":
        return {}
    found = contenders(resolution)
    if found is None:
        return {}
    keys = [c.entry.build_key for c in found.candidates]
    memory = Memory(settings.home, fingerprint(found.device, found.candidates))
    remembered = memory.get(keys)
    if remembered is not None:
        apply(resolution, remembered, f"remembered from {remembered.get('when', 'an earlier load')}")
        return {}
    if opener is None:
        return {}
    estimate = estimate_s(found.candidates)
    if settings.measure == "auto" and (estimate is None or estimate > AUTO_BUDGET_S):
        cost = "an unknown time (no farm numbers to estimate from)" if estimate is None else f"about {estimate:.0f} s"
        resolution.notes.append(
            f"not timed on this device ({found.why}): it would take {cost}, more than auto's {AUTO_BUDGET_S:.0f} s; "
            "set ENGINEFARM_MEASURE=on to time them once and remember the winner"
        )
        return {}
    return _time(resolution, found, memory, settings, report, opener)


def estimate_s(candidates: list[Candidate]) -> float | None:
    """Seconds to fetch what is not cached, load, warm up and run each candidate MIN_ROUNDS times, from the farm's
    numbers."""
    total = 0.0
    for c in candidates:
        record = c.bench or next(iter(c.entry.benchmarks), None)
        if record is None:
            return None
        runs_ms = (
            float(record.load_ms or 0)
            + float(record.first_inference_ms or record.p50_ms)
            + (1 + MIN_ROUNDS) * record.p50_ms
        )
        download = 0.0 if c.source.startswith("cache") else float(c.entry.stored_size) / ASSUMED_BYTES_PER_S
        total += runs_ms / 1000 + download
    return total


def _time(
    resolution: Resolution, found: Contenders, memory: Memory, settings: Settings, report: Progress, opener: Opener
) -> dict[str, tuple[Any, Any]]:
    from enginefarm.builder.hostlock import alone

    with alone(LOCK_WAIT_S) as host:
        if host["alone"] is False:
            resolution.notes.append(
                f"not timed on this device: a build or another timing held the host for {LOCK_WAIT_S:.0f} s"
            )
            return {}
        names = ", ".join(c.label for c in found.candidates)
        report.message(f"timing {len(found.candidates)} candidates on this device ({found.why}): {names}")
        opened: dict[str, tuple[Any, Any]] = {}
        for c in found.candidates:
            try:
                opened[c.entry.build_key] = opener(c)
            except Exception as exc:  # load() tries it again in its own order and reports why it fails
                log.info("not timing %s: %s", c.describe(), exc)
        feeds = _feeds(opened)
        if len(feeds) < 2:
            return opened
        runs = {key: _run(opened[key][1], feed) for key, feed in feeds.items()}
        for run in runs.values():
            run()  # warm-up, as the farm's benchmark does
        label = {c.entry.build_key: c.label for c in found.candidates}

        def on_round(number: int, timings: dict[str, Timing]) -> None:
            report.message(
                f"  round {number}: " + ", ".join(f"{label[k]} {_ms(t.median_ms)} ms" for k, t in timings.items())
            )

        budget = AUTO_BUDGET_S if settings.measure == "auto" else BUDGET_S
        timings = time_interleaved(
            runs, min_rounds=MIN_ROUNDS, max_rounds=MAX_ROUNDS, budget_s=budget, on_round=on_round, clock=CLOCK
        )
    records = {key: {**t.record(), "alone": host["alone"]} for key, t in timings.items()}  # remembered as stored JSON
    winner = pick(records, {c.entry.build_key: c.entry.precision for c in found.candidates})
    result = {
        "winner": winner,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "ref": resolution.ref,
        "why": found.why,
        "timings": records,
    }
    memory.put([c.entry.build_key for c in found.candidates], result)  # as decide() looks it up
    report.message(f"fastest here: {label[winner]} ({_ms(timings[winner].median_ms)} ms); remembered for this device")
    apply(resolution, result, "just now")
    return opened


def pick(records: dict[str, dict[str, Any]], precisions: dict[str, str]) -> str:
    """The fastest, with the same tie rule as resolution: within each other's noise, the more accurate precision."""
    timed = {key: benchmark(record) for key, record in records.items()}
    fastest = min(timed, key=lambda k: timed[k].p50_ms)
    tied_keys = [k for k in timed if k == fastest or timed[fastest].tied(timed[k])]
    return min(tied_keys, key=lambda k: (precision_table.tie_order(precisions.get(k)), timed[k].p50_ms))


def apply(resolution: Resolution, result: dict[str, Any], when: str) -> None:
    timings = result.get("timings", {})
    usable = {c.entry.build_key: c for c in resolution.candidates if c.usable}
    if result.get("winner") not in usable:
        return
    try:
        timed = {key: benchmark(record) for key, record in timings.items() if key in usable}
    except FieldError as exc:  # a damaged memory file: the farm's numbers decide, as if nothing was timed
        log.info("ignoring this device's remembered timings: %s", exc)
        return
    for key, record in timed.items():
        usable[key].on_device = record
    resolution.preferred = result["winner"]
    rounds = max((r.runs or 0 for r in timed.values()), default=0)
    resolution.notes.append(
        f"timed on this device ({when}; {result.get('why', '')}; {rounds} interleaved runs each): this device's "
        "own numbers decide among those it timed, the farm's rank the rest; ENGINEFARM_MEASURE=off ignores them"
    )


def _run(session: Any, feed: dict[str, np.ndarray]) -> Callable[[], object]:
    """One timed run of `session` on `feed` (a closure per contender, not over the loop's variables)."""
    return lambda: session.run(feed)


def _feeds(opened: dict[str, tuple[Any, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """One seeded input at the first contender's opt shape, for every contender whose profile admits it (timed on
    different inputs, the numbers would not compare)."""
    if not opened:
        return {}
    first = next(iter(opened.values()))[0]
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in first.io.get("inputs", []):
        shape = first.profile[spec["name"]]["opt"]
        kind = np.dtype(spec["dtype"])
        feeds[spec["name"]] = rng.uniform(-1, 1, shape).astype(kind) if kind.kind == "f" else np.zeros(shape, kind)
    fits = {}
    for key, (manifest, _) in opened.items():
        if all(
            name in manifest.profile and _within(list(array.shape), manifest.profile[name])
            for name, array in feeds.items()
        ):
            fits[key] = feeds
    return fits


def _within(shape: list[int], bounds: dict[str, list[int]]) -> bool:
    return len(shape) == len(bounds["min"]) and all(
        lo <= d <= hi for d, lo, hi in zip(shape, bounds["min"], bounds["max"], strict=True)
    )
