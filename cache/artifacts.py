"""Publishing and reading artifacts in a store: blobs first, manifest last, then the derived index."""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from enginefarm.errors import IntegrityError, StoreError

from .atomic import sha256_file
from .codecs import encode_file
from .manifest import ArtifactFile, Manifest
from .stores.base import Store

log = logging.getLogger(__name__)

INDEX_FORMAT = 1
_CAS_ATTEMPTS = 20


def pack_files(root: Path, entries: Iterable[tuple[str, str]], blob_dir: Path, codec: str = "zstd") -> tuple[list[ArtifactFile], dict[str, Path]]:
    """Encode each (relative path, role) under `root` into `blob_dir`. Returns the file records and digest → blob path."""
    files: list[ArtifactFile] = []
    blobs: dict[str, Path] = {}
    blob_dir.mkdir(parents=True, exist_ok=True)
    for rel, role in entries:
        src = root / rel
        with tempfile.NamedTemporaryFile(dir=blob_dir, delete=False, suffix=".blob") as out:
            encode_file(src, out, codec)
        blob = Path(out.name)
        stored_sha = sha256_file(blob)
        blobs[stored_sha] = blob
        files.append(ArtifactFile(rel, role, src.stat().st_size, sha256_file(src), codec, blob.stat().st_size, stored_sha))
    return files, blobs


def publish(store: Store, manifest: Manifest, blobs: dict[str, Path], progress: Callable[[str], None] | None = None) -> bool:
    """Upload blobs (existing ones count as success), then the manifest, then merge into the index.

    Returns False if a manifest with this key already existed (nothing is rewritten)."""
    if not store.writable:
        raise StoreError(f"store {store.url} is read-only", hint="publish to a local directory or s3:// store")
    for digest, path in blobs.items():
        if progress:
            progress(f"upload blob {digest[:12]}")
        store.put_blob(digest, path)
    written = store.put_manifest_bytes(manifest.build_key, manifest.to_json())
    update_index(store, [manifest])
    return written


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


def _dump_index(index: dict[str, Any]) -> bytes:
    return json.dumps(index, indent=1, sort_keys=True).encode()


def update_index(store: Store, manifests: list[Manifest], *, replace_all: bool = False) -> None:
    """Compare-and-swap the per-model index, merging with whatever a concurrent writer put there."""
    by_model: dict[str, list[Manifest]] = {}
    for manifest in manifests:
        by_model.setdefault(manifest.model, []).append(manifest)
    for model, items in by_model.items():
        for _ in range(_CAS_ATTEMPTS):
            raw, etag = store.get_index_bytes(model)
            index = empty_index(model) if replace_all else parse_index(raw, model)
            for manifest in items:
                index["entries"][manifest.build_key] = manifest.index_entry()
            if store.cas_index_bytes(model, _dump_index(index), etag):
                break
        else:
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
    update_index(store, manifests, replace_all=True)
    counts: dict[str, int] = {}
    for manifest in manifests:
        counts[manifest.model] = counts.get(manifest.model, 0) + 1
    return counts


def with_files(manifest: Manifest, files: list[ArtifactFile]) -> Manifest:
    return replace(manifest, files=tuple(files))
