"""Atomic file writes and hashing. A reader sees the old file, the new file, or nothing; never a part."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20
# os.urandom(6).hex() is what secrets.token_hex(6) reads; importing secrets (hmac, base64) costs a warm load ~1 ms.


def temp_sibling(path: Path, suffix: str = ".incomplete") -> Path:
    return path.with_name(f".{path.name}.{os.urandom(6).hex()}{suffix}")


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """Write to a temp file beside `path`, fsync, then os.replace. On error the temp file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_writer(path) as handle:
        handle.write(data)


def write_once(path: Path, data: bytes) -> bool:
    """Create `path` with `data` unless it exists. Returns False if it was already there.

    The temp file is hard-linked into place: link() fails if the name exists, so two writers never
    overwrite each other, and a reader never sees a partial file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return False
    tmp = temp_sibling(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:
            # Filesystems without hard links: fall back to replace, guarded by the existence check above.
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def remove_tree(path: Path) -> None:
    """Make a directory disappear atomically (rename), then delete it at leisure."""
    if not path.exists():
        return
    trash = temp_sibling(path, ".trash")
    try:
        os.replace(path, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


FUTURE_SLACK_S = 60.0  # clocks of hosts sharing a store or cache differ a little; that is not "the future"


def aging_mtime(path: Path, now: float | None = None) -> float:
    """`path`'s modification time for an age check (raises FileNotFoundError if it is gone). A time in the future (a
    wrong clock, an archive extracted with its times) is first set to now: counted as it stands, the file would stay
    younger than any grace forever and no gc would remove it; from now it ages out like any other."""
    mtime = path.stat().st_mtime
    now = time.time() if now is None else now
    if mtime <= now + FUTURE_SLACK_S:
        return mtime
    try:
        os.utime(path, (now, now))
    except FileNotFoundError:
        raise
    except OSError:
        pass  # read-only: counted as now this time, and again next time
    return now
