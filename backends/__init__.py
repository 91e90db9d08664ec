"""The backend registry: one table maps each backend's name to its module, whose `BACKEND` object (a `Backend`)
says everything else. There is no second table: device matching, ranking, runner labels, install hints, options
and features are read from that object. Adding a backend to the product is one module plus one line here.

Outside backends are added without editing the product, two ways:
- an installed distribution declares one in the `enginefarm.backends` entry-point group
  (`mybackend = my_package.backend`, or `my_package.backend:MyBackend` for another attribute, an instance or a class);
- ENGINEFARM_BACKENDS (`name=module[,name=module]`) names one for a process and the build workers it starts.
The variable wins over an entry point of the same name; neither may take a built-in name."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from typing import TYPE_CHECKING

from enginefarm.cache.manifest import Target
from enginefarm.errors import BackendUnavailable, ConfigError

from .base import (
    Availability,
    Backend,
    BackendSession,
    Built,
    BuiltFile,
    BundleSpec,
    Feature,
    Rank,
    option_defaults,
)
from .build_job import BuildJob, PlannedJob

if TYPE_CHECKING:
    from enginefarm.hardware.devices import Device

BACKENDS: dict[str, str] = {
    "onnxruntime": "enginefarm.backends.onnxruntime",
    "openvino": "enginefarm.backends.openvino",
    "tensorrt": "enginefarm.backends.tensorrt",
    "tensorrt-rtx": "enginefarm.backends.tensorrt_rtx",
    "migraphx": "enginefarm.backends.migraphx",
    "coreml": "enginefarm.backends.coreml",
    "assets": "enginefarm.backends.assets",  # a model's tokenizers and configs, published beside its engines
}
PLUGINS_ENV = "ENGINEFARM_BACKENDS"
ENTRY_POINT_GROUP = "enginefarm.backends"
log = logging.getLogger(__name__)


def registry() -> dict[str, str]:
    """BACKENDS, the installed entry points, then ENGINEFARM_BACKENDS (read on every call: a worker process sees its
    parent's). A value is `module` (its BACKEND) or `module:attribute`."""
    return {**BACKENDS, **_entry_points(tuple(sys.path)), **_added()}


def _added() -> dict[str, str]:
    """ENGINEFARM_BACKENDS, parsed and checked (a malformed value or a built-in name is a ConfigError)."""
    added: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(","))):
        name, _, module = item.partition("=")
        name, module = name.strip(), module.strip()
        if not name or not module:
            raise ConfigError(
                f"{PLUGINS_ENV}: {item!r} is not name=module", hint=f"e.g. {PLUGINS_ENV}=mybackend=my_package.backend"
            )
        if name in BACKENDS:
            raise ConfigError(
                f"{PLUGINS_ENV}: {name!r} is a built-in backend", hint="give the added backend another name"
            )
        added[name] = module
    return added


@functools.lru_cache(maxsize=4)
def _entry_points(path: tuple[str, ...]) -> dict[str, str]:
    """The `enginefarm.backends` entry points of the distributions on `path` (scanning site-packages costs milliseconds,
    so once per sys.path). One that takes a built-in name is left out with a warning: an installed package must not
    replace a backend under the user's feet, nor stop every command."""
    from importlib.metadata import entry_points

    found: dict[str, str] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in BACKENDS:
            log.warning(
                "entry point %s = %s (group %s) takes the built-in backend name %r; left out",
                point.name,
                point.value,
                ENTRY_POINT_GROUP,
                point.name,
            )
            continue
        found[point.name] = point.value
    return found


def _load(name: str, where: str) -> object:
    """The object `where` names: `module` → its BACKEND, `module:attribute` → that attribute; a Backend class is
    instantiated."""
    module_name, _, attribute = where.partition(":")
    try:
        module = importlib.import_module(module_name.strip())
    except ImportError as exc:  # only an added backend can miss: the built-in modules import no SDK at module level
        raise BackendUnavailable(
            f"backend {name!r}: cannot import {module_name} ({exc})",
            hint=f"check {PLUGINS_ENV} or the {ENTRY_POINT_GROUP} entry point that names it",
        ) from None
    found = getattr(module, attribute.strip() or "BACKEND", None)
    if isinstance(found, type) and issubclass(found, Backend):
        return _INSTANCES.setdefault(found, found())  # one object per class, as a module's BACKEND is
    return found


_INSTANCES: dict[type, Backend] = {}


def get_backend(name: str) -> Backend:
    # A built-in name is always the built-in module (neither an entry point nor the variable may take it), so it
    # needs no scan of the installed distributions: importing importlib.metadata and reading every entry point
    # cost 50-100 ms of an app's first inference. The variable is still checked, as registry() would.
    if name in BACKENDS:
        _added()
        modules = BACKENDS
    else:
        modules = registry()
    where = modules.get(name)
    if where is None:
        raise BackendUnavailable(f"unknown backend {name!r}", hint=f"known backends: {', '.join(modules)}")
    backend = _load(name, where)
    if not isinstance(backend, Backend) or backend.name != name:
        what = "is not a Backend" if ":" in where else "has no BACKEND object"
        raise BackendUnavailable(
            f"backend {name!r}: {where} {what} named {name!r}",
            hint="a backend module sets BACKEND = MyBackend(), an instance of enginefarm.backends.Backend",
        )
    return backend


def all_backends() -> list[Backend]:
    return [get_backend(name) for name in registry()]


def targets_for(device: Device) -> tuple[str, ...]:
    """Every `backend:device-class` target a detected device runs, as each backend matches it. An added backend that
    does not import is left out with a warning: it must not hide the device from the others."""
    found = []
    for name in registry():
        try:
            backend = get_backend(name)
        except BackendUnavailable as exc:
            log.warning("%s (%s)", exc, exc.hint)
            continue
        found += [f"{name}:{cls}" for cls in backend.device_classes(device)]
    return tuple(found)


def rank_of(target: Target) -> Rank:
    """How specific `target`'s artifact kind is. A backend this install does not know ranks last, never first."""
    try:
        return get_backend(target.backend).rank(target.device)
    except BackendUnavailable:
        return Rank.ONNX


def availability(target: Target) -> Availability:
    """Whether `target` can be built and loaded here. Never raises: a broken SDK is reported, not crashed on."""
    try:
        backend = get_backend(target.backend)
        return backend.available(target.device)
    except BackendUnavailable as exc:
        return Availability.missing(str(exc))
    except Exception as exc:  # a half-installed SDK can fail in any way; show why, keep going
        return Availability.missing(f"{type(exc).__name__}: {exc}")


def job_availability(job: PlannedJob) -> Availability:
    """`availability(job.target)`, narrowed by what this job's options need of the build host (a backend's
    optional `check_job(job)` says why not, e.g. TensorRT-RTX weight stripping without a GPU)."""
    here = availability(job.target)
    why = get_backend(job.target.backend).check_job(job) if here.can_build else ""
    return Availability(False, False, why) if why else here


def job_refusal(job: PlannedJob) -> tuple[str, str] | None:
    """(why, fix) when the backend's SDK would refuse this job on any host."""
    return get_backend(job.target.backend).refusal(job)


def gpu_build_reason(job: PlannedJob) -> tuple[str, str] | None:
    """(why, fix) when this job needs a GPU on the build host, for backends that otherwise build on a CPU
    (Feature.BUILDS_WITHOUT_DEVICE). Other backends build where their target's device is."""
    backend = get_backend(job.target.backend)
    return backend.gpu_build_reason(job) if backend.has(Feature.BUILDS_WITHOUT_DEVICE) else None


def builds_on_cpu(job: PlannedJob) -> bool:
    """Whether a runner without a GPU builds this job: CPU targets, and backends that build without their device
    (TensorRT-RTX) unless an option needs one."""
    if job.target.device == "cpu":
        return True
    return get_backend(job.target.backend).has(Feature.BUILDS_WITHOUT_DEVICE) and gpu_build_reason(job) is None


def precision_refusal(target: Target, precision: str) -> str | None:
    """Why `target`'s device class never computes in `precision` natively (None: it does). A backend module says so
    with `Backend.computes` and, per device class, `precision_refusal(precision, device)`. Refused jobs are never
    built: an artifact labelled bf16 that computes in fp32 would be a lie, and one that does not load a waste."""
    try:
        backend = get_backend(target.backend)
    except BackendUnavailable:
        return None
    return backend.precision_refusal(precision, target.device)


def job_options(target: Target, written: dict[str, dict]) -> dict:
    """The options a job of `target` is built with: the backend's defaults (a tuple's first choice), overridden by
    what the recipe wrote. All go into the build key, so changing one rebuilds; backends without options give {}."""
    declared = get_backend(target.backend).options
    return {**option_defaults(declared), **written.get(target.backend, {})}


def validate_target(target: Target) -> tuple[str, str] | None:
    """(reason, hint) if the recipe names a backend or device class that does not exist."""
    known = registry()
    if target.backend not in known:
        return f"unknown backend {target.backend!r} in {target}", f"known backends: {', '.join(known)}"
    backend = get_backend(target.backend)
    if not backend.devices.fullmatch(target.device):
        return (
            f"{target.backend} has no device class {target.device!r}",
            f"{target.backend} devices: {backend.device_hint}",
        )
    return None


__all__ = [
    "BACKENDS",
    "Availability",
    "Backend",
    "BackendSession",
    "BuildJob",
    "BundleSpec",
    "Built",
    "BuiltFile",
    "Feature",
    "Rank",
    "all_backends",
    "availability",
    "builds_on_cpu",
    "get_backend",
    "gpu_build_reason",
    "job_availability",
    "job_options",
    "job_refusal",
    "PlannedJob",
    "precision_refusal",
    "rank_of",
    "registry",
    "targets_for",
    "validate_target",
]
