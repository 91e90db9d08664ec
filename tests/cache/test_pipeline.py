"""The fetch pipeline's stages: exact read-ahead of frames, and chained hashing + writing."""

from __future__ import annotations

import hashlib
import io

import pytest

from enginefarm.cache.pipeline import HashingWriter, Prefetcher
from enginefarm.errors import IntegrityError


class Trickle(io.BytesIO):
    """A source that returns at most 333 bytes per read, like one socket read at a time."""

    def read(self, size=-1):
        return super().read(min(size if size and size > 0 else 1 << 30, 333))


def test_pieces_are_read_whole_and_in_order():
    data = bytes(range(256)) * 40
    sizes = [1000, 1, 4000, 5239]
    reader = Prefetcher(Trickle(data), depth=2, sizes=sizes)
    try:
        pieces = [bytes(reader.read()) for _ in sizes]
        assert [len(p) for p in pieces] == sizes and b"".join(pieces) == data
        assert not reader.read()
    finally:
        reader.close()


@pytest.mark.parametrize("extra, match", [(-1, "truncated"), (1, "trailing bytes")])
def test_a_source_of_the_wrong_length_is_an_error(extra, match):
    data = b"x" * (3000 + extra)
    reader = Prefetcher(Trickle(data), sizes=[1000, 2000])
    try:
        with pytest.raises(IntegrityError, match=match):
            for _ in range(3):
                reader.read()
    finally:
        reader.close()


def test_chunks_are_handed_out_as_asked():
    data = bytes(range(256)) * 10000
    reader = Prefetcher(Trickle(data), chunk=4096)
    try:
        got = []
        while part := reader.read(1000):
            assert len(part) <= 1000
            got.append(bytes(part))
        assert b"".join(got) == data
    finally:
        reader.close()


def test_source_errors_surface_in_the_reader():
    class Broken(io.BytesIO):
        def read(self, size=-1):
            raise ConnectionResetError("peer went away")

    reader = Prefetcher(Broken(), sizes=[10])
    try:
        with pytest.raises(ConnectionResetError):
            reader.read()
    finally:
        reader.close()


def test_hashing_writer_writes_and_hashes_every_chunk_in_order():
    out = io.BytesIO()
    writer = HashingWriter(out, depth=2)
    chunks = [bytes([i]) * (i * 997 + 1) for i in range(50)]
    for chunk in chunks:
        writer.write(memoryview(chunk))
    assert writer.finish() == hashlib.sha256(b"".join(chunks)).hexdigest()
    assert out.getvalue() == b"".join(chunks)


def test_a_failing_write_is_raised_and_the_threads_end():
    class Full(io.BytesIO):
        def write(self, data):
            raise OSError(28, "No space left on device")

    writer = HashingWriter(Full(), depth=1)
    with pytest.raises(OSError, match="No space"):
        for _ in range(100):
            writer.write(b"x" * 1000)
        writer.finish()
    writer.abandon()
    assert not any(thread.is_alive() for thread in writer._threads)
