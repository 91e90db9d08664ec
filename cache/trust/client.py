"""The runtime's side of a release channel: python-tuf's ngclient, reading through our stores.

The app ships the channel's root.json (`trusted_root`). Each `load(channel=...)` refreshes the channel's
metadata with ngclient (root chain → timestamp → snapshot → targets: signatures, thresholds, versions,
expiry, length limits), then resolves only among its signed targets. A target's manifest must match its signed
length and sha256 and the target's custom fields; the manifest's sha256 per file then covers every blob.

Verified metadata is kept in ENGINEFARM_HOME/trust/<store+channel>/ (ngclient writes only what it verified).
Offline, or when the store cannot be reached, that metadata is handed back to ngclient, which verifies it again,
expiry included: the last verified release is used until its timestamp expires, and never after.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from enginefarm.errors import ArtifactNotFoundError, ConfigError, OfflineError, StoreError, TrustError

from ..atomic import write_bytes_atomic
from ..index import IndexEntry
from ..locks import file_lock
from ..manifest import Manifest
from ..stores.base import Store
from . import binding, require_tuf, target_path

if TYPE_CHECKING:
    from tuf.api.metadata import TargetFile

log = logging.getLogger(__name__)

_BASE = "store:/"  # ngclient builds URLs from these; our fetchers map them back to store reads
_CHUNK = 64 << 10
CHECKED_FIELDS = ("model", "component", "precision", "target", "build_key")


def _fetchers():
    from tuf.api.exceptions import DownloadError, DownloadHTTPError
    from tuf.ngclient import FetcherInterface

    class StoreFetcher(FetcherInterface):
        """Channel metadata and target manifests from an enginefarm store (local, S3 or HTTP), as streams:
        ngclient stops reading at the length it allows, so endless data costs nothing. Metadata of another
        channel is refused here, before ngclient trusts and stores it (binding.py)."""

        def __init__(self, store: Store, channel: str) -> None:
            self.store, self.channel = store, channel
            self.trusted: Callable[[], dict | None] = lambda: None  # the binding of the root trusted now

        def _fetch(self, url: str) -> Iterator[bytes]:
            rel = url.removeprefix(_BASE)
            try:
                if rel.startswith(f"channels/{self.channel}/"):
                    stream = self.store.open_channel_file(self.channel, rel.rsplit("/", 1)[-1])
                    try:
                        data = b"".join(_chunks_upto(stream, binding._LIMIT + 1))
                    finally:
                        stream.close()
                    binding.check(
                        data,
                        self.channel,
                        self.trusted(),
                        f"channel {self.channel} of {self.store.url}, {rel.rsplit('/', 1)[-1]}",
                    )
                    return iter([data])
                elif rel.startswith("manifests/") and rel.endswith(".json"):
                    stream = self.store.open_manifest(rel[len("manifests/") : -len(".json")])
                else:
                    raise DownloadError(f"no such release file: {url}")
            except ArtifactNotFoundError:
                raise DownloadHTTPError(f"{rel} not found in {self.store.url}", 404) from None
            except StoreError as exc:
                if getattr(exc, "status", None) == 403:  # what public buckets answer for a missing object
                    raise DownloadHTTPError(f"{rel}: access denied in {self.store.url}", 403) from None
                raise
            return _chunks(stream)

    class ReplayFetcher(FetcherInterface):
        """Offline: hands the last verified metadata back to ngclient, which checks it again as if it were new."""

        def __init__(self, folder: Path, channel: str) -> None:
            self.folder, self.channel = folder, channel
            self.trusted: Callable[[], dict | None] = lambda: None

        def _fetch(self, url: str) -> Iterator[bytes]:
            name = url.rsplit("/", 1)[-1]
            role = name.split(".")[-2]
            path = self.folder / f"{role}.json"
            if role == "root" or not path.is_file():  # no newer root offline; ngclient keeps the trusted one
                raise DownloadHTTPError(f"{name} is not available offline", 404)
            data = path.read_bytes()
            binding.check(
                data, self.channel, self.trusted(), f"channel {self.channel} (verified earlier on this device), {name}"
            )
            return iter([data])

    return StoreFetcher, ReplayFetcher


def _chunks_upto(stream, limit: int) -> Iterator[bytes]:
    while limit > 0 and (chunk := stream.read(min(_CHUNK, limit))):
        limit -= len(chunk)
        yield chunk


def _chunks(stream) -> Iterator[bytes]:
    try:
        while chunk := stream.read(_CHUNK):
            yield chunk
    finally:
        stream.close()


def refusal(exc: Exception, what: str) -> TrustError:
    """A python-tuf failure as one typed, user-facing refusal."""
    from tuf.api import exceptions as tuf_errors

    reasons = [
        (
            tuf_errors.BadVersionNumberError,
            "rollback",
            "older metadata than this device already trusts was served (rollback)",
        ),
        (tuf_errors.ExpiredMetadataError, "expired", "metadata has expired (a frozen or stale channel)"),
        (tuf_errors.UnsignedMetadataError, "signature", "metadata is not signed by enough trusted keys"),
        (tuf_errors.LengthOrHashMismatchError, "hash", "a file does not match its signed length and hashes"),
        (tuf_errors.DownloadLengthMismatchError, "too-long", "a file is longer than its signed or allowed length"),
    ]
    known = next(((reason, text) for kind, reason, text in reasons if isinstance(exc, kind)), None)
    if known is not None:
        reason, text = known
    elif isinstance(exc, tuf_errors.DownloadHTTPError) and exc.status_code in (403, 404):
        reason, text = "missing", "release metadata is missing"
    else:
        reason, text = "invalid", "release metadata is invalid"
    if reason == "expired" and "root" in str(exc):  # python-tuf: "Final root.json is expired", "New root is expired"
        reason, text = (
            "root-expired",
            "the channel's root has expired; nothing loads from it until its maintainers renew it",
        )
    hint = {
        "expired": "the channel's maintainers must run `enginefarm release refresh`; if this device is offline, go "
        "online once",
        "root-expired": "the channel's maintainers must renew the root with its keys: `enginefarm release refresh "
        "--role root` (or `release rotate root`); apps follow the renewed root on their next load, with the root.json "
        "they ship",
        "missing": "check the store URL and the channel name",
    }.get(reason, "nothing was loaded or cached; report it to whoever publishes this store")
    return TrustError(f"{what}: {text} ({exc})", hint=hint, reason=reason)


def trust_dir(home: Path, store_url: str, channel: str) -> Path:
    return home / "trust" / hashlib.sha256(f"{store_url}\n{channel}".encode()).hexdigest()[:16]


class ChannelClient:
    """The verified state of one channel of one store on this device."""

    def __init__(self, store: Store, channel: str, trusted_root: Path, home: Path, *, offline: bool = False) -> None:
        require_tuf()
        self.store, self.channel = store, channel
        self.what = f"channel {channel} of {store.url}"
        self.dir = trust_dir(home, store.url, channel)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = home / "locks" / f"trust-{self.dir.name}.lock"
        self.offline = offline
        self.note = ""
        try:
            self.root = Path(trusted_root).read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the trusted root {trusted_root}: {exc.strerror}",
                hint="ship the channel's root.json with the app (`enginefarm release export-root`)",
            ) from None
        if offline:
            self._refresh(offline=True)
            self.note = f"offline: using the release metadata of {self.what} verified earlier"
            return
        try:
            self._refresh(offline=False)
        except StoreError as exc:  # the network, not the metadata: fall back to what was verified before
            if not (self.dir / "timestamp.json").is_file():
                raise
            log.warning("%s unreachable (%s); using the release metadata verified earlier", self.what, exc)
            self._refresh(offline=True)
            self.note = f"store unreachable: using the release metadata of {self.what} verified earlier"

    def _refresh(self, offline: bool) -> None:
        from tuf.ngclient import UpdaterConfig

        store_fetcher, replay_fetcher = _fetchers()
        if offline and not (self.dir / "timestamp.json").is_file():
            raise OfflineError(
                f"no verified release metadata for {self.what} on this device yet",
                hint="go online once (unset ENGINEFARM_OFFLINE)",
            )
        fetcher = replay_fetcher(self.dir, self.channel) if offline else store_fetcher(self.store, self.channel)
        config = UpdaterConfig(prefix_targets_with_hash=False)  # targets are manifests/<build-key>.json, written once
        # ngclient writes each file atomically; the lock only keeps two processes from refreshing at once.
        with file_lock(self.lock, timeout=60):
            self._refresh_locked(fetcher, config)

    def _refresh_locked(self, fetcher, config) -> None:
        from tuf.api.exceptions import DownloadError, DownloadHTTPError, RepositoryError
        from tuf.ngclient import Updater

        try:
            self.updater = Updater(
                str(self.dir),
                f"{_BASE}channels/{self.channel}/",
                str(self.dir / "manifests"),
                _BASE,
                fetcher,
                config,
                bootstrap=self.root,
            )
        except (RepositoryError, ValueError, KeyError, TypeError) as exc:
            raise TrustError(
                f"the trusted root for {self.what} is not valid TUF root metadata ({exc})",
                reason="invalid",
                hint="ship the root.json from `enginefarm release export-root`",
            ) from None
        bound = self._trusted_binding()
        if bound is not None and bound.get("channel") != self.channel:
            raise TrustError(
                f"the trusted root is the root of channel {bound.get('channel')!r}, not of {self.what}",
                reason="channel",
                hint="ship the root.json of this channel (`enginefarm release export-root --channel NAME`)",
            )
        fetcher.trusted = self._trusted_binding
        previous = self._released()
        try:
            self.updater.refresh()
        except (RepositoryError, DownloadHTTPError) as exc:
            raise refusal(exc, self.what) from None
        except DownloadError as exc:
            if isinstance(exc.__cause__, (StoreError, TrustError)):
                raise exc.__cause__ from None
            raise refusal(exc, self.what) from None
        self._note_yanked(previous)

    def _trusted_binding(self) -> dict | None:
        """The binding of the root ngclient trusts right now (its root chain may advance during a refresh): what
        every file must carry. Read from ngclient's trusted set; if a python-tuf release hides it, from the newest
        root ngclient persisted (it writes only roots it verified), else the shipped one."""
        trusted = getattr(self.updater, "_trusted_set", None)
        if trusted is not None:
            return binding.of(trusted.root)
        from tuf.api.metadata import Metadata

        history = sorted(self.dir.glob("root_history/*.root.json"), key=lambda p: int(p.name.split(".")[0]))
        return binding.of(Metadata.from_bytes(history[-1].read_bytes() if history else self.root).signed)

    # Yanked artifacts ---------------------------------------------------------------------------------------
    def _released(self) -> dict[str, dict]:
        """build key → custom fields of the targets this device trusts now (before a refresh: the previous release)."""
        from tuf.api.metadata import Metadata, Targets

        try:
            targets = Metadata[Targets].from_bytes((self.dir / "targets.json").read_bytes()).signed.targets
        except Exception:  # none yet, or unreadable: nothing to compare with
            return {}
        return {str(t.custom.get("build_key")): dict(t.custom) for t in targets.values() if isinstance(t.custom, dict)}

    def _note_yanked(self, previous: dict[str, dict]) -> None:
        """Remember what a refresh withdrew, so a load that finds nothing says "yanked" instead of "build one"."""
        record = self.dir / "yanked.json"
        try:
            yanked = json.loads(record.read_text()) if record.is_file() else {}
        except ValueError:
            yanked = {}
        now = self._released()
        yanked = {
            k: v for k, v in {**yanked, **{k: v for k, v in previous.items() if k not in now}}.items() if k not in now
        }
        write_bytes_atomic(record, json.dumps(yanked, sort_keys=True).encode())

    def yanked(self, model: str) -> list[dict]:
        """Custom fields of `model`'s artifacts this device saw released and then withdrawn."""
        try:
            yanked = json.loads((self.dir / "yanked.json").read_text())
        except (OSError, ValueError):
            return []
        return [v for v in yanked.values() if isinstance(v, dict) and v.get("model") == model]

    # What the channel holds --------------------------------------------------------------------------------
    def targets(self) -> dict[str, TargetFile]:
        """path → TargetFile of the verified targets metadata."""
        from tuf.api.metadata import Metadata, Targets

        signed = Metadata[Targets].from_bytes((self.dir / "targets.json").read_bytes()).signed.targets
        return {path: info for path, info in signed.items() if self.updater.get_targetinfo(path) == info}

    def entries(self, model: str) -> list[IndexEntry]:
        """Index entries of `model`'s released artifacts, from the signed custom fields. A malformed target is
        skipped with a warning naming it; the others still resolve."""
        found = []
        for path, info in self.targets().items():
            custom = info.custom if isinstance(info.custom, dict) else {}
            if custom.get("model") != model or path != target_path(str(custom.get("build_key"))):
                continue
            try:
                entry = IndexEntry.from_dict(json.loads(custom.get("entry") or ""), model)
            except (TypeError, ValueError, RecursionError) as exc:  # FieldError is a ValueError
                log.warning("skipping %s, target %s: its entry is malformed (%s)", self.what, path, exc)
                continue
            if any(getattr(entry, f) != custom.get(f) for f in CHECKED_FIELDS if f != "model"):
                log.warning("skipping %s, target %s: its entry disagrees with its signed fields", self.what, path)
                continue  # resolution only trusts entries that agree with their own fields
            found.append(entry)
        return found

    def manifest(self, build_key: str) -> Manifest:
        """The released manifest of `build_key`, matching its signed length, sha256 and custom fields."""
        from tuf.api.exceptions import DownloadError, RepositoryError

        info = self.updater.get_targetinfo(target_path(build_key))
        if info is None:
            raise TrustError(
                f"{build_key[:12]} is not released in {self.what}", reason="missing", hint="it may have been yanked"
            )
        path = self.dir / "manifests" / f"{build_key}.json"
        if self.updater.find_cached_target(info, str(path)) is None:
            if self.offline or self.note:
                raise OfflineError(
                    f"the manifest of {build_key[:12]} was never fetched on this device", hint="go online once"
                )
            try:
                self.updater.download_target(info, str(path))
            except (RepositoryError, DownloadError) as exc:
                if isinstance(exc.__cause__, StoreError):
                    raise exc.__cause__ from None
                raise refusal(exc, f"{self.what}, manifest {build_key[:12]}") from None
        try:
            manifest = Manifest.from_json(path.read_bytes(), expect_key=build_key)
            custom = info.custom if isinstance(info.custom, dict) else {}
            wrong = [f for f in CHECKED_FIELDS if getattr(manifest, f) != custom.get(f)]
            if wrong:
                raise TrustError(
                    f"{self.what}: the manifest at {info.path} is {manifest.ref} {manifest.target} "
                    f"{manifest.precision} [{manifest.build_key[:12]}], but its release says otherwise "
                    f"({', '.join(wrong)})",
                    reason="mismatch",
                    hint="nothing was loaded or cached; the channel's targets are inconsistent, report it to its "
                    "maintainers",
                )
        except Exception:
            path.unlink(missing_ok=True)
            raise
        return manifest
