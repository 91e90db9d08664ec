"""The backend contract: each vendor SDK is one module of this package whose `BACKEND` object is an instance of a
`Backend` subclass, named by one line in the registry (`backends/__init__.py`). Everything the rest of the product
knows about a backend comes from that object: its device classes and which of them a detected device runs, how its
artifacts rank, which farm runners build it, how to install it, and which optional features it has.

Optional features are declared (`features = frozenset({Feature.REFIT, ...})`) and checked when the class is
defined: a declared feature without its hooks, or a hook without its feature, is an error at import, so callers
ask `backend.has(Feature.X)` and never probe attributes. The SDK is imported inside the hooks only, so importing a
backend module is cheap and always works.
"""

from __future__ import annotations

import enum
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from enginefarm.cache import precision_table
from enginefarm.errors import BackendUnavailable

from .build_job import BuildJob, PlannedJob

if TYPE_CHECKING:  # the device type (hardware/devices.py), for annotations only
    from enginefarm.hardware.devices import Device


def import_sdk(module: str, install: str) -> ModuleType:
    """Import a vendor SDK on first use; a missing SDK is a BackendUnavailable naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailable(f"{module} is not installed ({exc})", hint=install) from None


def option_defaults(declared: dict[str, Any]) -> dict[str, Any]:
    """A backend's OPTIONS as the values a job gets when the recipe writes none: a tuple's first choice."""
    return {name: d[0] if isinstance(d, tuple) else d for name, d in declared.items()}


@dataclass(frozen=True)
class Availability:
    can_build: bool
    can_load: bool
    reason: str | None = None  # why not, when either is False

    @classmethod
    def missing(cls, reason: str) -> Availability:
        return cls(False, False, reason)


@dataclass(frozen=True)
class BuiltFile:
    path: str  # relative to the build's workdir
    role: str  # engine | weights | ir | model


@dataclass(frozen=True)
class Built:
    """What a build wrote: its files, and notes the manifest's provenance keeps (timings, choices the SDK made)."""

    files: list[BuiltFile]
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BundleSpec:
    """What `enginefarm bundle` copies of a backend's runtime for one device class (enginefarm/bundle.py). Every file
    its pip distributions installed (their RECORD), minus those matching a `drop` glob unless a `keep` glob matches
    too; globs match '/'-separated paths relative to site-packages (fnmatch: `*` crosses folders). `runs_here`: the
    proof can run an artifact on a machine without the device class's hardware (a CPU); where it cannot, the proof
    calls the backend's `bundle_probe` inside the bundle instead, which shows how far the runtime's files load."""

    distributions: tuple[str, ...]
    drop: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    runs_here: bool = True
    notes: str = ""  # what the bundle still needs from the system (a driver, an ICD loader)


class BackendSession(Protocol):
    input_names: list[str]
    output_names: list[str]
    compute_precision: str  # what it really computes in: "fp32", "fp16", "bf16"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    # Optional: `close()` releases what the session holds (weights, compiled code, device buffers) at once.
    # Optional: `bind(fixed)` returns an object with `run(feeds, keep) -> dict` and `close()` that holds `fixed` on the
    # device and returns `hardware.tensors.DeviceTensor`s for the outputs named in `keep` (hardware/tensors.py); without
    # it, Session.bind runs through numpy (HostBinding). Its results must equal `run`'s bit for bit.


def version_in_range(version: str, spec: str) -> bool:
    """Whether a runtime's version satisfies a PEP 440 specifier set (`>=10.13.0.35,<11`, `==10.12.0.36`, `~=2.1`,
    `!=1.2`, `<=3`), with every component counted: a TensorRT plan built by 10.12.0.36 is not usable on 10.12.0.99.
    Vendor versions that are not PEP 440 (OpenVINO's `2026.4.1-22982-…`) are compared by their leading release
    numbers; a specifier that cannot be parsed is not satisfied (the artifact is not ranked usable on a guess)."""
    floor, plain = _FLOOR.match(spec.strip()), _NUMERIC.match(version.strip())
    if floor and plain:  # ">=X.Y.Z" against a plain release, what every runtime range is: no packaging import (~20 ms)
        return _release(plain.group(0)) >= _release(floor.group(1))
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        wanted = SpecifierSet(spec)
    except InvalidSpecifier:
        return False
    try:
        have = Version(version)
    except InvalidVersion:
        release = _RELEASE.match(version.strip())
        if release is None:
            return False
        have = Version(release.group(0))
    return wanted.contains(have, prereleases=True)


_RELEASE = re.compile(r"\d+(\.\d+)*")
_FLOOR = re.compile(r"^>=\s*(\d+(?:\.\d+)*)$")
_NUMERIC = re.compile(r"^\d+(?:\.\d+)*$")


def _release(text: str) -> tuple[int, ...]:
    """PEP 440 release numbers compared with trailing zeros ignored (1.32 == 1.32.0)."""
    numbers = [int(part) for part in text.split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


class Feature(enum.Enum):
    """What a backend may do beyond build and load; each comes with the hooks listed in FEATURE_HOOKS."""

    REFIT = "refit"  # replace named weights of a built engine at load (custom weights, LoRA stacks)
    PATCH_WEIGHTS = "patch weights"  # write a copy of the artifact with new weights, then load that
    WEIGHTS_AT_LOAD = "weights at load"  # open the artifact with new weights given in memory: nothing written or cached
    OWN_VALIDATION = "own validation"  # the artifact may not run on the build host: a stand-in or golden samples
    BUILD_CACHE = "build cache"  # fetch / publish a shared build cache (TensorRT timing caches) around a build
    BUILDS_WITHOUT_DEVICE = (
        "builds without its device"  # a GPU target a CPU farm builds, unless an option needs the GPU
    )
    COMPILES_STACKS_ON_DEVICE = "compiles stacks on the device"  # a LoRA stack on a non-refittable engine is rebuilt


FEATURE_HOOKS: dict[Feature, tuple[str, ...]] = {
    Feature.REFIT: ("refit", "check_refit"),
    Feature.PATCH_WEIGHTS: ("patch_weights", "read_weights", "weight_shapes"),
    Feature.WEIGHTS_AT_LOAD: ("load_with_weights",),
    Feature.OWN_VALIDATION: ("validation_session",),
    Feature.BUILD_CACHE: ("before_build", "after_build"),
    Feature.BUILDS_WITHOUT_DEVICE: ("gpu_build_reason",),
    Feature.COMPILES_STACKS_ON_DEVICE: ("can_build_refittable",),
}


class Rank(enum.IntEnum):
    """How specific an artifact kind is. Lower is preferred when no benchmark tells artifacts apart: engines for one
    exact architecture beat hardware-compatible classes, then JIT-able engines, portable IR, and ONNX for ONNX
    Runtime."""

    EXACT_ARCH = 0
    HARDWARE_COMPATIBLE = 1
    JIT = 2
    PORTABLE_IR = 3
    ONNX = 4

    @property
    def label(self) -> str:
        """The kind in words, as explanations and reports print it."""
        return {
            0: "exact-arch engine",
            1: "hardware-compatible engine",
            2: "JIT-able engine",
            3: "portable IR",
            4: "ONNX (ORT)",
        }[self.value]


REQUIRED = ("name", "devices", "device_hint", "install")


class Backend:
    """One vendor SDK as the product sees it. Subclasses set the class attributes and implement the hooks; the
    module exposes one instance as `BACKEND`."""

    name: ClassVar[str]  # its name in targets ("openvino")
    devices: ClassVar[re.Pattern]  # the device classes a recipe may name ("cpu", "sm_89", "ampere+", ...)
    device_hint: ClassVar[str]  # what to write instead, for errors
    install: ClassVar[str]  # how a user installs its SDK, for errors and `doctor`
    extra: ClassVar[str | None] = None  # the pip extra a farm's build runner installs besides `all` (None: in `all`)
    onnx_precision: ClassVar[str] = "fp32"  # which prepared ONNX `build` wants: "fp32", or "same" as the job
    # The precisions (rows of cache/precision_table.py) some device class of it computes natively; a device class
    # that lacks one of them says so in `precision_refusal`. Declared here, not in the table, so that an outside
    # backend needs no edit of the product.
    computes: ClassVar[frozenset[str]] = frozenset({"fp32", "fp16"})
    # Why it lacks a precision of the table, for the refusal (default: which it computes).
    lacks: ClassVar[dict[str, str]] = {}
    options: ClassVar[
        dict[str, Any]
    ] = {}  # build options a recipe may set, with defaults (a tuple: the allowed values)
    features: ClassVar[frozenset[Feature]] = frozenset()
    build_memory_factor: ClassVar[float] = 2.5  # a build's peak memory over the source's weights (builder/memory.py)
    vendor_label: ClassVar[str] = ""  # the farm runner label of its GPU vendor ("nvidia")
    hosted_runners: ClassVar[dict[str, list[str]]] = {}  # device class -> labels of a hosted runner that builds it
    example_device: ClassVar[str] = "cpu"  # the device class `doctor` asks about when it reports this backend
    bundles: ClassVar[
        dict[str, BundleSpec]
    ] = {}  # device class -> what an app bundle of the runtime holds (none: not bundlable)
    sdk_module: ClassVar[str | None] = None  # the vendor SDK's Python module, imported on first use by `sdk()`
    # The device probes (enginefarm.hardware.devices.PROBES) that can find a device it runs; None: every probe. A load
    # whose candidates are all this backend's runs only these (OpenVINO's GPU probe alone costs half a second).
    probes: ClassVar[tuple[str, ...] | None] = None

    def __init_subclass__(cls, abstract: bool = False, **kwargs) -> None:
        """`abstract`: a base several backends share (NVIDIA's), checked in its subclasses."""
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        missing = [name for name in REQUIRED if not hasattr(cls, name)]
        if missing:
            raise TypeError(f"backend {cls.__name__} does not set {', '.join(missing)}")
        for feature, hooks in FEATURE_HOOKS.items():
            written = [hook for hook in hooks if getattr(cls, hook) is not getattr(Backend, hook)]
            if feature in cls.features and len(written) < len(hooks):
                raise TypeError(
                    f"backend {cls.name} declares {feature.value} but lacks "
                    f"{', '.join(sorted(set(hooks) - set(written)))}"
                )
            if feature not in cls.features and written:
                raise TypeError(f"backend {cls.name} has {', '.join(written)} but does not declare {feature.value}")

    def has(self, feature: Feature) -> bool:
        """Whether the backend declares `feature` (and so has its hooks: FEATURE_HOOKS, checked at class creation)."""
        return feature in self.features

    def bundle_probe(self, device_class: str) -> dict[str, Any]:
        """Run inside a bundle whose device class cannot run here (BundleSpec.runs_here False): load the runtime's
        files as far as this machine allows. `loads`: the device's library loaded; `missing`: the library it lacked
        (the proof fails if the bundled distribution has it); `line`: what to tell the user."""
        raise NotImplementedError(f"{self.name} has no bundle probe")

    def sdk(self) -> ModuleType:
        """The vendor SDK, imported on first use; a missing one is a BackendUnavailable with the install command."""
        if self.sdk_module is None:
            raise NotImplementedError(f"{self.name} names no sdk_module")
        return import_sdk(self.sdk_module, self.install)

    # What every backend implements.

    def available(self, device: str) -> Availability:
        """Whether this machine can build and load artifacts of the device class `device`, and why not: never raises
        (a missing SDK is an Availability with the reason)."""
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Every version that goes into the build key; by default the SDK's own `__version__`."""
        return {self.name: str(self.sdk().__version__)}

    def constraints(self, job: BuildJob) -> dict:
        """What a device needs to load the artifact (runtime range, ISA, driver, OS ...)."""
        raise NotImplementedError

    def build(self, prepared_onnx: Path, job: BuildJob, workdir: Path) -> Built:
        """Build into `workdir`. Backends with Feature.COMPILES_STACKS_ON_DEVICE also take `progress=(done, total,
        phase)`."""
        raise NotImplementedError

    def load(self, artifact_dir: Path, manifest, device: str) -> BackendSession:
        """Open a verified artifact folder for the device class `device` and return a session that runs it."""
        raise NotImplementedError

    def device_classes(self, device: Device) -> tuple[str, ...]:
        """Which of this backend's device classes a detected device runs, most specific first."""
        raise NotImplementedError

    def rank(self, device_class: str) -> Rank:
        """How specific the artifacts of this device class are; resolution prefers lower ranks when no benchmark
        tells candidates apart."""
        raise NotImplementedError

    # What backends may refine; the defaults suit a backend that builds where its device is.

    def runner_labels(self, device_class: str, on_cpu: bool = False) -> list[str]:
        """GitHub Actions labels of the farm runner that builds this device class (`on_cpu`: the job needs no GPU)."""
        if device_class in self.hosted_runners:
            return self.hosted_runners[device_class]
        if on_cpu or device_class == "cpu":  # CPU builds run on hosted runners
            return ["ubuntu-latest"]
        return ["self-hosted", self.vendor_label or self.name, device_class]

    def check_job(self, job: PlannedJob) -> str:
        """Why this host cannot build this job although the target's SDK is here ("": it can)."""
        return ""

    def refusal(self, job: PlannedJob) -> tuple[str, str] | None:
        """(why, fix) when the SDK would refuse this job on any host."""
        return None

    def precision_refusal(self, precision: str, device: str) -> str | None:
        """Why `device` never computes in `precision` natively (None: it does)."""
        if precision in self.computes:
            return None
        built = " or ".join(sorted(self.computes, key=precision_table.tie_order))
        return self.lacks.get(precision) or f"{self.name} artifacts are built in {built} only"

    def precision_here(self, precision: str, device: str) -> str | None:
        """Why this host cannot build and validate `precision` although the device class runs it."""
        return None

    def bench_device(self, manifest) -> dict:
        """The device class benchmarks were measured on: resolution ranks artifacts by it."""
        from enginefarm.hardware.device_info import cpu_description

        device = manifest.parsed_target.device
        return cpu_description() if device == "cpu" else {"class": device}

    # Feature hooks: a backend implements those of the features it declares.

    def refit(self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], device: str) -> BackendSession:
        """Feature.REFIT: load, then replace named weights."""
        raise NotImplementedError

    def check_refit(self, manifest) -> None:
        """Feature.REFIT: raises (ConfigError with a hint) when this artifact cannot be refitted."""
        raise NotImplementedError

    def patch_weights(
        self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], outdir: Path
    ) -> list[BuiltFile]:
        """Feature.PATCH_WEIGHTS: write the artifact with `weights` replaced into `outdir`."""
        raise NotImplementedError

    def load_with_weights(
        self, artifact_dir: Path, manifest, weights: dict[str, np.ndarray], device: str
    ) -> BackendSession:
        """Feature.WEIGHTS_AT_LOAD: a session of the artifact with `weights` (ONNX layout; float32 or the
        weight's own dtype) in place of its own."""
        raise NotImplementedError

    def read_weights(self, artifact_dir: Path, manifest, names) -> dict[str, np.ndarray]:
        """Feature.PATCH_WEIGHTS: the artifact's current values of these weights, in the float dtype it stores them."""
        raise NotImplementedError

    def weight_shapes(self, artifact_dir: Path, manifest) -> dict[str, tuple[int, ...]]:
        """Feature.PATCH_WEIGHTS: every patchable weight's shape, as the artifact stores it."""
        raise NotImplementedError

    def validation_session(self, artifact_dir: Path, manifest, device: str) -> tuple[BackendSession | None, dict]:
        """Feature.OWN_VALIDATION: the artifact's session, a stand-in, or None (published unvalidated), and a note
        the validation record keeps."""
        raise NotImplementedError

    def before_build(self, store, job: BuildJob, workdir: Path) -> None:
        """Feature.BUILD_CACHE: fetch a shared build cache before building."""
        raise NotImplementedError

    def after_build(self, store, job: BuildJob, workdir: Path) -> None:
        """Feature.BUILD_CACHE: publish the build cache after building."""
        raise NotImplementedError

    def can_build_refittable(self) -> bool:
        """Feature.COMPILES_STACKS_ON_DEVICE: whether this device can build a refittable engine (then later stacks are
        refits of it); otherwise each stack is merged into the ONNX and compiled."""
        raise NotImplementedError

    def gpu_build_reason(self, job: PlannedJob) -> tuple[str, str] | None:
        """Feature.BUILDS_WITHOUT_DEVICE: (why, fix) when this job's options need a GPU on the build host."""
        raise NotImplementedError
