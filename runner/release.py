"""Resolution inside a signed release channel: candidates are the channel's targets only, and each manifest is
the one its target signs. The cache is reused only for artifacts identical to the released ones."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from enginefarm.cache.device_cache import DeviceCache
from enginefarm.cache.index import IndexEntry
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.stores import open_store
from enginefarm.cache.stores.base import Store
from enginefarm.errors import ConfigError
from enginefarm.settings import Settings

if TYPE_CHECKING:
    from enginefarm.cache.trust.client import ChannelClient


def open_channel(store: str | None, settings: Settings) -> tuple[ChannelClient, Store | None]:
    """(client, store to fetch blobs from or None offline). The app's shipped root is required."""
    from enginefarm.cache.trust.client import ChannelClient

    channel = settings.channel or "stable"
    if settings.trusted_root is None:
        raise ConfigError(
            f"channel {channel!r} needs the channel's root metadata (trusted_root=PATH or ENGINEFARM_TRUSTED_ROOT)",
            hint="ship the root.json from `enginefarm release export-root` with the app",
        )
    opened: Store = open_store(store or settings.store)  # no I/O yet: offline, only its URL is used
    client = ChannelClient(opened, channel, Path(settings.trusted_root), settings.home, offline=settings.offline)
    return client, (None if settings.offline else opened)


def released_entries(client: ChannelClient, model: str) -> list[tuple[IndexEntry, str]]:
    return [(entry, f"channel {client.channel}") for entry in client.entries(model)]


def released_manifest(client: ChannelClient, cache: DeviceCache, key: str) -> Manifest:
    manifest = client.manifest(key)
    cached = cache.manifest(key)
    if cached is not None and cached != manifest:
        cache.evict(key)  # built here or fetched outside this channel: not the released artifact
    return manifest
