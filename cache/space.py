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


def disk_full(path: Path, need: int | None, free: int | None = None) -> DiskFullError:
    """`need` None: the write that failed had no known size (a build's work files)."""
    free = free_bytes(path) if free is None else free
    what = f"need {mb(need)} MB at {path}" if need else f"no space left at {path}"
    return DiskFullError(
        f"disk full: {what} ({mb(free)} MB free)",
        path=str(path),
        need=need,
        free=free,
        hint=f"free some space on the disk that holds {path}, or point ENGINEFARM_HOME (the cache) or the store "
        "elsewhere",
    )


def ensure_room(path: Path, need: int, reserve: int = RESERVE) -> None:
    """Refuse before writing `need` bytes under `path` if that would leave less than `reserve` free."""
    free = free_bytes(path)
    if free < need + reserve:
        raise disk_full(path, need + reserve, free)


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and not isinstance(exc, DiskFullError) and exc.errno in _FULL


@contextmanager
def full_disk_as_error(path: Path, need: int) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT raised inside the block into DiskFullError for `need` bytes at `path`."""
    try:
        yield
    except OSError as exc:
        if is_full(exc):
            raise disk_full(path, need) from None
        raise
