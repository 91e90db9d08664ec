"""Free space: checked before large writes, and a full disk turned into one clear error that says how much is
needed where ("disk full: need N MB at PATH"), instead of a traceback or a misleading "not found"."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from enginefarm.errors import DiskFullError

# Left free after a fetch: a cache that fills the disk to the last byte breaks the rest of the user's machine.
RESERVE = 64 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)


def mb(size: int) -> str:
    return f"{size / 1e6:,.1f}" if size < 10e6 else f"{size / 1e6:,.0f}"


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return shutil.disk_usage(path).free


def disk_full(path: Path, need: int | None, free: int | None = None, hint: str | None = None) -> DiskFullError:
    """`need` None: the write that failed had no known size (a build's work files)."""
    free = free_bytes(path) if free is None else free
    what = f"need {mb(need)} MB at {path}" if need else f"no space left at {path}"
    return DiskFullError(
        f"disk full: {what} ({mb(free)} MB free)",
        path=str(path),
        need=need,
        free=free,
        hint=hint
        or f"free some space on the disk that holds {path}, or point ENGINEFARM_HOME (the cache) or the store "
        "elsewhere",
    )


def ensure_room(path: Path, need: int, reserve: int = RESERVE, hint: str | None = None) -> None:
    """Refuse before writing `need` bytes under `path` if that would leave less than `reserve` free."""
    free = free_bytes(path)
    if free < need + reserve:
        raise disk_full(path, need + reserve, free, hint)


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and not isinstance(exc, DiskFullError) and exc.errno in _FULL


@contextmanager
def full_disk_as_error(path: Path, need: int, hint: str | None = None) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT raised inside the block into DiskFullError for `need` bytes at `path`."""
    try:
        yield
    except OSError as exc:
        if is_full(exc):
            raise disk_full(path, need, hint=hint) from None
        raise


# What a C++ SDK's output stream raises when a write fails (libstdc++'s words; OpenVINO's save_model says just this on
# a full disk). It names no errno, so a full disk is told from other failures by the free space left.
IOSTREAM_FAILURE = ("basic_ios::clear", "iostream error")


@contextmanager
def sdk_writes(path: Path, need: int, hint: str | None = None) -> Iterator[None]:
    """Turn a full disk met by an SDK writing about `need` bytes under `path` into DiskFullError: ENOSPC/EDQUOT, or
    the SDK's stream failure while less than `need` (and the reserve) is free there."""
    try:
        with full_disk_as_error(path, need, hint):
            yield
    except RuntimeError as exc:
        free = free_bytes(path)
        if any(words in str(exc) for words in IOSTREAM_FAILURE) and free < need + RESERVE:
            raise disk_full(path, need + RESERVE, free, hint) from exc
        raise
