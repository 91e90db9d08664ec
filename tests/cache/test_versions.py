"""Model versions: how they order, which one load() serves, and `gc --keep-versions` on a store and the cache."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from enginefarm.cache.manifest import ArtifactFile, Manifest
from enginefarm.cache.prune import older_versions
from enginefarm.cache.versions import by_age, newest, same_version, version_key
from tests.conftest import build_tiny_store, builds, run_cli, tiny_store_env


@pytest.mark.parametrize(
    "older,newer",
    [
        ("9", "10"),
        ("1.9", "1.10"),
        ("1", "2"),
        ("2rc1", "2"),
        ("2beta", "2rc1"),
        ("2", "2.1"),
        ("2.1", "2.1.1"),
        ("2024-05-01", "2024-11-30"),
        ("dev", "0"),
        ("", "dev"),
        ("alpha", "beta"),
        ("v9", "v10"),
        ("1.0.9", "1.1"),
    ],
)
def test_versions_order_as_people_read_them(older, newer):
    assert version_key(older) < version_key(newer), (older, newer)
    assert newest([newer, older]) == newer and newest([older, newer]) == newer


@pytest.mark.parametrize("a,b", [("2", "2.0"), ("2", "2.0.0"), ("v2", "2"), ("RC", "rc"), ("0", "0.0")])
def test_equal_spellings_are_the_same_version(a, b):
    assert same_version(a, b) and version_key(a) == version_key(b)


def test_by_age_lists_each_version_once_newest_first():
    assert by_age(["1", "10", "2.0", "2", "9", None]) == ["10", "9", "2.0", "1", None]


def _manifest(seed: str, version: str, component: str = "vae", blob: str = "") -> Manifest:
    digest = hashlib.sha256((blob or seed).encode()).hexdigest()
    return Manifest(
        build_key=hashlib.sha256(seed.encode()).hexdigest(),
        model="m",
        model_version=version,
        component=component,
        precision="fp32",
        profile_name="p",
        profile={},
        target="onnxruntime:cpu",
        toolchain={},
        files=(ArtifactFile("model.onnx", "model", 1, digest, "none", 1, digest),),
    )


def test_older_versions_are_chosen_per_component():
    manifests = [
        _manifest("a1", "1"),
        _manifest("a2", "2"),
        _manifest("a10", "10"),
        _manifest("a10b", "10.0"),
        _manifest("u1", "1", component="unet"),
    ]  # the unet has only version 1: it stays
    removed, kept = older_versions(manifests, keep=2)
    assert sorted(m.model_version for m in removed) == ["1"] and removed[0].component == "vae"
    assert kept == {"m/unet": ["1"], "m/vae": ["10", "2"]}
    with pytest.raises(ValueError):
        older_versions(manifests, keep=0)


# End to end: real builds, the CLI, the store and the cache ------------------------------------------------
@pytest.fixture(scope="module")
@builds
def two_versions_built(tmp_path_factory):
    """tiny-sd version 1 (fp32 + fp16) and version 2 (fp32 only) in one store, built once by the real CLI. Same
    source: the fp32 ONNX blob is shared by both versions, the fp16 one belongs to version 1 alone."""
    root = tmp_path_factory.mktemp("versions")
    store = build_tiny_store(root, ("fp32", "fp16"), ("onnxruntime:cpu",))
    v2 = root / "v2.toml"
    v2.write_text(
        (root / "recipe.toml")
        .read_text()
        .replace('version = "1"', 'version = "2"')
        .replace('precisions = ["fp32", "fp16"]', 'precisions = ["fp32"]')
    )
    run_cli("build", str(v2), "--no-bench", env=tiny_store_env(root), check=True)
    return store


@pytest.fixture
def two_versions(two_versions_built, tmp_path):
    """The two versions in this test's store (a copy: the tests gc it), its cache empty."""
    shutil.copytree(two_versions_built, tmp_path / "store", dirs_exist_ok=True)
    return tmp_path / "store"


def _index(store) -> dict:
    return json.loads((store / "index" / "tiny-sd.json").read_text())["entries"]


def _feeds():
    return {"latent": np.zeros((1, 4, 8, 8), np.float32)}


def test_load_serves_the_newest_version_unless_pinned(two_versions, cli):
    import enginefarm

    versions = sorted(e["model_version"] for e in _index(two_versions).values())
    assert versions == ["1", "1", "2"]
    session = enginefarm.load("tiny-sd/decoder", device="cpu")
    assert session.artifact.model_version == "2" and session.artifact.precision == "fp32"
    explained = session.explain()
    assert "newest model version" in explained and " v2 [" in explained and "older model version 1" in explained
    pinned = enginefarm.load("tiny-sd/decoder", device="cpu", version="1")
    assert pinned.artifact.model_version == "1" and "model version 1 (pinned)" in pinned.explain()
    assert (
        enginefarm.load("tiny-sd/decoder", device="cpu", precision="fp16").artifact.model_version == "1"
    )  # only v1 has fp16
    np.save(two_versions.parent / "x.npy", _feeds()["latent"])
    proc = cli("run", "tiny-sd/decoder", "--version", "7", "--input", f"latent={two_versions.parent / 'x.npy'}")
    assert proc.returncode == 1 and "has model version 7" in proc.stderr and "versions stored: 2, 1" in proc.stderr
    proc = cli("fetch", "tiny-sd/decoder", "--version", "1", "--explain", check=True)
    assert " v1 [" in proc.stdout


def test_a_cached_old_version_never_wins_over_a_stored_new_one(tiny_recipe, cli, tmp_path, monkeypatch):
    """The reported bug: a store holding only version 2 still served version 1 from the local cache."""
    import enginefarm

    v1 = tiny_recipe(name="v1.toml")
    cli("build", str(v1), "--store", str(tmp_path / "old-store"), check=True)
    first = enginefarm.load("tiny-sd/decoder", device="cpu", store=str(tmp_path / "old-store"))
    assert first.artifact.model_version == "1"  # now cached
    v2 = v1.with_name("v2.toml")
    v2.write_text(v1.read_text().replace('version = "1"', 'version = "2"'))
    cli("build", str(v2), "--store", str(tmp_path / "new-store"), check=True)
    session = enginefarm.load("tiny-sd/decoder", device="cpu", store=str(tmp_path / "new-store"))
    assert session.artifact.model_version == "2"
    # the cached v1 came from another store: never a candidate for this one's (issue 25), and the explanation says so
    assert "came from another store and were not considered" in session.explain()
    monkeypatch.setenv("ENGINEFARM_OFFLINE", "1")  # offline: the newest in the cache (now both are there)
    assert enginefarm.load("tiny-sd/decoder", device="cpu").artifact.model_version == "2"


def test_ls_shows_versions_newest_first(two_versions, cli):
    rows = json.loads(cli("ls", "--json", check=True).stdout)
    assert [r["model_version"] for r in rows] == ["2", "1", "1"]
    assert "version" in cli("ls", check=True).stdout


def test_gc_keep_versions_is_a_dry_run_until_delete(two_versions, cli):
    store = two_versions
    before = sorted(p.name for p in store.rglob("*") if p.is_file())
    proc = cli("gc", "--store", str(store), "--keep-versions", "1", check=True)
    assert proc.stdout.count("would remove tiny-sd/decoder v1") == 2 and "would remove blob" in proc.stdout
    assert sorted(p.name for p in store.rglob("*") if p.is_file()) == before


def test_gc_keep_versions_removes_old_manifests_and_only_their_blobs(two_versions, cli):
    import enginefarm
    from enginefarm.cache.artifacts import read_manifest
    from enginefarm.cache.stores import open_store

    store = open_store(two_versions)
    entries = _index(two_versions)
    old = [k for k, e in entries.items() if e["model_version"] == "1"]
    (new,) = [k for k, e in entries.items() if e["model_version"] == "2"]
    kept_blobs = {f.stored_sha256 for f in read_manifest(store, new).files}
    old_blobs = {f.stored_sha256 for k in old for f in read_manifest(store, k).files}
    assert kept_blobs & old_blobs and old_blobs - kept_blobs  # one shared blob, one of version 1 alone
    store.put_cache_object(f"validation/{old[0]}/settings.json", b"{}")  # a re-validation verdict of an old artifact

    proc = cli("gc", "--store", str(two_versions), "--keep-versions", "1", "--delete", check=True)
    assert "2 artifacts of older versions and 1 blobs removed; kept versions tiny-sd/decoder: 2" in proc.stdout
    assert set(_index(two_versions)) == {new}
    assert all(read_manifest(store, k) is None for k in old) and read_manifest(store, new) is not None
    assert all(store.has_blob(d) for d in kept_blobs), "a blob a kept manifest uses is never removed"
    assert not any(store.has_blob(d) for d in old_blobs - kept_blobs)
    assert store.list_cache_objects(f"validation/{old[0]}") == []
    assert enginefarm.load("tiny-sd/decoder", device="cpu").run(_feeds())["sample"].shape == (1, 3, 16, 16)
    again = cli("gc", "--store", str(two_versions), "--keep-versions", "1", "--delete", check=True)
    assert "0 artifacts of older versions and 0 blobs removed" in again.stdout


def test_cache_gc_keep_versions_evicts_older_cached_versions(two_versions, cli):
    import enginefarm
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.settings import load_settings

    enginefarm.load("tiny-sd/decoder", device="cpu", version="1")
    enginefarm.load("tiny-sd/decoder", device="cpu")
    cache = DeviceCache(load_settings().home)
    assert sorted(e.manifest.model_version for e in cache.entries()) == ["1", "2"]
    proc = cli("cache", "gc", "--keep-versions", "1", check=True)
    assert "evicted tiny-sd/decoder v1" in proc.stdout
    assert [e.manifest.model_version for e in cache.entries()] == ["2"]
    assert cli("gc", "--store", str(two_versions), "--keep-versions", "0").returncode == 2  # click: N must be >= 1


def test_a_channel_serves_the_version_it_released(tmp_path, monkeypatch):
    """A newer version in the store does not reach an app that loads from a release channel until it is promoted."""
    import dataclasses

    import enginefarm
    from enginefarm.cache.artifacts import pack_files, publish
    from enginefarm.cache.stores import open_store
    from enginefarm.cache.trust import repo
    from tests import models
    from tests.releases import REF, released

    store = open_store(tmp_path / "store")
    keys, a, _, root = released(store, tmp_path)
    models.linear(tmp_path / "v2" / "model.onnx", scale=3.0)
    files, blobs = pack_files(tmp_path / "v2", [("model.onnx", "model")], tmp_path / "v2-blobs")
    newer = dataclasses.replace(a, build_key=hashlib.sha256(b"v2").hexdigest(), model_version="2", files=tuple(files))
    publish(store, newer, blobs)
    assert enginefarm.load(REF, device="cpu", store=store.url).artifact.model_version == "2"
    in_channel = enginefarm.load(REF, device="cpu", store=store.url, channel="stable", trusted_root=root)
    assert in_channel.artifact.build_key == a.build_key and in_channel.artifact.model_version == "1"
    repo.promote(store, "stable", keys, [newer.build_key])
    assert (
        enginefarm.load(REF, device="cpu", store=store.url, channel="stable", trusted_root=root).artifact.model_version
        == "2"
    )
