"""Best-effort file locks. They save duplicate work; correctness never depends on them (flock lies on NFS).

POSIX uses flock; Windows, which has no fcntl, locks the file's first byte with msvcrt.locking, so two processes
do not fetch and build the same thing twice. A platform with neither runs unlocked: every
write is atomic, so that only costs duplicate work."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_BUSY = (errno.EACCES, errno.EAGAIN, getattr(errno, "EDEADLOCK", errno.EDEADLK))


class _Flock:
    def __init__(self, fcntl) -> None:
        self.fcntl = fcntl

    def try_lock(self, fd: int) -> bool:
        """True if taken, False if another holder has it; OSError if this file system cannot lock."""
        try:
            self.fcntl.flock(fd, self.fcntl.LOCK_EX | self.fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def unlock(self, fd: int) -> None:
        self.fcntl.flock(fd, self.fcntl.LOCK_UN)


class _Msvcrt:
    """msvcrt.locking locks a byte range from the current position; LK_NBLCK fails at once when it is held."""

    def __init__(self, msvcrt) -> None:
        self.msvcrt = msvcrt

    def try_lock(self, fd: int) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            self.msvcrt.locking(fd, self.msvcrt.LK_NBLCK, 1)
            return True
        except OSError as exc:
            if exc.errno in _BUSY:
                return False
            raise

    def unlock(self, fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        self.msvcrt.locking(fd, self.msvcrt.LK_UNLCK, 1)


def platform_locker() -> _Flock | _Msvcrt | None:
    """The platform's own lock: flock where fcntl exists, else msvcrt (Windows), else None (unlocked)."""
    try:
        import fcntl
    except ImportError:
        pass
    else:
        return _Flock(fcntl)
    try:
        import msvcrt
    except ImportError:
        return None
    return _Msvcrt(msvcrt)


@contextmanager
def file_lock(path: Path, timeout: float = 600.0) -> Iterator[bool]:
    """Yields True if the lock was taken, False if it timed out or locking is unsupported."""
    path.parent.mkdir(parents=True, exist_ok=True)
    locker = platform_locker()
    if locker is None:  # no lock on this platform: proceed unlocked, atomic writes keep us correct
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
    taken = False
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                taken = locker.try_lock(fd)
            except OSError:  # this file system cannot lock: proceed unlocked
                break
            if taken or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        yield taken
    finally:
        if taken:
            locker.unlock(fd)
        os.close(fd)
