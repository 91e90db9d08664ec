"""Publishing and reading artifacts in a store: blobs first, manifest last, then the derived index."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from enginefarm.errors import ConfigError, IntegrityError, StoreError

from .atomic import sha256_file
from .blob_codecs import codec_for, decode_stream, encode_file
from .faults import checkpoint
from .index import parse_index, read_index, remove_from_index, select_entries, update_index  # noqa: F401  (the index API, re-exported)
from .manifest import ArtifactFile, Manifest
from .names import case_twin, name_problem
from .progress import ProgressLike, as_progress
from .space import full_disk_as_error
from .stores.base import Store
from .workdirs import fresh, reclaim

log = logging.getLogger(__name__)


def pack_files(
    root: Path, entries: Iterable[tuple[str, str]], blob_dir: Path, codec: str | None = None
) -> tuple[list[ArtifactFile], dict[str, Path]]:
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
        files.append(
            ArtifactFile(rel, role, src.stat().st_size, sha256_file(src), chosen, blob.stat().st_size, stored_sha)
        )
    return files, blobs


def publish(store: Store, manifest: Manifest, blobs: dict[str, Path], progress: ProgressLike = None) -> bool:
    """Upload blobs (existing ones count as success), then the manifest, then merge into the index.

    Idempotent and self-healing: a rerun after a crash at any stage stores only what is missing, the index
    included. If another publisher wrote this key first, its manifest stays, and it is the one indexed, so a
    losing racer never replaces the winner's entry. Returns False if a manifest with this key already existed."""
    if not store.writable:
        raise StoreError(f"store {store.url} is read-only", hint="publish to a local directory or s3:// store")
    check_model_name(store, manifest.model)
    report = as_progress(progress)
    sizes = {digest: path.stat().st_size for digest, path in blobs.items()}
    on_bytes = _byte_counter(
        report, f"upload {manifest.ref} {manifest.target} {manifest.precision}", sum(sizes.values())
    )
    for digest, path in blobs.items():
        if not store.put_blob(digest, path, progress=on_bytes):
            on_bytes(sizes[digest])  # already there: nothing to send, but the bar should still fill
        checkpoint("publish:blob")
    written = store.put_manifest_bytes(manifest.build_key, manifest.to_json())
    checkpoint("publish:manifest")
    indexed = manifest if written else _stored(store, manifest.build_key)
    restore_blobs(store, indexed, blobs)
    update_index(store, [indexed])
    checkpoint("publish:index")
    return written


def check_model_name(store: Store, model: str) -> None:
    """Refuse, before anything is written, a model name that some file system cannot hold (names.py), or that
    differs only in case from a model the store holds."""
    problem = name_problem(model)
    twin = None if problem else case_twin(model, store.list_models())
    if problem or twin:
        raise ConfigError(
            f"cannot publish to {store.url}: model name "
            f"{problem or f'{model!r} differs only in case from {twin}, one file on Windows and macOS'}",
            hint="rename the model (model.name in its recipe)",
            model=model,
        )


def missing_blobs(store: Store, manifest: Manifest) -> list[str]:
    """The digests of `manifest`'s blobs that the store does not hold (one HEAD each on S3)."""
    return [d for d in dict.fromkeys(f.stored_sha256 for f in manifest.files) if not store.has_blob(d)]


def restore_blobs(store: Store, manifest: Manifest, blobs: dict[str, Path]) -> list[str]:
    """Once the manifest is stored, every blob it names must be there: a `gc` that planned before the manifest
    existed may have deleted a reused orphan after it was refreshed. Missing blobs we hold are uploaded again;
    returns the digests still missing (blobs another builder's manifest names, which only a rebuild can restore)."""
    missing = missing_blobs(store, manifest)
    for digest in missing:
        if digest in blobs:
            log.warning(
                "blob %s of %s vanished while publishing (a concurrent gc?); uploading it again",
                digest[:12],
                manifest.ref,
            )
            store.put_blob(digest, blobs[digest])
    return [d for d in missing if d not in blobs]


def _stored(store: Store, key: str) -> Manifest:
    manifest = read_manifest(store, key)
    if manifest is None:  # written and gone again: only gc or a person deletes manifests
        raise StoreError(f"manifest {key[:12]} disappeared from {store.url} while publishing", hint="publish again")
    return manifest


def heal_index(store: Store, key: str) -> Manifest | None:
    """For a key whose manifest is already stored: make sure the index lists it (a publish killed between its
    manifest and its index leaves it out). Returns the stored manifest, or None if it cannot be read."""
    try:
        manifest = read_manifest(store, key)
    except IntegrityError as exc:
        log.warning("manifest %s in %s is unreadable (%s); not indexed", key[:12], store.url, exc)
        return None
    if manifest is not None and store.writable:
        update_index(store, [manifest])
    return manifest


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


def rebuild_index(store: Store) -> dict[str, int]:
    """Rebuild every model's index from manifests/. Returns entries per model."""
    manifests: list[Manifest] = []
    for key in store.list_manifest_keys():
        try:
            manifest = read_manifest(store, key)
        except IntegrityError as exc:
            log.warning("skipping manifest %s: %s", key[:12], exc)
            continue
        if manifest is None:
            continue
        if problem := name_problem(manifest.model):  # stored before names were checked: its index file cannot exist
            log.warning("skipping manifest %s: model name %s", key[:12], problem)
            continue
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


def copy_artifacts(
    source: Store, dest: Store, keys: Iterable[str], progress: ProgressLike = None, workroot: Path | None = None
) -> dict[str, str]:
    """Copy artifacts between stores: blobs the destination lacks, then the manifest, then the index.

    Blobs are streamed through a temp file and hashed on the way, so a damaged source blob is never published.
    Returns {key: "copied" | "exists"}."""
    report = as_progress(progress)
    results: dict[str, str] = {}
    indexed: list[Manifest] = []
    # Blobs pass through a folder owned by this process under ENGINEFARM_HOME/tmp: if it is killed, the next
    # run (or `enginefarm cache gc`) reclaims the folder, instead of it staying in the system's temp dir.
    if workroot is None:
        from enginefarm.settings import load_settings

        workroot = load_settings().home / "tmp"
    workroot.mkdir(parents=True, exist_ok=True)
    reclaim(workroot, "copy")
    tmp = fresh(workroot, "copy")
    try:
        for key in keys:
            manifest = read_manifest(source, key)
            if manifest is None:
                raise StoreError(f"{source.url} has no manifest {key[:12]}")
            existing = read_manifest(dest, key)
            # A copy killed after its manifest left the index without it: the rerun heals that (and any blob a
            # damaged destination lost, when the source has the same bytes).
            target = existing or manifest
            total = sum(f.stored_size for f in target.files)
            on_bytes = _byte_counter(report, f"copy {manifest.ref} {manifest.target} {manifest.precision}", total)
            for entry in {f.stored_sha256: f for f in target.files}.values():
                if dest.refresh_blob(entry.stored_sha256):  # reused: young again, so a concurrent gc keeps it
                    on_bytes(entry.stored_size)
                    continue
                path = tmp / entry.stored_sha256
                with source.open_blob(entry.stored_sha256, entry.stored_size) as src, open(path, "wb") as out:
                    with full_disk_as_error(tmp, entry.stored_size):
                        digest = decode_stream(src, out, "none", entry.stored_size)  # copies, hashes, enforces the size
                if digest != entry.stored_sha256:
                    raise IntegrityError(
                        f"blob {entry.stored_sha256[:12]} in {source.url}: the stored bytes do not match their digest "
                        "(tampered or corrupt store)",
                        hint="nothing was published for this artifact",
                    )
                checkpoint("copy:blob-temp")
                dest.put_blob(entry.stored_sha256, path, progress=on_bytes)
                path.unlink()
            if existing is None and not dest.put_manifest_bytes(key, manifest.to_json()):
                existing = read_manifest(dest, key)  # another copier won: index theirs
            checkpoint("publish:manifest")
            indexed.append(existing or manifest)
            results[key] = "exists" if existing is not None else "copied"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    update_index(dest, [m for m in indexed if m is not None])
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
    stale_caches: list[str] = field(
        default_factory=list
    )  # build-cache objects past the newest few of their slot, older than the grace
    partials: list[str] = field(
        default_factory=list
    )  # what killed writers left (temp files, incomplete uploads), older than the grace


def all_manifests(store: Store, purpose: str) -> list[Manifest]:
    """Every manifest in the store. An unreadable one stops `purpose` (deleting on a partial view could orphan a blob
    it references)."""
    found = []
    for key in store.list_manifest_keys():
        try:
            manifest = read_manifest(store, key)
        except IntegrityError as exc:
            raise StoreError(
                f"manifest {key[:12]} is unreadable ({exc}); refusing to {purpose}",
                hint="fix or remove that manifest first",
            ) from None
        if manifest is not None:
            found.append(manifest)
    return found


def plan_gc(store: Store, grace_s: float, now: float | None = None) -> GcPlan:
    """Blobs that no manifest references and that are older than `grace_s` (a builder may be mid-publish:
    its blobs are written before its manifest, so young orphans are left alone)."""
    now = time.time() if now is None else now
    # Blobs are listed before manifests: a publish whose manifest lands between the two listings is seen.
    blobs = list(store.list_blobs())
    referenced = {f.stored_sha256 for manifest in all_manifests(store, "collect garbage") for f in manifest.files}
    orphans = [(digest, mtime) for digest, mtime in blobs if digest not in referenced]
    partials = [name for name, mtime in store.list_partials() if now - mtime > grace_s]
    return GcPlan(
        len(referenced),
        orphans,
        [d for d, mtime in orphans if now - mtime > grace_s],
        _stale_caches(store, grace_s, now),
        partials,
    )


def collect_garbage(store: Store, grace_s: float, *, delete: bool) -> GcPlan:
    """What `plan_gc` finds; with `delete`, removed too: unreferenced blobs past the grace, leftovers of interrupted
    writes, superseded build-cache objects. Returns the plan, which says what went (or, without `delete`, would go)."""
    plan = plan_gc(store, grace_s)
    if delete:
        planned = dict(plan.unreferenced)
        for digest in plan.to_delete:
            mtime = store.blob_mtime(digest)
            if mtime is not None and mtime > planned[digest]:
                log.info("blob %s was reused since gc planned; keeping it", digest[:12])  # a publish refreshed it
                continue
            store.delete_blob(digest)
        for name in plan.partials:
            store.delete_partial(name)
        for name in plan.stale_caches:
            store.delete_cache_object(name)
    return plan


def _stale_caches(store: Store, grace_s: float, now: float) -> list[str]:
    slots: dict[str, list[tuple[str, float]]] = {}
    for name, mtime in store.list_cache_entries(""):
        slots.setdefault(name.rsplit("/", 1)[0], []).append((name, mtime))
    stale = []
    for entries in slots.values():
        kept = set(newest_cache_objects(entries))
        stale += [name for name, mtime in entries if name not in kept and now - mtime > grace_s]
    return sorted(stale)
