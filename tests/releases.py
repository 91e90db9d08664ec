"""Helpers for release-channel tests: small real artifacts, and an attacker that writes channel metadata the
way someone holding some keys (or replaying old files) would. Described in one place, like tests/models.py."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

from enginefarm.cache.artifacts import pack_files, publish
from enginefarm.cache.manifest import Manifest
from tests import models

REF = "m/lin"


def artifact(
    store,
    tmp_path: Path,
    seed: str,
    *,
    target: str = "onnxruntime:cpu",
    precision: str = "fp32",
    p50: float | None = None,
    scale: float = 1.0,
    version: str = "1",
) -> Manifest:
    """Publish a real, loadable ONNX Runtime artifact of m/lin (y = x @ W * scale) and return its manifest."""
    src = tmp_path / f"src-{seed}"
    models.linear(src / "model.onnx", scale=scale)
    files, blobs = pack_files(src, [("model.onnx", "model")], tmp_path / f"blobs-{seed}")
    benches = () if p50 is None else ({"device": {"class": "cpu-any"}, "p50_ms": p50},)
    manifest = Manifest(
        build_key=hashlib.sha256(seed.encode()).hexdigest(),
        model="m",
        model_version=version,
        component="lin",
        precision=precision,
        profile_name="default",
        profile={"x": {"min": [1, 8], "opt": [1, 8], "max": [4, 8]}},
        target=target,
        toolchain={"onnxruntime": "1"},
        files=tuple(files),
        benchmarks=benches,
    )
    publish(store, manifest, blobs)
    return manifest


class Attacker:
    """Signs and writes channel metadata directly, with whatever keys are in `keys_dir`, bypassing every check
    the maintainer's commands make."""

    def __init__(self, store, channel: str, keys_dir: Path) -> None:
        from enginefarm.cache.trust.keys import load_signers
        from enginefarm.cache.trust.repo import Channel

        self.store, self.channel = store, channel
        self.ch = Channel(store, channel, keys_dir)
        self.signers = load_signers(keys_dir)

    def state(self):
        return self.ch.load()

    def raw(self, name: str) -> bytes:
        with self.store.open_channel_file(self.channel, name) as handle:
            return handle.read()

    def put_raw(self, name: str, data: bytes) -> None:
        self.store.put_channel_file(self.channel, name, data)

    def sign(self, metadata, role: str, root, *, only: int | None = None) -> None:
        metadata.signatures.clear()
        keyids = [k for k in root.signed.roles[role].keyids if k in self.signers][:only]
        for keyid in keyids:
            metadata.sign(self.signers[keyid], append=True)

    def publish_snapshot(self, state) -> None:
        """Sign and publish `state.snapshot` (its version already bumped), then a newer timestamp naming it."""
        self.sign(state.snapshot, "snapshot", state.root)
        self.put(f"{state.snapshot.signed.version}.snapshot.json", state.snapshot)
        state.timestamp.signed.version += 1
        state.timestamp.signed.snapshot_meta.version = state.snapshot.signed.version
        self.sign(state.timestamp, "timestamp", state.root)
        self.put("timestamp.json", state.timestamp)

    def put(self, name: str, metadata) -> None:
        from tuf.api.serialization.json import JSONSerializer

        self.put_raw(name, metadata.to_bytes(JSONSerializer(compact=False)))


def past() -> datetime:
    return (datetime.now(UTC) - timedelta(days=1)).replace(microsecond=0)


def snapshot_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (links followed) → bytes: to show a refusal changed nothing."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def released(store, tmp_path: Path, **init):
    """Artifacts a and b published in `store`, a channel `stable` (repo.init options in `init`) releasing only a,
    and the app's root.json. Returns (keys folder, a, b, root path)."""
    from enginefarm.cache.trust import repo

    keys = tmp_path / "keys"
    a = artifact(store, tmp_path, "a")
    b = artifact(store, tmp_path, "b", p50=0.001, scale=2.0)
    repo.init(store, "stable", keys, **init)
    repo.promote(store, "stable", keys, [a.build_key])
    root = tmp_path / "root.json"
    root.write_bytes(repo.root_bytes(store, "stable"))
    return keys, a, b, root
