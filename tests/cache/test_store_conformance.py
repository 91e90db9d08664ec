"""One conformance suite for every store. Each store's test class subclasses StoreConformance."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from enginefarm.cache.artifacts import publish, read_index, read_manifest, rebuild_index, update_index
from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.cache.stores import open_store
from enginefarm.errors import ArtifactNotFoundError, IntegrityError, StoreError


def blob_file(tmp_path: Path, data: bytes) -> tuple[str, Path]:
    path = tmp_path / f"blob-{hashlib.sha256(data).hexdigest()[:8]}"
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def make_manifest(key_seed: str, digest: str, size: int, model: str = "m", target: str = "onnxruntime:cpu") -> Manifest:
    key = hashlib.sha256(key_seed.encode()).hexdigest()
    return Manifest(
        build_key=key,
        model=model,
        model_version="1",
        component="c",
        precision="fp32",
        profile_name="p",
        profile={"x": {"min": [1], "opt": [1], "max": [1]}},
        target=target,
        toolchain={"onnxruntime": "1"},
        files=(ArtifactFile("model.onnx", "model", size, digest, "none", size, digest),),
    )


class StoreConformance:
    """Subclasses provide `store` (a fresh store to write with) and may override `reader` (the store readers use:
    the same one, except for read-only HTTP, which reads what an S3 store wrote)."""

    @pytest.fixture
    def reader(self, store):
        return store

    def test_blob_round_trip(self, store, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"hello blob" * 1000)
        assert not reader.has_blob(digest)
        assert store.put_blob(digest, path) is True
        assert reader.has_blob(digest)
        with reader.open_blob(digest, 10000) as handle:
            assert _read_all(handle) == b"hello blob" * 1000

    def test_existing_blob_counts_as_success_and_is_not_rewritten(self, store, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"same")
        assert store.put_blob(digest, path)
        assert store.put_blob(digest, path) is False
        with reader.open_blob(digest) as handle:
            assert _read_all(handle) == b"same"

    def test_a_blob_of_another_size_than_claimed_is_refused_before_reading(self, store, reader, tmp_path):
        """The store's own size (stat, the response's Content-Length or Content-Range) against the claim."""
        digest, path = blob_file(tmp_path, b"sized" * 777)
        store.put_blob(digest, path)
        with pytest.raises(IntegrityError, match=f"the store holds {5 * 777} bytes, the manifest claims {64 << 20}"):
            _read_all(reader.open_blob(digest, 64 << 20))

    def test_missing_blob_is_a_typed_error(self, reader):
        with pytest.raises(ArtifactNotFoundError):
            _read_all(reader.open_blob("0" * 64))

    def test_bad_digest_is_refused(self, reader, tmp_path):
        with pytest.raises(StoreError):
            reader.has_blob("../../etc/passwd")

    def test_reads_are_capped_at_the_expected_size(self, store, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"x" * 5000)
        store.put_blob(digest, path)
        with pytest.raises(IntegrityError):
            _read_all(reader.open_blob(digest, 100))

    def test_blob_listing_and_deletion(self, store, tmp_path):
        digest, path = blob_file(tmp_path, b"to be deleted")
        store.put_blob(digest, path)
        assert digest in dict(store.list_blobs())
        store.delete_blob(digest)
        assert not store.has_blob(digest)

    def test_manifest_is_written_once(self, store, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"x")
        first = make_manifest("k", digest, 1)
        assert publish(store, first, {digest: path}) is True
        assert read_manifest(reader, first.build_key) == first
        assert store.put_manifest_bytes(first.build_key, b"{}") is False
        assert read_manifest(reader, first.build_key) == first
        assert list(store.list_manifest_keys()) == [first.build_key]
        assert read_manifest(reader, "f" * 64) is None

    def test_manifests_are_deleted_only_on_purpose(self, store, reader, tmp_path):
        """`gc --keep-versions` removes an old version's manifest; the blob and the other manifests stay."""
        digest, path = blob_file(tmp_path, b"shared")
        old, new = make_manifest("old", digest, 6), make_manifest("new", digest, 6)
        publish(store, old, {digest: path})
        publish(store, new, {digest: path})
        store.delete_manifest(old.build_key)
        assert read_manifest(reader, old.build_key) is None and read_manifest(reader, new.build_key) == new
        assert list(store.list_manifest_keys()) == [new.build_key] and reader.has_blob(digest)
        store.delete_manifest(old.build_key)  # gone already: a rerun after a crash is harmless
        with pytest.raises(StoreError):
            store.delete_manifest("../index/m")

    def test_index_lists_published_artifacts(self, store, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"x")
        one, two = make_manifest("a", digest, 1), make_manifest("b", digest, 1, target="openvino:cpu")
        publish(store, one, {digest: path})
        publish(store, two, {digest: path})
        entries = read_index(reader, "m").entries
        assert set(entries) == {one.build_key, two.build_key}
        assert entries[two.build_key].target == "openvino:cpu"
        assert list(store.list_models()) == ["m"]
        assert read_index(reader, "nomodel").entries == {}

    def test_index_cas_rejects_a_stale_etag(self, store):
        assert store.cas_index_bytes("m", b'{"v": 1}', None)
        raw, etag = store.get_index_bytes("m")
        assert store.cas_index_bytes("m", b'{"v": 2}', None) is False
        assert store.cas_index_bytes("m", b'{"v": 2}', etag)
        assert store.cas_index_bytes("m", b'{"v": 3}', etag) is False
        assert store.get_index_bytes("m")[0] == b'{"v": 2}'

    def test_concurrent_index_updates_lose_nothing(self, store, tmp_path):
        digest, _ = blob_file(tmp_path, b"x")
        manifests = [make_manifest(f"k{i}", digest, 1) for i in range(16)]
        threads = [threading.Thread(target=update_index, args=(store, [m])) for m in manifests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(read_index(store, "m").entries) == {m.build_key for m in manifests}

    def test_lost_index_is_rebuilt_from_manifests(self, store, tmp_path):
        digest, path = blob_file(tmp_path, b"x")
        manifest = make_manifest("k", digest, 1)
        publish(store, manifest, {digest: path})
        raw, etag = store.get_index_bytes("m")
        assert store.cas_index_bytes("m", json.dumps({"format": 1, "model": "m", "entries": {}}).encode(), etag)
        assert read_index(store, "m").entries == {}
        assert rebuild_index(store) == {"m": 1}
        assert set(read_index(store, "m").entries) == {manifest.build_key}

    def test_garbage_index_reads_as_empty(self, store):
        store.cas_index_bytes("m", b"not json", None)
        assert read_index(store, "m").entries == {}

    def test_channel_files_are_replaced_and_streamed(self, store, reader):
        store.put_channel_file("stable", "timestamp.json", b'{"v": 1}')
        store.put_channel_file("stable", "timestamp.json", b'{"v": 2}')
        store.put_channel_file("beta", "1.root.json", b"root")
        assert _read_all(reader.open_channel_file("stable", "timestamp.json")) == b'{"v": 2}'
        assert _read_all(reader.open_channel_file("beta", "1.root.json")) == b"root"
        with pytest.raises(ArtifactNotFoundError):
            _read_all(reader.open_channel_file("stable", "2.root.json"))

    @pytest.mark.parametrize(
        "channel,name",
        [("../x", "root.json"), ("stable", "../../manifests/x.json"), ("stable", "root"), ("", "root.json")],
    )
    def test_bad_channel_paths_are_refused(self, store, reader, channel, name):
        with pytest.raises(StoreError):
            store.put_channel_file(channel, name, b"x")
        with pytest.raises(StoreError):
            reader.open_channel_file(channel, name)

    def test_manifest_stream(self, store, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"x")
        manifest = make_manifest("k", digest, 1)
        publish(store, manifest, {digest: path})
        assert _read_all(reader.open_manifest(manifest.build_key)) == manifest.to_json()
        with pytest.raises(ArtifactNotFoundError):
            _read_all(reader.open_manifest("e" * 64))

    def test_cache_objects_are_write_once_and_listed_by_prefix(self, store):
        """Shared build caches (TensorRT timing caches) follow the blob rules: written once, never rewritten."""
        name = "tensorrt-timing/sm_89/trt-10.13.0.35/aa"
        assert store.put_cache_object(name, b"one")
        assert not store.put_cache_object(name, b"two")
        assert store.get_cache_object(name) == b"one"
        store.put_cache_object("tensorrt-timing/sm_86/trt-10.13.0.35/bb", b"other arch")
        assert store.list_cache_objects("tensorrt-timing/sm_89/trt-10.13.0.35") == [name]
        assert store.list_cache_objects("tensorrt-timing/sm_75") == []
        assert store.get_cache_object("tensorrt-timing/sm_89/trt-10.13.0.35/zz") is None
        with pytest.raises(StoreError):
            store.put_cache_object("../manifests/x", b"escape")

    def test_cache_objects_are_listed_with_their_age_and_deleted_by_gc_only(self, store, tmp_path):
        from enginefarm.cache.artifacts import CACHE_NEWEST_KEPT, plan_gc

        slot = "tensorrt-timing/sm_89/trt-10"
        names = [f"{slot}/{i:02d}" for i in range(CACHE_NEWEST_KEPT + 2)]
        for name in names:
            store.put_cache_object(name, name.encode())
        store.put_cache_object("tensorrt-timing/sm_86/trt-10/only", b"another slot")
        entries = dict(store.list_cache_entries(""))
        assert set(entries) == {*names, "tensorrt-timing/sm_86/trt-10/only"}
        assert all(time.time() - mtime < 3600 for mtime in entries.values())
        assert plan_gc(store, grace_s=3600).stale_caches == []  # young objects are kept: a build may be reading them
        stale = plan_gc(store, grace_s=0, now=time.time() + 60).stale_caches
        assert len(stale) == 2 and set(stale) <= set(names)  # each slot keeps its newest few; sm_86's one is kept
        store.delete_cache_object(stale[0])
        assert store.get_cache_object(stale[0]) is None and len(store.list_cache_objects(slot)) == CACHE_NEWEST_KEPT + 1


class TestLocalStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path):
        return open_store(tmp_path / "local-store")

    def test_file_url_and_plain_path_are_the_same_store(self, tmp_path):
        assert open_store(f"file://{tmp_path}/s").url == open_store(tmp_path / "s").url

    def test_no_temp_files_are_left(self, store, tmp_path):
        digest, path = blob_file(tmp_path, b"y")
        publish(store, make_manifest("k", digest, 1), {digest: path})
        leftovers = [p for p in Path(store.url).rglob("*") if ".incomplete" in p.name]
        assert leftovers == []


class TestS3Store(StoreConformance):
    @pytest.fixture
    def store(self, bucket):
        return open_store(f"s3://{bucket}/farm")

    def test_multipart_upload_of_a_large_blob(self, bucket, tmp_path):
        from enginefarm.cache.stores.s3 import S3Store

        store = S3Store(f"s3://{bucket}/mp", part_size=5 << 20, multipart_threshold=6 << 20, verify_uploads=True)
        data = os.urandom(12 << 20)
        digest, path = blob_file(tmp_path, data)
        sent = []
        assert store.put_blob(digest, path, progress=sent.append)
        assert sum(sent) == len(data) and len(sent) == 3
        assert _read_all(store.open_blob(digest, len(data))) == data
        assert store.put_blob(digest, path) is False

    def test_missing_bucket_is_a_clear_error(self, s3_env):
        with pytest.raises(StoreError, match="bucket nosuchbucket does not exist"):
            open_store("s3://nosuchbucket/x").has_blob("0" * 64)


class TestHttpStore(StoreConformance):
    """Written through S3, read through plain HTTP GETs of the same bucket, as a CDN or public bucket serves it."""

    @pytest.fixture
    def store(self, bucket):
        return open_store(f"s3://{bucket}/farm")

    @pytest.fixture
    def reader(self, bucket, s3_env):
        return open_store(f"{s3_env.url}/{bucket}/farm")

    def test_keeps_no_build_caches(self, reader):
        """A build reading through HTTP just starts cold: no cache objects, and nothing is written."""
        assert reader.put_cache_object("tensorrt-timing/sm_89/trt-10/aa", b"x") is False
        assert reader.get_cache_object("tensorrt-timing/sm_89/trt-10/aa") is None
        assert reader.list_cache_objects("tensorrt-timing") == []

    def test_is_read_only(self, reader, tmp_path):
        digest, path = blob_file(tmp_path, b"x")
        with pytest.raises(StoreError, match="read-only"):
            reader.put_blob(digest, path)
        with pytest.raises(StoreError, match="read-only"):
            publish(reader, make_manifest("k", digest, 1), {digest: path})
        with pytest.raises(StoreError, match="read-only"):
            reader.put_channel_file("stable", "timestamp.json", b"{}")
        with pytest.raises(StoreError, match="read-only"):
            reader.delete_manifest("a" * 64)

    def test_parallel_ranged_get(self, store, bucket, s3_env, tmp_path):
        from enginefarm.cache.stores.http import HttpStore

        data = os.urandom(3 << 20)
        digest, path = blob_file(tmp_path, data)
        store.put_blob(digest, path)
        reader = HttpStore(f"{s3_env.url}/{bucket}/farm", parallel_threshold=1 << 20, workers=4)
        import enginefarm.cache.stores.http as http_module

        old = http_module.CHUNK
        http_module.CHUNK = 256 << 10
        try:
            assert _read_all(reader.open_blob(digest, len(data))) == data
        finally:
            http_module.CHUNK = old


def _read_all(handle) -> bytes:
    with handle:
        parts = []
        while chunk := handle.read(1 << 16):
            parts.append(chunk)
    return b"".join(parts)


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(StoreError, match="unknown store scheme 'ftp'"):
        open_store("ftp://example.com/store")
