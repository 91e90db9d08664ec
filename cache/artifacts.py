"""Publishing and reading artifacts in a store: blobs first, manifest last, then the derived index."""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from enginefarm.errors import IntegrityError, StoreError

from .atomic import sha256_file
from .codecs import codec_for, decode_stream, encode_file
from .manifest import ArtifactFile, Manifest, verdict_summary
from .progress import ProgressLike, as_progress
from .stores.base import Store

log = logging.getLogger(__name__)

INDEX_FORMAT = 1
_CAS_ATTEMPTS = 20


def pack_files(root: Path, entries: Iterable[tuple[str, str]], blob_dir: Path, codec: str | None = None) -> tuple[list[ArtifactFile], dict[str, Path]]:
    """Encode each (relative path, role) under `root` into `blob_dir`. Returns the file records and digest → blob path.
    `codec` None picks per file: efw1 for weight files, zstd for the rest."""
    files: list[ArtifactFile] = []
    blobs: dict[str, Path] = {}
    blob_dir.mkdir(parents=True, exist_ok=True)
    for rel, role in entries:
        src = root / rel
        chosen = codec or codec_for(role, src.stat().st_size)
        with tempfile.NamedTemporaryFile(dir=blob_dir, delete=False, suffix=".blob") as out:
            encode_file(src, out, chosen)
        blob = Path(out.name)
        stored_sha = sha256_file(blob)
        blobs[stored_sha] = blob
        files.append(ArtifactFile(rel, role, src.stat().st_size, sha256_file(src), chosen, blob.stat().st_size, stored_sha))
    return files, blobs


def publish(store: Store, manifest: Manifest, blobs: dict[str, Path], progress: ProgressLike = None) -> bool:
    """Upload blobs (existing ones count as success), then the manifest, then merge into the index.

    Returns False if a manifest with this key already existed (nothing is rewritten)."""
    if not store.writable:
        raise StoreError(f"store {store.url} is read-only", hint="publish to a local directory or s3:// store")
    report = as_progress(progress)
    sizes = {digest: path.stat().st_size for digest, path in blobs.items()}
    on_bytes = _byte_counter(report, f"upload {manifest.ref} {manifest.target} {manifest.precision}", sum(sizes.values()))
    for digest, path in blobs.items():
        if not store.put_blob(digest, path, progress=on_bytes):
            on_bytes(sizes[digest])  # already there: nothing to send, but the bar should still fill
    written = store.put_manifest_bytes(manifest.build_key, manifest.to_json())
    update_index(store, [manifest])
    return written


def _byte_counter(report, name: str, total: int) -> Callable[[int], None]:
    """Stores report increments; the progress callback wants running totals."""
    done = 0

    def on_bytes(increment: int) -> None:
        nonlocal done
        done = min(total, done + increment)
        report.transfer(name, done, total)

    return on_bytes


def read_manifest(store: Store, key: str) -> Manifest | None:
    raw = store.get_manifest_bytes(key)
    return None if raw is None else Manifest.from_json(raw, expect_key=key)


def empty_index(model: str) -> dict[str, Any]:
    return {"format": INDEX_FORMAT, "model": model, "entries": {}}


def parse_index(raw: bytes | None, model: str) -> dict[str, Any]:
    if raw is None:
        return empty_index(model)
    try:
        data = json.loads(raw)
    except ValueError:
        log.warning("index of %s is not JSON; treating it as empty (run `enginefarm index` to rebuild)", model)
        return empty_index(model)
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or not isinstance(data.get("entries"), dict):
        log.warning("index of %s has an unknown shape; treating it as empty", model)
        return empty_index(model)
    return data


def read_index(store: Store, model: str) -> dict[str, Any]:
    raw, _ = store.get_index_bytes(model)
    return parse_index(raw, model)


def select_entries(store: Store, models=(), components=(), targets=(), precisions=(), keys=()) -> list[dict[str, Any]]:
    """Index entries matching every given filter (empty: any). Shared by `publish` and `release promote`."""
    from .manifest import target_matches

    selected = []
    for name in models or tuple(store.list_models()):
        for entry in read_index(store, name)["entries"].values():
            if ((not components or entry["component"] in components)
                    and target_matches(entry["target"], targets)
                    and (not precisions or entry["precision"] in precisions)
                    and (not keys or any(entry["build_key"].startswith(k) for k in keys))):
                selected.append({**entry, "model": name})
    return selected


def _dump_index(index: dict[str, Any]) -> bytes:
    return json.dumps(index, indent=1, sort_keys=True).encode()


def update_index(store: Store, manifests: list[Manifest], *, replace_all: bool = False, verdicts: dict[str, dict] | None = None) -> None:
    """Compare-and-swap the per-model index, merging with whatever a concurrent writer put there.

    A re-validation's verdict (in an entry's `validation`, with `revalidated`) is newer than the build's own and is
    kept when the manifest is indexed again; `verdicts` (build key → record) replaces it.
    Some servers' conditional writes are not atomic (two writers can both 'win'), so each write is read back:
    if our entries are not all there, merge again. A lost update in the end costs a rebuild, never an artifact."""
    verdicts = verdicts or {}
    by_model: dict[str, list[Manifest]] = {}
    for manifest in manifests:
        by_model.setdefault(manifest.model, []).append(manifest)
    for model, items in by_model.items():
        wanted = {m.build_key for m in items}
        for attempt in range(_CAS_ATTEMPTS):
            raw, etag = store.get_index_bytes(model)
            index = empty_index(model) if replace_all else parse_index(raw, model)
            for manifest in items:
                entry = manifest.index_entry()
                previous = index["entries"].get(manifest.build_key) or {}
                kept = previous.get("validation") if isinstance(previous, dict) else None
                if manifest.build_key in verdicts:
                    entry["validation"] = verdict_summary(verdicts[manifest.build_key])
                elif isinstance(kept, dict) and kept.get("revalidated"):
                    entry["validation"] = kept
                index["entries"][manifest.build_key] = entry
            if store.cas_index_bytes(model, _dump_index(index), etag):
                if wanted <= set(read_index(store, model)["entries"]):
                    break
            time.sleep(random.uniform(0, 0.05 * (attempt + 1)))
        else:
            log.warning("index of %s kept changing under us; run `enginefarm index --store %s`", model, store.url)


def remove_from_index(store: Store, model: str, keys: list[str]) -> None:
    """Drop entries from a model's index: compare-and-swap, retried and read back like `update_index`."""
    unwanted = set(keys)
    for attempt in range(_CAS_ATTEMPTS):
        raw, etag = store.get_index_bytes(model)
        index = parse_index(raw, model)
        if raw is None or not unwanted & set(index["entries"]):
            return
        index["entries"] = {k: e for k, e in index["entries"].items() if k not in unwanted}
        if store.cas_index_bytes(model, _dump_index(index), etag) and not unwanted & set(read_index(store, model)["entries"]):
            return
        time.sleep(random.uniform(0, 0.05 * (attempt + 1)))
    log.warning("index of %s kept changing under us; run `enginefarm index --store %s`", model, store.url)


def rebuild_index(store: Store) -> dict[str, int]:
    """Rebuild every model's index from manifests/. Returns entries per model."""
    manifests: list[Manifest] = []
    for key in store.list_manifest_keys():
        try:
            manifest = read_manifest(store, key)
        except IntegrityError as exc:
            log.warning("skipping manifest %s: %s", key[:12], exc)
            continue
        if manifest is not None:
            manifests.append(manifest)
    update_index(store, manifests, replace_all=True, verdicts=latest_verdicts(store))
    counts: dict[str, int] = {}
    for manifest in manifests:
        counts[manifest.model] = counts.get(manifest.model, 0) + 1
    return counts


VERDICTS = "validation"  # caches/validation/<build key>/<settings digest>.json: re-validation verdicts, written once


def record_verdict(store: Store, manifest: Manifest, name: str, data: bytes) -> None:
    """Keep a re-validation's verdict: written once under caches/, and into the index entry resolution reads."""
    store.put_cache_object(name, data)
    update_index(store, [manifest], verdicts={manifest.build_key: manifest.validation})


def latest_verdicts(store: Store) -> dict[str, dict]:
    """The newest re-validation verdict of each build key the store keeps (an index rebuild restores them)."""
    newest: dict[str, tuple[float, str]] = {}
    for name, mtime in store.list_cache_entries(VERDICTS):
        parts = name.split("/")
        if len(parts) == 3 and (parts[1] not in newest or mtime > newest[parts[1]][0]):
            newest[parts[1]] = (mtime, name)
    found = {}
    for key, (_, name) in newest.items():
        try:
            record = json.loads(store.get_cache_object(name) or b"null")
        except ValueError:
            record = None
        if isinstance(record, dict):
            found[key] = record
    return found


def copy_artifacts(source: Store, dest: Store, keys: Iterable[str], progress: ProgressLike = None) -> dict[str, str]:
    """Copy artifacts between stores: blobs the destination lacks, then the manifest, then the index.

    Blobs are streamed through a temp file and hashed on the way, so a damaged source blob is never published.
    Returns {key: "copied" | "exists"}."""
    report = as_progress(progress)
    results: dict[str, str] = {}
    copied: list[Manifest] = []
    with tempfile.TemporaryDirectory(prefix="enginefarm-copy-") as tmp:
        for key in keys:
            manifest = read_manifest(source, key)
            if manifest is None:
                raise StoreError(f"{source.url} has no manifest {key[:12]}")
            if dest.get_manifest_bytes(key) is not None:
                results[key] = "exists"
                continue
            total = sum(f.stored_size for f in manifest.files)
            on_bytes = _byte_counter(report, f"copy {manifest.ref} {manifest.target} {manifest.precision}", total)
            for entry in {f.stored_sha256: f for f in manifest.files}.values():
                if dest.has_blob(entry.stored_sha256):
                    on_bytes(entry.stored_size)
                    continue
                path = Path(tmp) / entry.stored_sha256
                with source.open_blob(entry.stored_sha256, entry.stored_size) as src, open(path, "wb") as out:
                    digest = decode_stream(src, out, "none", entry.stored_size)  # copies, hashes, enforces the size
                if digest != entry.stored_sha256:
                    raise IntegrityError(f"blob {entry.stored_sha256[:12]} in {source.url} does not match its digest", hint="nothing was published for this artifact")
                dest.put_blob(entry.stored_sha256, path, progress=on_bytes)
                path.unlink()
            dest.put_manifest_bytes(key, manifest.to_json())
            copied.append(manifest)
            results[key] = "copied"
    update_index(dest, copied)
    return results


# Shared build caches (caches/<kind>/<slot>/<object>) are merged supersets: each new object holds what its builder
# fetched plus what it measured. Builders read only the newest few per slot and gc prunes the rest, so a farm's
# builds do not slow down as objects pile up.
CACHE_NEWEST_KEPT = 8


def newest_cache_objects(entries: list[tuple[str, float]], keep: int = CACHE_NEWEST_KEPT) -> list[str]:
    return [name for name, _ in sorted(entries, key=lambda e: (-e[1], e[0]))[:keep]]


@dataclass(frozen=True)
class GcPlan:
    referenced: int
    unreferenced: list[tuple[str, float]]  # (digest, mtime) of blobs no manifest uses
    to_delete: list[str]  # those older than the grace period
    stale_caches: list[str] = field(default_factory=list)  # build-cache objects past the newest few of their slot, older than the grace


def all_manifests(store: Store, purpose: str) -> list[Manifest]:
    """Every manifest in the store. An unreadable one stops `purpose` (deleting on a partial view could orphan a blob
    it references)."""
    found = []
    for key in store.list_manifest_keys():
        try:
            manifest = read_manifest(store, key)
        except IntegrityError as exc:
            raise StoreError(f"manifest {key[:12]} is unreadable ({exc}); refusing to {purpose}", hint="fix or remove that manifest first") from None
        if manifest is not None:
            found.append(manifest)
    return found


def plan_gc(store: Store, grace_s: float, now: float | None = None) -> GcPlan:
    """Blobs that no manifest references and that are older than `grace_s` (a builder may be mid-publish:
    its blobs are written before its manifest, so young orphans are left alone)."""
    now = time.time() if now is None else now
    referenced = {f.stored_sha256 for manifest in all_manifests(store, "collect garbage") for f in manifest.files}
    orphans = [(digest, mtime) for digest, mtime in store.list_blobs() if digest not in referenced]
    return GcPlan(len(referenced), orphans, [d for d, mtime in orphans if now - mtime > grace_s], _stale_caches(store, grace_s, now))


def _stale_caches(store: Store, grace_s: float, now: float) -> list[str]:
    slots: dict[str, list[tuple[str, float]]] = {}
    for name, mtime in store.list_cache_entries(""):
        slots.setdefault(name.rsplit("/", 1)[0], []).append((name, mtime))
    stale = []
    for entries in slots.values():
        kept = set(newest_cache_objects(entries))
        stale += [name for name, mtime in entries if name not in kept and now - mtime > grace_s]
    return sorted(stale)
