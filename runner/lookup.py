"""What a load's lookup saw (`runner/load.py`), in its own module so that what reads it (`not_found.py`'s messages)
need not import the loader that makes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from enginefarm.cache.device_cache import DeviceCache
    from enginefarm.cache.stores.base import Store
    from enginefarm.cache.trust.client import ChannelClient
    from enginefarm.hardware.devices import Device
    from enginefarm.settings import Settings

    from .resolve import Resolution


@dataclass
class Lookup:
    """Everything resolution saw: the ranked candidates, where to fetch from, and why anything was left out."""

    resolution: Resolution
    devices: list[Device]
    cache: DeviceCache
    store: Store | None
    note: str
    settings: Settings
    release: ChannelClient | None = None  # the signed channel's client when resolving inside a release channel
    selectors: tuple[str, ...] = ()  # the caller's --target
    filtered_out: list = field(default_factory=list)  # index entries of the component that --target left out
    unreadable_index: str = ""  # why the store's index of the model could not be read (then nothing is listed)
    refusals: list[Exception] = field(default_factory=list)  # trust and integrity failures, raised if nothing loads
    stack_refusals: list[Exception] = field(default_factory=list)  # artifacts that cannot take the user's stack
