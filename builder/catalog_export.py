"""A catalog recipe's first stages on a runner: download its pinned files, assemble the diffusers folder (the shipped
configs plus the recipe's files), export it (a single-file checkpoint over that folder), and hand `build` the
recipe the export wrote. The export is kept under ENGINEFARM_HOME/catalog/<name>-<key>/, keyed by everything that
decides it (pins, configs, family, build matrix), so a second build of the same recipe goes straight to the store."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginefarm.cache.build_keys import canonical_json
from enginefarm.errors import ConfigError

from .catalog import CHECKPOINT, CatalogRecipe
from .catalog_fetch import fetch_all

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Exported:
    recipe: Path  # the recipe `enginefarm export` wrote: what `build` builds
    download_seconds: float
    export_seconds: float  # 0 when the export was already there
    export_peak_bytes: int = 0  # this process's peak RSS while exporting (0: the export was already there)


def export_key(recipe: CatalogRecipe) -> str:
    """What decides the export: every file's pin, the configs and family, and the recipe's build matrix."""
    return hashlib.sha256(
        canonical_json(
            {
                "files": sorted((f.path, f.url, f.sha256, f.size) for f in recipe.files),
                "kind": recipe.kind,
                "family": recipe.family,
                "configs": recipe.configs,
                "defaults": recipe.defaults,
                "name": recipe.name,
                "ranges": sorted(recipe.ranges.items()),
            }
        )
    ).hexdigest()


def export_catalog(recipe: CatalogRecipe, home: Path, *, offline: bool = False, progress=None) -> Exported:
    """Download, verify and export `recipe` under `home` (ENGINEFARM_HOME). A file that does not match its pin is
    refused before anything reads it."""
    started = time.monotonic()
    files = fetch_all(recipe, home / "sources" / "catalog", offline=offline)
    downloaded = time.monotonic() - started
    out = home / "catalog" / f"{recipe.name}-{export_key(recipe)[:16]}"
    if (out / "recipe.toml").is_file():
        return Exported(out / "recipe.toml", downloaded, 0.0)
    from enginefarm.export.run import export_model

    options: dict[str, Any] = {
        "targets": recipe.targets,
        "precisions": recipe.precisions,
        "overwrite": True,
        **recipe.ranges,
    }
    from enginefarm.hardware.rss import peak_bytes, reset_peak

    reset_peak()  # where it cannot be reset (not Linux), the process's whole peak: still an upper bound
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{recipe.name}-folder-", dir=out.parent))
    try:
        if recipe.kind == "filter":  # the filter exporter recognises the architecture from the file's keys
            from enginefarm.export.filters.run import export_filter

            source = files[CHECKPOINT] if CHECKPOINT in files else assemble(recipe, files, holder / recipe.name)
            export_filter(
                source,
                out,
                recipe.name,
                targets=recipe.targets,
                precisions=recipe.precisions,
                overwrite=True,
                progress=progress,
            )
            return Exported(out / "recipe.toml", downloaded, time.monotonic() - started, peak_bytes())
        folder = assemble(recipe, files, holder / recipe.name)
        options["controlnet"] = split_controlnet(folder)
        _check_family(recipe, folder, options["controlnet"])
        if CHECKPOINT in files:
            export_model(files[CHECKPOINT], out, recipe.name, progress, base=folder, **options)
        else:
            export_model(folder, out, recipe.name, progress, origin=str(recipe.path), **options)
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    return Exported(out / "recipe.toml", downloaded, time.monotonic() - started, peak_bytes())


def assemble(recipe: CatalogRecipe, files: dict[str, Path], folder: Path) -> Path:
    """The diffusers folder: the shipped config set, then each downloaded file hard-linked at its path (a recipe's
    own config file replaces the shipped one)."""
    from .catalog_configs import write_configs

    folder.mkdir(parents=True)
    if recipe.configs:
        write_configs(recipe.configs, folder)
    for relative, path in files.items():
        if relative == CHECKPOINT:
            continue
        dest = folder / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        try:  # a hard link: the folder's own file (the exporter copies no link that leaves it), no second copy of GBs
            os.link(path, dest)
        except OSError:  # another file system
            shutil.copyfile(path, dest)
    return folder


def split_controlnet(folder: Path) -> Path | None:
    """A pipeline's `controlnet/` files, moved beside its folder: the ControlNet the export adds to the pipeline (as
    `enginefarm export … --controlnet DIR`), so the model has the UNet that takes its residuals. None without."""
    if not (folder / "controlnet" / "config.json").is_file() or not (folder / "model_index.json").is_file():
        return None
    moved = folder.with_name(f"{folder.name}-controlnet")
    (folder / "controlnet").rename(moved)
    return moved


def _check_family(recipe: CatalogRecipe, folder: Path, controlnet: Path | None = None) -> None:
    from enginefarm.export.source import read_source

    found = read_source(folder, controlnet).family.id
    if found != recipe.family:
        raise ConfigError(
            f"{recipe.path}: its configs and files make a {found} model, the recipe says family = {recipe.family!r}",
            hint="fix [export] family or configs",
        )
