"""A store in a local directory: the embedded default. Every write is atomic; blobs and manifests are write-once."""

from __future__ import annotations

import io
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from enginefarm.errors import ArtifactNotFoundError, IntegrityError, StoreError

from ..atomic import aging_mtime, atomic_writer, sha256_bytes, temp_sibling, write_once
from ..faults import checkpoint
from ..locks import file_lock
from ..space import full_disk_as_error
from .base import (
    BlobReader,
    CappedReader,
    Store,
    blob_relpath,
    cache_folder,
    channel_relpath,
    check_cache_name,
    index_relpath,
    local_root,
)

_HEX = re.compile(r"[0-9a-f]{64}")
_PARTIAL = re.compile(r"\.[^/]+\.[0-9a-f]{12}\.incomplete")  # atomic.temp_sibling's names


SMALL_LIMIT = 64 << 20  # an index, manifest or channel file larger than this is not one (as over HTTP)
CACHE_OBJECT_LIMIT = 1 << 30  # a shared build cache (a TensorRT timing cache is MBs)


def open_regular(path: Path, refuse: Callable[[Path], Exception] | None = None) -> BinaryIO:
    """Open a store file for reading, refusing anything but a regular file (a FIFO would block forever, /dev/zero
    never ends). Opened non-blocking so a FIFO is refused instead of waited on; raises FileNotFoundError if absent.
    `refuse` makes the error for a special file (other readers of user files: LoRAs, checkpoints); else StoreError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            if refuse is not None:
                raise refuse(Path(path))
            raise StoreError(
                f"{path} is not a regular file; refusing to read it",
                hint="a store holds only plain files: remove or replace it",
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(path: Path, limit: int = SMALL_LIMIT) -> bytes:
    """A whole small store file, at most `limit` bytes (raises FileNotFoundError if absent, StoreError if special or
    larger)."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise StoreError(
            f"{path} is larger than {limit >> 20} MiB; refusing to read it", hint="this is not an enginefarm store file"
        )
    return data


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _HEX.fullmatch(digest):
        raise StoreError(f"{digest!r} is not a sha256 hex digest")
    return digest


class LocalStore(Store):
    """A store in a local folder (a path or `file://` URL), the default: every write is atomic, blobs and manifests
    are written once, the index is replaced under a lock with its etag checked."""

    def __init__(self, url: str | Path) -> None:
        self.root = local_root(url)
        self.url = str(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is not a directory")

    # Blobs -----------------------------------------------------------------------------------------------
    def _blob(self, digest: str) -> Path:
        return self.root / blob_relpath(check_digest(digest))

    def has_blob(self, digest: str) -> bool:
        return self._blob(digest).is_file()

    def refresh_blob(self, digest: str) -> bool:
        try:
            os.utime(self._blob(digest))
            return True
        except FileNotFoundError:
            return False

    def blob_mtime(self, digest: str) -> float | None:
        try:
            return self._blob(digest).stat().st_mtime
        except FileNotFoundError:
            return None

    def put_blob(self, digest: str, path: Path, progress: Callable[[int], None] | None = None) -> bool:
        dest = self._blob(digest)
        if self.refresh_blob(digest):  # reused: young again, so a concurrent gc keeps it (it may be an old orphan)
            return False
        tmp = temp_sibling(dest)
        try:
            with full_disk_as_error(dest.parent, path.stat().st_size):
                dest.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "rb") as src, open(tmp, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
                        if progress:
                            progress(len(chunk))
                    out.flush()
                    os.fsync(out.fileno())  # durable before it becomes visible: a crash never links a hole into place
                checkpoint("store:blob-temp")
            try:
                os.link(tmp, dest)
            except FileExistsError:
                self.refresh_blob(digest)
                return False
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def open_blob(self, digest: str, size: int | None = None, offset: int = 0) -> BlobReader:
        try:
            handle = open_regular(self._blob(digest))
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"blob {digest[:12]} is missing from {self.url}") from None
        held = os.fstat(handle.fileno()).st_size
        if size is not None and held != size:
            handle.close()
            raise IntegrityError(f"blob {digest[:12]}: the store holds {held} bytes, the manifest claims {size}")
        if offset:
            handle.seek(offset)
        return handle if size is None else CappedReader(handle, size - offset)

    def delete_blob(self, digest: str) -> None:
        self._blob(digest).unlink(missing_ok=True)

    def list_blobs(self) -> Iterator[tuple[str, float]]:
        base = self.root / "blobs" / "sha256"
        if not base.is_dir():
            return
        for path in sorted(base.glob("??/*")):
            if _HEX.fullmatch(path.name):
                yield path.name, aging_mtime(path)

    def list_partials(self) -> list[tuple[str, float]]:
        """Temp files a killed writer left (`.<name>.<random>.incomplete`), with their mtimes."""
        found = []
        for folder in ("blobs/sha256", "manifests", "index", "channels", "caches"):
            base = self.root / folder
            if base.is_dir():
                for path in base.rglob(".*.incomplete"):
                    if _PARTIAL.fullmatch(path.name):
                        try:
                            found.append((str(path.relative_to(self.root)), aging_mtime(path)))
                        except FileNotFoundError:
                            continue
        return sorted(found)

    def delete_partial(self, name: str) -> None:
        path = (self.root / name).resolve()
        if path.parent.is_relative_to(self.root) and _PARTIAL.fullmatch(path.name):
            path.unlink(missing_ok=True)

    # Manifests -------------------------------------------------------------------------------------------
    def _manifest(self, key: str) -> Path:
        return self.root / "manifests" / f"{check_digest(key)}.json"

    def get_manifest_bytes(self, key: str) -> bytes | None:
        try:
            return read_small(self._manifest(key))
        except FileNotFoundError:
            return None

    def put_manifest_bytes(self, key: str, data: bytes) -> bool:
        with full_disk_as_error(self.root / "manifests", len(data)):
            return write_once(self._manifest(key), data)

    def open_manifest(self, key: str) -> BinaryIO:
        try:
            return io.BytesIO(read_small(self._manifest(key)))
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"manifest {key[:12]} is missing from {self.url}") from None

    def delete_manifest(self, key: str) -> None:
        self._manifest(key).unlink(missing_ok=True)

    def list_manifest_keys(self) -> Iterator[str]:
        base = self.root / "manifests"
        if base.is_dir():
            for path in sorted(base.glob("*.json")):
                if _HEX.fullmatch(path.stem):
                    yield path.stem

    # Index -----------------------------------------------------------------------------------------------
    def _index(self, model: str) -> Path:
        return self.root / index_relpath(model)

    def get_index_bytes(self, model: str) -> tuple[bytes | None, str | None]:
        try:
            data = read_small(self._index(model))
        except FileNotFoundError:
            return None, None
        return data, sha256_bytes(data)

    def cas_index_bytes(self, model: str, data: bytes, etag: str | None) -> bool:
        path = self._index(model)
        # The lock narrows the race window; a lost update is still harmless (the index is derived).
        with file_lock(self.root / "locks" / f"index-{model}.lock", timeout=30):
            _, current = self.get_index_bytes(model)
            if current != etag:
                return False
            with full_disk_as_error(path.parent, len(data)), atomic_writer(path) as handle:
                handle.write(data)
            return True

    def list_models(self) -> Iterator[str]:
        base = self.root / "index"
        if base.is_dir():
            for path in sorted(base.glob("*.json")):
                yield path.stem

    # Release channels ------------------------------------------------------------------------------------
    def open_channel_file(self, channel: str, name: str) -> BinaryIO:
        try:
            return io.BytesIO(read_small(self.root / channel_relpath(channel, name)))
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"{channel_relpath(channel, name)} is missing from {self.url}") from None

    def put_channel_file(self, channel: str, name: str, data: bytes) -> None:
        path = self.root / channel_relpath(channel, name)
        with full_disk_as_error(path.parent, len(data)), atomic_writer(path) as handle:
            handle.write(data)

    # Shared build caches ---------------------------------------------------------------------------------
    def put_cache_object(self, name: str, data: bytes) -> bool:
        with full_disk_as_error(self.root / "caches", len(data)):
            return write_once(self.root / "caches" / check_cache_name(name), data)

    def get_cache_object(self, name: str) -> bytes | None:
        try:
            return read_small(self.root / "caches" / check_cache_name(name), CACHE_OBJECT_LIMIT)
        except FileNotFoundError:
            return None

    def list_cache_entries(self, prefix: str) -> list[tuple[str, float]]:
        root = self.root / "caches"
        base = root / cache_folder(prefix)
        if not base.is_dir():
            return []
        return [
            (str(p.relative_to(root)), aging_mtime(p))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        ]

    def delete_cache_object(self, name: str) -> None:
        (self.root / "caches" / check_cache_name(name)).unlink(missing_ok=True)
