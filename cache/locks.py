"""Best-effort file locks. They save duplicate work; correctness never depends on them (flock lies on NFS)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def file_lock(path: Path, timeout: float = 600.0) -> Iterator[bool]:
    """Yields True if the lock was taken, False if it timed out or locking is unsupported."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no flock; proceed unlocked, atomic writes keep us correct.
        yield False
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    taken = False
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                taken = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            except OSError:
                break
        yield taken
    finally:
        if taken:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
