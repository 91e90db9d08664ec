"""Images in and out of the pipeline: float [H, W, 3] in [0, 1] on the outside, NCHW for the engines, and PNG files
written and read with the standard library (no Pillow in the runtime)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from enginefarm.errors import ConfigError


def to_nchw(image: np.ndarray, height: int, width: int, what: str) -> np.ndarray:
    """[H, W, 3] (or [1, 3, H, W]) float in [0, 1] → [1, 3, H, W] float32, checked against the size asked for."""
    array = np.asarray(image, dtype=np.float32)
    if array.ndim == 3 and array.shape[-1] == 3:
        array = array.transpose(2, 0, 1)[None]
    if array.ndim != 4 or array.shape[:2] != (1, 3):
        raise ConfigError(
            f"{what} has shape {list(np.shape(image))}", hint="give an RGB image as float [height, width, 3] in [0, 1]"
        )
    if array.shape[2:] != (height, width):
        raise ConfigError(
            f"{what} is {array.shape[3]}×{array.shape[2]}, the image is {width}×{height}",
            hint="resize it to the output size, or pass width= and height= to match it",
        )
    return np.ascontiguousarray(array)


def to_image(decoded: np.ndarray) -> np.ndarray:
    """The VAE's [1, 3, H, W] in about [-1, 1] → [H, W, 3] in [0, 1], as diffusers' postprocess does."""
    return np.clip(decoded[0].transpose(1, 2, 0) / 2 + 0.5, 0.0, 1.0).astype(np.float32)


def write_png(path: str | Path, image: np.ndarray, text: dict[str, str] | None = None) -> Path:
    """An 8-bit RGB PNG (no filters) from float [H, W, 3] in [0, 1]. `text`: keyword → value, written as text
    chunks before the pixels (tEXt where the value is Latin-1, else UTF-8 iTXt), as SD apps store an image's
    generation parameters; `read_png_text` reads them back."""
    pixels = (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)
    height, width, _ = pixels.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    body = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    for keyword, value in (text or {}).items():
        body += chunk(*_text_chunk(keyword, value))
    body += chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
    path = Path(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body + chunk(b"IEND", b""))
    return path


def _text_chunk(keyword: str, value: str) -> tuple[bytes, bytes]:
    key = keyword.encode("latin-1")
    if not 1 <= len(key) <= 79 or b"\0" in key:
        raise ValueError(f"a PNG text keyword is 1 to 79 Latin-1 characters, not {keyword!r}")
    try:
        return b"tEXt", key + b"\0" + value.encode("latin-1")
    except UnicodeEncodeError:  # iTXt: uncompressed, no language tag, no translated keyword
        return b"iTXt", key + b"\0\0\0\0\0" + value.encode("utf-8")


def read_png_text(path: str | Path) -> dict[str, str]:
    """The text chunks of a PNG (tEXt, iTXt, zTXt): keyword → value; {} when it has none."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ConfigError(f"{path}: not a PNG file", hint="give a PNG that enginefarm or an SD app wrote")
    found: dict[str, str] = {}
    pos = 8
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, payload = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        key, _, rest = payload.partition(b"\0")
        try:
            if kind == b"tEXt":
                found[key.decode("latin-1")] = rest.decode("latin-1")
            elif kind == b"zTXt":
                found[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
            elif kind == b"iTXt":
                compressed, body = rest[0], rest[2:]
                body = body.split(b"\0", 2)[2]  # past the language tag and the translated keyword
                found[key.decode("latin-1")] = (zlib.decompress(body) if compressed else body).decode("utf-8")
        except (IndexError, UnicodeDecodeError, zlib.error):
            continue  # a damaged text chunk does not make the image unreadable
    return found


def read_png(path: str | Path) -> np.ndarray:
    """float [H, W, 3] in [0, 1] from an 8-bit RGB or RGBA PNG, any filter (what most tools write)."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ConfigError(f"{path}: not a PNG file", hint="give the image as an 8-bit RGB PNG")
    pos, chunks = 8, dict[bytes, bytes]()
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunks[kind] = chunks.get(kind, b"") + data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][:13])
    if depth != 8 or color not in (2, 6) or interlace:
        raise ConfigError(
            f"{path}: a PNG of bit depth {depth}, color type {color}{', interlaced' if interlace else ''}",
            hint="give the image as an 8-bit RGB PNG without interlacing",
        )
    channels = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        up = out[y - 1] if y else np.zeros_like(line)
        out[y] = _unfilter(kind, line, up, channels)
    return (out.reshape(height, width, channels)[..., :3] / 255.0).astype(np.float32)


def _unfilter(kind: int, line: np.ndarray, up: np.ndarray, bpp: int) -> np.ndarray:
    if kind == 0:
        return line
    if kind == 2:
        return (line + up) & 0xFF
    row = np.zeros_like(line)
    for i in range(len(line)):
        left = row[i - bpp] if i >= bpp else 0
        corner = up[i - bpp] if i >= bpp else 0
        if kind == 1:
            predicted = left
        elif kind == 3:
            predicted = (left + up[i]) // 2
        else:  # Paeth
            p = left + up[i] - corner
            pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
            predicted = left if pa <= pb and pa <= pc else (up[i] if pb <= pc else corner)
        row[i] = (line[i] + predicted) & 0xFF
    return row
