"""A read-only store over HTTP(S): a CDN or a public bucket. It cannot be listed, so readers go through
`index/<model>.json`. Large blobs are fetched with parallel ranged GETs pinned to one ETag."""

from __future__ import annotations

import http.client
import io
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, NoReturn

from enginefarm.errors import ArtifactNotFoundError, StoreError

from .base import BlobReader, Store, blob_relpath, channel_relpath, index_relpath
from .local import check_digest
from .ranged import BlobChanged, Limits, Opened, ResumableReader, declared_total
from .small import Unreachable, read_whole, small_limits

PARALLEL_THRESHOLD = 32 << 20
CHUNK = 8 << 20
# ENGINEFARM_HTTP_CONNECTIONS defaults to 1: measured on loopback, a server that reads the whole object per
# Range request (moto, some origins) made 4 parallel ranges 9x slower than one stream. CDNs that cap
# per-connection throughput are the opposite case: raise it there.
SOCKET_TIMEOUT = 30.0
SMALL_LIMIT = 64 << 20  # an index, a manifest or a channel file larger than this is not one
_TRANSIENT = (
    ConnectionError,
    TimeoutError,
    socket.timeout,
    http.client.IncompleteRead,
    http.client.RemoteDisconnected,
    urllib.error.URLError,
)


class HttpStore(Store):
    """A read-only store over `http://` or `https://` (a CDN or a public bucket): readers go through
    `index/<model>.json`, large blobs arrive in parallel ranged GETs pinned to one ETag, and every read has a deadline
    and a minimum rate (ENGINEFARM_HTTP_DEADLINE, ENGINEFARM_HTTP_MIN_RATE)."""

    writable = False

    def __init__(
        self,
        url: str,
        *,
        limits: Limits | None = None,
        workers: int | None = None,
        parallel_threshold: int = PARALLEL_THRESHOLD,
    ) -> None:
        from enginefarm.settings import load_settings

        settings = load_settings()  # ENGINEFARM_HTTP_DEADLINE, _MIN_RATE, _CONNECTIONS
        self.url = url.rstrip("/")
        self.limits = limits or Limits(deadline_s=settings.http_deadline_s, min_rate=settings.http_min_rate)
        self.workers = workers or settings.http_connections
        self.parallel_threshold = parallel_threshold

    def _url(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _request(
        self, rel: str, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = SOCKET_TIMEOUT
    ):
        request = urllib.request.Request(
            self._url(rel), method=method, headers={"User-Agent": "enginefarm", **(headers or {})}
        )
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                raise ArtifactNotFoundError(f"{self._url(rel)} not found (404)") from None
            if exc.code == 403:
                raise StoreError(
                    f"{self._url(rel)}: access denied (403)",
                    hint="the bucket or CDN must allow public reads of this prefix",
                    status=403,
                ) from None
            if exc.code in (412, 416):  # a failed If-Match, or a range the object no longer has: it changed
                raise BlobChanged(f"{self._url(rel)} changed during the transfer") from None
            location = exc.headers.get("Location") if exc.headers is not None else None
            if 300 <= exc.code < 400 and location:  # urllib follows http(s) redirects only: file://, ftp:// land here
                raise StoreError(
                    f"{self._url(rel)}: redirects to {location[:200]}, which is not http(s): refused",
                    hint="a store serves its files over http(s); fix the server's redirect",
                ) from None
            raise StoreError(f"{self._url(rel)}: HTTP {exc.code} {exc.reason}") from None
        except _TRANSIENT as exc:
            raise Unreachable(
                f"cannot reach {self._url(rel)}: {getattr(exc, 'reason', exc)}", hint="check the URL and your network"
            ) from None

    def _read_small(self, rel: str, *, fresh: bool = True) -> tuple[bytes, str | None] | None:
        """(body, ETag) of a small object, or None if it is not there: paced, capped, length-checked, retried
        (small.py). `fresh`: ask caches for the current version (the index and channel metadata change; manifests never
        do)."""
        headers = {"Cache-Control": "no-cache"} if fresh else {}
        try:
            return read_whole(
                lambda timeout: self._request(rel, headers=headers, timeout=timeout),
                limit=SMALL_LIMIT,
                limits=small_limits(self.limits),
                what=self._url(rel),
                transient=_TRANSIENT,
            )
        except ArtifactNotFoundError:
            return None

    def _open_small(self, rel: str, *, fresh: bool = True) -> BinaryIO:
        got = self._read_small(rel, fresh=fresh)
        if got is None:
            raise ArtifactNotFoundError(f"{self._url(rel)} not found (404)")
        return io.BytesIO(got[0])

    def _refuse(self, what: str) -> NoReturn:
        raise StoreError(
            f"{self.url} is a read-only HTTP store: cannot {what}",
            hint="publish to the bucket behind it (s3://…) instead",
        )

    # Blobs -----------------------------------------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        # A one-byte GET, not HEAD: some CDNs and bucket policies answer HEAD differently from GET.
        try:
            self._request(blob_relpath(check_digest(digest)), headers={"Range": "bytes=0-0"}).close()
            return True
        except ArtifactNotFoundError:
            return False

    def put_blob(self, digest, path, progress=None) -> bool:
        self._refuse("upload blobs")

    def delete_blob(self, digest: str) -> None:
        self._refuse("delete blobs")

    def delete_manifest(self, key: str) -> None:
        self._refuse("delete manifests")

    def list_blobs(self) -> Iterator[tuple[str, float]]:
        self._refuse("list blobs")

    def open_blob(self, digest: str, size: int | None = None, offset: int = 0) -> BlobReader:
        rel = blob_relpath(check_digest(digest))
        if offset:
            return self._reader(
                rel, None if size is None else size - offset, f"blob {digest[:12]}", offset, object_size=size
            )
        if size is not None and size >= self.parallel_threshold and self.workers > 1:
            return _ParallelReader(self, rel, size, digest)
        return self._reader(rel, size, f"blob {digest[:12]}", object_size=size)

    def _reader(
        self,
        rel: str,
        size: int | None,
        what: str,
        offset: int = 0,
        etag: str | None = None,
        *,
        whole: bool = True,
        object_size: int | None = None,
    ) -> ResumableReader:
        """A resumable reader of `rel` from `offset` (`size` bytes, or to the end), pinned to `etag` once known."""
        end = "" if whole or size is None else str(offset + size - 1)

        def opener(start: int, pinned: str | None) -> Opened:
            headers = {}
            if start > 0 or not whole:
                headers["Range"] = f"bytes={start}-{end}"
                if pinned:
                    headers["If-Range"] = pinned  # a changed object comes back whole (200), which the reader refuses
            if pinned:
                headers["If-Match"] = pinned  # and where supported, as a plain 412
            response = self._request(rel, headers=headers)
            content_range = response.headers.get("Content-Range") or ""
            first = (
                int(content_range.split()[1].split("-")[0])
                if response.status == 206 and content_range.startswith("bytes ")
                else 0
            )
            length = response.headers.get("Content-Length")
            total = declared_total(content_range, int(length) if length and length.isdigit() else None, first)
            return Opened(response, response.headers.get("ETag"), first, response.status == 206, total)

        return ResumableReader(
            opener,
            expected_size=size,
            transient=_TRANSIENT,
            limits=self.limits,
            what=what,
            base=offset,
            etag=etag,
            object_size=object_size,
        )

    # Manifests -------------------------------------------------------------------------------------------
    def get_manifest_bytes(self, key: str) -> bytes | None:
        got = self._read_small(f"manifests/{check_digest(key)}.json", fresh=False)
        return None if got is None else got[0]

    def put_manifest_bytes(self, key: str, data: bytes) -> bool:
        self._refuse("write manifests")

    def open_manifest(self, key: str) -> BinaryIO:
        return self._open_small(f"manifests/{check_digest(key)}.json", fresh=False)

    def list_manifest_keys(self) -> Iterator[str]:
        self._refuse("list manifests (HTTP cannot list; readers use index/<model>.json)")

    # Index -----------------------------------------------------------------------------------------------
    def get_index_bytes(self, model: str) -> tuple[bytes | None, str | None]:
        got = self._read_small(index_relpath(model))
        return (None, None) if got is None else got

    def cas_index_bytes(self, model: str, data: bytes, etag: str | None) -> bool:
        self._refuse("write the index")

    def list_models(self) -> Iterator[str]:
        self._refuse("list models")

    # Release channels ------------------------------------------------------------------------------------
    def open_channel_file(self, channel: str, name: str) -> BinaryIO:
        return self._open_small(channel_relpath(channel, name))

    def put_channel_file(self, channel: str, name: str, data: bytes) -> None:
        self._refuse("write release metadata")


class _ParallelReader:
    """Fetches a large blob as CHUNK-sized ranges on several threads, all pinned to the first response's ETag,
    and hands the bytes out in order with bounded read-ahead."""

    def __init__(self, store: HttpStore, rel: str, size: int, digest: str) -> None:
        self._store, self._rel, self._size = store, rel, size
        self._what = f"blob {digest[:12]}"
        self._ranges = [(start, min(CHUNK, size - start)) for start in range(0, size, CHUNK)]
        # The first range runs alone: its response's ETag pins every other range to the same version.
        self._etag: str | None = None
        self._buffer = memoryview(self._fetch(*self._ranges[0]))
        self._pool = ThreadPoolExecutor(max_workers=store.workers, thread_name_prefix="enginefarm-get")
        self._futures = [
            self._pool.submit(self._fetch, start, length) for start, length in self._ranges[1 : store.workers + 2]
        ]
        self._next = 1 + len(self._futures)

    def _fetch(self, start: int, length: int) -> bytes:
        reader = self._store._reader(
            self._rel, length, self._what, start, self._etag, whole=False, object_size=self._size
        )
        parts = []
        try:
            while chunk := reader.read(1 << 20):
                parts.append(chunk)
        finally:
            reader.close()
        if self._etag is None:
            self._etag = reader.etag
        data = b"".join(parts)
        if len(data) != length:
            raise StoreError(f"{self._what}: range at {start} returned {len(data)} of {length} bytes")
        return data

    def read(self, size: int = -1) -> memoryview:
        """Views of the fetched ranges, not copies: slicing bytes would copy the rest of the 8 MiB range on every
        read."""
        while not self._buffer and self._futures:
            future = self._futures.pop(0)
            self._buffer = memoryview(future.result())
            if self._next < len(self._ranges):
                start, length = self._ranges[self._next]
                self._futures.append(self._pool.submit(self._fetch, start, length))
                self._next += 1
        if size is None or size < 0:
            size = len(self._buffer)
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def close(self) -> None:
        for future in self._futures:
            future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
