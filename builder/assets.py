"""Publishing a recipe's `[model] assets` folder: every file as a content-addressed blob, one manifest (component
`assets`, target `assets:any`), one index entry, through the same `publish` every artifact takes. The key is the
model, its version and each file's path and digest, so the same folder is published once and an edited one again."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from enginefarm.backends.assets import COMPONENT, ROLE, TARGET
from enginefarm.cache.artifacts import pack_files, publish
from enginefarm.cache.build_keys import build_key
from enginefarm.cache.manifest import Manifest
from enginefarm.cache.stores.base import Store
from enginefarm.errors import ConfigError

from .recipe import Recipe


@dataclass(frozen=True)
class PublishedAssets:
    key: str
    files: int
    size: int
    written: bool  # False: the same assets were already stored


def asset_files(folder: Path) -> list[str]:
    """The folder's files as '/'-separated relative paths, sorted. Links and special files are refused: assets are
    copied as bytes, and a link could reach outside the folder."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or (path.exists() and not (path.is_file() or path.is_dir())):
            raise ConfigError(f"{path}: assets must be plain files", hint="replace links with copies of the files")
        if path.is_file():
            found.append(path.relative_to(folder).as_posix())
    return found


def publish_assets(store: Store, recipe: Recipe) -> PublishedAssets | None:
    if recipe.assets is None:
        return None
    folder = recipe.assets
    files = asset_files(folder)
    with tempfile.TemporaryDirectory(prefix="enginefarm-assets-") as tmp:
        records, blobs = pack_files(folder, [(rel, ROLE) for rel in files], Path(tmp), codec="zstd")
        # pack_files hashed each file already: the key is made from those digests, not from reading the files again
        key = build_key(
            {
                "kind": COMPONENT,
                "model": recipe.name,
                "model_version": recipe.version,
                "files": [[r.path, r.sha256] for r in records],
            }
        )
        manifest = Manifest(
            build_key=key,
            model=recipe.name,
            model_version=recipe.version,
            component=COMPONENT,
            precision="fp32",
            profile_name="default",
            profile={},
            target=TARGET,
            toolchain={"assets": "1"},
            files=tuple(records),
            provenance={
                "recipe": str(recipe.path),
                "recipe_digest": recipe.digest,
                "source": str(folder),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
        written = publish(store, manifest, blobs)
    return PublishedAssets(key, len(records), sum(r.size for r in records), written)
