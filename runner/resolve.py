"""Resolution: which stored artifact to run on this device, and why. One rule table for all vendors."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from enginefarm.builder.backends import availability, get_backend
from enginefarm.builder.backends.base import version_in_range
from enginefarm.cache.index import IndexEntry
from enginefarm.cache.manifest import Target

from .device import Device

# Lower is preferred when no benchmark tells the artifacts apart. Engines for one exact architecture beat
# hardware-compatible classes, which beat JIT-able engines, portable IR, and finally ONNX for ONNX Runtime.
TIER_NAMES = {0: "exact-arch engine", 1: "hardware-compatible engine", 2: "JIT-able engine", 3: "portable IR", 4: "ONNX (ORT)"}


def _ms(value: float) -> str:
    """Milliseconds readable at any scale: tiny models run in microseconds, and 0.0 vs 0.0 explains nothing."""
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def tier_of(target: Target) -> int:
    if target.backend == "onnxruntime":
        return 4
    if target.backend == "openvino" or target.backend == "coreml":
        return 3
    if target.backend == "tensorrt-rtx":
        return 2
    if target.device.endswith("+"):
        return 1
    return 0


@dataclass
class Candidate:
    entry: IndexEntry
    device: Device | None = None
    reason: str = ""  # why it cannot be used here; empty if usable
    p50_ms: float | None = None
    measured_on: str | None = None  # "this device class" | "a similar device (<class>)" | None
    rank: tuple = ()
    source: str = "store"  # store | cache

    @property
    def usable(self) -> bool:
        return not self.reason

    @property
    def target(self) -> Target:
        return self.entry.parsed_target

    def describe(self) -> str:
        e = self.entry
        if self.p50_ms is not None:
            speed = f", p50 {_ms(self.p50_ms)} ms measured on {self.measured_on}"
        else:
            speed = "" if self.device is None else ", no benchmark for this device"
        return f"{e.label} {TIER_NAMES[tier_of(self.target)]}{speed}"


@dataclass
class Resolution:
    ref: str
    precision: str | None
    devices: list[Device]
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.candidates if c.usable), key=lambda c: c.rank)

    def explain(self, chosen: Candidate | None = None, note: str = "") -> str:
        lines = [f"{self.ref} (precision {self.precision or 'any'}) on {', '.join(f'{d.kind} {d.name} [{d.bench_class}]' for d in self.devices)}"]
        if chosen is not None:
            lines.append(f"chose {chosen.describe()} from the {chosen.source}")
            lines.append(f"  because: {self._why(chosen)}")
        if note:
            lines.append(f"  {note}")
        others = [c for c in self.candidates if c is not chosen]
        if others:
            lines.append("also considered:")
            for c in sorted(others, key=lambda c: (not c.usable, c.rank)):
                lines.append(f"  - {c.describe()}: {c.reason or 'usable, ranked lower'}")
        elif chosen is None:
            lines.append("no stored artifact for it")
        return "\n".join(lines)

    def _why(self, chosen: Candidate) -> str:
        rivals = [c for c in self.ranked if c is not chosen]
        if tier_of(chosen.target) <= 2 and any(tier_of(c.target) > tier_of(chosen.target) for c in rivals):
            return f"the most specific engine kind usable here ({TIER_NAMES[tier_of(chosen.target)]})"
        if chosen.p50_ms is not None:
            slower = [c for c in rivals if c.p50_ms is not None]
            if slower:
                best_other = min(slower, key=lambda c: c.p50_ms)
                return f"fastest measured: {_ms(chosen.p50_ms)} ms vs {_ms(best_other.p50_ms)} ms for {best_other.entry.target} {best_other.entry.precision}"
            return "the only usable artifact with a benchmark"
        if not rivals:
            return "the only usable artifact"
        return f"no benchmarks to compare, so the most specific kind wins ({TIER_NAMES[tier_of(chosen.target)]})"


def _runtime_version(backend: str) -> str | None:
    try:
        versions = get_backend(backend).versions()
    except Exception:
        return None
    return versions.get(backend)


def _check(entry: IndexEntry, component: str, precision: str | None, devices: list[Device], cache: dict, can_load) -> tuple[str, Device | None]:
    if entry.component != component:
        return "other component", None
    if entry.failed_validation:
        return f"failed validation when re-checked ({entry.validation.get('failure') or 'see enginefarm validate'})", None
    if precision and entry.precision != precision:
        return f"precision {entry.precision}, asked for {precision}", None
    target = entry.parsed_target
    device = next((d for d in devices if str(target) in d.targets), None)
    if device is None:
        return f"no device here runs {target}", None
    if str(target) not in cache:
        cache[str(target)] = can_load(target)
    avail = cache[str(target)]
    if not avail.can_load:
        return f"cannot load here: {avail.reason}", device
    constraints = entry.constraints
    for package, spec in constraints.get("runtime", {}).items():
        have = _runtime_version(package) if package == target.backend else None
        if have is not None and not version_in_range(have, spec):
            return f"needs {package} {spec}, this has {have}", device
    problem = _device_constraint(constraints, device)
    return problem, device


def _device_constraint(constraints: dict[str, Any], device: Device) -> str:
    """Minimum driver, OS and VRAM, where the artifact states them and the device reports them."""
    driver, wanted = device.info.get("driver"), constraints.get("min_driver")
    if driver and wanted and version_in_range(str(driver), f"<{wanted}"):
        return f"needs driver {wanted} or newer, this has {driver}"
    os_list, os_here = constraints.get("os"), device.info.get("os")
    if os_list and os_here and os_here not in os_list:
        return f"built for {', '.join(os_list)}, this is {os_here}"
    vram, need = device.info.get("vram_mb"), constraints.get("vram_mb")
    if vram and need and need > vram:
        return f"needs {need} MiB of VRAM, this GPU has {vram}"
    return ""


def _speed(entry: IndexEntry, device: Device) -> tuple[float | None, str | None]:
    exact = [b for b in entry.benchmarks if b["device"]["class"] == device.bench_class]
    if exact:
        return min(b["p50_ms"] for b in exact), "this device class"
    kind = device.bench_class.split("-")[0]
    similar = [b for b in entry.benchmarks if b["device"]["class"].startswith(kind)]
    if similar:
        best = min(similar, key=lambda b: b["p50_ms"])
        return best["p50_ms"], f"a similar device ({best['device'].get('class')})"
    return None, None


def resolve(ref: str, entries: list[tuple[IndexEntry, str]], precision: str | None, devices: list[Device], *, can_load=availability) -> Resolution:
    """`entries`: (index entry, where it came from). `can_load(target) -> Availability` says what this machine's
    SDKs can load (a parameter so the rule table can be tested for hardware this machine lacks).

    Ranking, first difference wins:
    1. the device: GPUs before the CPU;
    2. compiled engines (exact arch > hardware-compatible class > JIT-able), by kind first, then by speed;
    3. portable artifacts (IR, ONNX) by speed measured on this device class, then a similar class, then by kind.
    """
    model, _, component = ref.partition("/")
    resolution = Resolution(ref, precision, devices)
    cache: dict = {}
    seen: set[str] = set()
    # A verdict from re-validation (in the store's index) overrules the build-time record a cached copy carries.
    verdicts = {e.build_key: e.validation for e, _ in entries if e.validation.get("revalidated")}
    entries = [(replace(e, validation=verdicts[e.build_key]) if e.build_key in verdicts else e, source) for e, source in entries]
    for entry, source in entries:
        if entry.build_key in seen:
            continue
        seen.add(entry.build_key)
        reason, device = _check(entry, component, precision, devices, cache, can_load)
        if reason == "other component":
            continue
        candidate = Candidate(entry, device, reason, source=source)
        if device is not None:
            candidate.p50_ms, candidate.measured_on = _speed(entry, device)
        device_order = devices.index(device) if device in devices else len(devices)
        tier = tier_of(candidate.target)
        measured = candidate.p50_ms is not None
        how_measured = (0 if candidate.measured_on == "this device class" else 1) if measured else 2
        speed = candidate.p50_ms if measured else 0.0
        if tier <= 2:  # compiled engines: the most specific kind wins, speed breaks ties
            candidate.rank = (device_order, 0, tier, how_measured, speed, entry.precision != "fp32")
        else:  # portable artifacts: the fastest measured here wins
            candidate.rank = (device_order, 1, 0, how_measured, speed, tier, entry.precision != "fp32")
        resolution.candidates.append(candidate)
    return resolution
