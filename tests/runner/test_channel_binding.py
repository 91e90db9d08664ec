"""Channels that cannot be swapped (issue 17, finding 1): every signed file names its channel and repository, so a
file of one channel never verifies as another's, with keys shared (as `release init --keys` encourages) or not.
A refused replay changes nothing the device trusts: once the genuine files are back, the channel loads again."""

from __future__ import annotations

import json
import shutil

import pytest

from enginefarm.cache.stores import open_store
from enginefarm.cache.trust import binding, repo
from enginefarm.errors import ArtifactNotFoundError, TrustError
from tests.releases import Attacker, released
from tests.runner.test_release_attacks import App, refused


@pytest.fixture
def two_channels(tmp_path, monkeypatch):
    """stable releases a; beta, made with the same keys, releases b and has moved to higher versions. An app
    has loaded a from stable."""
    store = open_store(tmp_path / "store")
    keys, a, b, root = released(store, tmp_path)
    repo.init(store, "beta", keys)  # the same keys folder: what docs/releases.md suggests
    repo.promote(store, "beta", keys, [b.build_key])
    for _ in range(3):
        repo.yank(store, "beta", keys, lambda custom: False)
        repo.promote(store, "beta", keys, [b.build_key])
    app = App(store, root, tmp_path / "device")
    assert app.load(monkeypatch).artifact.build_key == a.build_key
    return store, keys, a, b, app


def channel_dir(store, name: str):
    return store.root / "channels" / name


def replay_beta_into_stable(store) -> dict[str, bytes]:
    """What the issue's attacker did: copy beta's current timestamp, snapshot and targets into stable. Returns
    stable's own files, to restore them."""
    stable, beta = channel_dir(store, "stable"), channel_dir(store, "beta")
    saved = {p.name: p.read_bytes() for p in stable.iterdir()}
    timestamp = json.loads((beta / "timestamp.json").read_text())["signed"]
    snapshot_version = timestamp["meta"]["snapshot.json"]["version"]
    targets_version = json.loads((beta / f"{snapshot_version}.snapshot.json").read_text())["signed"]["meta"][
        "targets.json"
    ]["version"]
    for name in ("timestamp.json", f"{snapshot_version}.snapshot.json", f"{targets_version}.targets.json"):
        shutil.copyfile(beta / name, stable / name)
    return saved


def restore(store, saved: dict[str, bytes]) -> None:
    stable = channel_dir(store, "stable")
    for path in stable.iterdir():
        if path.name not in saved:
            path.unlink()
    for name, data in saved.items():
        (stable / name).write_bytes(data)


def test_every_role_names_its_channel_and_repository(two_channels):
    store = two_channels[0]
    stable, beta = repo.Channel(store, "stable").load(), repo.Channel(store, "beta").load()
    for role in ("root", "targets", "snapshot", "timestamp"):
        assert binding.of(getattr(stable, role).signed)["channel"] == "stable"
        assert binding.of(getattr(beta, role).signed)["channel"] == "beta"
    assert binding.of(stable.root.signed)["repository"] != binding.of(beta.root.signed)["repository"]


def test_beta_files_replayed_into_stable_are_refused_and_stable_recovers(two_channels, monkeypatch, tmp_path):
    store, keys, a, b, app = two_channels
    saved = replay_beta_into_stable(store)
    error = refused(app, monkeypatch, reason="channel")  # a device that trusted stable: nothing it trusts changed
    assert "beta" in str(error)
    fresh = App(store, app.root, tmp_path / "fresh-device")
    refused(fresh, monkeypatch, reason="channel")
    restore(store, saved)  # the genuine files are back: no rollback lock-out
    assert app.load(monkeypatch).artifact.build_key == a.build_key
    assert fresh.load(monkeypatch).artifact.build_key == a.build_key


def test_a_root_of_another_channel_with_the_same_keys_is_refused_in_the_chain(two_channels, monkeypatch):
    store, keys, a, b, app = two_channels
    repo.refresh(store, "beta", keys, ["root"])  # beta's 2.root.json is signed by the shared root key
    shutil.copyfile(channel_dir(store, "beta") / "2.root.json", channel_dir(store, "stable") / "2.root.json")
    refused(app, monkeypatch, reason="channel")
    (channel_dir(store, "stable") / "2.root.json").unlink()
    assert app.load(monkeypatch).artifact.build_key == a.build_key


def test_the_same_channel_name_in_another_store_is_refused(two_channels, monkeypatch, tmp_path):
    """A staging store's `stable`, made with the same keys, copied over the production one."""
    store, keys, a, b, app = two_channels
    staging = open_store(tmp_path / "staging")
    from tests.releases import artifact

    artifact(staging, tmp_path, "b", p50=0.001, scale=2.0)
    repo.init(staging, "stable", keys)
    repo.promote(staging, "stable", keys, [b.build_key])
    for _ in range(3):
        repo.refresh(staging, "stable", keys, ["targets", "snapshot", "timestamp"])
    for name in ("timestamp.json", "5.snapshot.json", "5.targets.json"):
        shutil.copyfile(channel_dir(staging, "stable") / name, channel_dir(store, "stable") / name)
    refused(app, monkeypatch, reason="channel")


def test_the_maintainer_tools_refuse_a_mixed_up_channel(two_channels):
    """`promote` would otherwise re-sign beta's release as stable's."""
    store, keys, a, b, app = two_channels
    replay_beta_into_stable(store)
    with pytest.raises(TrustError) as caught:
        repo.promote(store, "stable", keys, [a.build_key])
    assert caught.value.reason == "channel"


def strip_binding(store, channel: str, keys) -> None:
    """Make `channel` look like one created before bindings: every role re-signed without the field."""
    attacker = Attacker(store, channel, keys)
    state = attacker.state()
    for role in ("root", "targets", "snapshot", "timestamp"):
        getattr(state, role).signed.unrecognized_fields.pop(binding.FIELD, None)
        attacker.sign(getattr(state, role), role, state.root)
    attacker.put("1.root.json", state.root)
    attacker.put("root.json", state.root)
    attacker.put(f"{state.targets.signed.version}.targets.json", state.targets)
    attacker.put(f"{state.snapshot.signed.version}.snapshot.json", state.snapshot)
    attacker.put("timestamp.json", state.timestamp)


def test_a_channel_from_before_bindings_loads_and_is_bound_by_a_root_refresh(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    keys, a, b, root = released(store, tmp_path)
    strip_binding(store, "stable", keys)
    root.write_bytes(repo.root_bytes(store, "stable"))  # the app shipped the legacy root
    assert binding.of(repo.Channel(store, "stable").load().root.signed) is None
    app = App(store, root, tmp_path / "device")
    assert app.load(monkeypatch).artifact.build_key == a.build_key  # legacy channels keep working

    repo.refresh(store, "stable", keys, ["root"])  # the upgrade: binds the channel and re-signs every role
    state = repo.Channel(store, "stable").load()
    bound = binding.of(state.root.signed)
    assert bound["channel"] == "stable" and all(
        binding.of(getattr(state, r).signed) == bound for r in ("targets", "snapshot", "timestamp")
    )
    assert app.load(monkeypatch).artifact.build_key == a.build_key  # the app followed the root chain

    repo.init(store, "beta", keys)
    repo.promote(store, "beta", keys, [b.build_key])
    for _ in range(4):
        repo.refresh(store, "beta", keys, ["targets", "snapshot", "timestamp"])
    replay_beta_into_stable(store)
    refused(app, monkeypatch, reason="channel")


def test_a_legacy_device_refuses_files_naming_another_channel(tmp_path, monkeypatch):
    """Before a channel is bound, its devices cannot check the repository, but a file naming another channel
    is still refused."""
    store = open_store(tmp_path / "store")
    keys, a, b, root = released(store, tmp_path)
    strip_binding(store, "stable", keys)
    root.write_bytes(repo.root_bytes(store, "stable"))
    app = App(store, root, tmp_path / "device")
    app.load(monkeypatch)
    repo.init(store, "beta", keys)
    for _ in range(4):
        repo.promote(store, "beta", keys, [b.build_key])
    replay_beta_into_stable(store)
    refused(app, monkeypatch, reason="channel")


def test_a_yank_says_yanked(tmp_path, monkeypatch):
    """Finding 8: a load after every release of the component was withdrawn says so, instead of "build one"."""
    store = open_store(tmp_path / "store")
    keys, a, b, root = released(store, tmp_path)
    app = App(store, root, tmp_path / "device")
    app.load(monkeypatch)
    repo.yank(store, "stable", keys, lambda custom: False)
    with pytest.raises(ArtifactNotFoundError, match="yanked from channel stable") as caught:
        app.load(monkeypatch)
    assert a.build_key[:12] in str(caught.value) and "build" not in caught.value.hint
    with pytest.raises(ArtifactNotFoundError, match="yanked"):  # and on the next load too
        app.load(monkeypatch)
