"""An app loading from a signed channel refuses every attack: each with a typed refusal (TrustError or
IntegrityError), the last trusted metadata kept, and nothing cached. Runs against the local store; the main
flow also runs against S3 (moto) and HTTP in tests/cache/test_trust_stores.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import enginefarm
from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.stores import open_store
from enginefarm.cache.trust import repo
from enginefarm.cache.trust.client import trust_dir
from enginefarm.errors import IntegrityError, OfflineError, TrustError
from tests.releases import REF, Attacker, artifact, past, released, snapshot_files


class App:
    """A device with its own cache, loading REF from the stable channel of one store."""

    def __init__(self, store, root: Path, home: Path) -> None:
        self.store, self.root, self.home = store, root, home

    def load(self, monkeypatch, **kwargs):
        monkeypatch.setenv("ENGINEFARM_HOME", str(self.home))
        return enginefarm.load(
            REF, device="cpu", store=self.store.url, channel="stable", trusted_root=self.root, **kwargs
        )

    @property
    def trusted(self) -> Path:
        return trust_dir(self.home, self.store.url, "stable")

    def state(self) -> tuple[dict, list[str]]:
        cache = DeviceCache(self.home)
        leftovers = list(cache.tmp.glob("*")) if cache.tmp.is_dir() else []
        return snapshot_files(self.trusted), sorted(e.manifest.build_key for e in cache.entries()) + [
            str(p) for p in leftovers
        ]


@pytest.fixture
def release(tmp_path, monkeypatch):
    """A store with artifacts a (released) and b (published, not released); a channel; an app that loaded a once."""
    store = open_store(tmp_path / "store")
    keys, a, b, root = released(store, tmp_path)
    app = App(store, root, tmp_path / "device")
    assert app.load(monkeypatch).artifact.build_key == a.build_key
    return store, keys, a, b, app


def refused(app, monkeypatch, kind=TrustError, reason=None):
    """On a device that loaded before, nothing changes; on a fresh one, no artifact and no manifest is kept."""
    fresh = not app.trusted.exists()
    before = app.state()
    with pytest.raises(kind) as caught:
        app.load(monkeypatch)
    if reason is not None:
        assert caught.value.reason in ((reason,) if isinstance(reason, str) else reason), caught.value
    if fresh:  # a manifest that matched its signed hashes may stay (it is release metadata); no artifact may
        assert app.state()[1] == [], "a refusal must cache nothing"
        if kind is TrustError:
            assert not list(app.trusted.glob("manifests/*"))
    else:
        assert app.state() == before, "a refusal must keep the trusted metadata and cache nothing"
    return caught.value


def test_only_signed_targets_are_candidates(release, monkeypatch):
    store, keys, a, b, app = release
    session = app.load(monkeypatch)
    assert session.artifact.build_key == a.build_key  # b is faster and in the index, but not released
    assert b.build_key[:12] not in session.explain() and "channel stable" in session.explain()
    assert session.run({"x": np.ones((1, 8), np.float32)})["y"].shape == (1, 8)


def test_promote_then_yank_changes_what_loads(release, monkeypatch):
    store, keys, a, b, app = release
    repo.promote(store, "stable", keys, [b.build_key])
    assert app.load(monkeypatch).artifact.build_key == b.build_key  # measured faster
    repo.yank(store, "stable", keys, lambda custom: custom["build_key"] != b.build_key)
    assert app.load(monkeypatch).artifact.build_key == a.build_key


def test_a_cached_artifact_outside_the_channel_is_not_used(release, monkeypatch, tmp_path):
    """The unsigned b was loaded earlier without a channel; in the channel it is not a candidate at all."""
    store, keys, a, b, app = release
    monkeypatch.setenv("ENGINEFARM_HOME", str(app.home))
    assert enginefarm.load(REF, device="cpu", store=store.url).artifact.build_key == b.build_key
    assert app.load(monkeypatch).artifact.build_key == a.build_key


# Rollback ---------------------------------------------------------------------------------------------------
def test_timestamp_rollback(release, monkeypatch):
    store, keys, a, b, app = release
    attacker = Attacker(store, "stable", keys)
    old = attacker.raw("timestamp.json")
    repo.promote(store, "stable", keys, [b.build_key])
    app.load(monkeypatch)
    attacker.put_raw("timestamp.json", old)  # a replay of the older, validly signed timestamp
    refused(app, monkeypatch, reason="rollback")


def test_timestamp_rollback_when_the_local_copy_has_expired(release, monkeypatch):
    """An expired trusted timestamp still guards its version: a fresher-looking older one is refused."""
    store, keys, a, b, app = release
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    local = state.timestamp
    local.signed.version += 5
    local.signed.expires = past()
    attacker.sign(local, "timestamp", state.root)
    from tuf.api.serialization.json import JSONSerializer

    (app.trusted / "timestamp.json").write_bytes(local.to_bytes(JSONSerializer()))
    refused(app, monkeypatch, reason="rollback")


def test_snapshot_rollback(release, monkeypatch):
    """A stolen timestamp key pointing at an older snapshot."""
    store, keys, a, b, app = release
    repo.promote(store, "stable", keys, [b.build_key])
    app.load(monkeypatch)
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    state.timestamp.signed.version += 1
    state.timestamp.signed.snapshot_meta.version -= 1
    attacker.sign(state.timestamp, "timestamp", state.root)
    attacker.put("timestamp.json", state.timestamp)
    refused(app, monkeypatch, reason="rollback")


@pytest.mark.parametrize("local_expired", [False, True])
def test_snapshot_that_rolls_targets_back(release, monkeypatch, local_expired):
    """Stolen timestamp and snapshot keys: a new snapshot that names an older targets version."""
    store, keys, a, b, app = release
    repo.promote(store, "stable", keys, [b.build_key])
    app.load(monkeypatch)
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    if local_expired:
        from tuf.api.serialization.json import JSONSerializer

        state.snapshot.signed.expires = past()
        attacker.sign(state.snapshot, "snapshot", state.root)
        (app.trusted / "snapshot.json").write_bytes(state.snapshot.to_bytes(JSONSerializer()))
        state = attacker.state()
    state.snapshot.signed.version += 1
    state.snapshot.signed.meta["targets.json"].version -= 1
    attacker.publish_snapshot(state)
    before_targets = (app.trusted / "targets.json").read_bytes()
    with pytest.raises(TrustError) as caught:
        app.load(monkeypatch)
    assert caught.value.reason == "rollback"
    assert (app.trusted / "targets.json").read_bytes() == before_targets


@pytest.mark.parametrize("local_expired", [False, True])
def test_targets_rollback(release, monkeypatch, local_expired):
    """No keys: the store serves the old targets file under the new version's name."""
    store, keys, a, b, app = release
    attacker = Attacker(store, "stable", keys)
    if local_expired:
        state = attacker.state()
        from tuf.api.serialization.json import JSONSerializer

        state.targets.signed.expires = past()
        attacker.sign(state.targets, "targets", state.root)
        (app.trusted / "targets.json").write_bytes(state.targets.to_bytes(JSONSerializer()))
    old = attacker.raw("2.targets.json")
    repo.promote(store, "stable", keys, [b.build_key])
    attacker.put_raw("3.targets.json", old)
    before_targets = (app.trusted / "targets.json").read_bytes()
    with pytest.raises(TrustError) as caught:
        app.load(monkeypatch)
    assert caught.value.reason == "rollback"
    assert (app.trusted / "targets.json").read_bytes() == before_targets
    assert sorted(e.manifest.build_key for e in DeviceCache(app.home).entries()) == [a.build_key]


# Freeze -----------------------------------------------------------------------------------------------------
def test_freeze_with_an_expired_timestamp(release, monkeypatch):
    store, keys, a, b, app = release
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    state.timestamp.signed.version += 1
    state.timestamp.signed.expires = past()
    attacker.sign(state.timestamp, "timestamp", state.root)
    attacker.put("timestamp.json", state.timestamp)
    error = refused(app, monkeypatch, reason="expired")
    assert "release refresh" in error.hint


def test_offline_uses_the_last_verified_release_until_it_expires(release, monkeypatch):
    store, keys, a, b, app = release
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")
    repo.promote(store, "stable", keys, [b.build_key])  # not seen offline
    session = app.load(monkeypatch)
    assert session.artifact.build_key == a.build_key and "offline" in session.explain()
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    state.timestamp.signed.expires = past()
    attacker.sign(state.timestamp, "timestamp", state.root)
    from tuf.api.serialization.json import JSONSerializer

    (app.trusted / "timestamp.json").write_bytes(state.timestamp.to_bytes(JSONSerializer()))
    refused(app, monkeypatch, reason="expired")


def test_offline_without_any_verified_metadata_is_a_clear_error(release, monkeypatch, tmp_path):
    store, keys, a, b, app = release
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")
    with pytest.raises(OfflineError, match="go online|no verified release metadata"):
        App(store, app.root, tmp_path / "new-device").load(monkeypatch)


# Mix-and-match, tampering -----------------------------------------------------------------------------------
def test_another_builds_manifest_at_the_released_path(release, monkeypatch, tmp_path):
    store, keys, a, b, app = release
    fresh = App(store, app.root, tmp_path / "fresh-device")
    manifest_a = Path(store.url) / "manifests" / f"{a.build_key}.json"
    manifest_a.write_bytes((Path(store.url) / "manifests" / f"{b.build_key}.json").read_bytes())
    refused(fresh, monkeypatch, reason=("hash", "too-long"))
    assert app.load(monkeypatch).artifact.build_key == a.build_key  # a device that verified it before keeps its copy


def test_a_target_whose_signed_fields_disagree_with_its_manifest(release, monkeypatch, tmp_path):
    """A targets key holder (or a bug) releases b's manifest labelled as an fp16 build: the manifest says fp32."""
    from tuf.api.metadata import TargetFile

    store, keys, a, b, app = release
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    raw = store.get_manifest_bytes(b.build_key)
    entry = TargetFile.from_data(f"manifests/{b.build_key}.json", raw, ["sha256"])
    custom = repo.describe(b)
    claimed = {
        **json.loads(custom["entry"]),
        "precision": "fp16",
        "benchmarks": [{"device": {"class": "cpu-any"}, "p50_ms": 0.0001}],
    }
    custom.update(precision="fp16", entry=json.dumps(claimed))
    entry.unrecognized_fields["custom"] = custom
    state.targets.signed.targets[entry.path] = entry
    attacker.ch.commit(state, "targets", attacker.signers)
    fresh = App(store, app.root, tmp_path / "fresh-device")
    session = fresh.load(monkeypatch)  # the mislabelled target ranks first, is refused, and the real release loads
    assert session.artifact.build_key == a.build_key and "release says otherwise" in session.explain()
    assert [e.manifest.build_key for e in DeviceCache(fresh.home).entries()] == [a.build_key]
    state = attacker.state()
    del state.targets.signed.targets[f"manifests/{a.build_key}.json"]
    attacker.ch.commit(state, "targets", attacker.signers)
    refused(App(store, app.root, tmp_path / "fresh-device-2"), monkeypatch, reason="mismatch")


def test_tampered_blob(release, monkeypatch, tmp_path):
    store, keys, a, b, app = release
    blob = Path(store.url) / "blobs" / "sha256" / a.files[0].stored_sha256[:2] / a.files[0].stored_sha256
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    refused(App(store, app.root, tmp_path / "fresh-device"), monkeypatch, kind=IntegrityError)


def test_arbitrary_blob_in_place_of_the_released_one(release, monkeypatch, tmp_path):
    store, keys, a, b, app = release
    blob = Path(store.url) / "blobs" / "sha256" / a.files[0].stored_sha256[:2] / a.files[0].stored_sha256
    other = Path(store.url) / "blobs" / "sha256" / b.files[0].stored_sha256[:2] / b.files[0].stored_sha256
    blob.chmod(0o644)
    blob.write_bytes(other.read_bytes())
    refused(App(store, app.root, tmp_path / "fresh-device"), monkeypatch, kind=IntegrityError)


# Endless data -----------------------------------------------------------------------------------------------
def test_endless_timestamp(release, monkeypatch):
    store, keys, a, b, app = release
    path = Path(store.url) / "channels" / "stable" / "timestamp.json"
    with open(path, "wb") as handle:
        handle.truncate(64 << 20)  # 64 MiB; the client must stop after its 16 KiB limit
    refused(app, monkeypatch, reason="too-long")


def test_endless_manifest(release, monkeypatch, tmp_path):
    store, keys, a, b, app = release
    path = Path(store.url) / "manifests" / f"{a.build_key}.json"
    path.chmod(0o644)
    with open(path, "ab") as handle:
        handle.write(b" " * (8 << 20))
    refused(App(store, app.root, tmp_path / "fresh-device"), monkeypatch, reason="too-long")


# Signatures and keys ----------------------------------------------------------------------------------------
def test_fewer_signatures_than_the_threshold(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    keys = tmp_path / "keys"
    a = artifact(store, tmp_path, "a")
    b = artifact(store, tmp_path, "b", p50=0.001)
    repo.init(store, "stable", keys, thresholds={"targets": 2})
    repo.promote(store, "stable", keys, [a.build_key])
    root = tmp_path / "root.json"
    root.write_bytes(repo.root_bytes(store, "stable"))
    app = App(store, root, tmp_path / "device")
    app.load(monkeypatch)
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    from tuf.api.metadata import TargetFile

    entry = TargetFile.from_data(f"manifests/{b.build_key}.json", store.get_manifest_bytes(b.build_key), ["sha256"])
    entry.unrecognized_fields["custom"] = repo.describe(b)
    state.targets.signed.targets[entry.path] = entry
    state.targets.signed.version += 1
    attacker.sign(state.targets, "targets", state.root, only=1)  # one of the two keys the root asks for
    attacker.put(f"{state.targets.signed.version}.targets.json", state.targets)
    state.snapshot.signed.version += 1
    state.snapshot.signed.meta["targets.json"].version = state.targets.signed.version
    attacker.publish_snapshot(state)
    before_targets = (app.trusted / "targets.json").read_bytes()
    with pytest.raises(TrustError) as caught:
        app.load(monkeypatch)
    assert caught.value.reason == "signature"
    assert (app.trusted / "targets.json").read_bytes() == before_targets
    assert sorted(e.manifest.build_key for e in DeviceCache(app.home).entries()) == [a.build_key]


def test_maintainer_cannot_sign_below_the_threshold(tmp_path):
    store = open_store(tmp_path / "store")
    keys = tmp_path / "keys"
    a = artifact(store, tmp_path, "a")
    repo.init(store, "stable", keys, thresholds={"targets": 2})
    next(keys.glob("targets-*.key")).unlink()
    with pytest.raises(TrustError, match="needs 2 of its 2 key"):
        repo.promote(store, "stable", keys, [a.build_key])


def test_fast_forward_recovery_after_timestamp_key_rotation(release, monkeypatch):
    store, keys, a, b, app = release
    attacker = Attacker(store, "stable", keys)
    good = attacker.raw("timestamp.json")
    state = attacker.state()
    state.timestamp.signed.version = 10**6  # a stolen timestamp key fast-forwards every client
    attacker.sign(state.timestamp, "timestamp", state.root)
    attacker.put("timestamp.json", state.timestamp)
    app.load(monkeypatch)
    attacker.put_raw("timestamp.json", good)  # the maintainers restore the channel...
    refused(app, monkeypatch, reason="rollback")  # ...which clients refuse until the stolen key is revoked
    repo.rotate(store, "stable", keys, "timestamp")
    session = app.load(monkeypatch)
    assert session.artifact.build_key == a.build_key
    import json

    assert json.loads((app.trusted / "timestamp.json").read_bytes())["signed"]["version"] < 10**6
    assert list((keys / "retired").glob("timestamp-*.key"))


def test_root_rotation_with_threshold_is_followed_by_old_clients(release, monkeypatch):
    store, keys, a, b, app = release
    repo.rotate(store, "stable", keys, "root", threshold=2)
    repo.promote(store, "stable", keys, [b.build_key])
    assert app.load(monkeypatch).artifact.build_key == b.build_key  # the app still ships root v1
    assert json_version(app.trusted / "root.json") == 2
    attacker = Attacker(store, "stable", keys)
    state = attacker.state()
    state.root.signed.version += 1
    attacker.sign(state.root, "root", state.root, only=1)  # one of the two new root keys
    attacker.put(f"{state.root.signed.version}.root.json", state.root)
    refused(app, monkeypatch, reason="signature")


def json_version(path: Path) -> int:
    return json.loads(path.read_bytes())["signed"]["version"]


def test_channel_needs_a_trusted_root(release, monkeypatch):
    from enginefarm.errors import ConfigError

    store, keys, a, b, app = release
    with pytest.raises(ConfigError, match="needs the channel's root"):
        enginefarm.load(REF, device="cpu", store=store.url, channel="stable")


def test_a_root_from_another_channel_is_refused(release, monkeypatch, tmp_path):
    store, keys, a, b, app = release
    repo.init(store, "beta", tmp_path / "other-keys")
    other_root = tmp_path / "beta-root.json"
    other_root.write_bytes(repo.root_bytes(store, "beta"))
    refused(App(store, other_root, tmp_path / "fresh-device"), monkeypatch, reason="channel")


@pytest.mark.parametrize("content", [b"not json", b'{"signed": {}, "signatures": []}'])
def test_a_broken_trusted_root_is_a_clear_error(release, monkeypatch, tmp_path, content):
    store, keys, a, b, app = release
    broken = tmp_path / "broken-root.json"
    broken.write_bytes(content)
    with pytest.raises(TrustError, match="not valid TUF root metadata"):
        App(store, broken, tmp_path / "fresh-device").load(monkeypatch)


# Root expiry (issue 25): its own reason and a hint that works; maintainers are warned well before ------------------
def _expire_root(store, keys) -> None:
    """The maintainer's root, re-signed as the next version with an expiry in the past: what a year after `release
    init` looks like to every client (the default root lifetime is 1y)."""
    maintainer = Attacker(store, "stable", keys)
    state = maintainer.state()
    state.root.signed.version += 1
    state.root.signed.expires = past()
    maintainer.sign(state.root, "root", state.root)
    maintainer.put(f"{state.root.signed.version}.root.json", state.root)
    maintainer.put("root.json", state.root)


def test_an_expired_root_says_so_and_its_hint_renews_it(release, monkeypatch):
    """Before: reason `expired` with the hint `release refresh`, which renews only the timestamp and does not help."""
    store, keys, a, b, app = release
    _expire_root(store, keys)
    cached = app.state()[1]
    for _ in range(2):  # as it expired; then after what the old hint said (`release refresh`: the timestamp only)
        with pytest.raises(TrustError) as caught:
            app.load(monkeypatch)
        error = caught.value
        assert (
            error.reason == "root-expired" and "the channel's root has expired" in str(error) and "\n" not in str(error)
        )
        assert (
            "release refresh --role root" in error.hint and app.state()[1] == cached
        )  # the root is signed: ngclient keeps it
        repo.refresh(store, "stable", keys)
    repo.refresh(store, "stable", keys, {"root"})  # what the new hint says
    assert app.load(monkeypatch).artifact.build_key == a.build_key
