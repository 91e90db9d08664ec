"""Blob codecs. Decoding is capped at the manifest's size, so a bomb or endless stream cannot fill the disk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from enginefarm.errors import IntegrityError

from .atomic import CHUNK

if TYPE_CHECKING:
    from .weight_codec import Readable

CODECS = ("efw1", "zstd", "none")
WEIGHT_ROLES = ("weights", "engine", "model")  # files that are mostly tensors: byte-grouped (cache/weight_codec.py)
EFW1_MIN_SIZE = 1 << 20


ZSTD_LEVEL = 3


def codec_for(role: str, size: int) -> str:
    return "efw1" if role in WEIGHT_ROLES and size >= EFW1_MIN_SIZE else "zstd"


def encode_file(src: Path, dst: IO[bytes], codec: str = "zstd") -> None:
    if codec == "efw1":
        from .weight_codec import encode_file as encode_efw1

        encode_efw1(src, dst)
        return
    with open(src, "rb") as reader:
        if codec == "none":
            while chunk := reader.read(CHUNK):
                dst.write(chunk)
            return
        import zstandard

        # A fixed level and single-threaded framing keep the output byte-identical across hosts,
        # so identical files in different artifacts share one blob.
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True, write_content_size=True)
        compressor.copy_stream(reader, dst, size=src.stat().st_size)


@dataclass
class Resume:
    """Decoding that continues a partly written file: `done` bytes are written already and hashed into `digest`;
    the source stream starts at the matching stored offset (for efw1, at frame `frame` of `layout`)."""

    done: int
    digest: Any
    layout: tuple | None = None
    frame: int = 0


def decode_stream(
    src: Readable,
    dst: BinaryIO,
    codec: str,
    expected_size: int,
    on_bytes: Callable[[int], None] | None = None,
    *,
    resume: Resume | None = None,
) -> str:
    """Decode `src` into `dst`, refusing to write more than `expected_size` bytes. Returns the sha256.
    `on_bytes` receives the running count of decoded bytes.

    Reading, decoding and hashing + writing run as a pipeline (cache/pipeline.py)."""
    from .pipeline import DEPTH, HashingWriter, Prefetcher

    # efw1 reads its own frames ahead (codec.decode_frames); the others read through a chunked prefetcher.
    prefetcher = None if codec == "efw1" else Prefetcher(src)
    source = src if prefetcher is None else prefetcher
    # efw1 hands over whole 4 MiB frames: two per queue keep the writer busy (measured: no slower than eight)
    writer = HashingWriter(dst, depth=2 if codec == "efw1" else DEPTH, digest=resume.digest if resume else None)
    written = resume.done if resume else 0
    try:
        if codec == "none":
            chunks = iter(lambda: source.read(CHUNK), b"")
        elif codec == "efw1":
            from .weight_codec import decode_frames

            chunks = decode_frames(
                source, expected_size, layout=resume.layout if resume else None, start=resume.frame if resume else 0
            )
        elif codec == "zstd":
            if resume:
                raise ValueError("zstd streams cannot resume mid-way")
            chunks = _zstd_chunks(source)
        else:
            raise IntegrityError(f"unknown codec {codec!r}", hint="upgrade enginefarm")
        for chunk in chunks:
            written += len(chunk)
            if written > expected_size:
                raise IntegrityError(f"blob decodes to more than the {expected_size} bytes its manifest allows")
            writer.write(chunk)
            if on_bytes:
                on_bytes(written)
        digest = writer.finish()
    except BaseException:
        writer.abandon()
        raise
    finally:
        if prefetcher is not None:
            prefetcher.close()
    if written != expected_size:
        raise IntegrityError(f"blob decodes to {written} bytes, manifest says {expected_size} (truncated?)")
    return digest


def _zstd_chunks(source):
    import zstandard

    reader = zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(
        source, read_size=CHUNK, read_across_frames=True
    )
    try:
        while chunk := reader.read(CHUNK):
            yield chunk
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"blob is not valid zstd: {exc}") from None
