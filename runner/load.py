"""`load` and `fetch`: resolve the best artifact for this device, fetch and verify it, and return a session."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from enginefarm.backends import get_backend
from enginefarm.cache import precision_table
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.index import IndexEntry, gc_paused, read_index
from enginefarm.cache.manifest import Manifest, target_matches
from enginefarm.cache.names import NAME_CHARS
from enginefarm.cache.progress import Progress, ProgressLike, as_progress
from enginefarm.cache.stores import open_store
from enginefarm.cache.versions import same_version
from enginefarm.errors import (
    ArtifactNotFoundError,
    ConfigError,
    DiskFullError,
    EnginefarmError,
    IntegrityError,
    StoreError,
    StoreNotFound,
    TrustError,
    WeightsError,
)
from enginefarm.hardware.devices import Device
from enginefarm.settings import Settings, load_settings

from . import golden_check, measure, warm
from .detect import detect
from .identity import check_served
from .lookup import Lookup
from .not_found import not_found
from .request import Request
from .resolve import Candidate, resolve
from .session import Session

if TYPE_CHECKING:
    from enginefarm.cache.stores.base import Store

    from .custom import Stack

log = logging.getLogger(__name__)


_NAME_MAX = 200  # bytes: the store's file names (index/<model>.json) must fit every file system's 255


def parse_ref(ref: str) -> tuple[str, str]:
    model, sep, component = ref.partition("/")
    if not sep or not model or not component or "/" in component:
        raise ConfigError(f"{ref!r} is not MODEL/COMPONENT", hint="for example: sd15/vae_decoder")
    shown = ref if len(ref) <= 80 else f"{ref[:60]}…"
    for what, name in (("model", model), ("component", component)):
        # Checked before any store is asked: a name no store can hold is the caller's typo, not an unreachable store.
        if not NAME_CHARS.fullmatch(name):
            raise ConfigError(
                f"{shown!r}: {name[:60]!r} is not a valid {what} name",
                hint="names are those of a recipe: letters, digits, '_', '.', '-', starting with a letter or digit",
            )
        if len(name.encode()) > _NAME_MAX:
            raise ConfigError(
                f"{shown!r}: the {what} name is {len(name.encode())} bytes long, more than any store holds "
                f"({_NAME_MAX})",
                hint="check the name: it is the recipe's [model] name or component, as `enginefarm ls` lists them",
            )
    return model, component


def lookup(request: Request, settings: Settings) -> Lookup:
    """The candidates for `request` (its version: None is the newest with an artifact usable here), ranked."""
    with gc_paused():  # one cycle-collector pass over the index's objects at the end, not one per stage (see gc_paused)
        return _lookup(request, settings)


def _lookup(request: Request, settings: Settings) -> Lookup:
    if request.precision is not None and request.precision not in precision_table.NAMES:
        raise ConfigError(
            f"unknown precision {request.precision!r}",
            hint=f"{precision_table.hint()}, or leave it out for the fastest",
        )
    model, component = parse_ref(request.ref)
    selectors = (request.target,) if request.target else ()

    def filtered(entries) -> tuple[list, list]:
        """(entries --target keeps, the component's entries it leaves out: named if nothing else fits)."""
        kept = [(e, where) for e, where in entries if target_matches(e.target, selectors)]
        left_out = (
            [e for e, _ in entries if e.component == component and not target_matches(e.target, selectors)]
            if selectors
            else []
        )
        return kept, left_out

    def devices_for(entries) -> list[Device]:
        found = [
            d
            for d in detect(request.device, probes_for(entries), settings)
            if any(target_matches(t, selectors) for t in d.targets)
        ]
        if not found:
            raise ConfigError(f"no device here runs {request.target or request.device}", hint="see `enginefarm doctor`")
        return found

    cache = DeviceCache(settings.home)
    if settings.channel or settings.trusted_root:
        from .release import open_channel, released_entries

        client, opened = open_channel(request.store, settings)
        entries, left_out = filtered(released_entries(client, model))
        devices = devices_for(entries)
        return Lookup(
            resolve(request.ref, entries, request.precision, devices, version=request.version),
            devices,
            cache,
            opened,
            client.note,
            settings,
            client,
            selectors,
            left_out,
        )
    # Artifacts patched with a user's weights are reached only through their stack, never picked by themselves.
    # Seamless variants likewise, through their tiling (runner/seamless.py).
    cached = [
        c.manifest
        for c in cache.entries()
        if c.manifest.model == model and "stack" not in c.manifest.options and "tiling" not in c.manifest.options
    ]
    store = _read_store(request, settings, model)
    cached, note = _still_served(cached, cache, store, model)
    entries, left_out = filtered([(IndexEntry.of(m), "cache") for m in cached] + store.entries)
    devices = devices_for(entries)
    return Lookup(
        resolve(request.ref, entries, request.precision, devices, version=request.version),
        devices,
        cache,
        store.opened,
        note,
        settings,
        selectors=selectors,
        filtered_out=left_out,
        unreadable_index=store.unreadable,
    )


@dataclass
class _StoreView:
    """What the store said of a model: its index entries, where it is, and why anything is missing."""

    opened: Store | None = None
    origin: str | None = None  # the URL its artifacts record as their origin; None: no store to ask
    entries: list = field(default_factory=list)  # (index entry, "store")
    listed: set[str] | None = None  # the build keys its index lists now; None: its index was not read
    unreadable: str = ""
    note: str = ""


def _read_store(request: Request, settings: Settings, model: str) -> _StoreView:
    view = _StoreView()
    if settings.offline:
        view.note = "offline (ENGINEFARM_OFFLINE): only the local cache was considered"
        # a store the caller named: only what it served, even offline
        view.origin = _url_of(request.store) if request.store else None
        return view
    try:
        view.opened = opened = open_store(
            request.store or settings.store, must_exist=bool(request.store) or settings.store_explicit
        )
        view.origin = opened.url
        index = read_index(opened, model)
        view.entries = [(e, "store") for e in index.entries.values()]
        view.unreadable = f"{opened.url}/index/{model}.json {index.unreadable}" if index.unreadable else ""
        view.listed = None if index.unreadable else set(index.entries)  # a damaged index is no word on anything
    except StoreNotFound:
        raise  # a mistyped path must not look like "nothing built", nor quietly serve what the cache holds
    except StoreError as exc:
        view.note = f"store unreachable ({exc}); only the local cache was considered"
        log.warning(view.note)
    return view


def _still_served(cached: list[Manifest], cache: DeviceCache, store: _StoreView, model: str) -> tuple[list, str]:
    """The cached manifests the store still serves, and the note naming what was left out."""
    if store.origin is None:  # no store to ask: the whole cache, less what every store that served it has withdrawn
        return [m for m in cached if not cache.withdrawn(m.build_key)], store.note
    origin = store.origin
    # What another store served never stands in for this one's: it is reached only through this store's own
    # entry of the same key, once the two manifests are equal (_materialize).
    foreign = {m.build_key for m in cached if not cache.served_by(m.build_key, origin)}
    # What this store served but its index no longer lists (the store was rebuilt or replaced at the same URL,
    # old versions were removed) is withdrawn: a warm cache serves what a fresh device would get from the store.
    withdrawn: set[str] = set()
    if store.listed is not None:
        for m in cached:
            if m.build_key not in foreign and m.build_key not in store.listed and cache.withdraw(m.build_key, origin):
                withdrawn.add(m.build_key)  # withdraw() also drops the store from the artifact's .origins
    said = [store.note] if store.note else []
    if foreign:
        said.append(f"{len(foreign)} cached artifact(s) of {model} came from another store and were not considered")
    if withdrawn:
        said.append(
            f"{len(withdrawn)} cached artifact(s) of {model} are no longer in the store's index (it was "
            "rebuilt, replaced or pruned since) and were not considered"
        )
    left_out = foreign | withdrawn
    return [m for m in cached if m.build_key not in left_out], "; ".join(said)


def probes_for(entries) -> tuple[str, ...] | None:
    """The device probes worth running for these candidates: the CPU's (a fallback compile and every explanation
    need it) and those of the candidates' backends. None (every probe) when there is no candidate, or a backend
    does not say which it needs."""
    kinds = {"cpu"}
    for name in {
        entry.target.partition(":")[0] for entry, _ in entries
    }:  # per backend, not per entry: there may be 10^5
        try:
            probes = get_backend(name).probes
        except EnginefarmError:
            return None
        if probes is None:
            return None
        kinds.update(probes)
    return tuple(sorted(kinds)) if entries else None


def _url_of(store: str) -> str | None:
    """The URL a store records as its artifacts' origin, without reaching it."""
    try:
        return open_store(store).url
    except StoreError:
        return None


def _materialize(candidate: Candidate, found: Lookup, report: Progress) -> tuple[Manifest, Path]:
    """The candidate's verified folder in the local cache, fetching it from the store if needed. The manifest must
    be the candidate's entry and the request (identity.py), and a cached artifact must be what this store serves."""
    key = candidate.entry.build_key
    cache = found.cache
    released = None
    if found.release is not None:
        from .release import released_manifest

        released = released_manifest(
            found.release, cache, key
        )  # a cached artifact that is not the released one is evicted
        path = cache.verified_dir(key)
        if path is not None:
            check_served(released, candidate.entry, found.resolution.ref, f"channel {found.release.channel}")
            return released, path
    elif candidate.source == "cache":  # offered by lookup: served by this store, or built here
        manifest, path = cache.manifest(key), cache.verified_dir(key)
        if manifest is not None and path is not None:
            check_served(manifest, candidate.entry, found.resolution.ref, "the local cache")
            return manifest, path
    if found.store is None:
        raise ArtifactNotFoundError("not in the local cache and no store to fetch from")
    from enginefarm.cache.artifacts import read_manifest  # the store's manifest: a warm load found its artifact cached

    manifest = released or read_manifest(found.store, key)
    if manifest is None:
        raise ArtifactNotFoundError(f"the index lists {key[:12]} but its manifest is missing (run `enginefarm index`)")
    check_served(manifest, candidate.entry, found.resolution.ref, found.store.url)
    path = cache.cached_as(manifest, found.store.url)
    if path is not None:
        return manifest, path
    report.message(f"fetching {manifest.ref} {manifest.target} {manifest.precision} from {found.store.url}")
    # A released manifest is signed (its sizes are the bound); an unsigned one may claim anything: cap it.
    cache.fetch(found.store, manifest, progress=report, limit=None if released else found.settings.max_artifact_size)
    path = cache.cached_as(manifest, found.store.url)  # hashed as it streamed in; checked again: the cache is shared
    if path is None:
        raise IntegrityError(f"{manifest.ref}: artifact {key[:12]} was damaged right after download")
    return manifest, path


def _first_usable(found: Lookup, use: Callable[[Candidate], object]):
    failures: list[str] = []
    for candidate in found.resolution.ranked:
        try:
            return candidate, use(candidate), failures
        except WeightsError:  # the user's files are wrong for every candidate alike
            raise
        except Exception as exc:  # vendor SDKs raise their own types; any failure means: try the next one
            if isinstance(exc, (TrustError, IntegrityError, DiskFullError)):
                found.refusals.append(exc)
            elif not isinstance(exc, EnginefarmError):
                _forget_if_fetched(found.cache, candidate.entry.build_key)
            why = _said(exc)
            failures.append(f"{candidate.entry.target} [{candidate.entry.build_key[:12]}]: {why}")
            candidate.reason = f"failed: {why}"
            log.warning("could not use %s: %s", candidate.describe(), why)
    return None, None, failures


def with_channel(settings: Settings, channel: str | None, trusted_root: str | Path | None) -> Settings:
    """Arguments win over ENGINEFARM_CHANNEL / ENGINEFARM_TRUSTED_ROOT."""
    if channel is None and trusted_root is None:
        return settings
    return replace(
        settings,
        channel=channel or settings.channel,
        trusted_root=Path(trusted_root) if trusted_root else settings.trusted_root,
    )


def fetch(
    request: Request, *, progress: ProgressLike = None, settings: Settings | None = None
) -> tuple[Manifest, Path, str]:
    """Fetch the artifact `load` would pick into the local cache, without loading it. Returns (manifest, folder,
    explanation). A winner this device timed before counts; nothing is timed here (that needs loading)."""
    settings = with_channel(settings or load_settings(), request.channel, request.trusted_root)
    found = lookup(request, settings)
    report = as_progress(progress)
    measure.decide(found.resolution, settings, report, None)
    candidate, got, failures = _first_usable(found, lambda c: _materialize(c, found, report))
    if candidate is None:
        raise not_found(request.ref, found, failures)
    return got[0], got[1], found.resolution.explain(candidate, note=found.note)


def load(request: Request, *, progress: ProgressLike = None, settings: Settings | None = None) -> Session:
    """`enginefarm.load` itself, asked with one `Request`: the best artifact for this device, fetched, verified and
    opened (with the request's custom weights, LoRAs and seamless variant applied), else compiled here from its
    recipe. `settings`: the environment's (`load_settings()`) when None; the request's channel overrides its own."""
    settings = with_channel(settings or load_settings(), request.channel, request.trusted_root)
    if request.tiling is not None:
        from .seamless import check_tiling

        request = replace(request, tiling=check_tiling(request.tiling))
    stack = None
    if request.custom:  # custom weights and LoRAs bring their own code (and the builder's readers)
        from .custom import Stack

        stack = Stack.parse(request.weights, request.loras)
    report = as_progress(progress)
    memo = None
    if stack is None and request.tiling is None and warm.remembers(request.store, settings):  # remembered? (warm.py)
        index_file = warm.index_file(request.model, request.store, settings)
        memo = (warm.request(request, settings), index_file, warm.state(settings.home, index_file))
    found = lookup(request, settings)

    def timed(candidate: Candidate):
        manifest, path = _materialize(candidate, found, report)
        return manifest, get_backend(manifest.parsed_target.backend).load(path, manifest, manifest.parsed_target.device)

    opened = measure.decide(found.resolution, settings, report, timed)

    def open_session(candidate: Candidate) -> Session:
        key = candidate.entry.build_key
        explanation = found.resolution.explain(candidate, note=found.note)
        if stack is None and request.tiling is None and key in opened:  # loaded already to time it here
            manifest, backend_session = opened.pop(key)
            opened.clear()
            return Session(backend_session, manifest, explanation)
        manifest, path = _materialize(candidate, found, report)
        return _session(manifest, path, stack, found, explanation, report, request.tiling)

    candidate, session, failures = _first_usable(found, open_session)
    if candidate is None:
        return _compile_here(request, found, failures, stack, report)
    found.cache.gc(settings.cache_quota, keep={candidate.entry.build_key, session.artifact.build_key})
    if memo is not None:
        asked, index_file, before = memo
        warm.remember(asked, settings.home, before, warm.state(settings.home, index_file), session)
    return session


def _compile_here(
    request: Request, found: Lookup, failures: list[str], stack: Stack | None, report: Progress
) -> Session:
    """Nothing stored loads: compile the component on this device from its recipe, if there is one to compile."""
    model, component = parse_ref(request.ref)
    from .fallback import compile_on_device, find_recipe, pick_job  # the builder: imported only to compile here

    settings = found.settings
    recipe = find_recipe(model, request.recipe, settings.recipe_path)
    version = request.version
    other_version = recipe is not None and version is not None and not same_version(recipe.version, version)
    if recipe is None or other_version or (found.release is not None and found.refusals):
        raise not_found(request.ref, found, failures)
    report.message(f"no stored artifact fits; compiling {request.ref} on this device")
    job = pick_job(
        recipe, component, request.precision, found.devices, settings.home / "sources", settings.offline, request.target
    )
    manifest = compile_on_device(job, found.cache, report.message)
    path = found.cache.verified_dir(manifest.build_key)
    if path is None:
        raise IntegrityError(
            f"the artifact just compiled for {request.ref} failed verification", key=manifest.build_key
        )
    chosen = Candidate(IndexEntry.of(manifest), source="cache (compiled on this device)")
    explanation = found.resolution.explain(
        chosen, note=f"compiled on this device from {recipe.path}: nothing stored fit"
    )
    return _session(manifest, path, stack, found, explanation, report, request.tiling)


def _session(
    manifest: Manifest,
    path: Path,
    stack: Stack | None,
    found: Lookup,
    explanation: str,
    report: Progress,
    tiling: str | None = None,
) -> Session:
    if tiling is not None:  # the seamless variant stands in for the artifact, custom weights included
        from .seamless import seamless_artifact

        base = manifest.build_key
        manifest, path = seamless_artifact(manifest, path, tiling, found.cache, found.store, report)
        explanation += f"\nseamless ({tiling}): derived on this device from [{base[:12]}] [{manifest.build_key[:12]}]"
    backend = get_backend(manifest.parsed_target.backend)
    if stack is None:
        loaded = backend.load(path, manifest, manifest.parsed_target.device)
        # Published unvalidated: this device checks it once on its golden samples, and refuses it if it misses.
        device = next((d for d in found.devices if manifest.target in d.targets), found.devices[0])
        verdict = golden_check.gate(loaded, manifest, path, found.settings.home, device, report)
        return Session(loaded, manifest, explanation + (f"\n{golden_check.describe(verdict)}" if verdict else ""))
    from . import recompile
    from .custom import apply, check_stackable

    if stack.active and recompile.applies(backend, manifest):  # an engine that cannot be refitted: compile one here
        if tiling is not None:  # its stack would be compiled from the plain ONNX: the wrap would be lost
            raise ConfigError(
                f"{manifest.ref} {manifest.target}: tiling with custom weights or LoRAs needs a refittable engine",
                hint="load it with target='onnxruntime' or 'openvino', or without the LoRAs",
            )
        try:
            applied = recompile.apply_stack(stack, manifest, backend, found.cache, found.store, report)
        except (
            ArtifactNotFoundError
        ) as exc:  # no ONNX to compile from; if no other candidate takes the stack, this says why
            found.stack_refusals.append(exc)
            raise
        return Session(
            applied.session,
            applied.manifest,
            f"{explanation}\nweights: {applied.how} [{applied.manifest.build_key[:12]}]",
        )
    if stack.active:
        try:
            check_stackable(backend, manifest)
        except EnginefarmError as exc:  # another candidate may take the stack; if none does, this says why
            found.stack_refusals.append(exc)
            raise
    applied = apply(stack, manifest, path, backend, found.cache, report)
    return Session(
        applied.session, applied.manifest, f"{explanation}\nweights: {applied.how} [{applied.manifest.build_key[:12]}]"
    )


def _said(exc: Exception) -> str:
    """What went wrong, never empty: some SDK errors carry no message."""
    text = str(exc).strip()
    return (
        text
        if isinstance(exc, EnginefarmError) and text
        else f"{type(exc).__name__}: {text}"
        if text
        else type(exc).__name__
    )


def _forget_if_fetched(cache: DeviceCache, key: str) -> None:
    """A fetched artifact that verified but does not load is dropped, so the next load fetches it again (the store
    may have been fixed since); artifacts compiled here are kept (there is nothing to fetch)."""
    manifest = cache.manifest(key)
    if manifest is not None and not manifest.provenance.get("built_on_device"):
        log.warning("evicting %s [%s] from the cache: it does not load", manifest.ref, key[:12])
        cache.evict(key)
