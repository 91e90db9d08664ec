"""Where each cached artifact came from: the stores that served it, or this device that built it.

A manifest is its store's word, and any store can publish a manifest naming any model and any build key. So the
cache keeps its own record, `.origins` beside the manifest, written by the cache when it fetches, builds or
compares, never taken from a store. `load` from a store offers only what that store served (or this device built)
and its index still lists; an artifact cached from elsewhere stands in for a store's entry only once its manifest
equals the store's. A store's origin is forgotten once its index stops listing the artifact (a store rebuilt or
replaced at the same URL, old versions removed), so offline loads naming that store no longer offer it either.
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


def withdrawn(root: Path) -> bool:
    """True if every store that served the artifact has since stopped listing it (the record is there, and empty)."""
    return (root / ORIGINS_NAME).is_file() and read(root) == set()


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


def discard(root: Path, origin: str) -> None:
    """Forget one origin: that store no longer lists the artifact. On a read-only cache the record stays, and the
    store's index withholds the artifact again at each load."""
    known = read(root)
    if origin in known:
        try:
            write(root, known - {origin})
        except OSError:
            pass
