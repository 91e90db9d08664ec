"""Resumable, capped, deadline-bound reads of one remote object, shared by the S3 and HTTP stores.

A transfer that breaks is resumed from where it stopped, pinned to the object's ETag, so two versions of an
object are never spliced: if the server ignores the Range or the object changed, `BlobChanged` tells the
caller to start over from zero. A wrong Content-Range aborts. Reads never go past the expected size, and
a transfer slower than the throughput floor or longer than the deadline is abandoned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from enginefarm.errors import BlobChanged, EnginefarmError, IntegrityError, StoreError, TransferTooSlow

log = logging.getLogger(__name__)

RESUME_ATTEMPTS = 8


class RawStream(Protocol):
    def read(self, size: int = -1) -> bytes: ...

    def close(self) -> None: ...


@dataclass
class Opened:
    stream: RawStream
    etag: str | None
    start: int  # absolute offset of the first byte this response carries (from Content-Range; 0 for a 200)
    partial: bool  # True for a 206 with Content-Range
    total: int | None = None  # the whole object's size, as the response declares it (declared_total)


def declared_total(content_range: str, content_length: int | None, start: int) -> int | None:
    """The whole object's size a response declares: Content-Range's `/TOTAL`, or a whole body's Content-Length."""
    total = content_range.rpartition("/")[2]
    if content_range.startswith("bytes ") and total.isdigit():
        return int(total)
    return content_length if not content_range and start == 0 and content_length is not None else None


# opener(start, etag) → Opened for the object's bytes from absolute offset `start` (up to the reader's end).
# `etag` is None on the first request of an unpinned read; when set, the request must be conditional on it.
Opener = Callable[[int, str | None], Opened]


@dataclass(frozen=True)
class Limits:
    deadline_s: float = 3600.0
    min_rate: float = 16 * 1024  # bytes/s, averaged over `window_s`
    window_s: float = 30.0


class Pace:
    """One transfer's deadline and throughput floor, checked after each read: past the deadline, or below
    `min_rate` averaged over a window, a one-line `error` (every reader of remote bytes shares these rules)."""

    def __init__(
        self, limits: Limits, what: str, *, started: float | None = None, error: type[EnginefarmError] = TransferTooSlow
    ):
        self.limits, self.what, self.error = limits, what, error
        self.started = time.monotonic() if started is None else started
        self.got = 0  # bytes read in all
        self._since, self._count = time.monotonic(), 0

    def add(self, got: int) -> None:
        self.got += got
        now = time.monotonic()
        if now - self.started > self.limits.deadline_s:
            raise self.error(
                f"{self.what}: not read within its {self.limits.deadline_s:.0f} s deadline ({self.got} bytes)",
                hint="set ENGINEFARM_HTTP_DEADLINE for very large files on slow links",
            )
        self._count += got
        if now - self._since >= self.limits.window_s:
            rate = self._count / (now - self._since)
            if rate < self.limits.min_rate:
                raise self.error(
                    f"{self.what}: {rate / 1024:.2f} KiB/s is below the {self.limits.min_rate / 1024:.0f} KiB/s floor",
                    hint="the server is trickling; try again later or set ENGINEFARM_HTTP_MIN_RATE",
                )
            self._since, self._count = now, 0


class ResumableReader:
    """A file-like reader over `opener` that resumes on broken connections. Retryable errors: `transient`."""

    def __init__(
        self,
        opener: Opener,
        *,
        expected_size: int | None,
        transient: tuple[type[BaseException], ...],
        limits: Limits = Limits(),
        what: str = "object",
        base: int = 0,
        etag: str | None = None,
        object_size: int | None = None,
    ) -> None:
        self._opener = opener
        self._object_size = object_size  # the whole object's claimed size: a response declaring another is refused
        self._base = base  # where this reader's bytes start in the object (parallel chunks)
        self._expected = expected_size
        self._transient = transient
        self._what = what
        self._pos = 0
        self._etag = etag
        self._current: RawStream | None = None
        self._pace = Pace(limits, what)
        self._attempts = 0

    def _open(self) -> None:
        want = self._base + self._pos
        opened = self._opener(want, self._etag)
        problem: StoreError | IntegrityError | None = None
        if want > 0 and not opened.partial:
            problem = BlobChanged(
                f"{self._what}: the server ignored the Range request (or the object changed); restarting from zero"
            )
        elif opened.etag and self._etag and opened.etag != self._etag:
            problem = BlobChanged(f"{self._what} changed during the transfer; restarting from zero")
        elif opened.partial and opened.start != want:
            problem = IntegrityError(
                f"{self._what}: asked for bytes from {want}, the server sent from {opened.start} (bad Content-Range)"
            )
        elif self._object_size is not None and opened.total is not None and opened.total != self._object_size:
            # before a byte is read: a 98 KB bomb under a 3 GB claim would otherwise decode the claim to disk
            problem = IntegrityError(
                f"{self._what}: the store holds {opened.total} bytes, the manifest claims {self._object_size}"
            )
        if problem is not None:
            opened.stream.close()
            raise problem
        if self._etag is None:
            self._etag = opened.etag
        self._current = opened.stream

    def read(self, size: int = -1) -> bytes:
        if self._expected is not None and self._pos >= self._expected:
            if self._current is not None and self._current.read(1):
                raise IntegrityError(f"{self._what} is longer than the {self._expected} bytes expected")
            return b""
        want = size if size is not None and size > 0 else 1 << 20
        if self._expected is not None:
            want = min(want, self._expected - self._pos)
        while True:
            try:
                if self._current is None:
                    self._open()
                assert self._current is not None  # _open() opened it or raised
                # read1 returns what one socket read brings, so the pace checks run even on a trickle
                # (a plain read(1 MiB) would block until the whole MiB arrived).
                reader = getattr(self._current, "read1", None) or self._current.read
                chunk = reader(want)
            except self._transient as exc:
                self._drop()
                self._attempts += 1
                if self._attempts > RESUME_ATTEMPTS:
                    raise StoreError(f"{self._what}: connection kept failing ({type(exc).__name__}: {exc})") from None
                log.info("%s: %s at byte %d; resuming", self._what, type(exc).__name__, self._pos)
                time.sleep(min(0.1 * 2**self._attempts, 5.0))
                continue
            if not chunk:
                if self._expected is not None and self._pos < self._expected:
                    # The server closed early without an error: treat it as a break and resume.
                    self._drop()
                    self._attempts += 1
                    if self._attempts > RESUME_ATTEMPTS:
                        raise StoreError(f"{self._what}: ends at {self._pos} of {self._expected} bytes (truncated)")
                    continue
                return b""
            self._pos += len(chunk)
            self._pace.add(len(chunk))
            return chunk

    @property
    def etag(self) -> str | None:
        return self._etag

    def _drop(self) -> None:
        if self._current is not None:
            try:
                self._current.close()
            except Exception:
                pass
        self._current = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> ResumableReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
