"""Custom weights and LoRAs on engines that cannot be refitted: compiled on this device from the component's ONNX.

A TensorRT-RTX engine built on a CPU farm is never refittable (the SDK builds refittable engines only with a GPU),
so a stack cannot be refitted into it. Instead, on a machine with the SDK:

- **The ONNX** comes from the same component's ONNX Runtime artifact in the store (same source model, same
  precision): its `model.onnx` is the prepared model the engine was built from, and its weight map speaks that
  model's initializer names. It is fetched only when a stack is asked for, so users who never load custom weights
  never download it, and the engine artifact stays as small as it is.
- **With a GPU** (CUDA sees one), a refittable, weight-stripped engine of the base weights is compiled once and
  cached (`device_build` in its options); every stack is then a refit of it (runner/custom.py), so changing a LoRA
  costs a refit, not a rebuild.
- **Without one**, the stack is merged into a copy of the ONNX (cached like any patched ONNX Runtime artifact) and a
  plain engine is compiled from it, cached under the stack's key (the base key plus the sha256 of every file and
  the strengths), so the same stack never compiles twice.

The engine build reports its phases through the progress callback's `work`; fetching the ONNX, its bytes.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from enginefarm.backends import Feature, get_backend
from enginefarm.backends.manifest_files import role_entry
from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.build_keys import build_key
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.locks import file_lock
from enginefarm.cache.manifest import Manifest, Target
from enginefarm.cache.progress import Progress
from enginefarm.cache.stores.base import Store
from enginefarm.errors import ArtifactNotFoundError, IntegrityError, StoreError

from .custom import Applied, Stack, apply, describe, patched_artifact, stack_key, stack_manifest, work_folder

log = logging.getLogger(__name__)

ONNX_TARGET = "onnxruntime:cpu"


@dataclass(frozen=True)
class DeviceJob:
    """What a backend's `build` and `constraints` read of a job, for an engine compiled here from a stored artifact."""

    label: str
    component: str
    target: Target
    precision: str
    profile: dict[str, dict[str, list[int]]]
    options: dict[str, Any] = field(default_factory=dict)
    fp16_keep: tuple[str, ...] = ()  # the ONNX artifact it starts from is already what the recipe kept


def applies(backend, manifest: Manifest) -> bool:
    """Whether a stack on this artifact is compiled on the device: the backend does it, and the engine cannot be
    refitted."""
    return backend.has(Feature.COMPILES_STACKS_ON_DEVICE) and not {**backend.options, **manifest.options}.get(
        "refittable", False
    )


def apply_stack(
    stack: Stack, manifest: Manifest, backend, cache: DeviceCache, store: Store | None, report: Progress
) -> Applied:
    onnx_manifest, onnx_dir = onnx_source(manifest, cache, store, report)
    source = f"{onnx_manifest.target} {onnx_manifest.precision} [{onnx_manifest.build_key[:12]}]"
    if backend.can_build_refittable():
        twin, twin_dir, built_now = refittable_twin(manifest, onnx_manifest, onnx_dir, backend, cache, report)
        applied = apply(stack, twin, twin_dir, backend, cache, report)
        origin = "compiled refittable on this device" if built_now else "compiled refittable on this device earlier"
        return replace(applied, how=f"{applied.how} (engine {origin} from {source})")
    patched, patched_dir, _ = patched_artifact(
        stack, onnx_manifest, onnx_dir, get_backend("onnxruntime"), cache, report
    )
    key = stack_key(manifest.build_key, stack)
    with file_lock(
        cache.locks / f"{key}.lock"
    ):  # a second process waits for the first one's engine instead of building its own
        path = cache.built_here_dir(key)
        how = f"compiled on this device earlier from {source} with the stack merged (cached)"
        if path is None:
            report.message(
                f"{describe(stack)} merged into the ONNX; compiling a {manifest.target} engine on this device (no GPU "
                "to build a refittable one)"
            )
            path, seconds = _compile(
                manifest,
                patched,
                patched_dir,
                backend,
                cache,
                key,
                {"strip_weights": False, "refittable": False},
                report,
                lambda workdir, built, elapsed: stack_manifest(manifest, stack, key, workdir, built, (), elapsed),
            )
            how = f"compiled on this device in {seconds:.1f} s from {source} with the stack merged"
    compiled = cache.manifest_in_use(key)
    return Applied(backend.load(path, compiled, manifest.parsed_target.device), compiled, how)


def onnx_source(manifest: Manifest, cache: DeviceCache, store: Store | None, report: Progress) -> tuple[Manifest, Path]:
    """The component's ONNX Runtime artifact built from the same source model in the same precision: from the
    local cache, or fetched from the store."""
    wanted = manifest.provenance.get("source_digest")
    candidates: dict[str, Store | None] = {}  # build key → the store it is in (None: the local cache)
    for cached in cache.entries():
        m = cached.manifest
        if (
            m.model == manifest.model
            and m.component == manifest.component
            and m.target == ONNX_TARGET
            and "stack" not in m.options
            and "tiling" not in m.options
            and (store is None or cache.served_by(m.build_key, store.url))
        ):  # another store's never stands in for this one's
            candidates[m.build_key] = None
    if store is not None:
        try:
            for key, entry in read_index(store, manifest.model).entries.items():
                if entry.component == manifest.component and entry.target == ONNX_TARGET:
                    candidates.setdefault(key, store)
        except StoreError as exc:
            log.warning("store unreachable while looking for %s's ONNX: %s", manifest.ref, exc)
    for key, source in sorted(candidates.items(), key=lambda kv: kv[1] is not None):  # what is here first
        found = cache.manifest(key) if source is None else read_manifest(source, key)
        if found is None or found.precision != manifest.precision or found.provenance.get("source_digest") != wanted:
            continue
        if not any(f.role == "map" for f in found.files) or (found.model, found.component, found.target) != (
            manifest.model,
            manifest.component,
            ONNX_TARGET,
        ):
            continue
        path = cache.verified_dir(key) if source is None else cache.cached_as(found, source.url)
        if path is None and store is not None:
            report.message(
                f"fetching {manifest.ref}'s ONNX ({ONNX_TARGET} {found.precision} [{key[:12]}]) to compile "
                f"{manifest.target} here"
            )
            cache.fetch(store, found, progress=report)
            path = cache.verified_dir(key)
        if path is None:
            raise IntegrityError(f"{manifest.ref}: its ONNX artifact {key[:12]} failed verification")
        return found, path
    raise ArtifactNotFoundError(
        f"{manifest.ref} {manifest.target} [{manifest.build_key[:12]}] is not refittable, and no {ONNX_TARGET} "
        f"{manifest.precision} artifact "
        "of the same source model (with a weight map) is stored to compile custom weights from on this device",
        hint=f"add {ONNX_TARGET} to the component's targets (with its checkpoint) and build it, or build "
        f"{manifest.target} with refittable = true on a GPU runner",
    )


def refittable_twin(
    manifest: Manifest, onnx_manifest: Manifest, onnx_dir: Path, backend, cache: DeviceCache, report: Progress
) -> tuple[Manifest, Path, bool]:
    """The base engine compiled here refittable and weight-stripped (its weights are the ONNX shipped beside it),
    once."""
    key = build_key({"base": manifest.build_key, "device_build": "refittable", "onnx": onnx_manifest.build_key})
    with file_lock(cache.locks / f"{key}.lock"):
        path = cache.built_here_dir(key)
        if path is not None:
            return cache.manifest_in_use(key), path, False
        report.message(
            f"compiling a refittable {manifest.target} engine of {manifest.ref} on this device (once: later stacks "
            "are refits)"
        )
        map_entry = role_entry(onnx_manifest, "map")

        def twin_manifest(workdir: Path, built, seconds: float) -> Manifest:
            from enginefarm.builder.build import plain_file

            shutil.copyfile(onnx_dir / map_entry.path, workdir / map_entry.path)
            record = {
                "base": manifest.build_key,
                "key": key,
                "from": onnx_manifest.build_key,
                "seconds": round(seconds, 2),
            }
            return replace(
                manifest,
                build_key=key,
                files=tuple(plain_file(workdir, b.path, b.role) for b in built) + (map_entry,),
                benchmarks=(),
                options={
                    **manifest.options,
                    "strip_weights": True,
                    "refittable": True,
                    "device_build": record,
                    "stack": {"base": manifest.build_key, "key": key, "weights": None, "loras": []},
                },
                validation={"passed": None, "executed": False, "why": "compiled on this device for custom weights"},
                provenance={**manifest.provenance, "built_on_device": True},
            )

        path, _ = _compile(
            manifest,
            onnx_manifest,
            onnx_dir,
            backend,
            cache,
            key,
            {"strip_weights": True, "refittable": True},
            report,
            twin_manifest,
        )
    return cache.manifest_in_use(key), path, True


def _compile(
    manifest: Manifest,
    onnx_manifest: Manifest,
    onnx_dir: Path,
    backend,
    cache: DeviceCache,
    key: str,
    options: dict[str, Any],
    report: Progress,
    describe_result,
) -> tuple[Path, float]:
    """Build `manifest`'s engine from the ONNX artifact's model with `options`, and cache it under `key`."""
    model = role_entry(onnx_manifest, "model")
    job = DeviceJob(
        f"{manifest.ref} {manifest.precision} {manifest.target} (on this device)",
        manifest.component,
        manifest.parsed_target,
        manifest.precision,
        manifest.profile,
        {**manifest.options, **options},
    )
    workdir = work_folder(cache, key)
    outdir = workdir / "artifact"
    outdir.mkdir()
    name = f"compiling {manifest.target} engine"
    try:
        started = time.perf_counter()
        built = backend.build(
            onnx_dir / model.path, job, outdir, progress=lambda done, total, _phase: report.work(name, done, total)
        )
        seconds = time.perf_counter() - started
        cache.add_local(describe_result(outdir, built.files, seconds), outdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    log.info("%s: compiled on this device in %.1f s", job.label, seconds)
    path = cache.verified_dir(key)
    if path is None:
        raise IntegrityError(
            f"the engine compiled on this device ({key[:12]}) failed verification right after it was cached", key=key
        )
    return path, seconds
