"""A small, strict reader of the safetensors format (numpy only, no torch).

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data. Everything the header claims is
checked against the file before anything is read or allocated, so a hostile header is a clear WeightsError.
Tensors are memory-mapped; `array()` returns float32 copies (bf16 is widened exactly)."""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Protocol

import numpy as np

from enginefarm.errors import WeightsError

MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own cap
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
FLOATS = ("F64", "F32", "F16", "BF16")


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # safetensors' name: F32, F16, BF16, ...
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


class TensorReader(Protocol):
    """What a reader of named tensors offers: a whole file (`SafeTensors`) or one component's part of a
    single-file checkpoint (`enginefarm.weights.single_file.PartView`)."""

    entries: dict[str, TensorEntry]

    @property
    def names(self) -> list[str]: ...

    def array(self, name: str) -> np.ndarray: ...

    def raw(self, name: str) -> np.ndarray: ...


class SafeTensors:
    """The tensors of one .safetensors file: names, dtypes and shapes from the header, data on demand."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.entries, self.metadata = _read_header(self.path)
        self._map: np.ndarray | None = None  # a memmap of the file (an empty array for an empty file)

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def raw(self, name: str, alone: bool = False) -> np.ndarray:
        """The tensor as stored. `alone`: mapped on its own, not through the file's one map (which holds every page
        read through it), so a reader going through a large file tensor by tensor holds one tensor's pages."""
        entry = self.entries[name]
        if alone:
            with _mapping(self.path, entry.end - entry.start):
                mapped = map_bytes(self.path, entry.start, entry.end - entry.start)
            return mapped.view(_DTYPES[entry.dtype]).reshape(entry.shape)
        if self._map is None:
            size = self.path.stat().st_size
            with _mapping(self.path, size):
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)
        data = self._map[entry.start : entry.end].view(_DTYPES[entry.dtype])
        return data.reshape(entry.shape)

    def array(self, name: str, alone: bool = False) -> np.ndarray:
        """The tensor as float32 (float dtypes only): F64 values past float32's range become ±Inf, which the readers
        of custom weights refuse. `alone`: as for `raw`."""
        entry = self.entries[name]
        if entry.dtype not in FLOATS:
            raise WeightsError(f"{self.path}: tensor {name!r} is {entry.dtype}, not a float tensor")
        raw = self.raw(name, alone)
        if entry.dtype == "BF16":
            return (raw.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(over="ignore"):
            return raw.astype(np.float32)


@contextmanager
def _mapping(path: Path, size: int) -> Iterator[None]:
    """A mapping refused for want of address space (`ulimit -v`: ENOMEM) said in one line, not as an OSError that a
    load reports as "no artifact fits this device"."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        raise WeightsError(
            f"{path}: cannot map {size / 2**30:.2f} GiB of it into memory: the process's address space is limited "
            "(ulimit -v) or exhausted",
            hint="raise the limit (ulimit -v unlimited), or use a smaller file",
        ) from None


def map_bytes(path: Path, offset: int, size: int) -> np.ndarray:
    """Bytes `offset` to `offset + size` of the file at `path`, memory-mapped on their own (read-only uint8): only the
    pages looked at are read, and dropping the array unmaps them."""
    if not size:
        return np.zeros(0, np.uint8)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), offset + size - start, offset=start, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, np.uint8, size, offset - start)


def _read_header(path: Path) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    def bad(reason: str) -> WeightsError:
        return WeightsError(
            f"{path}: not a valid safetensors file: {reason}", hint="re-download or re-save the file as .safetensors"
        )

    from enginefarm.cache.stores.local import open_regular

    def special(path: Path) -> WeightsError:
        if path.is_dir():
            return WeightsError(f"{path}: is a directory, not a .safetensors file")
        return WeightsError(
            f"{path}: not a regular file; refusing to read it",
            hint="give the path of a .safetensors file, not a pipe or device",
        )

    try:
        with open_regular(path, special) as handle:  # a FIFO would block the read for good, a device never end
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) < 8:
                raise bad("shorter than its 8-byte header length")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER:
                raise bad(f"its header claims {length} bytes, more than the {MAX_HEADER >> 20} MiB safetensors allows")
            if 8 + length > size:
                raise bad(f"header claims {length} bytes, the file has {size}")
            text = handle.read(length)
    except FileNotFoundError:
        raise WeightsError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise WeightsError(f"{path}: is a directory, not a .safetensors file") from None

    def unique(pairs):  # json keeps the last of repeated names: a header could show one tensor and read another
        names = [k for k, _ in pairs]
        if len(set(names)) != len(names):
            raise bad(f"names {sorted({n for n in names if names.count(n) > 1})[:3]} appear more than once")
        return dict(pairs)

    try:
        header = json.loads(text, object_pairs_hook=unique)
    except WeightsError:
        raise
    except (UnicodeDecodeError, ValueError):
        raise bad("header is not JSON") from None
    except RecursionError:  # a valid header nests three levels; thousands exhaust the parser's stack
        raise bad(f"header is nested deeper than the JSON reader allows ({sys.getrecursionlimit()} levels)") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad("__metadata__ must map strings to strings")
    data_size = size - 8 - length
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor {name!r} needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPES:
            raise bad(f"tensor {name!r} has unsupported dtype {dtype!r} (supported: {', '.join(_DTYPES)})")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise bad(f"tensor {name!r} has a malformed shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise bad(f"tensor {name!r} has data offsets {offsets!r} outside the {data_size}-byte data section")
        if (offsets[1] - offsets[0]) != math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize:
            raise bad(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes do not hold {dtype}{shape}")
        entries[name] = TensorEntry(dtype, tuple(shape), 8 + length + offsets[0], 8 + length + offsets[1])
    spans = sorted((e.start, e.end, n) for n, e in entries.items() if e.end > e.start)
    for (_, end_a, a), (start_b, _, b) in pairwise(spans):
        if start_b < end_a:
            raise bad(f"tensors {a!r} and {b!r} overlap")
    # As the reference reader requires: the tensors fill the data section, no bytes hidden between or after them.
    covered = sum(end - start for start, end, _ in spans)
    if covered != data_size:
        raise bad(f"its tensors cover {covered} of the {data_size} bytes of the data section")
    return entries, metadata


_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items() if k != "BF16"}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write `tensors` (numpy dtypes with a safetensors name) atomically."""
    from enginefarm.cache.atomic import atomic_writer

    header, offset, arrays = {}, 0, []
    for name, value in tensors.items():
        array = np.ascontiguousarray(value)
        kind = _NAMES.get(array.dtype.newbyteorder("<").str)
        if kind is None:
            raise WeightsError(f"cannot write {name!r}: dtype {array.dtype} has no safetensors name")
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        arrays.append(array.astype(np.dtype(_DTYPES[kind]), copy=False))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with atomic_writer(Path(path)) as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for array in arrays:
            handle.write(array.tobytes())
