"""A resumable export. Each component that passed its checks is recorded in the staging folder; a failed or
interrupted export keeps that folder, and the same command run again (same source files, same options) exports only
what is left. A large UNet alone takes many minutes to export on a CPU: a VAE failing after it must not throw it
away."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from enginefarm.cache.atomic import write_bytes_atomic
from enginefarm.cache.locks import file_lock
from enginefarm.errors import ConfigError

RECORD = "finished.json"
FORMAT = 1


def partial_folder(out: Path) -> Path:
    return out.parent / f".{out.name}.export-partial"


def export_key(folders: list[Path], options: dict) -> str:
    """What decides the exported files: every source file's path and stat (size, mtime, and the ctime and inode that
    no `cp -p` or `rsync -t` can keep: a file written in place or replaced changes them, as in cache/proof.py), the
    options, and the exporter's version. A changed checkpoint, another --latent or a new enginefarm starts over."""
    from enginefarm import __version__

    files = []
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            stat = path.stat()
            files.append([str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev])
    payload = {"format": FORMAT, "version": __version__, "files": files, "options": options}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class Partial:
    """The staging folder of one export and the record of the components already in it."""

    def __init__(self, folder: Path, key: str, finished: dict[str, dict]) -> None:
        self.folder = folder
        self.key = key
        self.finished = finished

    def get(self, component: str) -> dict | None:
        """The record of a component exported by an earlier run, if its files are all still there at their sizes."""
        entry = self.finished.get(component)
        if entry is None:
            return None
        for name, size in entry["files"].items():
            path = self.folder / name
            if not path.is_file() or path.stat().st_size != size:
                self.finished.pop(component)
                return None
        return entry

    def record(self, component: str, entry: dict, files: list[Path]) -> None:
        """Written after the component's files: a crash between the two leaves files the record does not name."""
        for path in files:
            _fsync(path)
        self.finished[component] = dict(entry, files={p.name: p.stat().st_size for p in files})
        self._write()

    def _write(self) -> None:
        write_bytes_atomic(
            self.folder / RECORD, json.dumps({"key": self.key, "components": self.finished}, indent=1).encode()
        )


def refuse_if_busy(out: Path) -> None:
    """Refuse at once an export to `out` while another holds it: before torch is imported (seconds), not after.
    The lock itself is taken by `staging`; this only asks whether it is free now."""
    lock = out.parent / f".{out.name}.export-lock"
    if not out.parent.is_dir():
        return  # no export is writing there: nothing holds the lock
    existed = lock.exists()
    with file_lock(lock, timeout=0) as taken:
        if not taken and existed:
            raise _busy(out)
    if not existed:
        lock.unlink(missing_ok=True)


def _busy(out: Path) -> ConfigError:
    return ConfigError(
        f"another `enginefarm export` is writing {out}", hint="wait for it to finish, or choose another --out"
    )


@contextmanager
def staging(out: Path, key: str, report) -> Iterator[Partial]:
    """The export's staging folder: the kept one if it was made by the same command, else a new one. It is removed if
    the export fails before any component finished, and kept (with a message saying so) if some had."""
    folder = partial_folder(out)
    lock = out.parent / f".{out.name}.export-lock"
    with file_lock(lock, timeout=0) as taken:
        if not taken:
            raise _busy(out)
        try:
            partial = _open(folder, key, report)
            try:
                yield partial
            except BaseException:
                if partial.finished:
                    report.message(
                        f"kept {len(partial.finished)} finished component(s) ({', '.join(partial.finished)}) in "
                        f"{folder}: "
                        "the same command resumes from there"
                    )
                else:
                    shutil.rmtree(folder, ignore_errors=True)
                raise
        finally:
            lock.unlink(missing_ok=True)


def _open(folder: Path, key: str, report) -> Partial:
    finished = {}
    try:
        record = json.loads((folder / RECORD).read_text())
        if record.get("key") == key and isinstance(record.get("components"), dict):
            finished = record["components"]
    except (OSError, ValueError):
        pass
    if finished:
        partial = Partial(folder, key, finished)
        kept = [name for name in list(finished) if partial.get(name) is not None]
        report.message(f"resuming: {', '.join(kept) or 'nothing'} kept from an earlier run of this export")
        return partial
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    partial = Partial(folder, key, {})
    partial._write()
    return partial


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
