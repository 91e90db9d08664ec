"""Fault tests with real processes and sockets: a proxy in front of moto breaks transfers the way networks do."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import boto3
import pytest

from enginefarm.cache.artifacts import pack_files, publish, read_index, read_manifest
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store
from enginefarm.cache.stores.http import HttpStore
from enginefarm.cache.stores.ranged import BlobChanged, Limits, TransferTooSlow
from enginefarm.errors import ArtifactNotFoundError, IntegrityError, StoreError
from tests.cache.test_store_conformance import make_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def artifact(bucket, tmp_path):
    """A published artifact with one 2 MiB incompressible file, in s3://bucket/farm."""
    store = open_store(f"s3://{bucket}/farm")
    src = tmp_path / "artifact"
    src.mkdir()
    (src / "model.bin").write_bytes(os.urandom(2 << 20))
    files, blobs = pack_files(src, [("model.bin", "weights")], tmp_path / "blobs")
    manifest = make_manifest("fault", files[0].sha256, files[0].size)
    manifest = manifest.__class__(**{**manifest.__dict__, "files": tuple(files)})
    publish(store, manifest, blobs)
    return store, manifest, (src / "model.bin").read_bytes()


def via_proxy(proxy, bucket) -> HttpStore:
    return HttpStore(f"{proxy.url}/{bucket}/farm", limits=Limits(deadline_s=60, min_rate=1, window_s=30))


def fetch(store, manifest, tmp_path) -> Path:
    return DeviceCache(tmp_path / "home").fetch(store, manifest)


def assert_nothing_cached(tmp_path, manifest, resumable: bool = False):
    """No artifact; and in tmp/ nothing, or (`resumable`) only the part a later fetch resumes from."""
    cache = DeviceCache(tmp_path / "home")
    assert not cache.path_of(manifest.build_key).exists()
    left = [p for p in cache.tmp.rglob("*") if p.is_file()] if cache.tmp.exists() else []
    if resumable:
        assert all(p.stat().st_size < manifest.files[0].size for p in left)
    else:
        assert left == []


def blob_requests(proxy) -> list[dict]:
    return [headers for method, path, headers in proxy.plan.log if method == "GET" and "/blobs/" in path]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_connection_drop_at_a_random_offset_resumes_there(artifact, proxy, bucket, tmp_path, seed):
    store, manifest, data = artifact
    offset = random.Random(seed).randrange(1000, manifest.files[0].stored_size - 1000)
    proxy.add(path_contains="/blobs/", reset_after=offset)
    path = fetch(via_proxy(proxy, bucket), manifest, tmp_path)
    assert (path / "model.bin").read_bytes() == data
    requests = blob_requests(proxy)
    assert len(requests) == 2 and requests[1]["Range"] == f"bytes={offset}-"
    assert requests[1]["If-Match"] == requests[1]["If-Range"] and requests[1]["If-Match"]


def test_tcp_reset_mid_download_recovers(artifact, proxy, bucket, tmp_path):
    """An RST can also discard bytes already in flight, so the resume point is wherever the reader really was."""
    store, manifest, data = artifact
    offset = manifest.files[0].stored_size // 2
    proxy.add(path_contains="/blobs/", reset_after=offset, hard_reset=True)
    path = fetch(via_proxy(proxy, bucket), manifest, tmp_path)
    assert (path / "model.bin").read_bytes() == data
    requests = blob_requests(proxy)
    assert len(requests) == 2
    assert int(requests[1].get("Range", "bytes=0-").removeprefix("bytes=").rstrip("-")) <= offset


def test_connection_reset_through_s3_resumes(artifact, proxy, bucket, tmp_path, monkeypatch):
    store, manifest, data = artifact
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    proxy.add(path_contains="/blobs/", reset_after=4096)
    path = fetch(open_store(f"s3://{bucket}/farm"), manifest, tmp_path)
    assert (path / "model.bin").read_bytes() == data
    assert any(h.get("Range") == "bytes=4096-" for h in blob_requests(proxy))


def test_server_ignoring_range_restarts_from_zero(artifact, proxy, bucket, tmp_path):
    store, manifest, data = artifact
    proxy.add(path_contains="/blobs/", reset_after=50_000)
    proxy.add(path_contains="/blobs/", ignore_range=True, only_ranged=True)
    path = fetch(via_proxy(proxy, bucket), manifest, tmp_path)
    assert (path / "model.bin").read_bytes() == data
    ranges = [h.get("Range") for h in blob_requests(proxy)]
    assert ranges == [None, "bytes=50000-", None], "after a 200 to a ranged request the fetch must start over"


def test_object_replaced_between_ranges_is_never_spliced(artifact, proxy, bucket, s3_env, tmp_path):
    store, manifest, data = artifact
    key = f"farm/blobs/sha256/{manifest.files[0].stored_sha256[:2]}/{manifest.files[0].stored_sha256}"
    other = os.urandom(len(data))

    def replace() -> None:
        client = boto3.client("s3", endpoint_url=s3_env.url, region_name="us-east-1")
        client.put_object(Bucket=bucket, Key=key, Body=other)

    proxy.add(path_contains="/blobs/", reset_after=30_000, after=replace)
    reader = via_proxy(proxy, bucket).open_blob(manifest.files[0].stored_sha256, manifest.files[0].stored_size)
    with pytest.raises(BlobChanged):
        while reader.read(1 << 16):
            pass
    fresh = via_proxy(proxy, bucket).open_blob(manifest.files[0].stored_sha256, len(other))
    got = b"".join(iter(lambda: fresh.read(1 << 16), b""))
    assert got == other, "a fresh read gets the new version whole, not a splice"


def test_replaced_object_fails_verification_and_caches_nothing(artifact, proxy, bucket, s3_env, tmp_path):
    store, manifest, data = artifact
    key = f"farm/blobs/sha256/{manifest.files[0].stored_sha256[:2]}/{manifest.files[0].stored_sha256}"

    def replace():
        client = boto3.client("s3", endpoint_url=s3_env.url, region_name="us-east-1")
        client.put_object(Bucket=bucket, Key=key, Body=os.urandom(100))

    proxy.add(path_contains="/blobs/", reset_after=30_000, after=replace)
    with pytest.raises(IntegrityError):
        fetch(via_proxy(proxy, bucket), manifest, tmp_path)
    assert [h.get("Range") for h in blob_requests(proxy)][:3] == [None, "bytes=30000-", None]
    assert_nothing_cached(tmp_path, manifest)


def test_wrong_content_range_aborts(artifact, proxy, bucket, tmp_path):
    store, manifest, _ = artifact
    proxy.add(path_contains="/blobs/", reset_after=10_000)
    proxy.add(path_contains="/blobs/", shift_content_range=100, only_ranged=True)
    with pytest.raises(IntegrityError, match="bad Content-Range"):
        fetch(via_proxy(proxy, bucket), manifest, tmp_path)
    assert_nothing_cached(tmp_path, manifest)


@pytest.mark.parametrize("status,error", [(404, ArtifactNotFoundError), (403, StoreError)])
def test_404_and_403_are_typed_and_leave_nothing(artifact, proxy, bucket, tmp_path, status, error):
    store, manifest, _ = artifact
    proxy.add(path_contains="/blobs/", status=status)
    with pytest.raises(error):
        fetch(via_proxy(proxy, bucket), manifest, tmp_path)
    assert_nothing_cached(tmp_path, manifest)


def test_trickling_server_is_abandoned(artifact, proxy, bucket, tmp_path):
    store, manifest, _ = artifact
    proxy.add(path_contains="/blobs/", trickle_bps=20_000)
    slow = HttpStore(f"{proxy.url}/{bucket}/farm", limits=Limits(deadline_s=60, min_rate=200_000, window_s=0.5))
    started = time.monotonic()
    with pytest.raises(TransferTooSlow):
        fetch(slow, manifest, tmp_path)
    assert time.monotonic() - started < 30
    assert_nothing_cached(tmp_path, manifest, resumable=True)


# Small reads over HTTP: indexes, manifests, channel metadata (issue 25, finding 3) -----------------------------
# Before: no deadline and no rate floor (a server sending 1 byte/s held `load` for good), a stalled body was a
# TimeoutError traceback after 30 s, and a body cut short (with the right Content-Length) was parsed anyway.
QUICK = Limits(deadline_s=6, min_rate=1024, window_s=2)


@pytest.mark.parametrize("what", ["index", "manifest"])
def test_a_small_read_cut_short_is_read_again(what, artifact, proxy, bucket):
    store, manifest, _ = artifact
    full = store.get_index_bytes("m")[0] if what == "index" else store.get_manifest_bytes(manifest.build_key)
    rule = proxy.add(path_contains="/index/" if what == "index" else "/manifests/", reset_after=len(full) // 2)
    http = via_proxy(proxy, bucket)
    got = http.get_index_bytes("m")[0] if what == "index" else http.get_manifest_bytes(manifest.build_key)
    assert rule.hits == 1 and got == full


def test_a_small_read_cut_short_every_time_is_a_store_error(artifact, proxy, bucket):
    store, manifest, _ = artifact
    proxy.add(path_contains="/manifests/", reset_after=40, times=-1)
    with pytest.raises(StoreError, match=r"40 of \d+ bytes") as caught:
        read_manifest(via_proxy(proxy, bucket), manifest.build_key)
    assert not isinstance(caught.value, IntegrityError)  # not "manifest is not JSON": the store, not the artifact


@pytest.mark.parametrize("fault", [{"trickle_bps": 10}, {"stall_after": 20}])
@pytest.mark.parametrize("what", ["index", "manifest", "channel"])
def test_a_trickling_or_stalled_small_read_is_abandoned_with_a_clear_error(what, fault, artifact, proxy, bucket):
    store, manifest, _ = artifact
    path = {"index": "/index/", "manifest": "/manifests/", "channel": "/channels/"}[what]
    proxy.add(path_contains=path, times=-1, **fault)
    if what == "channel":
        store.put_channel_file("stable", "timestamp.json", b"{}" * 200)
    http = HttpStore(f"{proxy.url}/{bucket}/farm", limits=QUICK)
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        if what == "index":
            http.get_index_bytes("m")
        elif what == "manifest":
            http.get_manifest_bytes(manifest.build_key)
        else:
            http.open_channel_file("stable", "timestamp.json").read()
    took = time.monotonic() - started
    assert took < QUICK.deadline_s + 3, took
    assert "\n" not in str(caught.value) and caught.value.hint


def test_load_from_a_trickling_store_fails_fast_in_one_line(artifact, proxy, bucket, cli):
    """Through the CLI, with the default window and deadline and only the rate floor set (docs/environment.md)."""
    proxy.add(path_contains="/index/", trickle_bps=10, times=-1)
    started = time.monotonic()
    proc = cli(
        "fetch",
        "m/c",
        "--device",
        "cpu",
        "--store",
        f"{proxy.url}/{bucket}/farm",
        env={"ENGINEFARM_HTTP_MIN_RATE": "1024"},
    )
    took = time.monotonic() - started
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "floor" in proc.stderr, proc.stderr
    assert took < 25, took


def test_slowdown_503_during_publish_is_retried(bucket, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = open_store(f"s3://{bucket}/farm")
    src = tmp_path / "a"
    src.mkdir()
    (src / "f").write_bytes(b"payload" * 1000)
    files, blobs = pack_files(src, [("f", "weights")], tmp_path / "blobs")
    manifest = make_manifest("slow", files[0].sha256, files[0].size)
    manifest = manifest.__class__(**{**manifest.__dict__, "files": tuple(files)})
    rule = proxy.add(method="PUT", path_contains="/farm/", status=503, times=3)
    assert publish(store, manifest, blobs) is True
    assert rule.hits == 3
    assert read_manifest(store, manifest.build_key) == manifest
    assert set(read_index(store, "m").entries) == {manifest.build_key}
    assert publish(store, manifest, blobs) is False  # idempotent: nothing rewritten


UPLOADER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from enginefarm.cache.stores.s3 import S3Store
    store = S3Store(sys.argv[1], part_size=5 << 20, multipart_threshold=6 << 20)
    marker = Path(sys.argv[3])
    def progress(n):
        marker.touch()
        time.sleep(30)   # hang after the first part, so the test can kill us mid-upload
    store.put_blob(sys.argv[2], Path(sys.argv[4]), progress=progress)
""")


def test_kill_9_during_multipart_upload_leaves_no_object(bucket, s3_env, tmp_path):
    data = os.urandom(12 << 20)
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "big").write_bytes(data)
    marker = tmp_path / "part-sent"
    proc = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, f"s3://{bucket}/farm", digest, str(marker), str(tmp_path / "big")]
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "uploader died or never sent a part"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    store = open_store(f"s3://{bucket}/farm")
    assert not store.has_blob(digest)
    assert list(store.list_manifest_keys()) == []
    uploads = (
        boto3.client("s3", endpoint_url=s3_env.url, region_name="us-east-1")
        .list_multipart_uploads(Bucket=bucket)
        .get("Uploads", [])
    )
    assert len(uploads) == 1, "the parts exist only as an incomplete upload, invisible to readers"


CRASHER = textwrap.dedent("""
    import os, sys, json
    from pathlib import Path
    from enginefarm.cache.artifacts import pack_files, publish
    from enginefarm.cache.manifest import Manifest
    from enginefarm.cache.stores import open_store
    store = open_store(sys.argv[1])
    src = Path(sys.argv[2])
    files, blobs = pack_files(src, [("f", "weights")], src.parent / "crash-blobs")
    manifest = Manifest.from_dict({**json.loads(sys.argv[3]), "files": [f.__dict__ for f in files]})
    if sys.argv[4] == "crash":
        store.put_manifest_bytes = lambda *a: os._exit(9)   # the process dies between blobs and manifest
    publish(store, manifest, blobs)
    print(json.dumps(sorted(blobs)))
""")


def _manifest_json(seed: str, **provenance) -> str:
    data = make_manifest(seed, "0" * 64, 1).to_dict()
    data["provenance"] = provenance
    return json.dumps(data)


def test_crash_between_blobs_and_manifest_never_exposes_a_manifest(bucket, s3_env, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(os.urandom(5000))
    url = f"s3://{bucket}/farm"
    proc = subprocess.run(
        [sys.executable, "-c", CRASHER, url, str(tmp_path / "src"), _manifest_json("crash"), "crash"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 9
    store = open_store(url)
    assert list(store.list_manifest_keys()) == []
    assert read_index(store, "m").entries == {}
    assert len(list(store.list_blobs())) == 1  # an orphan blob, for `enginefarm gc`
    from enginefarm.cache.artifacts import plan_gc

    assert len(plan_gc(store, grace_s=0).to_delete) == 1
    assert plan_gc(store, grace_s=3600).to_delete == []


def test_four_concurrent_publishers_of_one_job(bucket, s3_env, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"same artifact bytes" * 1000)
    url = f"s3://{bucket}/farm"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CRASHER, url, str(tmp_path / "src"), _manifest_json("race", writer=i), "ok"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [o[1][-500:] for o in outs]
    store = open_store(url)
    (key,) = store.list_manifest_keys()
    stored = read_manifest(store, key)
    assert stored.provenance["writer"] in range(4)
    assert all(store.has_blob(f.stored_sha256) for f in stored.files)
    assert set(read_index(store, "m").entries) == {key}


def test_concurrent_builders_keep_each_others_index_entries(bucket, s3_env, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x" * 100)
    url = f"s3://{bucket}/farm"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CRASHER, url, str(tmp_path / "src"), _manifest_json(f"job{i}"), "ok"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(6)
    ]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    store = open_store(url)
    assert set(read_index(store, "m").entries) == set(store.list_manifest_keys())
    assert len(set(store.list_manifest_keys())) == 6
