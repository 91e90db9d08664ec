"""The efw1 weight codec: exact round trips, corruption detected, bombs refused in bounded memory."""

from __future__ import annotations

import io
import os
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
import zstandard

from enginefarm.cache import weight_codec
from enginefarm.cache.artifacts import pack_files
from enginefarm.cache.blob_codecs import decode_stream
from enginefarm.errors import IntegrityError

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", None]


def weights(n: int, dtype: str | None, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    if dtype in (None, "int8", "uint8", "int32", "int64"):
        return rng.integers(0, 200, n, dtype=np.uint8).tobytes()
    if dtype == "bfloat16":
        return (
            (rng.standard_normal(n // 2 + 1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()[:n]
        )
    return rng.standard_normal(n).astype(dtype).tobytes()[:n]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "length", [0, 1, 3, 7, 1001, weight_codec.FRAME_RAW - 1, weight_codec.FRAME_RAW, weight_codec.FRAME_RAW + 5]
)
def test_round_trip_is_exact(dtype, length):
    data = weights(length, dtype)[:length].ljust(length, b"\x01")
    blob = weight_codec.compress(data, dtype)
    assert weight_codec.decompress(blob, len(data)) == data


def test_grouping_beats_plain_zstd_on_weights():
    data = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float16).tobytes()
    ours = len(weight_codec.compress(data, "float16")) / len(data)
    plain = len(zstandard.ZstdCompressor(level=3).compress(data)) / len(data)
    assert ours < plain - 0.05


def test_width_is_detected_from_the_data():
    assert weight_codec.best_width(weights(1 << 20, "float16")) == 2
    assert weight_codec.best_width(weights(1 << 20, "float32")) == 4
    assert weight_codec.best_width(b"text that is not weights at all " * 10000) == 1


def test_streaming_decode_equals_whole_decode():
    data = weights(3 * weight_codec.FRAME_RAW + 12345, "float32")
    blob = weight_codec.compress(data, "float32")

    class Trickle(io.BytesIO):
        def read(self, size=-1):
            return super().read(min(size if size and size > 0 else 1 << 30, 777))

    streamed = b"".join(bytes(c) for c in weight_codec.decode_frames(Trickle(blob), len(data)))
    assert streamed == weight_codec.decompress(blob, len(data)) == data


def test_file_encoding_matches_and_streams(tmp_path):
    data = weights(2 * weight_codec.FRAME_RAW + 99, "float16")
    (tmp_path / "w.bin").write_bytes(data)
    with open(tmp_path / "w.efw1", "wb") as out:
        assert weight_codec.encode_file(tmp_path / "w.bin", out) == 2
    out = io.BytesIO()
    digest = decode_stream(open(tmp_path / "w.efw1", "rb"), out, "efw1", len(data))
    assert out.getvalue() == data and digest == __import__("hashlib").sha256(data).hexdigest()


def test_weight_files_are_packed_with_efw1(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.bin").write_bytes(weights(3 << 20, "float16"))
    (tmp_path / "a" / "model.xml").write_bytes(b"<net/>" * 100)
    files, _ = pack_files(tmp_path / "a", [("model.bin", "weights"), ("model.xml", "ir")], tmp_path / "blobs")
    assert [f.codec for f in files] == ["efw1", "zstd"]
    assert files[0].stored_size < 0.9 * files[0].size


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x40]) + blob[at + 1 :]


@pytest.mark.parametrize("where", ["exponent group", "mantissa group", "header", "table"])
def test_corruption_is_detected(where):
    data = weights(1 << 20, "float16")
    blob = weight_codec.compress(data, "float16")
    header = weight_codec._HEADER.size + weight_codec._ENTRY.size
    record = weight_codec._RECORD.size
    first_mode, first_size, _ = weight_codec._RECORD.unpack_from(blob, header)
    at = {
        "mantissa group": header + record + first_size // 2,  # group 0 (low bytes): zstd keeps it as raw blocks
        "exponent group": header + record + first_size + record + 40,
        "header": 4,  # the element width
        "table": weight_codec._HEADER.size + 2,
    }[where]
    assert first_mode == weight_codec.ZSTD and first_size > 0.99 * len(data) / 2  # random bytes: stored, not shrunk
    with pytest.raises(IntegrityError):
        weight_codec.decompress(_flip(blob, at), len(data))


def test_raw_records_of_older_blobs_decode_and_are_checked():
    payload = bytes(range(256)) * 16
    blob = _forged(4096, 4096, [(weight_codec.RAW, payload, zlib.crc32(payload)), (weight_codec.RAW, b"", 0)])
    assert weight_codec.decompress(blob, 4096) == payload
    with pytest.raises(IntegrityError, match="crc32"):
        weight_codec.decompress(_flip(blob, len(blob) - 100), 4096)


def test_truncated_blob_is_detected():
    data = weights(1 << 20, "float32")
    blob = weight_codec.compress(data, "float32")
    with pytest.raises(IntegrityError, match="truncated"):
        weight_codec.decompress(blob[:-100], len(data))


def test_declared_size_must_match_the_manifest():
    blob = weight_codec.compress(b"x" * 1000, None)
    with pytest.raises(IntegrityError, match="the manifest says 999"):
        weight_codec.decompress(blob, 999)


def _forged(
    raw_size: int,
    frame_raw: int,
    records: list[tuple[int, bytes, int]],
    width: int = 1,
    declared_raw: int | None = None,
) -> bytes:
    frame = b"".join(weight_codec._RECORD.pack(mode, len(payload), crc) + payload for mode, payload, crc in records)
    header = weight_codec._HEADER.pack(weight_codec.MAGIC, width, 3, 0, raw_size, frame_raw, 1)
    return header + weight_codec._ENTRY.pack(len(frame), declared_raw if declared_raw is not None else raw_size) + frame


def _peak_mb(fn) -> float:
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError):
            fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_high_ratio_bomb_is_refused_in_bounded_memory():
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (512 << 20))  # 512 MiB of zeros in ~16 KiB
    blob = _forged(4096, 4096, [(weight_codec.ZSTD, bomb, 0), (weight_codec.RAW, b"", 0)])
    assert _peak_mb(lambda: weight_codec.decompress(blob, 4096)) < 32


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_bomb_without_a_declared_size_is_refused_in_bounded_memory():
    stream = zstandard.ZstdCompressor(level=19, write_content_size=False).compressobj()
    bomb = b"".join(stream.compress(b"\0" * (64 << 20)) for _ in range(8)) + stream.flush()  # 512 MiB, size unknown
    assert zstandard.get_frame_parameters(bomb).content_size == zstandard.CONTENTSIZE_UNKNOWN
    blob = _forged(4096, 4096, [(weight_codec.ZSTD, bomb, 0), (weight_codec.RAW, b"", 0)])
    assert _peak_mb(lambda: weight_codec.decompress(blob, 4096)) < 32


def test_lying_content_size_is_refused():
    honest = zstandard.ZstdCompressor(write_content_size=True).compress(b"a" * 8192)
    # Claims 4096 bytes in the table but the frame holds 8192.
    blob = _forged(4096, 4096, [(weight_codec.ZSTD, honest, 0), (weight_codec.RAW, b"", 0)])
    assert _peak_mb(lambda: weight_codec.decompress(blob, 4096)) < 32


def test_huge_window_frame_is_refused():
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=31, write_content_size=False)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()
    wide = stream.compress(b"b" * 4096) + stream.flush()  # unknown size: the 2 GiB window stays in the header
    assert zstandard.get_frame_parameters(wide).window_size == 1 << 31
    blob = _forged(4096, 4096, [(weight_codec.ZSTD, wide, 0), (weight_codec.RAW, b"", 0)])
    with pytest.raises(IntegrityError):
        weight_codec.decompress(blob, 4096)


def test_absurd_frame_sizes_are_refused_before_allocation():
    huge = weight_codec._HEADER.pack(weight_codec.MAGIC, 1, 3, 0, 1 << 40, 0xFFFFFFFF, 256)
    assert _peak_mb(lambda: weight_codec.decompress(huge + b"\0" * 100, 1 << 40)) < 8
    many = weight_codec._HEADER.pack(weight_codec.MAGIC, 1, 3, 0, 1 << 40, weight_codec.FRAME_RAW, 0xFFFFFFFF)
    assert _peak_mb(lambda: weight_codec.decompress(many + b"\0" * 100, 1 << 40)) < 8
    sneaky = struct.pack("<4sBBHQII", weight_codec.MAGIC, 3, 3, 0, 10, 10, 1)
    with pytest.raises(IntegrityError, match="width 3"):
        weight_codec.decompress(sneaky, 10)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float64", "float16"])
def test_rotated_layout_round_trips_and_is_recorded(dtype):
    data = weights(weight_codec.FRAME_RAW + 13, dtype)
    blob = weight_codec.compress(data, dtype, rotate=True)
    assert weight_codec._HEADER.unpack_from(blob)[3] == weight_codec.ROTATE
    assert weight_codec.decompress(blob, len(data)) == data


def test_unknown_flags_are_refused():
    blob = bytearray(weight_codec.compress(b"x" * 100, "float32"))
    struct.pack_into("<H", blob, 6, 0x8000)
    with pytest.raises(IntegrityError, match="unknown flags"):
        weight_codec.decompress(bytes(blob), 100)


@pytest.mark.parametrize("damage", ["trailing bytes", "truncated"])
def test_streamed_blob_of_the_wrong_length_is_refused(damage):
    data = weights(2 * weight_codec.FRAME_RAW + 7, "float16")
    blob = weight_codec.compress(data, "float16")
    bad = blob + b"\0" if damage == "trailing bytes" else blob[:-1]
    with pytest.raises(IntegrityError, match=damage):
        decode_stream(io.BytesIO(bad), io.BytesIO(), "efw1", len(data))


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_concurrent_decodes_share_scratch_buffers_safely():
    from concurrent.futures import ThreadPoolExecutor

    blobs = {
        dtype: (weights(3 * weight_codec.FRAME_RAW + 11, dtype, seed=i), None)
        for i, dtype in enumerate(["float16", "float32", "bfloat16", "int8"])
    }
    blobs = {dtype: (data, weight_codec.compress(data, dtype)) for dtype, (data, _) in blobs.items()}
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda item: weight_codec.decompress(item[1], len(item[0]), threads=3) == item[0],
                list(blobs.values()) * 3,
            )
        )
    assert all(results) and len(weight_codec._SPARE) <= weight_codec._SPARE_KEEP


def _reference_interleave(groups: bytes, width: int, rotate: bool) -> bytes:
    """The definition, byte by byte: element i is byte i of every group, then rotated right by one bit."""
    n = len(groups) // width
    elements = np.frombuffer(groups, np.uint8).reshape(width, n).T.copy().reshape(-1)
    if rotate:
        values = elements.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
        values[:] = (values >> 1) | (values << (8 * width - 1))
    return elements.tobytes()


native = pytest.mark.skipif(
    weight_codec._native is None and os.environ.get("CI") != "true",
    reason="the C interleave was not compiled in this install",
)


def test_the_native_interleave_is_built_in_ci():
    if os.environ.get("CI") != "true" and weight_codec._native is None:
        pytest.skip("the C interleave was not compiled in this install (CI requires it)")
    assert weight_codec._native is not None, (
        "cache/_interleave.c did not build: is a C compiler and Python.h installed?"
    )


@native
@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("count", [1, 7, 4099, (1 << 20) + 3])
def test_native_and_numpy_interleave_build_the_same_elements(width, rotate, count):
    groups = np.random.default_rng(count).integers(0, 256, width * count, dtype=np.uint8)
    expected = _reference_interleave(groups.tobytes(), width, rotate)
    out = np.zeros(width * count, np.uint8)
    weight_codec._native.interleave(groups, out, width, rotate)
    assert out.tobytes() == expected
    out[:] = 0
    weight_codec._interleave(
        [groups[k * count : (k + 1) * count] for k in range(width)],
        out,
        width,
        rotate,
        np.empty(width * count, np.uint8),
    )
    assert out.tobytes() == expected


@native
def test_native_interleave_refuses_bad_sizes_instead_of_overrunning():
    with pytest.raises(ValueError, match="same size"):
        weight_codec._native.interleave(np.zeros(8, np.uint8), np.zeros(16, np.uint8), 2, False)
    with pytest.raises(ValueError, match="multiple"):
        weight_codec._native.interleave(np.zeros(6, np.uint8), np.zeros(6, np.uint8), 4, False)
    with pytest.raises(ValueError, match="width"):
        weight_codec._native.interleave(np.zeros(6, np.uint8), np.zeros(6, np.uint8), 3, False)
    with pytest.raises(TypeError):
        weight_codec._native.interleave(np.zeros(8, np.uint8), b"\0" * 8, 2, False)  # read-only output
    space = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="aligned"):  # it stores whole words
        weight_codec._native.interleave(np.zeros(8, np.uint8), space[1:9], 4, False)
    with pytest.raises(ValueError, match="overlap"):  # the loop reads the groups as it writes, so no aliasing
        weight_codec._native.interleave(space[:16], space[8:24], 4, False)


def test_frames_at_odd_offsets_decode_through_the_numpy_loop():
    """A frame size that is not a multiple of the element width puts later frames at unaligned offsets of the
    output, where the word-storing C loop must not run; the blob still decodes exactly."""
    data = weights(5 * 4099 + 3, "float32")
    blob = weight_codec.compress(data, "float32", frame_raw=4099)
    assert bytes(weight_codec.decompress(blob, len(data))) == data


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_blobs_decode_the_same_without_the_native_loop(dtype, monkeypatch):
    data = weights(2 * weight_codec.FRAME_RAW + 9, dtype)
    blob = weight_codec.compress(data, dtype)
    monkeypatch.setattr(weight_codec, "_native", None)
    assert weight_codec.decompress(blob, len(data)) == data
    assert b"".join(bytes(c) for c in weight_codec.decode_frames(io.BytesIO(blob), len(data))) == data
