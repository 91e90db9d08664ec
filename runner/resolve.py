"""Resolution: which stored artifact to run on this device, and why. One rule table for all vendors."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from enginefarm.backends import Rank, availability, get_backend, rank_of
from enginefarm.backends.base import version_in_range
from enginefarm.cache import precision_table
from enginefarm.cache.index import IndexEntry, gc_paused
from enginefarm.cache.manifest import Target
from enginefarm.cache.records import Benchmark, Constraints
from enginefarm.cache.versions import newest, same_version, version_key
from enginefarm.hardware.devices import Device

from .ties import Tie, clusters

# Ties (numbers within each other's noise) go to the more accurate precision: more mantissa bits first.
TIE_RULE = (
    "numbers whose middle halves (median ± IQR/2) overlap are tied; a tie goes to the more accurate precision "
    "(fp32, then fp16, then bf16), then to the lower median"
)

LISTED = 25  # rivals an explanation names one by one; the rest are counted (an index may hold 10^5 entries)


def _more(rest: list[Candidate]) -> str:
    """'1200 more: 1000 usable, ranked lower; 200 not usable (150 no device here runs …, 50 …)'."""
    reasons: dict[str, int] = {}
    for c in rest:
        if c.reason:
            reasons[c.reason] = reasons.get(c.reason, 0) + 1
    usable = len(rest) - sum(reasons.values())
    parts = [f"{usable} usable, ranked lower"] if usable else []
    if reasons:
        common = sorted(reasons.items(), key=lambda kv: -kv[1])
        listed = ", ".join(f"{n}: {why}" for why, n in common[:3]) + (", …" if len(common) > 3 else "")
        parts.append(f"{sum(reasons.values())} not usable ({listed})")
    return f"{len(rest)} more: " + "; ".join(parts)


def _ms(value: float) -> str:
    """Milliseconds readable at any scale: tiny models run in microseconds, and 0.0 vs 0.0 explains nothing."""
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


@dataclass(eq=False)  # identity: candidates refer to each other (tied_with)
class Candidate:
    entry: IndexEntry
    device: Device | None = None
    reason: str = ""  # why it cannot be used here; empty if usable
    p50_ms: float | None = None
    measured_on: str | None = None  # "this device class" | "a similar device (<class>)" | None
    rank: tuple = ()
    source: str = "store"  # store | cache
    bench: Benchmark | None = None  # the farm's benchmark record behind p50_ms
    tie: Tie | None = None  # the candidates within each other's noise (same bucket), this one included
    tier: Rank | None = None  # rank_of(target), set once by _rank (asked per candidate, it dominated 10^5-entry loads)
    on_device: Benchmark | None = None  # this device's own timing at a first load (runner.measure)

    @property
    def tied_with(self) -> list[Candidate]:
        """Rivals within each other's noise (same bucket)."""
        return [] if self.tie is None else [c for c in self.tie.members if c is not self]

    def is_tied_with(self, other: Candidate) -> bool:
        return other is not self and self.tie is not None and other.tie is self.tie

    @property
    def kind(self) -> Rank:
        return self.tier if self.tier is not None else rank_of(self.target)

    @property
    def usable(self) -> bool:
        return not self.reason

    @property
    def target(self) -> Target:
        return self.entry.parsed_target

    @property
    def version(self) -> str | None:
        """The model version (recipe `model.version`); None in index entries written before versions were recorded."""
        return self.entry.model_version or None

    @property
    def label(self) -> str:
        return f"{self.entry.target} {self.entry.precision}"

    def describe(self) -> str:
        e = self.entry
        if self.p50_ms is not None:
            noise = _noise(self.bench) if self.bench else ""
            speed = f", p50 {_ms(self.p50_ms)} ms measured on {self.measured_on} by the farm{noise}"
        else:
            speed = "" if self.device is None else ", no benchmark for this device"
        if self.on_device is not None:
            speed += f"; timed on this device at a first load: {_ms(self.on_device.p50_ms)} ms{_noise(self.on_device)}"
        version = f" v{self.version}" if self.version is not None else ""
        return f"{e.target} {e.precision}{version} [{e.build_key[:12]}] {self.kind.label}{speed}"


def _measured_label(c: Candidate) -> str:
    """'cpu-x86 fp16 at 1.2 ms'; a tie holds only measured candidates (_rank), but the label says so if not."""
    return c.label if c.p50_ms is None else f"{c.label} at {_ms(c.p50_ms)} ms"


def _noise(record: Benchmark) -> str:
    """' (±1.2%, 12 runs)': the half-IQR around the median and the repetitions, where the record has them."""
    runs = record.runs
    if not record.noise_ms or not record.p50_ms:
        return f" ({runs} runs)" if runs else ""
    return f" (±{100 * record.noise_ms / record.p50_ms:.1f}%, {runs} runs)"


@dataclass
class Resolution:
    ref: str
    precision: str | None
    devices: list[Device]
    candidates: list[Candidate] = field(default_factory=list)
    pinned: str | None = None  # the model version the caller asked for (None: the newest usable)
    version: str | None = None  # the model version served
    notes: list[str] = field(default_factory=list)  # what explain() adds: newer versions not usable, on-device timing
    preferred: str | None = None  # the build key timed fastest on this device (runner.measure): ranked first
    by_rank: list[Candidate] | None = None  # the candidates sorted by rank once ranked (ranks never change after)

    def _ordered(self) -> list[Candidate]:
        return self.by_rank if self.by_rank is not None else sorted(self.candidates, key=lambda c: c.rank)

    @property
    def ranked(self) -> list[Candidate]:
        """The usable candidates, best first: the one timed fastest here (if any), then by rank. Linear once ranked
        (asked several times per load, over up to 10^5 candidates)."""
        usable = [c for c in self._ordered() if c.usable]
        first = [c for c in usable if c.entry.build_key == self.preferred]
        return first + [c for c in usable if c.entry.build_key != self.preferred] if first else usable

    def explain(self, chosen: Candidate | None = None, note: str = "") -> str:
        version = f"model version {self.pinned} (pinned)" if self.pinned is not None else "newest model version"
        lines = [
            f"{self.ref} (precision {self.precision or 'any'}, {version}) on "
            f"{', '.join(f'{d.kind} {d.name} [{d.bench_class}]' for d in self.devices)}"
        ]
        if chosen is not None:
            lines.append(f"chose {chosen.describe()} from the {chosen.source}")
            lines.append(f"  because: {self._why(chosen)}")
        lines += [f"  {n}" for n in self.notes]
        if note:
            lines.append(f"  {note}")
        others = [c for c in self._ordered() if c is not chosen]
        if others:
            lines.append("also considered:")
            others = [c for c in others if c.usable] + [c for c in others if not c.usable]  # each part by rank
            for c in others[:LISTED]:
                lines.append(f"  - {c.describe()}: {c.reason or 'usable, ranked lower'}")
            if len(others) > LISTED:
                lines.append(f"  … and {_more(others[LISTED:])}")
        elif chosen is None:
            lines.append("no stored artifact for it")
        return "\n".join(lines)

    def _why(self, chosen: Candidate) -> str:
        rivals = [c for c in self.ranked if c is not chosen]
        if chosen.entry.build_key == self.preferred and chosen.on_device is not None:
            timed = [(c.label, c.on_device) for c in rivals if c.on_device is not None]
            against = ", ".join(f"{_ms(record.p50_ms)} ms for {label}" for label, record in timed)
            return f"timed fastest on this device at a first load: {_ms(chosen.on_device.p50_ms)} ms" + (
                f" vs {against}" if against else ""
            )
        if chosen.kind <= Rank.JIT and any(c.kind > chosen.kind for c in rivals):
            return f"the most specific engine kind usable here ({chosen.kind.label})"
        if chosen.p50_ms is not None:
            if chosen.tied_with:
                tied = chosen.tied_with
                others = ", ".join(_measured_label(c) for c in tied[:LISTED])
                others += f" and {len(tied) - LISTED} more" if len(tied) > LISTED else ""
                return f"tied with {others} (p50 {_ms(chosen.p50_ms)} ms; within each other's noise): {TIE_RULE}"
            slower = [(c.p50_ms, c) for c in rivals if c.p50_ms is not None]
            if slower:
                best_p50, best_other = min(slower, key=lambda pair: pair[0])
                return (
                    f"fastest measured: {_ms(chosen.p50_ms)} ms vs {_ms(best_p50)} ms for "
                    f"{best_other.entry.target} {best_other.entry.precision}"
                )
            return "the only usable artifact with a benchmark"
        if not rivals:
            return "the only usable artifact"
        return f"no benchmarks to compare, so the most specific kind wins ({chosen.kind.label})"


def _runtime_version(backend: str) -> str | None:
    try:
        versions = get_backend(backend).versions()
    except Exception:
        return None
    return versions.get(backend)


def _check(
    entry: IndexEntry, component: str, precision: str | None, devices: list[Device], cache: dict, can_load
) -> tuple[str, Device | None]:
    if entry.component != component:
        return "other component", None
    if entry.failed_validation:
        return f"failed validation when re-checked ({entry.validation.failure or 'see enginefarm validate'})", None
    if precision and entry.precision != precision:
        return f"precision {entry.precision}, asked for {precision}", None
    target = entry.parsed_target
    text = entry.target  # the cache's key: a string hashes once, a Target per lookup
    if ("device", text) not in cache:  # per distinct target, not per entry
        cache["device", text] = next((d for d in devices if str(target) in d.targets), None)
    device = cache["device", text]
    if device is None:
        return f"no device here runs {target}", None
    if ("load", text) not in cache:
        cache["load", text] = can_load(target)
    avail = cache["load", text]
    if not avail.can_load:
        return f"cannot load here: {avail.reason}", device
    constraints = entry.constraints
    for package, spec in (constraints.runtime or {}).items():
        if package == target.backend and ("runtime", package) not in cache:
            cache["runtime", package] = _runtime_version(package)
        have = cache["runtime", package] if package == target.backend else None
        if have is not None and ("range", have, spec) not in cache:
            cache["range", have, spec] = version_in_range(have, spec)
        if have is not None and not cache["range", have, spec]:
            return f"needs {package} {spec}, this has {have}", device
    problem = _device_constraint(constraints, device)
    return problem, device


def _device_constraint(constraints: Constraints, device: Device) -> str:
    """Minimum driver, OS and VRAM, where the artifact states them and the device reports them."""
    driver, wanted = device.info.get("driver"), constraints.min_driver
    if driver and wanted and version_in_range(str(driver), f"<{wanted}"):
        return f"needs driver {wanted} or newer, this has {driver}"
    os_list, os_here = constraints.os, device.info.get("os")
    if os_list and os_here and os_here not in os_list:
        return f"built for {', '.join(os_list)}, this is {os_here}"
    vram, need = device.info.get("vram_mb"), constraints.vram_mb
    if vram and need and need > vram:
        return f"needs {need} MiB of VRAM, this GPU has {vram}"
    flags, any_of = device.info.get("flags"), constraints.cpu_flags_any
    if device.kind == "cpu" and flags is not None and any_of and not set(any_of) & set(flags):
        return f"computes as built only on a CPU with {' or '.join(any_of)}; this one has neither"
    return ""


def _speed(entry: IndexEntry, device: Device) -> tuple[Benchmark | None, str | None]:
    """The farm's benchmark record that speaks for this device, and where it was measured."""
    exact = [b for b in entry.benchmarks if b.device_class == device.bench_class]
    if exact:
        return min(exact, key=lambda b: b.p50_ms), "this device class"
    kind = device.bench_class.split("-")[0]
    similar = [b for b in entry.benchmarks if b.device_class.startswith(kind)]
    if similar:
        best = min(similar, key=lambda b: b.p50_ms)
        return best, f"a similar device ({best.device_class})"
    return None, None


def resolve(
    ref: str,
    entries: list[tuple[IndexEntry, str]],
    precision: str | None,
    devices: list[Device],
    *,
    can_load=availability,
    version: str | None = None,
) -> Resolution:
    """`entries`: (index entry, where it came from). `can_load(target) -> Availability` says what this machine's
    SDKs can load (a parameter so the rule table can be tested for hardware this machine lacks). `version`: serve
    only this model version; None: the newest version that has a usable artifact here.

    Ranking, first difference wins:
    1. the device: GPUs before the CPU;
    2. compiled engines (exact arch > hardware-compatible class > JIT-able), by kind first, then by speed;
    3. portable artifacts (IR, ONNX) by speed measured on this device class, then a similar class, then by kind.
    Speeds within each other's noise are tied, and a tie is broken by TIE_RULE.
    """
    with gc_paused():  # 10^5 candidates, no cycles worth collecting until resolution is done (see gc_paused)
        return _resolve(ref, entries, precision, devices, can_load, version)


def _resolve(
    ref: str,
    entries: list[tuple[IndexEntry, str]],
    precision: str | None,
    devices: list[Device],
    can_load,
    version: str | None,
) -> Resolution:
    model, _, component = ref.partition("/")
    resolution = Resolution(ref, precision, devices, pinned=version)
    cache: dict = {}
    seen: set[str] = set()
    # A verdict from re-validation (in the store's index) overrules the build-time record a cached copy carries.
    verdicts = {e.build_key: e.validation for e, _ in entries if e.validation.revalidated}
    entries = [
        (replace(e, validation=verdicts[e.build_key]) if e.build_key in verdicts else e, source)
        for e, source in entries
    ]
    for entry, source in entries:
        if entry.build_key in seen:
            continue
        seen.add(entry.build_key)
        reason, device = _check(entry, component, precision, devices, cache, can_load)
        if reason == "other component":
            continue
        candidate = Candidate(entry, device, reason, source=source)
        if device is not None:
            candidate.bench, candidate.measured_on = _speed(entry, device)
            candidate.p50_ms = candidate.bench.p50_ms if candidate.bench else None
        resolution.candidates.append(candidate)
    _choose_version(resolution)
    _rank(resolution.candidates, devices)
    resolution.by_rank = sorted(resolution.candidates, key=lambda c: c.rank)
    return resolution


def _choose_version(resolution: Resolution) -> None:
    """Keep one model version: the pinned one, or the newest that has a usable artifact here. Older versions stay
    listed with the reason; a newer version with nothing usable here is named in the explanation."""
    candidates = resolution.candidates
    if resolution.pinned is not None:
        for c in candidates:
            if not same_version(c.version, resolution.pinned):
                c.reason = f"model version {c.version or 'unknown'}, pinned to {resolution.pinned}"
        resolution.version = resolution.pinned
        return
    usable = [c for c in candidates if c.usable]
    if not usable:
        return
    served = newest(c.version for c in usable)
    resolution.version = served
    newer = [c for c in candidates if not c.usable and version_key(c.version) > version_key(served)]
    if newer:
        top = newest(c.version for c in newer)
        why = next(c.reason for c in newer if same_version(c.version, top))
        resolution.notes.append(
            f"model version {top} exists but none of its artifacts is usable here ({why}); serving version {served}"
        )
    for c in usable:
        if not same_version(c.version, served):
            c.reason = (
                f"older model version {c.version or 'unknown'} (version {served} is usable here; pin version= "
                "to use it)"
            )


def _rank(candidates: list[Candidate], devices: list[Device]) -> None:
    """Each usable candidate's rank tuple. Within a bucket (same device and kind of artifact, numbers from the same
    kind of source), measured candidates fall into tie clusters: the fastest remaining and everything within its
    noise, ordered by TIE_RULE."""
    tiers: dict[str, Rank] = {}
    buckets: dict[tuple, list[tuple[float, Candidate]]] = {}  # the measured usable ones, with their p50
    order: dict[int, int] = {}  # per device object, not per candidate (Device equality compares every field)
    for c in candidates:
        if id(c.device) not in order:
            order[id(c.device)] = devices.index(c.device) if c.device in devices else len(devices)
        device_order = order[id(c.device)]
        if c.entry.target not in tiers:
            tiers[c.entry.target] = rank_of(c.target)
        tier = c.tier = tiers[c.entry.target]
        how_measured = (0 if c.measured_on == "this device class" else 1) if c.p50_ms is not None else 2
        bucket = (
            (device_order, 0, tier) if tier <= Rank.JIT else (device_order, 1, 0)
        )  # compiled engines: the most specific kind first
        precision = precision_table.tie_order(c.entry.precision)
        c.rank = bucket + (how_measured, 0, tier, precision)  # unmeasured: by kind, then precision
        if c.p50_ms is not None and c.usable:
            buckets.setdefault(bucket + (how_measured,), []).append((c.p50_ms, c))
    for prefix, members in buckets.items():
        for cluster, group in enumerate(clusters(members, lambda m: m[0], lambda m: _noise_of(m[1]))):
            tie = Tie([c for _, c in group])
            for p50, c in group:
                c.tie = tie
                c.rank = prefix + (cluster, precision_table.tie_order(c.entry.precision), p50, c.tier)


def _noise_of(c: Candidate) -> float:
    """Its half-IQR; a negative or NaN one (a damaged record) counts as none, so a leader is always in its own
    cluster."""
    noise = c.bench.noise_ms if c.bench is not None else 0.0
    return noise if noise >= 0 else 0.0
