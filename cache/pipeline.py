"""Overlap the three stages of a fetch: network reads, decoding, and hashing + writing.

Each stage runs on its own thread with a small bounded queue between them; zstd, hashlib and file writes
release the GIL on large buffers, so the stages really run side by side. Errors in any stage surface in
the caller's thread, and memory stays bounded (depth × chunk per queue).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from typing import BinaryIO

from enginefarm.errors import IntegrityError

from .faults import checkpoint

CHUNK = 1 << 20
DEPTH = 8
_END = object()


class Prefetcher:
    """A read-ahead wrapper: a thread pulls chunks from `stream` while the caller consumes earlier ones.

    With `sizes`, it reads exactly those pieces (the frames of a blob whose table is already known), each
    straight into a buffer of its own, so a frame is copied once on its way from the socket to the decoder,
    and `read()` hands out one whole piece at a time; bytes after the last piece are an error."""

    def __init__(
        self, stream, chunk: int = CHUNK, depth: int = DEPTH, sizes: list[int] | None = None, buffers: int = 0
    ) -> None:
        """buffers (with sizes): read the pieces into that many buffers made here, on the caller's thread, which the
        caller hands back with `recycle` once done with a piece (at least 2 more than it holds at once). A buffer
        made on the reading thread would be freed into that thread's malloc arena, which keeps it (malloc_trim
        cannot shrink another thread's arena)."""
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stream = stream
        self._chunk = chunk
        self._sizes = sizes
        self._free: queue.Queue | None = None
        if sizes and buffers:
            self._free = queue.Queue()
            for _ in range(min(buffers, len(sizes))):
                self._free.put(bytearray(max(sizes)))
        self._stop = threading.Event()
        self._buffer = memoryview(b"")
        self._done = False
        self._thread = threading.Thread(target=self._pump, name="enginefarm-prefetch", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for item in self._pieces() if self._sizes is not None else self._chunks():
                if self._stop.is_set():
                    return
                self._put(item)
            self._put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _chunks(self):
        pending: list[bytes] = []
        size = 0
        while data := self._stream.read(self._chunk):
            # Sources that return one socket read at a time (read1) are coalesced into full chunks,
            # so the stages downstream handle few large buffers.
            pending.append(data)
            size += len(data)
            if size >= self._chunk:
                yield pending[0] if len(pending) == 1 else b"".join(pending)
                pending, size = [], 0
        if pending:
            yield b"".join(pending)

    def _pieces(self):
        for size in self._sizes:
            piece = bytearray(size) if self._free is None else self._spare(size)
            if piece is None:
                return  # closed while waiting for a buffer
            view, got = memoryview(piece), 0
            while got < size:
                data = self._stream.read(min(size - got, self._chunk))
                if not data:
                    raise IntegrityError("blob is truncated (it ends inside a frame)")
                view[got : got + len(data)] = data
                got += len(data)
            yield piece
        if self._stream.read(1):
            raise IntegrityError("blob has trailing bytes after its last frame")

    def _spare(self, size: int) -> memoryview | None:
        assert self._free is not None
        while not self._stop.is_set():
            try:
                return memoryview(self._free.get(timeout=0.1))[:size]
            except queue.Empty:
                continue
        return None

    def recycle(self, piece) -> None:
        """Hand back a piece `read` gave (buffers=): its buffer takes a later piece."""
        if self._free is not None:
            self._free.put(piece.obj if isinstance(piece, memoryview) else piece)

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, size: int = -1) -> bytes | memoryview:
        if not self._buffer and not self._done:
            item = self._queue.get()
            if item is _END:
                self._done = True
            elif isinstance(item, BaseException):
                self._done = True
                raise item
            else:
                self._buffer = memoryview(item)
        if self._sizes is not None or size is None or size < 0 or size >= len(self._buffer):
            out, self._buffer = self._buffer, memoryview(b"")
        else:  # views, not copies, of the chunk
            out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class HashingWriter:
    """Hashes and writes chunks on two background threads, chained, so hashing one chunk overlaps writing the
    one before (each costs about the same per byte; on one thread they were the fetch's slowest stage).
    `finish()` waits and returns the sha256 hex digest of what was written."""

    def __init__(self, out: BinaryIO, depth: int = DEPTH, digest=None) -> None:
        self._out = out
        self._digest = digest if digest is not None else hashlib.sha256()  # a resumed file's hash of what it has
        self._to_hash: queue.Queue = queue.Queue(maxsize=depth)
        self._to_write: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._hash, name="enginefarm-hash", daemon=True),
            threading.Thread(target=self._write, name="enginefarm-write", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _hash(self) -> None:
        while True:
            item = self._to_hash.get()
            if item is not _END and self._error is None:
                try:
                    self._digest.update(item)
                except BaseException as exc:
                    self._error = exc
            self._to_write.put(item)  # after an error too, so both threads keep draining until _END
            if item is _END:
                return

    def _write(self) -> None:
        while True:
            item = self._to_write.get()
            if item is _END:
                return
            if self._error is None:
                try:
                    self._out.write(item)
                    checkpoint("fetch:chunk")  # after the bytes reached the file: what a killed fetch leaves
                except BaseException as exc:
                    self._error = exc

    def write(self, chunk: bytes | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._to_hash.put(chunk)

    def _stop(self, timeout: float | None) -> None:
        self._to_hash.put(_END)
        for thread in self._threads:
            thread.join(timeout)

    def finish(self) -> str:
        self._stop(None)
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()

    def abandon(self) -> None:
        self._error = self._error or RuntimeError("abandoned")
        self._stop(5)
