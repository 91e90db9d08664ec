"""Work folders owned by one process. Each name carries its owner, `<stem>.<pid>-<start>[.<random>][.incomplete]`
(start: the process's start time), so two processes never share a folder, and a folder whose owner is gone
(the pid no longer runs, or now belongs to a process that started later) is recognized as a leftover that the
next run or `gc` may reclaim, or a download may resume from."""

from __future__ import annotations

import os
import re
import shutil
from functools import lru_cache
from pathlib import Path

_OWNED = re.compile(r"(?P<stem>.+)\.(?P<pid>\d+)-(?P<start>\d+)(?:\.[0-9a-f]+)?(?:\.incomplete)?")


def _start_of(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).create_time() * 100)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


@lru_cache(maxsize=4)  # keyed by pid, so a forked child gets its own tag
def _tag(pid: int) -> str:
    return f"{pid}-{_start_of(pid)}"


def owner_tag() -> str:
    return _tag(os.getpid())


def own(parent: Path, stem: str) -> Path:
    """This process's folder for `stem` under `parent` (the same path every time it is asked in this process)."""
    return Path(parent) / f"{stem}.{owner_tag()}"


def unique_name(parent: Path, stem: str, suffix: str = "") -> Path:
    """A new name for `stem` owned by this process, unique even among its threads (nothing is created)."""
    # os.urandom: what secrets.token_hex reads, without importing secrets (hmac, base64)
    return Path(parent) / f"{stem}.{owner_tag()}.{os.urandom(6).hex()}{suffix}"


def fresh(parent: Path, stem: str, suffix: str = "") -> Path:
    path = unique_name(parent, stem, suffix)
    path.mkdir(parents=True)
    return path


def mine(path: Path) -> bool:
    match = _OWNED.fullmatch(Path(path).name)
    return match is not None and f"{match['pid']}-{match['start']}" == owner_tag()


def owner_alive(path: Path) -> bool | None:
    """True or False for an owned name, None for a name that carries no owner."""
    match = _OWNED.fullmatch(Path(path).name)
    if match is None:
        return None
    pid, start = int(match["pid"]), int(match["start"])
    if pid == os.getpid():
        return owner_tag() == f"{pid}-{start}"
    return _start_of(pid) == start


def stem_of(path: Path) -> str | None:
    match = _OWNED.fullmatch(Path(path).name)
    return None if match is None else match["stem"]


def leftovers(parent: Path, stem: str | None = None) -> list[Path]:
    """Owned folders and files under `parent` (named for `stem`, if given) whose owner is gone."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if owner_alive(p) is False and (stem is None or stem_of(p) == stem))


def size_of(path: Path) -> int:
    path = Path(path)
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except FileNotFoundError:  # another process is reclaiming it
        return 0


def remove(path: Path) -> int:
    """Delete a leftover; returns the bytes freed."""
    size = size_of(path)
    if Path(path).is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)
    return size


def reclaim(parent: Path, stem: str | None = None) -> int:
    """Delete every leftover of a dead process under `parent` (named for `stem`, if given). Returns the bytes freed."""
    return sum(remove(path) for path in leftovers(parent, stem))
