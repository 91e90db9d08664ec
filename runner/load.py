"""`load`: resolve the best artifact for this device, fetch and verify it, and return a session."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from enginefarm.builder.backends import get_backend
from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store
from enginefarm.errors import ArtifactNotFoundError, ConfigError, EnginefarmError, IntegrityError, StoreError
from enginefarm.settings import Settings, load_settings

from .device import detect
from .fallback import compile_on_device, find_recipe, pick_job
from .resolve import Candidate, Resolution, resolve
from .session import Session

log = logging.getLogger(__name__)

Progress = Callable[[str], None]


def parse_ref(ref: str) -> tuple[str, str]:
    model, sep, component = ref.partition("/")
    if not sep or not model or not component or "/" in component:
        raise ConfigError(f"{ref!r} is not MODEL/COMPONENT", hint="for example: sd15/vae_decoder")
    return model, component


def _entries(model: str, store_url: str, cache: DeviceCache, offline: bool) -> tuple[list[tuple[dict, str]], str, object | None]:
    """Index entries from the store (unless offline) and from the device cache. Returns (entries, note, store)."""
    entries: list[tuple[dict, str]] = []
    note, store = "", None
    if offline:
        note = "offline (ENGINEFARM_OFFLINE): only the local cache was considered"
    else:
        try:
            store = open_store(store_url)
            entries += [(e, "store") for e in read_index(store, model)["entries"].values()]
        except StoreError as exc:
            note = f"store unreachable ({exc}); only the local cache was considered"
            log.warning(note)
            store = None
    cached = [(c.manifest.index_entry(), "cache") for c in cache.entries() if c.manifest.model == model]
    return cached + entries, note, store


def load(
    ref: str,
    precision: str | None = None,
    device: str = "auto",
    store: str | None = None,
    weights: str | None = None,
    loras: tuple = (),
    *,
    recipe: str | Path | None = None,
    progress: Progress | None = None,
    settings: Settings | None = None,
) -> Session:
    settings = settings or load_settings()
    if weights is not None or loras:
        raise ConfigError("custom weights and LoRA stacks are not supported by this release", hint="tracked in issue #5")
    if precision is not None and precision not in ("fp32", "fp16"):
        raise ConfigError(f"unknown precision {precision!r}", hint="use fp32 or fp16, or leave it out for the fastest")
    model, component = parse_ref(ref)
    step = progress or (lambda _msg: None)
    devices = detect(device)
    cache = DeviceCache(settings.home)
    entries, note, opened = _entries(model, store or settings.store, cache, settings.offline)
    resolution = resolve(ref, entries, precision, devices)

    failures: list[str] = []
    for candidate in resolution.ranked:
        try:
            session = _open(candidate, opened, cache, step, resolution, note)
        except (EnginefarmError, RuntimeError) as exc:
            failures.append(f"{candidate.entry['target']} [{candidate.entry['build_key'][:12]}]: {exc}")
            candidate.reason = f"failed to load: {exc}"
            log.warning("could not use %s: %s", candidate.describe(), exc)
            continue
        cache.gc(settings.cache_quota, keep={candidate.entry["build_key"]})
        return session

    found = find_recipe(model, recipe, settings.recipe_path)
    if found is None:
        why = "; ".join(failures) or resolution.explain(note=note).split("\n", 1)[-1]
        raise ArtifactNotFoundError(
            f"no artifact of {ref} fits this device ({why})",
            hint="build one with `enginefarm build RECIPE`, or pass recipe= (ENGINEFARM_RECIPE_PATH) to compile here",
        )
    step(f"no stored artifact fits; compiling {ref} on this device")
    job = pick_job(found, component, precision, devices, settings.home / "sources", settings.offline)
    manifest = compile_on_device(job, cache, step)
    path = cache.verified_dir(manifest.build_key)
    if path is None:
        raise IntegrityError(f"the artifact just compiled for {ref} failed verification", key=manifest.build_key)
    backend = get_backend(manifest.parsed_target.backend)
    chosen = Candidate(manifest.index_entry(), source="cache (compiled on this device)")
    explanation = resolution.explain(chosen, note=f"compiled on this device from {found.path}: nothing stored fit")
    return Session(backend.load(path, manifest, manifest.parsed_target.device), manifest, explanation)


def _open(candidate: Candidate, store, cache: DeviceCache, step: Progress, resolution: Resolution, note: str) -> Session:
    key = candidate.entry["build_key"]
    path = cache.verified_dir(key)
    manifest = cache.manifest(key) if path is not None else None
    if path is None:
        if store is None:
            raise ArtifactNotFoundError("not in the local cache and no store to fetch from")
        manifest = read_manifest(store, key)
        if manifest is None:
            raise ArtifactNotFoundError(f"index lists {key[:12]} but its manifest is missing (run `enginefarm index`)")
        step(f"fetching {manifest.ref} {manifest.target} {manifest.precision}")
        path = cache.fetch(store, manifest, progress=lambda what, done, total: step(f"fetched {what} ({done >> 20}/{total >> 20} MiB)"))
        # Hash once more as it is loaded: the cache is shared with other processes.
        path = cache.verified_dir(key)
        if path is None:
            raise IntegrityError(f"{manifest.ref}: artifact {key[:12]} was damaged right after download")
    backend = get_backend(manifest.parsed_target.backend)
    backend_session = backend.load(path, manifest, manifest.parsed_target.device)
    return Session(backend_session, manifest, resolution.explain(candidate, note=note))
