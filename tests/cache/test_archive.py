"""Folder artifacts as one deterministic tar, and extraction that refuses every way out of its folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from enginefarm.cache.archive import UnsafeArchiveError, extract, pack_dir
from enginefarm.cache.atomic import sha256_file
from enginefarm.errors import IntegrityError


def _tree(root: Path) -> Path:
    (root / "Data" / "com.apple.CoreML" / "weights").mkdir(parents=True)
    (root / "Manifest.json").write_text('{"fileFormatVersion": "1.0.0"}')
    (root / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(b"spec" * 100)
    (root / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").write_bytes(os.urandom(5000))
    return root


def _listing(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))
    }


def test_same_tree_gives_the_same_bytes_whatever_the_times_owners_and_modes(tmp_path):
    tree = _tree(tmp_path / "a" / "model.mlpackage")
    first = pack_dir(tree, tmp_path / "one.tar")
    for path in tree.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
        if path.is_file():
            path.chmod(0o600)
    second = pack_dir(tree, tmp_path / "two.tar")
    assert first.read_bytes() == second.read_bytes() and sha256_file(first) == sha256_file(second)

    with tarfile.open(first) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == sorted(m.name for m in members)
        assert members[0].name == "model.mlpackage" and members[0].isdir()
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
        assert {m.mode for m in members if m.isfile()} == {0o644} and {m.mode for m in members if m.isdir()} == {0o755}
        assert tar.pax_headers == {}
    assert b"PaxHeader" not in first.read_bytes()


def test_round_trip_restores_the_tree(tmp_path):
    tree = _tree(tmp_path / "src" / "model.mlpackage")
    archive = pack_dir(tree, tmp_path / "m.tar")
    out = extract(archive, tmp_path / "dest", "model.mlpackage")
    assert out == tmp_path / "dest" / "model.mlpackage"
    assert _listing(out) == _listing(tree)
    assert [p.name for p in (tmp_path / "dest").iterdir()] == ["model.mlpackage"]  # no staging left behind


def test_a_second_extraction_replaces_the_first(tmp_path):
    tree = _tree(tmp_path / "src" / "model.mlpackage")
    archive = pack_dir(tree, tmp_path / "m.tar")
    out = extract(archive, tmp_path / "dest", "model.mlpackage")
    (out / "stray").write_text("left by someone")
    out = extract(archive, tmp_path / "dest", "model.mlpackage")
    assert _listing(out) == _listing(tree)


def test_packing_refuses_a_symlink_in_the_tree(tmp_path):
    tree = _tree(tmp_path / "model.mlpackage")
    (tree / "link").symlink_to("/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="symlink"):
        pack_dir(tree, tmp_path / "m.tar")
    assert not (tmp_path / "m.tar").exists()


def _hostile(path: Path, *entries: tarfile.TarInfo, data: bytes = b"pwned") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        root = tarfile.TarInfo("model.mlpackage")
        root.type = tarfile.DIRTYPE
        tar.addfile(root)
        for info in entries:
            if info.isfile():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _entry(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


HOSTILE = {
    "dot-dot": ([_entry("../evil")], "'..'"),
    "dot-dot inside root": ([_entry("model.mlpackage/../../evil")], "'..'"),
    "absolute": ([_entry("/tmp/evil-enginefarm")], "absolute"),
    "outside root": ([_entry("other/evil")], "outside model.mlpackage/"),
    "symlink": ([_entry("model.mlpackage/weights", tarfile.SYMTYPE, "/etc")], "link"),
    "symlink then write through it": (
        [_entry("model.mlpackage/w", tarfile.SYMTYPE, ".."), _entry("model.mlpackage/w/evil")],
        "link",
    ),
    "hardlink": ([_entry("model.mlpackage/passwd", tarfile.LNKTYPE, "/etc/passwd")], "link"),
    "char device": ([_entry("model.mlpackage/null", tarfile.CHRTYPE)], "device"),
    "block device": ([_entry("model.mlpackage/sda", tarfile.BLKTYPE)], "device"),
    "fifo": ([_entry("model.mlpackage/pipe", tarfile.FIFOTYPE)], "device, fifo"),
    "duplicate": ([_entry("model.mlpackage/a"), _entry("model.mlpackage/a")], "clashes"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_archives_are_refused_and_nothing_is_written(tmp_path, case):
    entries, reason = HOSTILE[case]
    archive = _hostile(tmp_path / "in" / "evil.tar", *entries)
    dest = tmp_path / "work" / "artifact"
    dest.mkdir(parents=True)
    before = _listing(tmp_path)
    with pytest.raises(UnsafeArchiveError, match=reason) as caught:
        extract(archive, dest, "model.mlpackage")
    assert isinstance(caught.value, IntegrityError)
    assert _listing(tmp_path) == before
    assert not Path("/tmp/evil-enginefarm").exists()


def test_a_file_that_is_not_a_tar_is_refused(tmp_path):
    bogus = tmp_path / "m.tar"
    bogus.write_bytes(b"\x00not a tar" * 10)
    with pytest.raises(UnsafeArchiveError):
        extract(bogus, tmp_path / "dest", "model.mlpackage")
    assert not (tmp_path / "dest" / "model.mlpackage").exists()
