"""Trust: signed release channels with python-tuf (The Update Framework).

Each channel is one TUF repository under `channels/<channel>/` in a store, with consistent snapshots:

    <N>.root.json, root.json     root: which keys may sign each role (offline keys)
    <N>.targets.json             targets: the released manifests, with length, sha256 and custom fields
    <N>.snapshot.json            snapshot: the current targets version (stops mix-and-match of metadata)
    timestamp.json               timestamp: the current snapshot version, short-lived (stops freeze attacks)

A target is `manifests/<build-key>.json`; the manifest lists every file's sha256, so its signed hash chains
trust to every byte. `repo` is the maintainer's side (`enginefarm release`), `client` the runtime's.
Nothing here imports tuf until it is used: the `release` extra is optional.
"""

from __future__ import annotations

from enginefarm.errors import TrustError

INSTALL_HINT = "pip install 'enginefarm[release]'"
ROLES = ("root", "targets", "snapshot", "timestamp")


def require_tuf() -> None:
    try:
        import securesystemslib.signer  # noqa: F401
        import tuf.api.metadata  # noqa: F401
    except ImportError as exc:
        raise TrustError(
            f"signed release channels need python-tuf ({exc.name} is missing)", hint=INSTALL_HINT, reason="missing"
        ) from None


def target_path(build_key: str) -> str:
    """The TUF target path of an artifact: its manifest, which pins every file by sha256."""
    return f"manifests/{build_key}.json"
