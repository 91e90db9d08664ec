"""Proof that cached files are still the ones that were hashed: what `stat` says about each, kept at hashing time.

Hashing a 3.4 GB UNet costs ~2 s on every start; the bytes were already hashed when they were fetched (as they
streamed in) or when they were last verified. So the device cache records, per file, its size, mtime_ns, ctime_ns,
inode and device at that moment, in `.verified` beside the manifest, and a load re-hashes only files whose stat
differs. Writing a file through any path changes its mtime and ctime (ctime cannot be set back from user space),
replacing it changes its inode, so a changed file fails the proof and is hashed again. What stat cannot see (bits
rotting on disk under an unchanged inode) `enginefarm cache verify` finds: it hashes everything.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path

PROOF_NAME = ".verified"
_FORMAT = 1


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def record(root: Path, files: Iterable[str]) -> None:
    """Remember the stat of each file (relative to `root`), just verified by hashing. Best effort: in a read-only
    cache nothing is recorded, and the files are hashed again next time."""
    from .atomic import write_bytes_atomic  # here: a warm load only reads proofs (atomic brings shutil and hashlib)

    stamps = {rel: _stamp(root / rel) for rel in files}
    try:
        write_bytes_atomic(root / PROOF_NAME, json.dumps({"format": _FORMAT, "files": stamps}, sort_keys=True).encode())
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise


def unproven(root: Path, files: Iterable[str]) -> list[str]:
    """The files whose stat no longer matches the proof (all of them when there is no readable proof)."""
    files = list(files)
    try:
        kept = json.loads((root / PROOF_NAME).read_bytes())
        stamps = kept["files"] if kept.get("format") == _FORMAT else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return files
    out = []
    for rel in files:
        try:
            if stamps.get(rel) != _stamp(root / rel):
                out.append(rel)
        except OSError:
            out.append(rel)
    return out


def forget(root: Path) -> None:
    try:
        os.unlink(root / PROOF_NAME)
    except FileNotFoundError:
        pass
