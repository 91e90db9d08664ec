"""Removing old model versions: `enginefarm gc --keep-versions N` (a store) and `enginefarm cache gc --keep-versions N`.

Per model and component, the N newest versions (ordered as `versions` says) stay; older versions' manifests go,
with their index entries and re-validation verdicts, and so do the blobs that only they referenced. A blob any kept
manifest references is never touched, whatever else referenced it: the kept set is computed from the manifests
themselves, not from the index.

Order, so that a crash at any point leaves a consistent store: index entries first (resolution stops offering the
artifact), then manifests (nothing points at the blobs any more), then blobs. Rerunning finishes the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .artifacts import VERDICTS, all_manifests, remove_from_index
from .manifest import Manifest
from .stores.base import Store
from .versions import by_age, version_key


@dataclass
class Pruning:
    keep: int
    removed: list[Manifest] = field(default_factory=list)  # manifests of older versions
    blobs: list[str] = field(default_factory=list)  # digests nothing kept references
    kept_versions: dict[str, list[str]] = field(default_factory=dict)  # "model/component" → versions kept, newest first


def older_versions(manifests: list[Manifest], keep: int) -> tuple[list[Manifest], dict[str, list[str]]]:
    """Manifests beyond the `keep` newest versions of their model and component, and the versions kept."""
    if keep < 1:
        raise ValueError("keep at least one version")
    groups: dict[str, list[Manifest]] = {}
    for manifest in manifests:
        groups.setdefault(manifest.ref, []).append(manifest)
    removed, kept = [], {}
    for ref, members in sorted(groups.items()):
        versions = by_age(m.model_version for m in members)[:keep]
        keys = {version_key(v) for v in versions}
        kept[ref] = [str(v) for v in versions]
        removed += [m for m in members if version_key(m.model_version) not in keys]
    return removed, kept


def plan(store: Store, keep: int) -> Pruning:
    manifests = all_manifests(store, "remove versions")
    removed, kept = older_versions(manifests, keep)
    gone = {m.build_key for m in removed}
    referenced = {f.stored_sha256 for m in manifests if m.build_key not in gone for f in m.files}
    orphans = sorted({f.stored_sha256 for m in removed for f in m.files} - referenced)
    return Pruning(keep, removed, orphans, kept)


def apply(store: Store, pruning: Pruning) -> None:
    by_model: dict[str, list[str]] = {}
    for manifest in pruning.removed:
        by_model.setdefault(manifest.model, []).append(manifest.build_key)
    for model, keys in by_model.items():
        remove_from_index(store, model, keys)
    for manifest in pruning.removed:
        store.delete_manifest(manifest.build_key)
        for name in store.list_cache_objects(f"{VERDICTS}/{manifest.build_key}"):
            store.delete_cache_object(name)
    for digest in pruning.blobs:
        store.delete_blob(digest)


def prune_store(store: Store, keep: int, *, delete: bool) -> Pruning:
    """What goes when only the `keep` newest versions of each model and component stay; removed with `delete`."""
    pruning = plan(store, keep)
    if delete:
        apply(store, pruning)
    return pruning


def prune_cache(cache, keep: int) -> list[Manifest]:
    """Evict the device cache's artifacts of older model versions (artifacts patched with custom weights included:
    they carry their base's version). Each cached artifact holds its own files, so nothing else is affected."""
    entries = list(cache.entries())
    removed, _ = older_versions([e.manifest for e in entries], keep)
    for manifest in removed:
        cache.evict(manifest.build_key)
    return removed
