"""Typed records inside an index entry: a benchmark, a validation verdict, what a device needs (constraints).

They are store-side JSON, so each is checked at the edge (`from_dict` raises FieldError naming the wrong field) and
written back exactly as it was read (`to_dict`): the fields this version reads are attributes; every other key, and
a read field stored as null or in a form it does not read, is kept in `rest` and written back untouched. An index
written by an older or a newer enginefarm therefore survives a read-merge-write by this one byte for byte.

Slotted and frozen: an index may hold 10^5 entries (tests/runner/test_resolve_scale.py bounds their memory), and
entries with no verdict or no constraints share one empty record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar

from . import fields as f

EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty():
    return field(default_factory=lambda: EMPTY)  # one shared empty mapping: records are frozen


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _split(data: Mapping[str, Any], readers: dict[str, Any]) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """The read fields that hold a value of their form, and the rest (kept as stored)."""
    read, rest = {}, {}
    for key, value in data.items():
        accepts = readers.get(key)
        if accepts is not None and value is not None and accepts(value):
            read[key] = value
        else:
            rest[key] = value
    return read, (rest or EMPTY)


def _written(record, listed: frozenset[str] = frozenset()) -> dict[str, Any]:
    out = dict(record.rest)
    for item in fields(record):
        value = getattr(record, item.name)
        if item.name != "rest" and value is not None:
            if item.name in listed:
                value = list(value)
            out[item.name] = dict(value) if isinstance(value, Mapping) else value
    return out


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark: where it ran and how fast (hardware/timing.py's record, plus the device it ran on)."""

    p50_ms: float
    device: Mapping[str, Any] = _empty()  # {"class": "cpu-x86_64-v4", ...}; a record timed on this device names none
    p90_ms: float | None = None
    iqr_ms: float | None = None
    spread: float | None = None
    runs: int | None = None
    load_ms: float | None = None
    first_inference_ms: float | None = None
    rest: Mapping[str, Any] = _empty()
    _READ: ClassVar[dict[str, Any]] = {
        "p90_ms": _number,
        "iqr_ms": _number,
        "spread": _number,
        "runs": _number,
        "load_ms": _number,
        "first_inference_ms": _number,
    }

    @classmethod
    def from_dict(cls, data: Any, where: str = "benchmark", *, on_device: bool = False) -> Benchmark:
        """`on_device`: a timing of this device's own (runner/measure.py), which names no device class."""
        data = f.mapping(data, where)
        p50 = f.number(data.get("p50_ms"), f"{where}.p50_ms")
        device = data.get("device")
        if not on_device or device is not None:
            f.text(f.mapping(device, f"{where}.device").get("class"), f"{where}.device.class")
        read, rest = _split({k: v for k, v in data.items() if k not in ("p50_ms", "device")}, cls._READ)
        return cls(p50, device if device is not None else EMPTY, **read, rest=rest)

    def to_dict(self) -> dict[str, Any]:
        out = _written(self)
        if not self.device and "device" not in self.rest:
            out.pop("device", None)
        return out

    @property
    def device_class(self) -> str:
        return self.device.get("class", "")

    @property
    def noise_ms(self) -> float:
        """Half the interquartile range, in ms: its median ± this holds the middle half of its runs. Records from
        before spreads were measured have no known noise (0)."""
        if self.iqr_ms is not None:
            return float(self.iqr_ms) / 2
        if self.spread is not None:
            return float(self.spread) * float(self.p50_ms) / 2
        return 0.0

    def tied(self, other: Benchmark) -> bool:
        """Within each other's noise: their middle halves (median ± IQR/2) overlap."""
        from enginefarm.hardware.timing import within_noise  # the rule a device's own runs are judged by too

        return within_noise(float(self.p50_ms), 2 * self.noise_ms, float(other.p50_ms), 2 * other.noise_ms)


def benchmark(record: Benchmark | dict[str, Any]) -> Benchmark:
    """A record as stored (a manifest's benchmark, an on-device timing) as the typed one; raises FieldError."""
    return record if isinstance(record, Benchmark) else Benchmark.from_dict(record, on_device=True)


def noise_ms(record: Benchmark | dict[str, Any]) -> float:
    """Half the interquartile range of a benchmark record, in ms (Benchmark.noise_ms)."""
    return benchmark(record).noise_ms


def tied(a: Benchmark | dict[str, Any], b: Benchmark | dict[str, Any]) -> bool:
    """Whether two benchmark records are within each other's noise: their middle halves (median ± IQR/2) overlap."""
    return benchmark(a).tied(benchmark(b))


def benchmarks(value: Any, field: str) -> tuple[Benchmark, ...]:
    """Each benchmark needs the speed and the device class resolution ranks by."""
    return tuple(Benchmark.from_dict(bench, f"{field}[{i}]") for i, bench in enumerate(f.items(value, field)))


def _kinds(*kinds: type):
    return lambda value: isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


@dataclass(frozen=True, slots=True)
class Verdict:
    """The current validation verdict of an artifact, as resolution reads it (the full report is the manifest's)."""

    passed: bool | None = None  # None: not validated (stored as null or absent)
    executed: bool | None = None  # False: published unvalidated, the first device that runs it checks it
    settings: str | None = None  # the digest of the validation settings it was reached under (builder/gate.py)
    min_cosine: float | None = None
    failure: str | None = None
    revalidated: str | None = None  # when a re-check against the recipe's current [validate] reached it
    why: str | None = None
    rest: Mapping[str, Any] = _empty()
    # The summary an index entry keeps of a validation report, each with the types it may take.
    KINDS: ClassVar[dict[str, tuple[type, ...]]] = {
        "passed": (bool, type(None)),
        "executed": (bool,),
        "settings": (str,),
        "min_cosine": (int, float, type(None)),
        "failure": (str,),
        "revalidated": (str,),
        "why": (str,),
    }

    @classmethod
    def from_dict(cls, value: Any, where: str = "validation") -> Verdict:
        """The summary of a validation record (its other fields are the manifest's); a field of the wrong type is a
        FieldError."""
        data = f.mapping(value, where)
        kept = {k: data[k] for k in cls.KINDS if k in data}
        for name, value in kept.items():
            if not _kinds(*cls.KINDS[name])(value):
                raise f.FieldError(f"{where}.{name}", f"has the wrong type ({type(value).__name__})")
        if not kept:
            return NO_VERDICT
        read, rest = _split(kept, {k: _kinds(*kinds) for k, kinds in cls.KINDS.items()})
        return cls(**read, rest=rest)

    def to_dict(self) -> dict[str, Any]:
        return _written(self)

    def __bool__(self) -> bool:
        """Whether any verdict is stored (an artifact indexed before validation was recorded has none)."""
        return self is not NO_VERDICT and bool(self.to_dict())

    def stored(self, name: str) -> bool:
        """Whether the verdict states `name`, null included (`passed: null`: validation did not run where built)."""
        return getattr(self, name) is not None or name in self.rest

    @property
    def failed(self) -> bool:
        return self.passed is False


NO_VERDICT = Verdict()


def _text_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a device needs to load an artifact, the parts resolution reads; a backend may state more (`rest`)."""

    runtime: Mapping[str, str] | None = None  # package -> PEP 440 range of the runtime that loads it
    min_driver: str | None = None
    os: tuple[str, ...] | None = None
    vram_mb: float | None = None
    cpu_flags_any: tuple[str, ...] | None = None  # computes as built only on a CPU with one of these
    engine: Mapping[str, Any] | None = None  # what a compiled engine needs besides (backends read it from the manifest)
    rest: Mapping[str, Any] = _empty()
    _LISTS: ClassVar[frozenset[str]] = frozenset({"os", "cpu_flags_any"})

    @classmethod
    def from_dict(cls, value: Any, where: str = "constraints") -> Constraints:
        data = f.mapping(value, where)
        if not data:
            return NO_CONSTRAINTS
        if "runtime" in data:
            f.text_map(data["runtime"], f"{where}.runtime")
        if data.get("min_driver") is not None:
            f.text(data["min_driver"], f"{where}.min_driver")
        if data.get("os") is not None:
            for i, item in enumerate(f.items(data["os"], f"{where}.os")):
                f.text(item, f"{where}.os[{i}]")
        if data.get("vram_mb") is not None:
            f.number(data["vram_mb"], f"{where}.vram_mb")
        if "engine" in data:
            f.mapping(data["engine"], f"{where}.engine")
        read, rest = _split(
            data,
            {
                "runtime": _text_map,
                "min_driver": _kinds(str),
                "os": _texts,
                "vram_mb": _number,
                "cpu_flags_any": _texts,
                "engine": _kinds(dict),
            },
        )
        for name in cls._LISTS & set(read):
            read[name] = tuple(read[name])
        return cls(**read, rest=rest)

    def to_dict(self) -> dict[str, Any]:
        return _written(self, self._LISTS)


NO_CONSTRAINTS = Constraints()
