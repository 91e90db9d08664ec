"""Directory artifacts (a Core ML `.mlpackage`) as one deterministic tar file, and its safe extraction.

An artifact is a list of files, each hashed and stored as one blob; a directory becomes one `.tar` file so that
the manifest, the codecs, the stores and the device cache need nothing new. Packing is deterministic (sorted
entries, fixed mtime/uid/gid/mode, GNU format: no pax headers with times), so the same tree gives the same bytes
and the same blob digest. Extraction writes regular files and folders only, under one root, into a fresh staging
folder that is moved into place: `..`, absolute paths, links and device files are refused.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from enginefarm.errors import UnsafeArchiveError

from .atomic import CHUNK, atomic_writer

FIXED_MTIME = 0
_DIR_MODE = 0o755
_FILE_MODE = 0o644


def pack_dir(src: Path, dest: Path, root: str | None = None) -> Path:
    """Write `src` (a folder) as a tar at `dest` whose entries all live under `root` (default: src's name)."""
    src = Path(src)
    root = root or src.name
    _check_name(root, root, dest)
    entries: list[tuple[str, Path]] = [(root, src)]
    for folder, dirs, files in os.walk(src):
        dirs.sort()
        here = Path(folder)
        for name in sorted(dirs + files):
            path = here / name
            if path.is_symlink():
                raise UnsafeArchiveError(f"{path}: refusing to archive a symlink")
            if not (path.is_dir() or path.is_file()):
                raise UnsafeArchiveError(f"{path}: refusing to archive a special file")
            entries.append((f"{root}/{path.relative_to(src).as_posix()}", path))
    entries.sort(key=lambda item: item[0])
    with atomic_writer(Path(dest)) as handle, tarfile.open(fileobj=handle, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, path in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = FIXED_MTIME, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, _DIR_MODE
                tar.addfile(info)
            else:
                info.type, info.mode, info.size = tarfile.REGTYPE, _FILE_MODE, path.stat().st_size
                with open(path, "rb") as data:
                    tar.addfile(info, data)
    return Path(dest)


def extract(archive: Path, dest_parent: Path, root: str) -> Path:
    """Extract `archive`, whose entries must all live under `root`, to `dest_parent/root`; returns that path.

    Call it only on an archive whose digest was verified. Every entry is checked before anything is written; the
    tree is built in a staging folder beside the destination and moved into place, replacing an older copy."""
    archive, dest_parent = Path(archive), Path(dest_parent)
    _check_name(root, root, archive)
    try:
        tar = tarfile.open(archive, mode="r:")
    except (tarfile.TarError, OSError) as exc:
        raise UnsafeArchiveError(f"{archive.name}: not a readable tar archive ({exc})") from None
    with tar:
        members = tar.getmembers()
        for member in members:
            _check_member(member, root, archive)
        if not any(m.name.rstrip("/") == root and m.isdir() for m in members):
            raise UnsafeArchiveError(f"{archive.name}: has no {root}/ folder")
        dest_parent.mkdir(parents=True, exist_ok=True)
        staging = dest_parent / f".{root}.{secrets.token_hex(6)}.incomplete"
        staging.mkdir()
        try:
            for member in members:
                # Entries are re-rooted under the staging folder; the checks above make `rel` a plain relative path.
                rel = PurePosixPath(member.name.rstrip("/")).relative_to(root)
                try:
                    _write_member(tar, member, staging.joinpath(*rel.parts))
                except (FileExistsError, NotADirectoryError):
                    raise UnsafeArchiveError(
                        f"{archive.name}: entry {member.name!r} clashes with an earlier entry; refusing to extract"
                    ) from None
            final = dest_parent / root
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
            return final
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if member.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None  # _check_member let only regular files and folders through
    with source, open(target, "xb") as out:  # "x": never write through what is there
        shutil.copyfileobj(source, out, CHUNK)


def _check_member(member: tarfile.TarInfo, root: str, archive: Path) -> None:
    name = member.name
    if member.issym() or member.islnk():
        raise UnsafeArchiveError(
            f"{archive.name}: entry {name!r} is a link (to {member.linkname!r}); refusing to extract"
        )
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(
            f"{archive.name}: entry {name!r} is a device, fifo or other special file; refusing to extract"
        )
    _check_name(name.rstrip("/"), root, archive)


def _check_name(name: str, root: str, archive: Path) -> None:
    path = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"{archive.name}: entry {name!r} is an absolute path; refusing to extract")
    if any(part in ("..", ".", "") for part in name.split("/")):
        raise UnsafeArchiveError(
            f"{archive.name}: entry {name!r} is not a plain relative path ('..' or '.'); refusing to extract"
        )
    if path.parts[0] != root:
        raise UnsafeArchiveError(f"{archive.name}: entry {name!r} is outside {root}/; refusing to extract")
