"""Custom weights and LoRA stacks on top of a base artifact: refit in place where the backend can, otherwise
patch the weights and recompile, cached under the base build key + digest(weights, loras, strengths).

No residue: every result is computed from the base artifact's own weights (never from a previous stack), and a
refit is given every weight the map covers, base values included, so nothing from an earlier stack survives.
"""

from __future__ import annotations

import logging
import math
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from enginefarm.backends.base import BuiltFile, Feature
from enginefarm.backends.manifest_files import role_entry
from enginefarm.cache.build_keys import build_key
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.locks import file_lock
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.progress import Progress
from enginefarm.errors import BackendUnavailable, ConfigError, IntegrityError, WeightsError
from enginefarm.formats.safetensors_io import SafeTensors, write_safetensors
from enginefarm.formats.weightmap import WeightMap, read_map
from enginefarm.weights.lora import LoraFile
from enginefarm.weights.lora import read as read_lora_file

from .checkpoint import read_checkpoint
from .lora import LoraLayer, place_lora
from .merge import merged_weights

log = logging.getLogger(__name__)

MAX_STRENGTH = 100.0  # far past any useful strength; 1e308 would only turn every merged weight into Inf
REFIT_FILE = "refit.safetensors"  # a refit stack's cached merged weights, by ONNX initializer name


@dataclass(frozen=True)
class Stack:
    """What the user asked for: a checkpoint and LoRAs with strengths, in order, each LoRA file read once."""

    weights: Path | None = None
    loras: tuple[tuple[LoraFile, float], ...] = ()

    @classmethod
    def parse(cls, weights, loras, read: Callable[[Path], LoraFile] = read_lora_file) -> Stack:
        """The stack checked, each LoRA file read by `read` (a pipeline passes files it read already as they
        are: it reads each once per load and deals them to its components)."""
        if isinstance(loras, (str, Path)):  # iterating it would read each character as a LoRA file
            raise ConfigError(
                f"loras={str(loras)!r} is one path, not a list of LoRAs", hint=f'loras=[("{loras}", 1.0)]'
            )
        items = []
        for item in loras or ():
            path, strength = (item, 1.0) if isinstance(item, (str, Path)) else _pair(item)
            head, sep, tail = str(path).rpartition(":")
            if isinstance(item, str) and sep and not Path(item).exists() and Path(head).exists():
                raise ConfigError(
                    f"LoRA {item!r}: PATH:STRENGTH is the command line's form", hint=f'loras=[("{head}", {tail})]'
                )
            items.append((path if isinstance(path, LoraFile) else Path(path), strength))
        for what, path in [("weights", weights), *(("LoRA", p) for p, _ in items if not isinstance(p, LoraFile))]:
            if (
                path is not None and Path(path).is_dir()
            ):  # else an IsADirectoryError deep in the reader, reported as a load failure
                raise WeightsError(f"{what} {path} is a folder, not a file", hint="pass the .safetensors file itself")
        files = tuple((p if isinstance(p, LoraFile) else read(p), s) for p, s in items)
        return cls(Path(weights) if weights is not None else None, files)

    @property
    def active(self) -> bool:
        """A stack that changes nothing (no checkpoint, every strength 0) is the base artifact itself."""
        return self.weights is not None or any(s != 0 for _, s in self.loras)


def _pair(item) -> tuple[str | Path, float]:
    try:
        path, strength = item
        strength = float(strength)
    except (TypeError, ValueError):
        raise ConfigError(
            f"LoRA {item!r} is not (path, strength)", hint='loras=[("a.safetensors", 0.8), ...]'
        ) from None
    if not math.isfinite(strength):
        raise ConfigError(
            f"LoRA {path}: strength {strength} is not a finite number", hint="strengths are usually between -2 and 2"
        )
    if abs(strength) > MAX_STRENGTH:
        raise ConfigError(
            f"LoRA {path}: strength {strength:g} is beyond ±{MAX_STRENGTH:g}",
            hint="strengths are usually between -2 and 2",
        )
    return path, strength


@dataclass
class Applied:
    session: object
    manifest: Manifest
    how: str


@dataclass(frozen=True)
class _Job:
    """A stack applied to one base artifact: the artifact as its backend opens it, the stack's cache key, and the
    user's tensors read against the artifact's weight map."""

    stack: Stack
    key: str
    manifest: Manifest
    artifact_dir: Path
    backend: Any
    wmap: WeightMap
    custom: dict[str, np.ndarray]
    loras: list[tuple[list[LoraLayer], float]]

    @classmethod
    def of(cls, stack: Stack, manifest: Manifest, artifact_dir: Path, backend, read=None) -> _Job:
        """`read`: the map and the user's tensors, when the caller has them already."""
        wmap, custom, loras = read if read is not None else _read_mapped(stack, artifact_dir, manifest)
        key = stack_key(manifest.build_key, stack)
        return cls(stack, key, manifest, artifact_dir, backend, wmap, custom, loras)

    def merged(self, *, every: bool, stored: bool = False) -> dict[str, np.ndarray]:
        """The stack's new values (runner/merge.py): every weight the map covers, or those the stack changes."""
        base = (self.wmap, self.backend, self.artifact_dir, self.manifest)
        return merged_weights(*base, self.custom, self.loras, every=every, stored=stored)

    def stacked(self) -> Manifest:
        """The base artifact's manifest, marked with the stack its session carries."""
        record = _stack_record(self.manifest, self.stack, self.key)
        return replace(self.manifest, options={**self.manifest.options, "stack": record})


def apply(
    stack: Stack, manifest: Manifest, artifact_dir: Path, backend, cache: DeviceCache, report: Progress
) -> Applied:
    """A backend session of the base artifact with `stack` applied (the base session itself if the stack is empty)."""
    device = manifest.parsed_target.device
    read = _read_mapped(stack, artifact_dir, manifest)
    if not stack.active:
        return Applied(
            backend.load(artifact_dir, manifest, device), manifest, "base weights (every LoRA strength is 0)"
        )
    check_stackable(backend, manifest)  # before any merging or caching
    job = _Job.of(stack, manifest, artifact_dir, backend, read)
    if backend.has(Feature.REFIT):
        return _refit(job, cache, report)
    if backend.has(Feature.WEIGHTS_AT_LOAD):
        return _at_load(job, report)
    patched, path, how = _patched(job, cache, report)
    return Applied(backend.load(path, patched, device), patched, how)


def _at_load(job: _Job, report: Progress) -> Applied:
    """The changed weights merged in memory and given to the backend as the session opens: every combination costs
    a merge and a load, and no cache space."""
    manifest = job.manifest
    report.message(f"applying {describe(job.stack)} to {manifest.ref} {manifest.target} {manifest.precision} in memory")
    started = time.perf_counter()
    weights = job.merged(every=False, stored=True)
    session = job.backend.load_with_weights(job.artifact_dir, manifest, weights, manifest.parsed_target.device)
    log.info("%d weights applied at load in %.2f s", len(weights), time.perf_counter() - started)
    return Applied(session, job.stacked(), "applied in memory at load (nothing cached)")


def patched_artifact(
    stack: Stack, manifest: Manifest, artifact_dir: Path, backend, cache: DeviceCache, report: Progress, read=None
) -> tuple[Manifest, Path, str]:
    """A copy of the artifact with the stack merged into its weights (backends with Feature.PATCH_WEIGHTS), cached under
    the stack's key. Returns its manifest, verified folder and how it was had. `read`: the map and the user's
    tensors, when the caller has them already."""
    return _patched(_Job.of(stack, manifest, artifact_dir, backend, read), cache, report)


def _patched(job: _Job, cache: DeviceCache, report: Progress) -> tuple[Manifest, Path, str]:
    key, manifest = job.key, job.manifest
    with file_lock(
        cache.locks / f"{key}.lock"
    ):  # saves a second process the same work; the cache stays correct without it
        path = cache.built_here_dir(key)
        how = "patched and compiled earlier (cached)"
        if path is None:
            report.message(
                f"applying {describe(job.stack)} to {manifest.ref} {manifest.target} {manifest.precision}; compiling"
            )
            path = _patch_and_cache(job, cache)
            how = "patched and compiled on this device"
    return cache.manifest_in_use(key), path, how


def _read_mapped(stack: Stack, artifact_dir: Path, manifest: Manifest):
    wmap = read_map(artifact_dir, manifest)
    if wmap is None:
        raise WeightsError(
            f"{manifest.ref} [{manifest.build_key[:12]}] has no weight map, so it cannot take custom weights or LoRAs",
            hint='declare the component\'s base weights with checkpoint = "….safetensors" in its recipe and rebuild',
        )
    return (wmap, *_read(stack, wmap, manifest))


def check_stackable(backend, manifest: Manifest) -> None:
    """Raises, with the fix as its hint, when this artifact cannot take custom weights at all (a TensorRT plan
    built without refittable = true; a backend that can neither refit nor patch)."""
    if backend.has(Feature.REFIT):
        backend.check_refit(manifest)
    elif not backend.has(Feature.PATCH_WEIGHTS):
        raise BackendUnavailable(
            f"{manifest.parsed_target.backend} can neither refit nor patch weights",
            hint="use another target (--target)",
        )


def _refit(job: _Job, cache: DeviceCache, report: Progress) -> Applied:
    """Refit with every weight the map covers. The merged weights are what is cached: a later load refits
    straight from them."""
    key, manifest = job.key, job.manifest
    report.message(f"refitting {manifest.ref} {manifest.target} with {describe(job.stack)}")
    path = cache.built_here_dir(key)
    if path is not None:
        cached = SafeTensors(path / REFIT_FILE)
        weights, how = {name: cached.array(name) for name in cached.names}, "refit in place from cached merged weights"
    else:
        weights, how = job.merged(every=True), "refit in place"
        workdir = work_folder(cache, key)
        try:
            write_safetensors(workdir / REFIT_FILE, weights)
            built = [BuiltFile(REFIT_FILE, "weights")]
            cache.add_local(stack_manifest(manifest, job.stack, key, workdir, built, ()), workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    started = time.perf_counter()
    session = job.backend.refit(job.artifact_dir, manifest, weights, manifest.parsed_target.device)
    log.info("refit %d weights in %.2f s", len(weights), time.perf_counter() - started)
    return Applied(session, job.stacked(), how)


def stack_manifest(
    manifest: Manifest, stack: Stack, key: str, workdir: Path, built, extra: tuple, seconds: float = 0.0
) -> Manifest:
    from enginefarm.builder.build import plain_file

    return replace(
        manifest,
        build_key=key,
        files=tuple(plain_file(workdir, b.path, b.role) for b in built) + extra,
        benchmarks=(),
        validation={"passed": None, "executed": False, "why": "custom weights: not validated against a reference"},
        options={**manifest.options, "stack": _stack_record(manifest, stack, key)},
        provenance={**manifest.provenance, "built_on_device": True, "stack_seconds": round(seconds, 2)},
    )


def stack_key(base_key: str, stack: Stack) -> str:
    from enginefarm.weights.single_file import digest  # hashed once per process: every component of a pipeline asks

    return build_key(
        {
            "base": base_key,
            "weights": digest(stack.weights) if stack.weights else None,
            "loras": [[f.digest, s] for f, s in stack.loras if s != 0],
        }
    )


def describe(stack: Stack) -> str:
    parts = ([f"weights {stack.weights.name}"] if stack.weights else []) + [
        f"LoRA {f.name}@{s:g}" for f, s in stack.loras if s != 0
    ]
    return ", ".join(parts)


def _stack_record(manifest: Manifest, stack: Stack, key: str) -> dict:
    return {
        "base": manifest.build_key,
        "key": key,
        "weights": str(stack.weights) if stack.weights else None,
        "loras": [[str(f.path), s] for f, s in stack.loras],
    }


def _read(
    stack: Stack, wmap: WeightMap, manifest: Manifest
) -> tuple[dict[str, np.ndarray], list[tuple[list[LoraLayer], float]]]:
    custom = read_checkpoint(stack.weights, wmap, manifest) if stack.weights is not None else {}
    return custom, [
        (place_lora(parsed, wmap, manifest.component, ref=manifest.ref), strength) for parsed, strength in stack.loras
    ]


def work_folder(cache: DeviceCache, key: str) -> Path:
    """A folder of this process's own: two processes applying the same stack never share one."""
    path = cache.home / "build" / "stacks" / f"{key[:24]}.{secrets.token_hex(4)}"
    path.mkdir(parents=True)
    return path


def _patch_and_cache(job: _Job, cache: DeviceCache) -> Path:
    key, manifest = job.key, job.manifest
    workdir = work_folder(cache, key)
    try:
        started = time.perf_counter()
        weights = job.merged(every=False, stored=True)
        built = job.backend.patch_weights(job.artifact_dir, manifest, weights, workdir)
        map_entry = role_entry(manifest, "map")
        shutil.copyfile(Path(job.artifact_dir) / map_entry.path, workdir / map_entry.path)
        seconds = time.perf_counter() - started
        patched = stack_manifest(manifest, job.stack, key, workdir, built, (map_entry,), seconds)
        cache.add_local(patched, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    path = cache.verified_dir(key)
    if path is None:
        raise IntegrityError(f"the patched artifact {key[:12]} failed verification right after it was cached", key=key)
    return path
