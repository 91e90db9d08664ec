"""The build's work cache: one folder per source under WORKROOT/prep/, shared by every job of that source.

    prep/<id>/prepared-fp32.onnx (+ .data)    checked, simplified, shapes inferred   (prep.py)
    prep/<id>/prepared-fp16.onnx (+ .data)    converted from the fp32 one            (prep.py)
    prep/<id>/prepared-*.failed.json          a prep that failed, failing later jobs without running again
    prep/<id>/references/<cases>.npz          fp32 reference outputs per set of cases (references.py)

<id> covers the source's digest and the prep toolchain (prep version, onnx, onnxsim, and ONNX Runtime, which
both converts to fp16 and computes the references), so a new toolchain never reuses old work. Every job that
uses a folder touches its `.last_used`. After each build run, folders unused for KEEP_S are removed (`prune`):
the prep of a multi-GB model is worth keeping for the next run that adds a target or a precision, but not forever.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from enginefarm.cache.build_keys import build_key

from .prep import LAST_USED, prep_versions

log = logging.getLogger(__name__)

KEEP_S = 24 * 3600.0


def source_folder(workroot: Path, source_digest: str) -> Path:
    return workroot / "prep" / build_key({"source": source_digest, "prep": prep_versions("fp16")})[:24]


def prune(workroot: Path, keep_s: float = KEEP_S, now: float | None = None) -> list[Path]:
    """Remove work folders no job has used for `keep_s` seconds. Returns what was removed."""
    root = workroot / "prep"
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    removed = []
    for folder in root.iterdir():
        if not folder.is_dir():
            continue
        stamp = folder / LAST_USED
        try:
            used = (stamp if stamp.exists() else folder).stat().st_mtime
        except OSError:
            continue
        if now - used > keep_s:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            log.info("removed the build work cache %s (unused for %.0f h)", folder.name, (now - used) / 3600)
    return removed
