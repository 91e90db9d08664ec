"""A stand-in for Windows' msvcrt.locking on POSIX, to test how cache/locks.py picks and uses the platform's lock
where fcntl is missing: msvcrt's interface, backed by real byte-range locks (fcntl.lockf) between processes."""

from __future__ import annotations

import errno
import fcntl as _fcntl
import os
import sys
import types

LK_UNLCK, LK_LOCK, LK_NBLCK = 0, 1, 2  # msvcrt's values
calls: list[int] = []


def locking(fd: int, mode: int, nbytes: int) -> None:
    """Lock or unlock `nbytes` from the current position; a held lock fails at once with EACCES, as the CRT's does."""
    calls.append(mode)
    if mode == LK_NBLCK:
        try:
            _fcntl.lockf(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB, nbytes, 0, os.SEEK_CUR)
        except OSError:
            raise OSError(errno.EACCES, "Permission denied") from None
    elif mode == LK_UNLCK:
        _fcntl.lockf(fd, _fcntl.LOCK_UN, nbytes, 0, os.SEEK_CUR)
    else:
        raise ValueError(f"mode {mode} is not used by enginefarm")


def module() -> types.ModuleType:
    stand_in = types.ModuleType("msvcrt")
    stand_in.locking, stand_in.LK_UNLCK, stand_in.LK_LOCK, stand_in.LK_NBLCK = locking, LK_UNLCK, LK_LOCK, LK_NBLCK
    return stand_in


def simulate_windows() -> None:
    """From now on in this process: no fcntl, and an msvcrt."""
    sys.modules["fcntl"] = None  # `import fcntl` raises ImportError, as on Windows
    sys.modules["msvcrt"] = module()
