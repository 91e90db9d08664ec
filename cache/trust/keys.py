"""Signing keys on disk: one ed25519 key per file, PEM (PKCS#8), readable by the owner only.

    KEYS/<role>-<keyid[:8]>.key   private key, mode 0600 (never printed)
    KEYS/<role>-<keyid[:8]>.pub   public key (JSON), for reviewers

Which role a key signs for is decided by the channel's root, not by the file name: a folder holding only the
timestamp key (CI) can renew the timestamp and nothing else.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from enginefarm.errors import ConfigError

_PRIVATE_MODE = 0o600


def generate(keys_dir: Path, role: str):
    """A new ed25519 signer for `role`, written to `keys_dir`."""
    from securesystemslib.signer import CryptoSigner

    signer = CryptoSigner.generate_ed25519()
    keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{role}-{signer.public_key.keyid[:8]}"
    fd = os.open(keys_dir / f"{name}.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(signer.private_bytes)
    (keys_dir / f"{name}.pub").write_text(
        json.dumps({"keyid": signer.public_key.keyid, **signer.public_key.to_dict()}, indent=1)
    )
    return signer


def load_signers(keys_dir: Path) -> dict:
    """keyid → signer for every private key file in `keys_dir`."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    if not keys_dir.is_dir():
        raise ConfigError(
            f"keys folder {keys_dir} does not exist", hint="create keys with `enginefarm release init --keys DIR`"
        )
    signers = {}
    for path in sorted(keys_dir.glob("*.key")):
        mode = stat.S_IMODE(path.stat().st_mode)
        if os.name == "posix" and mode & 0o077:
            raise ConfigError(f"private key {path} is readable by others (mode {mode:o})", hint=f"chmod 600 {path}")
        try:
            signer = CryptoSigner(load_pem_private_key(path.read_bytes(), None))
        except (ValueError, TypeError):
            raise ConfigError(f"{path} is not an unencrypted PEM private key") from None
        signers[signer.public_key.keyid] = signer
    return signers


def role_files(keys_dir: Path, role: str) -> list[Path]:
    return sorted(keys_dir.glob(f"{role}-*.key")) if keys_dir.is_dir() else []


def retire(keys_dir: Path, keyid: str) -> None:
    """Move a revoked key's files to KEYS/retired/ (kept, not deleted: a maintainer may need to audit old
    signatures)."""
    retired = keys_dir / "retired"
    for path in list(keys_dir.glob(f"*-{keyid[:8]}.key")) + list(keys_dir.glob(f"*-{keyid[:8]}.pub")):
        retired.mkdir(exist_ok=True, mode=0o700)
        os.replace(path, retired / path.name)
