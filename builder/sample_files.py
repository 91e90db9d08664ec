"""Sample arrays a recipe names (`validate.samples` .npz, `validate.inputs.NAME.file` .npy), read safely at plan
time: shapes come from each array's .npy header (inside an .npz, only the header is decompressed), a member may
not hold more bytes than its header declares, and the arrays together are bounded, so a 2 MB zip bomb cannot take
`plan` to gigabytes and a corrupt file is a recipe error, not a traceback."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import IO

MAX_SAMPLE_BYTES = 1 << 30  # validation runs the model on these: far more than any real sample needs
_HEADER_SLACK = 1 << 16


class SampleError(ValueError):
    """A sample file that cannot be used; the message says why."""


def _header(handle: IO[bytes], where: str) -> tuple[tuple[int, ...], int]:
    """(shape, data bytes) from a .npy header."""
    import numpy as np

    fmt = np.lib.format
    try:
        version = fmt.read_magic(handle)
        read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if read is None:
            raise SampleError(f"{where}: unsupported .npy version {version}")
        shape, _fortran, dtype = read(handle)
    except SampleError:
        raise
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise SampleError(f"{where}: not a numpy array ({exc})") from None
    if dtype.hasobject:
        raise SampleError(f"{where}: holds Python objects, which are never loaded")
    return tuple(shape), math.prod(shape) * dtype.itemsize


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Array name → shape, for every array in an .npz, without decompressing the data."""
    shapes, total = {}, 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    raise SampleError(f"{info.filename!r} is not a numpy array")
                with archive.open(info) as member:
                    shape, size = _header(member, info.filename)
                if info.file_size > size + _HEADER_SLACK:
                    raise SampleError(f"{info.filename}: holds {info.file_size} bytes, its header declares {size}")
                total += size
                if total > MAX_SAMPLE_BYTES:
                    raise SampleError(f"the arrays hold more than {MAX_SAMPLE_BYTES >> 20} MiB")
                shapes[info.filename[:-4]] = shape
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, RuntimeError, NotImplementedError) as exc:
        raise SampleError(f"not a numpy .npz file ({exc})") from None
    return shapes


def npy_shape(path: Path) -> tuple[int, ...]:
    try:
        with open(path, "rb") as handle:
            shape, size = _header(handle, path.name)
            data = path.stat().st_size - handle.tell()
    except OSError as exc:
        raise SampleError(f"cannot read it ({exc.strerror})") from None
    if size > MAX_SAMPLE_BYTES:
        raise SampleError(f"the array holds more than {MAX_SAMPLE_BYTES >> 20} MiB")
    if data < size:
        raise SampleError(f"truncated: {data} bytes of data, its header declares {size}")
    return shape
