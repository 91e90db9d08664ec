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


def test_pieces_read_into_the_callers_buffers_come_back_whole_as_each_is_recycled():
    data = bytes(range(256)) * 40
    sizes = [1000, 1, 4000, 2000, 3239]
    reader = Prefetcher(Trickle(data), depth=1, sizes=sizes, buffers=2)
    try:
        pieces, buffers = [], set()
        for _ in sizes:
            piece = reader.read()
            pieces.append(bytes(piece))
            buffers.add(id(piece.obj))
            reader.recycle(piece)  # without it the third piece would wait for a buffer
        assert [len(p) for p in pieces] == sizes and b"".join(pieces) == data
        assert len(buffers) == 2 and not reader.read()
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


def _streamed_decode_peak_mib(tmp_path, mib: int) -> float:
    """Peak traced memory while an efw1 blob of `mib` MiB of fp16 streams from a file into another file."""
    import tracemalloc

    import numpy as np

    from enginefarm.cache import weight_codec
    from enginefarm.cache.blob_codecs import decode_stream

    raw = tmp_path / f"raw{mib}.bin"
    np.random.default_rng(mib).standard_normal(mib << 19).astype(np.float16).tofile(raw)
    blob = tmp_path / f"blob{mib}.efw1"
    with open(blob, "wb") as out:
        weight_codec.encode_file(raw, out)
    size = raw.stat().st_size
    raw.unlink()
    tracemalloc.start()
    try:
        with open(blob, "rb") as src, open(tmp_path / "decoded.bin", "wb") as dst:
            decode_stream(src, dst, "efw1", size)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_a_streamed_decode_holds_a_bounded_number_of_frames_whatever_the_size(tmp_path):
    from enginefarm.cache import weight_codec

    frame = weight_codec.FRAME_RAW / 2**20
    # compressed frames: read ahead (threads + 2), one being read, one per decoding thread and one queued for
    # them; decoded frames: threads + 1 waiting in order, one with the writer's caller; two scratch halves per
    # thread; the writer's two queues of two plus one in each of its threads' hands. Well below the 192 MiB.
    t = weight_codec.THREADS
    bound = ((t + 2 + 1 + t + 1) + (t + 1 + 1) + 2 * t + 6) * frame
    peak = _streamed_decode_peak_mib(tmp_path, 192)
    assert peak < bound, f"decoding 192 MiB peaked at {peak:.0f} MiB (bound {bound:.0f})"
