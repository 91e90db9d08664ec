"""The store contract. Every store passes one conformance suite (tests/cache/test_store_conformance.py)."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from enginefarm.errors import ArtifactNotFoundError, IntegrityError, StoreError

_CACHE_NAME = re.compile(r"[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*")


class Store(ABC):
    """Raw object access, in the layout every store shares (docs/stores.md; `<2>` is the digest's first two hex
    characters):

    ```text
    blobs/sha256/<2>/<digest>   immutable stored bytes, content-addressed
    manifests/<build-key>.json  immutable, written once after its blobs
    index/<model>.json          derived, updated by compare-and-swap
    channels/<channel>/<name>   signed release metadata, written only by enginefarm release
    caches/<kind>/.../<sha256>  shared build caches (TensorRT timing caches), write-once
    ```
    """

    url: str
    writable: bool = True

    # Blobs -----------------------------------------------------------------------------------------------
    @abstractmethod
    def has_blob(self, digest: str) -> bool:
        """True if a blob with this sha256 hex digest is stored."""

    @abstractmethod
    def put_blob(self, digest: str, path: Path, progress: Callable[[int], None] | None = None) -> bool:
        """Store the file at `path` under `digest` unless present. True if written; an existing blob counts as success.
        `progress` receives byte counts as they are sent."""

    def refresh_blob(self, digest: str) -> bool:
        """True if the blob is present, its modification time now renewed: a publish that reuses an orphan blob (a
        killed build's) makes it young again, so `gc` (which deletes orphans older than its grace) leaves it be."""
        return self.has_blob(digest)

    def blob_mtime(self, digest: str) -> float | None:
        """The blob's modification time now (None: gone, or this store cannot tell); `gc` checks it again just
        before deleting, so a blob refreshed since its plan is kept."""
        return None

    @abstractmethod
    def open_blob(self, digest: str, size: int | None = None, offset: int = 0) -> BlobReader:
        """A readable stream of the stored bytes from `offset` (to resume a download), never past `size` when
        given. Raises ArtifactNotFoundError; a remote stream may raise BlobChanged, meaning: read it again from the
        start. `size` is the whole blob's claimed size: where the store says it holds another (stat, the response's
        Content-Length or Content-Range), IntegrityError before a byte is read, so a lying manifest (a 98 KB bomb
        claiming 3 GB) makes nothing decode."""

    @abstractmethod
    def delete_blob(self, digest: str) -> None:
        """Remove one blob; only `enginefarm gc` calls it, for blobs that no kept manifest names."""

    @abstractmethod
    def list_blobs(self) -> Iterator[tuple[str, float]]:
        """(digest, modification time) of every blob."""

    def list_partials(self) -> list[tuple[str, float]]:
        """(name, start time) of what killed writers left behind: temp files of a local store, incomplete multipart
        uploads on S3. Invisible to readers; `enginefarm gc` removes those older than its grace period."""
        return []

    def delete_partial(self, name: str) -> None:
        """Remove one leftover named by `list_partials`."""
        return None  # a store whose list_partials is always empty has nothing to remove

    # Manifests -------------------------------------------------------------------------------------------
    @abstractmethod
    def get_manifest_bytes(self, key: str) -> bytes | None:
        """The manifest stored under this build key, or None."""

    @abstractmethod
    def put_manifest_bytes(self, key: str, data: bytes) -> bool:
        """Write once. False if a manifest with this key already exists (it is never rewritten)."""

    @abstractmethod
    def list_manifest_keys(self) -> Iterator[str]:
        """The build key of every stored manifest."""

    @abstractmethod
    def delete_manifest(self, key: str) -> None:
        """Only `enginefarm gc --keep-versions` deletes a manifest (an old model version's), after its index entry."""

    # Index (the one object that is rewritten) ------------------------------------------------------------
    @abstractmethod
    def get_index_bytes(self, model: str) -> tuple[bytes | None, str | None]:
        """(content, etag) or (None, None)."""

    @abstractmethod
    def cas_index_bytes(self, model: str, data: bytes, etag: str | None) -> bool:
        """Replace the index if its etag is still `etag` (None: only if absent). False on conflict."""

    @abstractmethod
    def list_models(self) -> Iterator[str]:
        """The model name of every `index/<model>.json`."""

    def open_manifest(self, key: str) -> BinaryIO:
        """The manifest as a stream, so a verifier can stop reading at the length it trusts."""
        import io

        data = self.get_manifest_bytes(key)
        if data is None:
            raise ArtifactNotFoundError(f"manifest {key[:12]} is missing from {self.url}")
        return io.BytesIO(data)

    # Release channels (signed metadata; rewritten only by `enginefarm release`) -----------------------------
    @abstractmethod
    def open_channel_file(self, channel: str, name: str) -> BinaryIO:
        """A stream of `channels/<channel>/<name>`; raises ArtifactNotFoundError. The caller caps what it reads."""

    @abstractmethod
    def put_channel_file(self, channel: str, name: str, data: bytes) -> None:
        """Create or replace `channels/<channel>/<name>` atomically."""

    # Shared build caches (TensorRT timing caches): write-once objects under caches/, merged by their readers.
    # Defaults for stores that keep none (HTTP is read-only and cannot list): builds then just start cold.
    def put_cache_object(self, name: str, data: bytes) -> bool:
        """Write `caches/<name>` once. False if it exists or this store keeps no caches; never rewrites."""
        return False

    def get_cache_object(self, name: str) -> bytes | None:
        """The bytes of `caches/<name>`, or None (absent, or this store keeps no caches)."""
        return None

    def list_cache_entries(self, prefix: str) -> list[tuple[str, float]]:
        """(name relative to caches/, mtime) of every object under `prefix`."""
        return []

    def list_cache_objects(self, prefix: str) -> list[str]:
        """The names under `prefix`, sorted (`list_cache_entries` without the times)."""
        return sorted(name for name, _ in self.list_cache_entries(prefix))

    def delete_cache_object(self, name: str) -> None:
        """Only `enginefarm gc` deletes: a cache object costs a slower build when missing, never an artifact."""
        return None  # a store that keeps no cache objects (list_cache_entries empty) has nothing to delete

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def cache_folder(prefix: str) -> str:
    """A listing prefix under caches/: "" for all of it, else a checked name ending in '/'."""
    prefix = prefix.strip("/")
    return f"{check_cache_name(prefix)}/" if prefix else ""


def check_cache_name(name: str) -> str:
    if not isinstance(name, str) or not _CACHE_NAME.fullmatch(name) or ".." in name.split("/"):
        raise StoreError(f"{name!r} is not a valid cache object name")
    return name


_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_model(model: str) -> str:
    if not isinstance(model, str) or not _MODEL.fullmatch(model):
        raise StoreError(f"{model!r} is not a valid model name")
    return model


def index_relpath(model: str) -> str:
    return f"index/{check_model(model)}.json"


def local_root(url: str | Path) -> Path:
    """The folder of a directory store, named by a path or a file:// URL (a warm load finds its index file here
    without opening the store: runner/warm.py)."""
    return Path(str(url).removeprefix("file://")).expanduser().resolve()


def blob_relpath(digest: str) -> str:
    return f"blobs/sha256/{digest[:2]}/{digest}"


_CHANNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_CHANNEL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.json")


def channel_relpath(channel: str, name: str) -> str:
    if not _CHANNEL.fullmatch(channel):
        raise StoreError(f"{channel!r} is not a valid channel name", hint="letters, digits, '.', '_' and '-'")
    if not _CHANNEL_FILE.fullmatch(name):
        raise StoreError(f"{name!r} is not a valid channel file name")
    return f"channels/{channel}/{name}"


class BlobReader(Protocol):
    """What `open_blob` returns: a file, or a remote store's resumable or parallel reader, whose read() may hand out
    views of its buffer instead of copies."""

    def read(self, size: int = -1, /) -> bytes | memoryview: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


class CappedReader:
    """Reads at most `limit` bytes from a stream; more data than that is an error, never written anywhere."""

    def __init__(self, stream, limit: int) -> None:
        self.stream = stream
        self.left = limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            if self.stream.read(1):
                raise IntegrityError("blob is longer than its manifest says")
            return b""
        want = self.left if size is None or size < 0 else min(size, self.left)
        chunk = self.stream.read(want)
        self.left -= len(chunk)
        return chunk

    def close(self) -> None:
        self.stream.close()

    def __enter__(self) -> CappedReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
