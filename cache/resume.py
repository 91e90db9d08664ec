"""Resuming a download that a killed or failed fetch left in the cache's tmp/: the decoded bytes already written
are kept (hashed again, never trusted), and decoding goes on from the next whole frame of the stored blob, read
from the matching offset. Files stored as plain bytes resume at their length; zstd files start over (they are the
small ones). The file's final sha256 still covers every byte, so a damaged prefix fails like any bad download."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from .atomic import CHUNK
from .blob_codecs import Resume
from .manifest import ArtifactFile
from .stores.base import Store

log = logging.getLogger(__name__)


def plan(store: Store, entry: ArtifactFile, dest: Path) -> tuple[Resume | None, int]:
    """(how to resume `dest`, stored offset to read from), or (None, 0) to fetch it from the start."""
    have = dest.stat().st_size if dest.is_file() else 0
    if have == 0 or have > entry.size or entry.codec not in ("none", "efw1"):
        return None, 0
    layout, frame = None, 0
    if entry.codec == "none":
        done = offset = have
    else:
        from .weight_codec import read_layout, resume_point

        with store.open_blob(entry.stored_sha256, entry.stored_size) as head:
            layout = read_layout(head, entry.size)
        frame, done, offset = resume_point(layout, have)
    if done == 0:
        return None, 0
    digest = hashlib.sha256()
    with open(dest, "r+b") as handle:
        handle.truncate(done)
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    log.info("resuming %s at %d of %d bytes", entry.path, done, entry.size)
    return Resume(done, digest, layout, frame), offset


def is_complete(dest: Path, entry: ArtifactFile) -> bool:
    """A file a previous fetch finished: right size and right sha256."""
    if not dest.is_file() or dest.stat().st_size != entry.size:
        return False
    from .atomic import sha256_file

    return sha256_file(dest) == entry.sha256
