"""Which channel a piece of signed metadata belongs to.

Channels of one store, and of other stores, may share keys (`release init` reuses a keys folder), so a valid
signature alone does not say which channel signed a file: beta's targets, snapshot and timestamp verify under
stable's root too. Every role therefore carries, inside its signed part, the channel's name and the id of the
repository it was created in (random, minted by `release init`):

    "x-enginefarm-channel": {"channel": "stable", "repository": "<32 hex>"}

The root names it; every other role must name the same. A client checks each file *before* python-tuf accepts
and stores it (in its fetcher), so a file of another channel is refused without touching what the device
trusts: no rollback lock-out once the genuine files are back.

Channels created before the binding (no field in root) are read as before, except that a file naming another
channel is refused; `enginefarm release refresh --role root` binds such a channel (the next root carries the
field), and clients that follow the root chain from then on require it on every file.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from enginefarm.errors import TrustError

FIELD = "x-enginefarm-channel"
_LIMIT = 16 << 20  # larger than any role python-tuf accepts by default; beyond it, python-tuf refuses on its own


def new(channel: str) -> dict[str, str]:
    return {"channel": channel, "repository": secrets.token_hex(16)}


def of(signed: Any) -> dict[str, str] | None:
    """The binding of a python-tuf Signed object (None for a channel made before bindings)."""
    value = signed.unrecognized_fields.get(FIELD)
    return value if isinstance(value, dict) else None


def stamp(signed: Any, binding: dict[str, str] | None) -> None:
    if binding is not None:
        signed.unrecognized_fields[FIELD] = dict(binding)


def check(data: bytes, channel: str, trusted: dict[str, str] | None, what: str) -> None:
    """Refuse metadata `data` (a root, timestamp, snapshot or targets file) that belongs to another channel.

    `trusted` is the binding of the root this device trusts now (None: a channel from before bindings).
    Unparseable data passes: python-tuf refuses it with its own reason."""
    if len(data) > _LIMIT:
        return
    try:
        signed = json.loads(data).get("signed")
        found = signed.get(FIELD) if isinstance(signed, dict) else None
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return
    if not isinstance(signed, dict):
        return
    hint = (
        "nothing this device trusts was changed; the store holds metadata of another channel (copied or replayed): "
        "restore the channel's own files"
    )
    if found is None:
        if trusted is not None:
            raise TrustError(
                f"{what}: {signed.get('_type', 'metadata')} version {signed.get('version')} names no channel, "
                f"but channel {channel} is bound to repository {trusted['repository'][:12]}",
                reason="channel",
                hint=hint,
            )
        return
    if not isinstance(found, dict) or found.get("channel") != channel or (trusted is not None and found != trusted):
        name = found.get("channel") if isinstance(found, dict) else found
        repo = found.get("repository", "?") if isinstance(found, dict) else "?"
        raise TrustError(
            f"{what}: {signed.get('_type', 'metadata')} version {signed.get('version')} belongs to channel {name!r} "
            f"of repository {str(repo)[:12]}, not to this channel",
            reason="channel",
            hint=hint,
        )
