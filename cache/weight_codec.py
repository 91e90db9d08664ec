"""The weight-aware codec ("efw1"): byte-grouping by element width, then zstd, in independent frames.

Weights are arrays of fp16/fp32 numbers. Their high bytes (sign, exponent) repeat a lot; their low bytes
(mantissa) look random. Plain zstd sees them interleaved and saves little. Grouping byte 0 of every element,
then byte 1, ... (as ZipNN does) lets zstd find the redundancy in the high bytes.

Layout, all integers little-endian:

    magic "EFW1" | u8 width | u8 level | u16 flags | u64 raw size | u32 frame raw size | u32 frame count
    (flags bit 0, ROTATE: each element was rotated left by one bit before grouping, so the sign bit moves to
    the bottom and a bf16/fp32 exponent fills its own byte; as ZipNN does for the sign bit)
    frame count × (u64 compressed size, u32 raw size)
    frames: one per chunk of `frame raw size` bytes; a frame is `width` group records (byte k of every element)
            plus one record for the chunk's tail (len % width bytes), each record: u8 mode | u32 size | u32 crc32 |
            payload, mode 1 = zstd with its content size and checksum (crc32 is 0); what zstd cannot shrink (mantissa
                     bytes) it keeps as raw blocks, which decode at memcpy speed under its xxh64 checksum;
            mode 0 = stored raw, guarded by crc32 (written by earlier encoders; still read)

Frames are independent, so they decode on several threads and a streamed download decodes as it arrives.
A hostile blob is refused before it can use memory beyond the declared size: the raw size must equal what the
manifest expects, every frame's raw size is bounded, and each group decodes into a buffer of exactly its size
(one byte more is an error).

Decoding is python-zstandard plus one small optional C loop (no torch): each group is decoded straight into a
per-thread buffer, and the groups are put back together in one pass by cache/_interleave.c, or, where it was
not compiled, as whole integers with numpy arithmetic (same bytes; whole decodes measured 1.2-1.4x slower for fp32).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from types import ModuleType
from typing import IO, Protocol

import numpy as np

from enginefarm.errors import IntegrityError


class Readable(Protocol):
    """What the decoder reads: a file, a store's resumable or parallel reader, a prefetcher; read() may hand out
    views of its buffer instead of copies."""

    def read(self, size: int = -1, /) -> bytes | memoryview: ...


MAGIC = b"EFW1"
_HEADER = struct.Struct("<4sBBHQII")
_ENTRY = struct.Struct("<QI")
FRAME_RAW = 4 << 20
MAX_FRAME_RAW = 64 << 20
MAX_WINDOW = 1 << 27
MAX_FRAMES = 1 << 22  # a 64 MiB frame table: 16 TiB in the default 4 MiB frames
LEVEL = 3  # for ungrouped data (width 1)
GROUPED_LEVEL = 1  # for byte groups, with the parameters in _compressor
# Frames are independent, so more cores decode (and encode) faster; past 4 the per-thread buffers (12 MiB each)
# cost more memory than the speed is worth inside an app. Measured only on 2 cores (1.7-1.9x from 1 to 2 threads).
THREADS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
WIDTHS = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}


def width_of(dtype: str | None) -> int:
    if dtype is None:
        return 1
    if dtype not in WIDTHS:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(WIDTHS)} or None")
    return WIDTHS[dtype]


ROTATE = 1
_UINT: dict[int, np.dtype] = {
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}  # byte k of an element is bits 8k..8k+7
ROTATED_DTYPES = ("bfloat16", "float32", "float64")  # where moving the sign bit aligns the exponent to a byte


def _rotate_left(elements: np.ndarray, width: int) -> np.ndarray:
    values = elements.view(_UINT[width])
    return ((values << 1) | (values >> (8 * width - 1))).view(np.uint8)


def _compressor(level: int, grouped: bool = False):
    import zstandard

    if grouped:
        # A byte group of weights (exponents, say) has few long repeats but a skewed byte histogram: a tiny hash
        # table and long minimum matches leave it to zstd's Huffman stage. Measured on fp32 exponents of normal
        # weights: 0.327 of raw at ~700 MB/s, against 0.406 at level 3 and 0.325 at level 19 (1 MB/s).
        params = zstandard.ZstdCompressionParameters.from_level(
            level, hash_log=8, min_match=7, write_content_size=True, write_checksum=True
        )
        return zstandard.ZstdCompressor(compression_params=params)
    return zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True)


def _decompressor():
    import zstandard

    return zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)


_RECORD = struct.Struct("<BII")
RAW, ZSTD = 0, 1


def _encode_frame(chunk, width: int, level: int, rotate: bool = False) -> bytes:
    whole = len(chunk) - len(chunk) % width
    elements = np.frombuffer(chunk, np.uint8, whole)
    if rotate and whole:
        elements = _rotate_left(elements, width)
    groups = elements.reshape(-1, width).T if width > 1 else None
    parts = (
        [np.ascontiguousarray(groups[k]).data for k in range(width)]
        if groups is not None
        else [memoryview(chunk)[:whole]]
    )
    parts.append(memoryview(chunk)[whole:])
    out = []
    compressor = _compressor(GROUPED_LEVEL if width > 1 else level, grouped=width > 1)
    for part in parts:
        # Every group goes through zstd, even random mantissa bytes: zstd stores what it cannot shrink as raw
        # blocks, which decode at memcpy speed and are guarded by its xxh64 checksum (2.5x faster than crc32).
        packed = compressor.compress(part) if len(part) else b""
        out += [_RECORD.pack(ZSTD, len(packed), 0), packed]
    return b"".join(out)


def compress(
    data: bytes,
    dtype: str | None = None,
    *,
    level: int = LEVEL,
    frame_raw: int = FRAME_RAW,
    threads: int = THREADS,
    rotate: bool | None = None,
) -> bytes:
    """Encode `data` (the raw bytes of `dtype` elements, or anything with dtype None)."""
    width = width_of(dtype)
    rotate = (dtype in ROTATED_DTYPES) if rotate is None else (rotate and width > 1)
    view = memoryview(data)
    chunks = [view[i : i + frame_raw] for i in range(0, len(data), frame_raw)]
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        frames = list(pool.map(lambda chunk: _encode_frame(chunk, width, level, rotate), chunks))
    header = _HEADER.pack(MAGIC, width, level, ROTATE if rotate else 0, len(data), frame_raw, len(frames))
    table = b"".join(_ENTRY.pack(len(frame), len(chunk)) for frame, chunk in zip(frames, chunks, strict=True))
    return header + table + b"".join(frames)


def decompress(blob: bytes, expected_size: int | None = None, *, threads: int = THREADS) -> memoryview:
    """Decode a whole blob into one buffer (frames decode in parallel, each straight into its place).
    `expected_size` (the manifest's) is enforced before any large allocation. Returns a writable, bytes-like
    memoryview (`bytes(result)` copies it)."""
    stream = _BytesReader(blob)
    width, rotate, raw_size, entries = _read_layout(stream, expected_size)
    # numpy allocates large buffers on huge pages: 64 MiB costs ~8 ms to fault in, against ~55 ms for bytearray()
    target = np.empty(raw_size, np.uint8)
    jobs, offset = [], 0
    for compressed, raw in entries:
        jobs.append((_read_exact(stream, compressed, "frame"), raw, offset))
        offset += raw
    if stream.read(1):
        raise IntegrityError("efw1 blob has trailing bytes")
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(lambda job: _decode_frame(job[0], job[1], width, rotate, target[job[2] : job[2] + job[1]]), jobs))
    return target.data


def read_layout(stream: Readable, expected_size: int | None) -> tuple[int, bool, int, list[tuple[int, int]]]:
    """(width, rotated, raw size, [(compressed, raw) per frame]) from the blob's head; reads nothing past its table."""
    return _read_layout(stream, expected_size)


def resume_point(layout: tuple, have: int) -> tuple[int, int, int]:
    """Where to resume decoding when `have` decoded bytes are already written: (frame, raw offset, stored offset).
    Only whole frames count; the bytes of a partly written frame are decoded again."""
    _width, _rotate, _raw, entries = layout
    frame = raw = 0
    stored = _HEADER.size + _ENTRY.size * len(entries)
    for compressed, size in entries:
        if raw + size > have:
            break
        frame, raw, stored = frame + 1, raw + size, stored + compressed
    return frame, raw, stored


def _read_layout(stream: Readable, expected_size: int | None) -> tuple[int, bool, int, list[tuple[int, int]]]:
    """Header and frame table, validated against the expected size before anything large is allocated."""
    header = _read_exact(stream, _HEADER.size, "header")
    magic, width, _level, flags, raw_size, frame_raw, count = _HEADER.unpack(header)
    if magic != MAGIC:
        raise IntegrityError("blob is not in the efw1 format (bad magic)")
    if width not in (1, 2, 4, 8):
        raise IntegrityError(f"efw1 blob declares element width {width}")
    if flags & ~ROTATE or (flags & ROTATE and width == 1):
        raise IntegrityError(f"efw1 blob has unknown flags {flags:#x}", hint="upgrade enginefarm")
    if expected_size is not None and raw_size != expected_size:
        raise IntegrityError(f"efw1 blob declares {raw_size} bytes, the manifest says {expected_size}")
    if not 0 < frame_raw <= MAX_FRAME_RAW or count != -(-raw_size // frame_raw):
        raise IntegrityError(f"efw1 blob declares {count} frames of {frame_raw} bytes for {raw_size} bytes")
    if count > MAX_FRAMES:
        raise IntegrityError(
            f"efw1 blob declares {count} frames (at most {MAX_FRAMES} are accepted): a forged frame table"
        )
    table = _read_exact(stream, _ENTRY.size * count, "frame table")
    entries = [_ENTRY.unpack_from(table, i * _ENTRY.size) for i in range(count)]
    if sum(raw for _, raw in entries) != raw_size or any(
        raw > frame_raw or compressed > MAX_FRAME_RAW * 2 for compressed, raw in entries
    ):
        raise IntegrityError("efw1 frame table is inconsistent with the declared size")
    return width, bool(flags & ROTATE), raw_size, entries


def decode_frames(
    stream: Readable,
    expected_size: int | None,
    *,
    threads: int = THREADS,
    ahead: int | None = None,
    layout: tuple | None = None,
    start: int = 0,
) -> Iterator[memoryview]:
    """Yield decoded chunks in order while reading `stream` once, front to back. A thread reads whole frames
    ahead (at most `ahead`, by default 2 more than the decoding threads), and they decode on `threads` threads
    while later ones are still arriving. To resume, pass the blob's `layout` (`read_layout`) and a `stream`
    positioned at frame `start` (`resume_point`)."""
    from .pipeline import Prefetcher

    width, rotate, _raw_size, entries = layout or _read_layout(stream, expected_size)
    entries = entries[start:]
    depth = ahead or threads + 2
    # Buffers made here, on this thread, not on the reading or decoding ones: a thread's own malloc arena keeps what
    # is freed into it (malloc_trim cannot shrink it), 90 MB after a 1.2 GB fetch. Read-ahead plus what decodes.
    sizes = [compressed for compressed, _ in entries]
    frames = Prefetcher(stream, depth=depth, sizes=sizes, buffers=depth + threads + 2)
    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            pending: list[tuple[Future, bytes | memoryview]] = []

            def done(future: Future, piece) -> memoryview:
                result = future.result()
                frames.recycle(piece)
                return result

            for _compressed, raw in entries:
                piece, out = frames.read(), np.empty(raw, np.uint8)
                pending.append((pool.submit(_decode_frame, piece, raw, width, rotate, out), piece))
                if len(pending) > threads:
                    yield done(*pending.pop(0))
            for future, piece in pending:
                yield done(future, piece)
        frames.read()  # the end, or the error that trailing bytes raised
    finally:
        frames.close()


_native: ModuleType | None
try:  # the same loop in C, one pass (cache/_interleave.c); optional at install. It stores little-endian words.
    from . import _interleave as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None
if sys.byteorder != "little":  # pragma: no cover - no big-endian host here
    _native = None

INTERLEAVE_BLOCK = 1 << 22  # elements: a whole frame (measured: a call per 64 Ki elements cost more than cache misses)
_SPARE: list[np.ndarray] = []  # scratch buffers kept between frames and calls
_SPARE_LOCK = threading.Lock()
_SPARE_KEEP = 2  # at most 2 × 8 MiB stay allocated after decoding


def drop_scratch() -> None:
    """Free the scratch buffers kept between decodes (`hardware.rss.give_back_memory` calls it): 16 MiB that a load's
    fetch took and a closed session no longer needs."""
    with _SPARE_LOCK:
        _SPARE.clear()


@contextmanager
def _scratch(size: int) -> Iterator[np.ndarray]:
    """A scratch buffer of `size` bytes, reused across frames and calls: a fresh one costs a page fault per 4 KiB,
    which for small blobs costs more than decoding them."""
    usual = 2 * FRAME_RAW
    with _SPARE_LOCK:
        fits = [i for i, spare in enumerate(_SPARE) if len(spare) >= size]
        buffer = _SPARE.pop(fits[0]) if fits else None
    if buffer is None:
        buffer = np.empty(max(size, usual), np.uint8)
    try:
        yield buffer[:size]
    finally:
        with _SPARE_LOCK:
            if len(_SPARE) < _SPARE_KEEP and len(buffer) == usual:
                _SPARE.append(buffer)


def _decode_frame(frame: bytes | memoryview, raw: int, width: int, rotate: bool = False, out: np.ndarray | None = None):
    """Rebuild one chunk of `raw` bytes into `out` (or a new buffer): decode every group, then interleave them."""
    whole = raw - raw % width
    out = np.empty(raw, np.uint8) if out is None else out
    if width == 1:
        return _decode_groups(frame, raw, width, rotate, out, out[:whole])
    with _scratch(2 * whole) as space:  # groups decode into its first half; the interleave's temporary is the second
        return _decode_groups(frame, raw, width, rotate, out, space)


def _decode_groups(frame, raw: int, width: int, rotate: bool, out: np.ndarray, space: np.ndarray):
    whole = raw - raw % width
    count = whole // width
    view, pos = memoryview(frame), 0
    decompressor = _decompressor()
    groups = []
    for k in range(width + 1):
        want = count if k < width else raw - whole
        target = space[k * count : (k + 1) * count] if k < width else out[whole:raw]
        if pos + _RECORD.size > len(view):
            raise IntegrityError("efw1 frame is truncated")
        mode, size, crc = _RECORD.unpack_from(view, pos)
        pos += _RECORD.size
        payload = view[pos : pos + size]
        pos += size
        if len(payload) != size:
            raise IntegrityError("efw1 frame is truncated")
        if mode == RAW:
            if len(payload) != want:
                raise IntegrityError(f"efw1 group holds {len(payload)} bytes, expected {want}")
            if zlib.crc32(payload) != crc:
                raise IntegrityError("efw1 frame is corrupt: a raw group fails its crc32")
            target[:] = np.frombuffer(payload, np.uint8)
        elif mode == ZSTD:
            if want:
                _unzstd_into(decompressor, payload, target)
            elif len(payload):
                raise IntegrityError("efw1 frame is corrupt: an empty group has a payload")
        else:
            raise IntegrityError(f"efw1 record has unknown mode {mode}")
        groups.append(target)
    if pos != len(view):
        raise IntegrityError("efw1 frame has trailing bytes")
    if count and width > 1:
        if _native is not None and out.ctypes.data % width == 0:  # groups lie back to back at the start of `space`
            _native.interleave(space[:whole], out[:whole], width, rotate)
        else:
            _interleave(groups[:width], out[:whole], width, rotate, space[whole:])
    return out.data  # a memoryview of the decoded bytes: no extra copy


def _interleave(groups: list[np.ndarray], out: np.ndarray, width: int, rotate: bool, scratch: np.ndarray) -> None:
    """out[i*width + k] = groups[k][i], then undo the rotation. `scratch` holds len(out) bytes.

    Built as whole elements with vectorized arithmetic (element = sum of group k << 8k): numpy's strided byte
    copies (out.reshape(-1, width)[:, k] = group) run one byte at a time, 3-4x slower for fp16."""
    step = INTERLEAVE_BLOCK
    if len(groups[0]) > step:  # block by block, so each block's passes run in the core's cache
        for start in range(0, len(groups[0]), step):
            _interleave(
                [group[start : start + step] for group in groups],
                out[start * width : (start + step) * width],
                width,
                rotate,
                scratch[start * width : (start + step) * width],
            )
        return
    elements = out.view(_UINT[width])
    if width == 2:
        _pair(groups[1], groups[0], elements)
    elif width == 4:  # two 16-bit halves, then the halves paired: 6 passes instead of 11
        halves = scratch.view(np.uint16)
        top, bottom = halves[: len(elements)], halves[len(elements) : 2 * len(elements)]
        _pair(groups[3], groups[2], top)
        _pair(groups[1], groups[0], bottom)
        _pair(top, bottom, elements)
    else:
        wide = scratch.view(_UINT[width])
        np.copyto(elements, groups[-1])
        np.left_shift(elements, 8 * (width - 1), out=elements)
        for k in range(width - 2, -1, -1):
            np.copyto(wide, groups[k])
            if k:
                np.left_shift(wide, 8 * k, out=wide)
            np.bitwise_or(elements, wide, out=elements)
    scratch = scratch.view(_UINT[width])
    if rotate:
        np.right_shift(elements, 1, out=scratch)
        np.left_shift(elements, 8 * width - 1, out=elements)
        np.bitwise_or(elements, scratch, out=elements)


def _pair(high: np.ndarray, low: np.ndarray, out: np.ndarray) -> None:
    """out = high << bits | low, where `out` elements are twice as wide as `high`'s and `low`'s: two passes,
    each ufunc widening its narrow input as it goes (twice the speed of copy, shift, or)."""
    np.multiply(high, 1 << (8 * high.itemsize), out=out, dtype=out.dtype)
    np.add(out, low, out=out, casting="unsafe")


def _unzstd_into(decompressor, payload, target: np.ndarray) -> None:
    """Decompress one group into `target`, which it must fill exactly. The frame header is checked first (a
    lying content size or a huge window is refused before decoding), and decoding never writes past `target`:
    one more byte than expected is an error, so a bomb stops after at most one zstd block."""
    import zstandard

    want = len(target)
    try:
        params = zstandard.get_frame_parameters(payload)
        if params.content_size not in (want, zstandard.CONTENTSIZE_UNKNOWN):
            raise IntegrityError(f"efw1 group declares {params.content_size} bytes, expected {want}")
        if params.window_size > MAX_WINDOW:
            raise IntegrityError(f"efw1 group asks for a {params.window_size >> 20} MiB window")
        reader = decompressor.stream_reader(payload, read_across_frames=False)
        got = 0
        while got < want and (n := reader.readinto(target[got:])):
            got += n
        if got != want or reader.read(1):  # read(1) also makes zstd check the frame's checksum
            raise IntegrityError(
                f"efw1 group decodes to {'fewer' if got < want else 'more'} bytes than the {want} expected"
            )
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"efw1 frame is corrupt: {exc}") from None


_READ_AT_ONCE = MAX_FRAME_RAW * 2


def _read_exact(stream: Readable, size: int, what: str):
    # A file object allocates what read() asks for, so a forged size must not be asked for at once.
    first = stream.read(size if isinstance(stream, _BytesReader) or size <= _READ_AT_ONCE else _READ_AT_ONCE)
    if len(first) == size:
        return first  # in-memory sources hand the whole frame over at once, without a copy
    parts, left = [first], size - len(first)
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            raise IntegrityError(f"efw1 blob is truncated (in its {what})")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class _BytesReader:
    """read() over an in-memory blob that hands out views, not copies."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, size: int = -1) -> memoryview:
        end = len(self._view) if size is None or size < 0 else self._pos + size
        out = self._view[self._pos : end]
        self._pos += len(out)
        return out


LAYOUTS = ((1, False), (2, False), (2, True), (4, False), (4, True))


def best_layout(sample: bytes, level: int = LEVEL) -> tuple[int, bool]:
    """The (element width, rotate) that compresses `sample` best, measured with the real frame encoder: weight
    files need no dtype hint, and alignment quirks (OpenVINO .bin constants, tensors inside an .onnx protobuf)
    are measured rather than guessed. A fancier layout must win by 0.3% to be chosen."""
    best, best_size = (1, False), None
    for width, rotate in LAYOUTS:
        size = len(_encode_frame(memoryview(sample), width, level, rotate))
        if best_size is None or size < best_size * 0.997:
            best, best_size = (width, rotate), size
    return best


def best_width(sample: bytes, level: int = LEVEL) -> int:
    return best_layout(sample, level)[0]


def encode_file(src, dst: IO[bytes], *, level: int = LEVEL, frame_raw: int = FRAME_RAW, threads: int = THREADS) -> int:
    """Stream-encode the file at `src` into the seekable `dst`, in bounded memory. The element width is chosen
    from the file's first 8 MiB. Returns the width used."""
    import os

    size = os.path.getsize(src)
    count = -(-size // frame_raw)
    with open(src, "rb") as handle:
        width, rotate = best_layout(handle.read(8 << 20), level=level)
        handle.seek(0)
        start = dst.tell()
        dst.write(_HEADER.pack(MAGIC, width, level, ROTATE if rotate else 0, size, frame_raw, count))
        table_at = dst.tell()
        dst.write(b"\0" * (_ENTRY.size * count))
        entries = []
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            pending: list[tuple[Future[bytes], int]] = []

            def drain(limit: int) -> None:
                while len(pending) > limit:
                    frame, raw = pending.pop(0)
                    data = frame.result()
                    dst.write(data)
                    entries.append(_ENTRY.pack(len(data), raw))

            while chunk := handle.read(frame_raw):
                pending.append((pool.submit(_encode_frame, chunk, width, level, rotate), len(chunk)))
                drain(threads * 2)
            drain(0)
        end = dst.tell()
        dst.seek(table_at)
        dst.write(b"".join(entries))
        dst.seek(end)
    assert len(entries) == count and end > start
    return width
