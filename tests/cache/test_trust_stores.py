"""The release flow through every store: maintained in S3 (moto on loopback), loaded through S3 and through
plain HTTP GETs of the same public bucket, with attacks refused the same way."""

from __future__ import annotations

import pytest

import enginefarm
from enginefarm.cache.stores import open_store
from enginefarm.cache.trust import repo
from enginefarm.errors import TrustError
from tests.releases import REF, Attacker, released


@pytest.fixture
def s3_release(bucket, s3_env, tmp_path):
    store = open_store(f"s3://{bucket}/farm")
    keys, a, b, root = released(store, tmp_path)
    return store, keys, a, b, root, f"{s3_env.url}/{bucket}/farm"


@pytest.mark.parametrize("reader", ["s3", "http"])
def test_release_flow(s3_release, reader, monkeypatch, tmp_path):
    store, keys, a, b, root, http_url = s3_release
    url = store.url if reader == "s3" else http_url
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / f"device-{reader}"))
    load = lambda: enginefarm.load(REF, device="cpu", store=url, channel="stable", trusted_root=root)  # noqa: E731
    assert load().artifact.build_key == a.build_key
    repo.promote(store, "stable", keys, [b.build_key])
    assert load().artifact.build_key == b.build_key
    repo.yank(store, "stable", keys, lambda custom: custom["build_key"] != b.build_key)
    assert load().artifact.build_key == a.build_key
    repo.rotate(store, "stable", keys, "timestamp")
    repo.refresh(store, "stable", keys)
    assert load().artifact.build_key == a.build_key

    attacker = Attacker(store, "stable", keys)
    old = attacker.raw("timestamp.json")
    repo.refresh(store, "stable", keys)
    assert load().artifact.build_key == a.build_key
    attacker.put_raw("timestamp.json", old)
    with pytest.raises(TrustError) as caught:
        load()
    assert caught.value.reason == "rollback"

    attacker.put_raw("timestamp.json", b"{" * (1 << 20))
    with pytest.raises(TrustError) as caught:
        load()
    assert caught.value.reason == "too-long"


def test_an_unreachable_store_falls_back_to_the_last_verified_release(s3_release, monkeypatch, tmp_path):
    from tests.servers import free_port

    store, keys, a, b, root, http_url = s3_release
    monkeypatch.setenv("ENGINEFARM_HOME", str(tmp_path / "device"))
    session = enginefarm.load(REF, device="cpu", store=http_url, channel="stable", trusted_root=root)
    # The same URL's metadata stays on the device; point the app at a dead port under the same store URL.
    from enginefarm.cache.trust.client import trust_dir

    dead = f"http://127.0.0.1:{free_port()}/x"
    trust_dir(tmp_path / "device", http_url, "stable").rename(trust_dir(tmp_path / "device", dead, "stable"))
    again = enginefarm.load(REF, device="cpu", store=dead, channel="stable", trusted_root=root)
    assert again.artifact.build_key == session.artifact.build_key == a.build_key
    assert "store unreachable" in again.explain()
