"""Where each cached artifact came from: the stores that served it, or this device that built it.

A manifest is its store's word, and any store can publish a manifest naming any model and any build key. So the
cache keeps its own record, `.origins` beside the manifest, written by the cache when it fetches, builds or
compares, never taken from a store. `load` from a store offers only what that store served (or this device built);
an artifact cached from elsewhere stands in for a store's entry only once its manifest equals the store's.
"""

from __future__ import annotations

import json
from pathlib import Path

from .atomic import write_bytes_atomic

ORIGINS_NAME = ".origins"
THIS_DEVICE = "this device"  # built or patched here (add_local), not fetched


def read(root: Path) -> set[str]:
    """The origins recorded for the artifact folder `root`; empty when none are (or the record is unreadable)."""
    try:
        data = json.loads((root / ORIGINS_NAME).read_bytes())
    except (OSError, ValueError):
        return set()
    return {x for x in data if isinstance(x, str)} if isinstance(data, list) else set()


def write(root: Path, origins: set[str]) -> None:
    write_bytes_atomic(root / ORIGINS_NAME, json.dumps(sorted(origins)).encode())


def add(root: Path, origin: str) -> None:
    """Record one more origin. Two processes adding at once may lose one: that costs a later manifest comparison,
    never a wrong artifact (a missing origin only ever withholds a cached artifact)."""
    known = read(root)
    if origin not in known:
        try:
            write(root, known | {origin})
        except OSError:  # a read-only cache still serves; the comparison is made again next time
            pass
