"""The maintainer's side of a release channel (`enginefarm release`): create it, promote and yank artifacts,
renew the timestamp, rotate keys. Every change is signed with python-tuf and written targets → snapshot →
timestamp, so a reader sees the old release or the new one, never a mix: the timestamp is written last."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from enginefarm.errors import ArtifactNotFoundError, StoreError, TrustError

from ..index import IndexEntry
from ..manifest import Manifest
from ..stores.base import Store
from . import ROLES, binding, require_tuf, target_path
from .keys import generate, load_signers, retire, role_files

log = logging.getLogger(__name__)

DAY = 86400
# Root, targets and snapshot are re-signed by people; the timestamp by CI, so it can be short-lived: a client
# that has not seen a fresh timestamp within this time refuses the channel (freeze attack).
DEFAULT_EXPIRES = {"root": 365 * DAY, "targets": 365 * DAY, "snapshot": 365 * DAY, "timestamp": 2 * DAY}
POLICY_FIELD = "x-enginefarm-expires"  # in root: each role's lifetime in seconds, so CI renews with the same policy
_READ_LIMIT = 16 << 20


@dataclass
class State:
    root: Any  # Metadata[Root]
    targets: Any
    snapshot: Any
    timestamp: Any


def describe(manifest: Manifest) -> dict[str, Any]:
    """The signed custom fields of a target. The runtime resolves from `entry` and refuses a manifest whose own
    fields differ from these (an artifact of another model, target or build served at this path)."""
    import json

    # `entry` is JSON text: TUF's canonical JSON has no floats, and benchmarks are floats.
    return {
        "model": manifest.model,
        "component": manifest.component,
        "precision": manifest.precision,
        "target": manifest.target,
        "build_key": manifest.build_key,
        "entry": json.dumps(IndexEntry.of(manifest).to_dict(), sort_keys=True),
    }


class Channel:
    def __init__(self, store: Store, name: str, keys_dir: Path | None = None) -> None:
        require_tuf()
        self.store, self.name, self.keys_dir = store, name, keys_dir

    # Reading ---------------------------------------------------------------------------------------------
    def _read(self, name: str):
        from tuf.api.metadata import Metadata

        with self.store.open_channel_file(self.name, name) as handle:
            data = handle.read(_READ_LIMIT + 1)
        if len(data) > _READ_LIMIT:
            raise TrustError(f"channel {self.name}: {name} is larger than {_READ_LIMIT} bytes", reason="too-long")
        try:
            return Metadata.from_bytes(data)
        except Exception as exc:
            raise TrustError(f"channel {self.name}: {name} is not TUF metadata ({exc})", reason="invalid") from None

    def exists(self) -> bool:
        try:
            self.store.open_channel_file(self.name, "root.json").close()
            return True
        except ArtifactNotFoundError:
            return False

    def load(self) -> State:
        """The channel's current metadata, each role checked against the root's keys and thresholds."""
        from tuf.api.exceptions import UnsignedMetadataError

        try:
            root = self._read("root.json")
        except ArtifactNotFoundError:
            raise TrustError(
                f"channel {self.name} does not exist in {self.store.url}",
                reason="missing",
                hint=f"create it with `enginefarm release init --channel {self.name} --store {self.store.url} --keys "
                "DIR`",
            ) from None
        timestamp = self._read("timestamp.json")
        snapshot = self._read(f"{timestamp.signed.snapshot_meta.version}.snapshot.json")
        targets = self._read(f"{snapshot.signed.meta['targets.json'].version}.targets.json")
        state = State(root, targets, snapshot, timestamp)
        for role in ROLES:
            try:
                metadata = getattr(state, role)
                root.signed.verify_delegate(role, metadata.signed_bytes, metadata.signatures)
            except UnsignedMetadataError as exc:
                raise TrustError(
                    f"channel {self.name} in {self.store.url}: {role} metadata does not verify ({exc})",
                    reason="signature",
                    hint="someone without the keys changed the channel; restore it from a backup",
                ) from None
        # Signatures alone do not tell channels that share keys apart: never re-sign another channel's files as ours.
        bound = binding.of(root.signed)
        for role in ROLES:
            metadata = getattr(state, role)
            binding.check(metadata.to_bytes(), self.name, bound, f"channel {self.name} in {self.store.url}, {role}")
        return state

    def expires(self, root) -> dict[str, int]:
        return {**DEFAULT_EXPIRES, **root.signed.unrecognized_fields.get(POLICY_FIELD, {})}

    # Signing and writing ---------------------------------------------------------------------------------
    def _signers(self):
        if self.keys_dir is None:
            raise TrustError("signing needs --keys DIR", reason="keys")
        return load_signers(self.keys_dir)

    def _sign(self, metadata, role: str, roots: Iterable[Any], signers: dict) -> None:
        """Sign with every key in the keys folder that `role` accepts in each of `roots` (both the old and the
        new root when root itself changes), and refuse if any root's threshold is not met."""
        metadata.signatures.clear()
        for root in roots:
            wanted = root.roles[role]
            have = [signers[k] for k in wanted.keyids if k in signers]
            if len(have) < wanted.threshold:
                raise TrustError(
                    f"signing {role} of channel {self.name} needs {wanted.threshold} of its {len(wanted.keyids)} "
                    f"key(s); {len(have)} found in {self.keys_dir}",
                    reason="keys",
                    hint=f"put the {role} key file(s) (from `release init`) into {self.keys_dir}",
                )
            for signer in have:
                if signer.public_key.keyid not in metadata.signatures:
                    metadata.sign(signer, append=True)

    def _renew(self, metadata, role: str, root, bump: bool = True) -> None:
        if bump:
            metadata.signed.version += 1
        metadata.signed.expires = _in(self.expires(root)[role])

    def _write(self, state: State, roles: Iterable[str]) -> None:
        from tuf.api.serialization.json import JSONSerializer

        def put(name: str, metadata) -> None:
            self.store.put_channel_file(self.name, name, metadata.to_bytes(JSONSerializer(compact=False)))

        roles = set(roles)
        if not self.store.writable:
            raise StoreError(
                f"store {self.store.url} is read-only",
                hint="run release commands against the bucket (s3://…) or directory",
            )
        if "root" in roles:
            put(f"{state.root.signed.version}.root.json", state.root)
            put("root.json", state.root)
        if "targets" in roles:
            put(f"{state.targets.signed.version}.targets.json", state.targets)
        if "snapshot" in roles:
            put(f"{state.snapshot.signed.version}.snapshot.json", state.snapshot)
        put("timestamp.json", state.timestamp)  # last: the switch to the new release

    def commit(
        self, state: State, changed: str, signers: dict | None = None, *, root_changed: bool = False, bump: bool = True
    ) -> State:
        """Re-sign `changed` and every role below it (targets → snapshot → timestamp), then write them
        (the root first when it changed)."""
        from tuf.api.metadata import MetaFile

        signers = signers if signers is not None else self._signers()
        root = state.root.signed
        order = ["targets", "snapshot", "timestamp"]
        todo = order[order.index(changed) :] if changed in order else order
        bound = binding.of(root)
        for role in todo:
            binding.stamp(getattr(state, role).signed, bound)
        if "targets" in todo:
            self._renew(state.targets, "targets", state.root, bump)
            self._sign(state.targets, "targets", [root], signers)
        if "snapshot" in todo:
            state.snapshot.signed.meta["targets.json"] = MetaFile(version=state.targets.signed.version)
            self._renew(state.snapshot, "snapshot", state.root, bump)
            self._sign(state.snapshot, "snapshot", [root], signers)
        state.timestamp.signed.snapshot_meta = MetaFile(version=state.snapshot.signed.version)
        self._renew(state.timestamp, "timestamp", state.root, bump)
        self._sign(state.timestamp, "timestamp", [root], signers)
        self._write(state, todo + (["root"] if root_changed or changed == "root" else []))
        return state


def _in(seconds: int) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)


# The release commands -------------------------------------------------------------------------------------
def init(
    store: Store,
    channel: str,
    keys_dir: Path,
    thresholds: dict[str, int] | None = None,
    expires: dict[str, int] | None = None,
) -> State:
    """Create the channel's four roles. Keys already in `keys_dir` for a role are reused (one set of keys can
    serve several channels); missing ones are generated, as many as the role's threshold."""
    from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, Targets, Timestamp

    ch = Channel(store, channel, keys_dir)
    if ch.exists():
        raise TrustError(
            f"channel {channel} already exists in {store.url}",
            reason="exists",
            hint="promote into it, or rotate its keys with `enginefarm release rotate`",
        )
    thresholds = {role: 1 for role in ROLES} | (thresholds or {})
    policy = {**DEFAULT_EXPIRES, **(expires or {})}
    existing = load_signers(keys_dir) if keys_dir.is_dir() else {}
    root = Root(
        expires=_in(policy["root"]),
        consistent_snapshot=True,
        unrecognized_fields={POLICY_FIELD: policy, binding.FIELD: binding.new(channel)},
    )
    for role in ROLES:
        if thresholds[role] < 1:
            raise TrustError(f"threshold of {role} must be at least 1", reason="invalid")
        keyids = [path.stem.split("-", 1)[1] for path in role_files(keys_dir, role)]
        signers = [s for keyid, s in existing.items() if keyid[:8] in keyids]
        signers += [generate(keys_dir, role) for _ in range(thresholds[role] - len(signers))]
        for signer in signers:
            root.add_key(signer.public_key, role)
        root.roles[role].threshold = thresholds[role]
    state = State(
        Metadata(root), Metadata(Targets()), Metadata(Snapshot()), Metadata(Timestamp(snapshot_meta=MetaFile(1)))
    )
    loaded = load_signers(keys_dir)
    ch._sign(state.root, "root", [root], loaded)
    ch.commit(state, "root", loaded, bump=False)
    return state


def promote(store: Store, channel: str, keys_dir: Path, build_keys: Iterable[str]) -> list[Manifest]:
    """Add these artifacts to the channel's signed targets. Each manifest and every blob it names must be in the
    store."""
    from tuf.api.metadata import TargetFile

    ch = Channel(store, channel, keys_dir)
    state = ch.load()
    added = []
    for key in build_keys:
        raw = store.get_manifest_bytes(key)
        if raw is None:
            raise ArtifactNotFoundError(f"{store.url} has no manifest {key[:12]}")
        manifest = Manifest.from_json(raw, expect_key=key)
        missing = [f.path for f in manifest.files if not store.has_blob(f.stored_sha256)]
        if missing:
            raise ArtifactNotFoundError(
                f"{manifest.ref} [{key[:12]}] lacks blobs for {', '.join(missing)} in {store.url}; not promoted",
                hint="publish the artifact completely first (`enginefarm publish`)",
            )
        entry = TargetFile.from_data(target_path(key), raw, ["sha256"])
        entry.unrecognized_fields["custom"] = describe(manifest)
        state.targets.signed.targets[entry.path] = entry
        added.append(manifest)
    if added:
        ch.commit(state, "targets")
    return added


def yank(store: Store, channel: str, keys_dir: Path, keep: Callable[[dict], bool]) -> list[dict]:
    """Remove the targets for which `keep(custom)` is False. Returns the removed targets' custom fields."""
    ch = Channel(store, channel, keys_dir)
    state = ch.load()
    targets = state.targets.signed.targets
    removed = [targets.pop(path).custom for path in [p for p, t in targets.items() if not keep(t.custom or {})]]
    if removed:
        ch.commit(state, "targets")
    return removed


def refresh(store: Store, channel: str, keys_dir: Path, roles: Iterable[str] = ("timestamp",)) -> State:
    """Re-sign with renewed expiry: the timestamp (all that CI's online key can do), or more roles when their keys are
    here."""
    ch = Channel(store, channel, keys_dir)
    state = ch.load()
    roles = set(roles)
    signers = ch._signers()
    if "root" in roles:
        if (
            binding.of(state.root.signed) is None
        ):  # a channel from before bindings: bind it, and re-sign every role with it
            binding.stamp(state.root.signed, binding.new(channel))
            roles |= {"targets", "snapshot"}
            log.warning(
                "channel %s is now bound to its name and a new repository id; apps follow the new root on their next "
                "refresh",
                channel,
            )
        ch._renew(state.root, "root", state.root)
        ch._sign(state.root, "root", [state.root.signed], signers)
    top = next(role for role in ("targets", "snapshot", "timestamp") if role in roles | {"timestamp"})
    return ch.commit(state, top, signers, root_changed="root" in roles)


def rotate(store: Store, channel: str, keys_dir: Path, role: str, threshold: int | None = None) -> list[str]:
    """Replace every key of `role` with new ones (as many as the threshold). The new root is signed by the old
    root keys and, when root itself rotates, by the new ones too, so clients holding any older root can follow
    the chain. Metadata the role signs is re-signed at once; clients drop what the revoked keys signed (that
    is how they recover from a fast-forward attack with a stolen timestamp or snapshot key). Returns new keyids."""
    if role not in ROLES:
        raise TrustError(f"unknown role {role!r}", reason="invalid", hint=f"one of {', '.join(ROLES)}")
    ch = Channel(store, channel, keys_dir)
    state = ch.load()
    signers = ch._signers()
    from copy import deepcopy

    old_root = deepcopy(state.root.signed)
    root = state.root.signed
    threshold = threshold or root.roles[role].threshold
    old_keys = list(root.roles[role].keyids)
    new = [generate(keys_dir, role) for _ in range(threshold)]
    for keyid in old_keys:
        root.revoke_key(keyid, role)
    for signer in new:
        root.add_key(signer.public_key, role)
    root.roles[role].threshold = threshold
    ch._renew(state.root, "root", state.root)
    signers.update({s.public_key.keyid: s for s in new})
    ch._sign(state.root, "root", [old_root, root], signers)
    ch.commit(state, role, signers, root_changed=True)
    for keyid in old_keys:
        if all(keyid not in r.keyids for r in root.roles.values()):
            retire(keys_dir, keyid)
    return [s.public_key.keyid for s in new]


def listing(store: Store, channel: str) -> dict[str, Any]:
    """What `release ls` shows: each role's version, expiry and keys, and every signed target."""
    state = Channel(store, channel).load()
    roles = {}
    for role in ROLES:
        signed = getattr(state, role).signed
        spec = state.root.signed.roles[role]
        roles[role] = {
            "version": signed.version,
            "expires": signed.expires.isoformat(),
            "threshold": spec.threshold,
            "keys": len(spec.keyids),
        }
    targets = [
        {**(t.custom or {}), "length": t.length, "sha256": t.hashes.get("sha256")}
        for t in state.targets.signed.targets.values()
    ]
    for item in targets:
        item.pop("entry", None)
    return {
        "channel": channel,
        "store": store.url,
        "roles": roles,
        "targets": sorted(
            targets,
            key=lambda t: (t.get("model", ""), t.get("component", ""), t.get("target", ""), t.get("precision", "")),
        ),
    }


def root_expiry(store: Store, channel: str):
    """When the channel's current root expires (a datetime in UTC): every client stops loading from it then."""
    return Channel(store, channel).load().root.signed.expires


def root_bytes(store: Store, channel: str) -> bytes:
    """The channel's current root, verified: what an app ships as its trusted root."""
    from tuf.api.serialization.json import JSONSerializer

    return Channel(store, channel).load().root.to_bytes(JSONSerializer(compact=False))
