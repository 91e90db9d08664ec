"""The device cache: everything is hashed before use; tampered or truncated artifacts leave nothing behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.artifacts import read_index, read_manifest
from enginefarm.cache.device_cache import MANIFEST_NAME, DeviceCache
from enginefarm.cache.stores import open_store
from enginefarm.cache.stores.base import blob_relpath
from enginefarm.errors import ArtifactNotFoundError, IntegrityError
from tests.conftest import build_tiny_store, builds


@pytest.fixture(scope="module")
@builds
def built_store(tmp_path_factory) -> Path:
    """One ORT fp32 artifact of the tiny model, built once by the real CLI into a store the tests copy."""
    return build_tiny_store(tmp_path_factory.mktemp("device-cache"), ("fp32",), ("onnxruntime:cpu",))


@pytest.fixture
def published(built_store, tmp_path):
    """One ORT fp32 artifact of the tiny model in the test's own store (a copy: tests damage it), its cache empty."""
    shutil.copytree(built_store, tmp_path / "store", dirs_exist_ok=True)
    store = open_store(tmp_path / "store")
    (key,) = read_index(store, "tiny-sd").entries
    return store, read_manifest(store, key)


def blob_path(store, manifest) -> Path:
    return Path(store.url) / blob_relpath(manifest.files[0].stored_sha256)


def cache_dir(tmp_path) -> DeviceCache:
    return DeviceCache(tmp_path / "home")


def test_fetch_verifies_and_caches(published, tmp_path):
    store, manifest = published
    path = cache_dir(tmp_path).fetch(store, manifest)
    assert (path / "model.onnx").is_file()
    assert cache_dir(tmp_path).problems(manifest.build_key) == []
    assert cache_dir(tmp_path).manifest_in_use(manifest.build_key) == manifest


def test_an_artifact_gone_while_in_use_is_a_one_line_error(tmp_path):
    """After compiling on the device, the runner reads the manifest it just cached; another process's gc (or a
    corrupt manifest, evicted on read) used to hand it None, and it failed later with an AttributeError."""
    cache, key = cache_dir(tmp_path), "ab" * 32
    with pytest.raises(ArtifactNotFoundError, match="left the local cache") as gone:
        cache.manifest_in_use(key)
    assert gone.value.key == key
    cache.path_of(key).mkdir(parents=True)
    (cache.path_of(key) / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ArtifactNotFoundError, match="left the local cache"):
        cache.manifest_in_use(key)
    assert not cache.path_of(key).exists()  # the corrupt entry was evicted, not left to fail again


def _rewrite(path: Path, data: bytes) -> None:
    os.chmod(path, 0o644)
    path.write_bytes(data)


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "garbage"])
def test_damaged_blob_raises_and_leaves_no_cache_entry(published, tmp_path, damage):
    store, manifest = published
    blob = blob_path(store, manifest)
    data = blob.read_bytes()
    damaged = {
        "flip": data[:100] + bytes([data[100] ^ 0xFF]) + data[101:],
        "truncate": data[: len(data) // 2],
        "extend": data + data,
        "garbage": os.urandom(len(data)),
    }[damage]
    _rewrite(blob, damaged)
    cache = cache_dir(tmp_path)
    with pytest.raises(IntegrityError):
        cache.fetch(store, manifest)
    assert list(cache.entries()) == []
    assert not cache.path_of(manifest.build_key).exists()
    assert not any(cache.tmp.glob("*")), "staging folder must be cleaned up (or never made)"


def test_load_refuses_a_tampered_store_with_a_clear_error(published, tmp_path):
    store, manifest = published
    blob = blob_path(store, manifest)
    _rewrite(blob, blob.read_bytes()[:-10])
    with pytest.raises(
        IntegrityError, match=r"the stored bytes do not match their manifest \(tampered or corrupt store\)"
    ) as caught:
        enginefarm.load("tiny-sd/decoder", device="cpu")
    assert "build" not in (caught.value.hint or "")  # not "no artifact fits this device; build one"
    assert list(cache_dir(tmp_path).entries()) == []


def test_corrupted_cache_entry_is_evicted_and_fetched_again(published, tmp_path):
    store, manifest = published
    latent = np.zeros((1, 4, 8, 8), np.float32)
    first = enginefarm.load("tiny-sd/decoder", device="cpu").run({"latent": latent})["sample"]
    cached = cache_dir(tmp_path).path_of(manifest.build_key) / "model.onnx"
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    again = enginefarm.load("tiny-sd/decoder", device="cpu").run({"latent": latent})["sample"]
    np.testing.assert_array_equal(first, again)
    assert cache_dir(tmp_path).problems(manifest.build_key) == []


def test_decompression_bomb_is_capped(published, tmp_path):
    """A blob that decodes to far more than the manifest's size stops at that size."""
    import dataclasses

    import zstandard

    store, manifest = published
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))
    digest = __import__("hashlib").sha256(bomb).hexdigest()
    bomb_file = tmp_path / "bomb"
    bomb_file.write_bytes(bomb)
    store.put_blob(digest, bomb_file)
    entry = dataclasses.replace(manifest.files[0], codec="zstd", stored_size=len(bomb), stored_sha256=digest)
    evil = dataclasses.replace(manifest, files=(entry,))
    with pytest.raises(IntegrityError, match="more than"):
        cache_dir(tmp_path).fetch(store, evil)
    assert list(cache_dir(tmp_path).entries()) == []


def test_cache_verify_cli_evicts_damage(published, tmp_path, cli):
    store, manifest = published
    path = cache_dir(tmp_path).fetch(store, manifest)
    (path / "model.onnx").write_bytes(b"tampered")
    proc = cli("cache", "verify")
    assert proc.returncode == 1
    assert "evicted tiny-sd/decoder" in proc.stdout
    assert not path.exists()


def test_verify_all_evicts_damage_and_artifacts_without_a_manifest(published, tmp_path, cli):
    store, manifest = published
    cache = cache_dir(tmp_path)
    path = cache.fetch(store, manifest)
    assert [(c.key, c.problems, c.evicted) for c in cache.verify_all()] == [(manifest.build_key, (), False)]
    (path / "model.onnx").write_bytes(b"tampered")
    orphan = cache.artifacts / ("0" * 64)
    orphan.mkdir()  # a folder whose manifest went missing
    (checked_orphan, checked) = cache.verify_all()
    assert checked_orphan.key == orphan.name and checked_orphan.manifest is None and checked_orphan.evicted
    assert checked.manifest == manifest and checked.problems and checked.evicted
    assert not path.exists() and not orphan.exists()
    orphan.mkdir()
    proc = cli("cache", "verify")
    assert proc.returncode == 1 and f"evicted [{orphan.name[:12]}]: its manifest is missing or malformed" in proc.stdout
    assert (
        not orphan.exists() and cli("cache", "verify", check=True).stdout == ""
    )  # evicted, so a second run finds nothing


def test_gc_respects_the_quota_in_lru_order(tiny_recipe, cli, tmp_path):
    cli("build", str(tiny_recipe(precisions=("fp32", "fp16"))), "--no-bench", check=True)
    store = open_store(tmp_path / "store")
    cache = cache_dir(tmp_path)
    keys = list(read_index(store, "tiny-sd").entries)
    for key in keys:
        cache.fetch(store, read_manifest(store, key))
    os.utime(cache.path_of(keys[0]) / ".last_used", (1, 1))  # the older one goes first
    sizes = {e.manifest.build_key: e.size for e in cache.entries()}
    removed = cache.gc(quota=sizes[keys[1]])
    assert removed == [keys[0]]
    assert [e.manifest.build_key for e in cache.entries()] == [keys[1]]


def test_offline_uses_the_cache_only(published, tmp_path, monkeypatch):
    store, manifest = published
    with pytest.raises(ArtifactNotFoundError):
        monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")
        enginefarm.load("tiny-sd/decoder", device="cpu")
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "0")
    enginefarm.load("tiny-sd/decoder", device="cpu")
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    assert "offline" in session.explain()


def _hashes(monkeypatch) -> list[Path]:
    """Every file the device cache hashes (the real sha256_file, recorded)."""
    from enginefarm.cache import device_cache

    seen: list[Path] = []
    real = device_cache.sha256_file
    monkeypatch.setattr(device_cache, "sha256_file", lambda path: seen.append(Path(path)) or real(path))
    return seen


def test_bytes_are_hashed_once_then_proven_by_stat(published, tmp_path, monkeypatch):
    """A cold load hashes as it fetches; a warm load hashes nothing; `cache verify` hashes everything."""
    store, manifest = published
    hashed = _hashes(monkeypatch)
    latent = np.zeros((1, 4, 8, 8), np.float32)
    enginefarm.load("tiny-sd/decoder", device="cpu").run({"latent": latent})
    assert hashed == []  # the fetch hashed the stream (decode_stream), nothing was read again
    enginefarm.load("tiny-sd/decoder", device="cpu").run({"latent": latent})
    assert hashed == []
    assert cache_dir(tmp_path).problems(manifest.build_key) == []  # what `enginefarm cache verify` does
    assert [p.name for p in hashed] == [f.path for f in manifest.files]


@pytest.mark.parametrize("how", ["rewrite", "rewrite keeping size and mtime", "replace"])
def test_a_changed_file_fails_the_proof_and_is_hashed(published, tmp_path, how):
    store, manifest = published
    cache = cache_dir(tmp_path)
    root = cache.fetch(store, manifest)
    cached = root / "model.onnx"
    before = cached.stat()
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    if how == "replace":  # a new file put in its place: another inode
        sibling = cached.with_name("new")
        sibling.write_bytes(bytes(data))
        os.utime(sibling, ns=(before.st_atime_ns, before.st_mtime_ns))
        os.replace(sibling, cached)
    else:
        cached.write_bytes(bytes(data))
        if how == "rewrite keeping size and mtime":  # ctime still moves: user space cannot set it back
            os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert cache.verified_dir(manifest.build_key) is None  # hashed, found damaged, evicted
    assert not root.exists()


def test_a_missing_or_unreadable_proof_means_hashing_again(published, tmp_path, monkeypatch):
    from enginefarm.cache.proof import PROOF_NAME

    store, manifest = published
    cache = cache_dir(tmp_path)
    root = cache.fetch(store, manifest)
    (root / PROOF_NAME).write_text("{not json")
    hashed = _hashes(monkeypatch)
    assert cache.verified_dir(manifest.build_key) == root
    assert [p.name for p in hashed] == [f.path for f in manifest.files]
    hashed.clear()
    assert cache.verified_dir(manifest.build_key) == root  # the proof was renewed by that hash
    assert hashed == []
