"""Leftovers no gc cleaned, and a lying manifest that made the cache write what it claims (issue 25)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

import pytest
import zstandard

from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.progress import Progress
from enginefarm.cache.stores import open_store
from enginefarm.errors import IntegrityError
from tests.releases import artifact


class Written(Progress):
    def __init__(self) -> None:
        self.most = 0

    def transfer(self, name: str, done: int, total: int) -> None:
        self.most = max(self.most, done)


def test_a_manifest_claiming_more_than_the_store_holds_is_refused_before_writing(tmp_path):
    """A few KB of zstd that decode to 64 MiB of zeros, under a manifest claiming 64 MiB stored and decoded: before,
    the cache decoded all 64 MiB to disk (3 GB in the issue's case) and refused only at the digest."""
    store = open_store(str(tmp_path / "store"))
    honest = artifact(store, tmp_path, "a")
    bomb = zstandard.ZstdCompressor(level=3).compress(b"\0" * (64 << 20))
    assert len(bomb) < 100_000
    digest = hashlib.sha256(bomb).hexdigest()
    (tmp_path / "bomb").write_bytes(bomb)
    store.put_blob(digest, tmp_path / "bomb")
    claim = 64 << 20
    lie = dataclasses.replace(honest.files[0], codec="zstd", size=claim, stored_size=claim, stored_sha256=digest)
    evil = dataclasses.replace(honest, files=(lie,))
    cache, written = DeviceCache(tmp_path / "home"), Written()
    with pytest.raises(IntegrityError, match=f"the store holds {len(bomb)} bytes, the manifest claims {claim}"):
        cache.fetch(store, evil, progress=written)
    assert written.most == 0
    assert list(cache.entries()) == [] and not any(cache.tmp.glob("*"))
    assert cache.fetch(store, honest).is_dir()  # the honest artifact still fetches


YEAR = 365 * 86400.0


def test_store_gc_ages_out_files_dated_in_the_future(tmp_path):
    """An orphan blob, a killed writer's temp file and a superseded build-cache object, all dated a year ahead (a
    wrong clock, an archive extracted with its times): before, each stayed younger than any grace, forever."""
    from enginefarm.cache.artifacts import plan_gc

    store = open_store(str(tmp_path / "store"))
    (tmp_path / "orphan").write_bytes(b"orphan")
    orphan = hashlib.sha256(b"orphan").hexdigest()
    store.put_blob(orphan, tmp_path / "orphan")
    partial = tmp_path / "store" / "manifests" / ".x.json.0123456789ab.incomplete"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half")
    for i in range(12):  # a slot keeps its newest 8 objects; the others are stale once past the grace
        store.put_cache_object(f"slot/object-{i}", b"x")
    future = time.time() + YEAR
    for path in [*(tmp_path / "store").rglob("*")]:
        if path.is_file():
            os.utime(path, (future, future))
    grace = 3600.0
    first = plan_gc(store, grace)  # sees the future dates: counts them as now from here on
    assert first.to_delete == [] and first.partials == [] and first.stale_caches == []
    later = plan_gc(store, grace, now=time.time() + grace + 60)
    assert later.to_delete == [orphan]
    assert later.partials == [str(partial.relative_to(tmp_path / "store"))]
    assert later.stale_caches  # the slot's oldest, once its files' dates are no longer in the future


@pytest.mark.slow  # over a second of the quick loop's time (make test-fast)
def test_device_cache_gc_ages_out_leftovers_dated_in_the_future(tmp_path):
    cache = DeviceCache(tmp_path / "home")
    stray = cache.tmp / "stray-download"  # no owner in its name: removed once older than max_tmp_age
    stray.mkdir(parents=True)
    (stray / "part").write_bytes(b"x" * 100)
    future = time.time() + YEAR
    os.utime(stray, (future, future))
    cache.gc(None, max_tmp_age=1.0)
    assert stray.exists()  # young: its future date now counts as now
    time.sleep(1.2)
    cache.gc(None, max_tmp_age=1.0)
    assert not stray.exists()
