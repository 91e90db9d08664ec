"""Model sources: local files, or https:// and hf:// downloads (the .onnx and its external data) pinned by sha256."""

from __future__ import annotations

import logging
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from enginefarm.cache.atomic import sha256_file
from enginefarm.cache.build_keys import canonical_json
from enginefarm.errors import OfflineError, SourceError
from enginefarm.formats.onnx_io import check_external_data, check_external_locations, external_locations, load_header

from .downloads import beside, download, hf_to_https
from .recipe import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalSource:
    path: Path
    digest: str  # covers the .onnx file and any external data files


def materialize(source: Source, downloads: Path, *, offline: bool = False) -> LocalSource:
    """A verified local copy of the source. Raises SourceError on a missing file or a digest mismatch."""
    if source.local is not None:
        path = source.local
        if not path.is_file():
            raise SourceError(f"source {path} not found")
        if source.sha256 and sha256_file(path) != source.sha256:
            raise SourceError(
                f"source {path} does not match its sha256 in the recipe",
                hint="the file changed: re-check it, then update sha256",
            )
        return LocalSource(path, source_digest(path))
    assert source.sha256, "remote sources are required to carry sha256 by the recipe parser"
    return _remote(source, source.sha256, downloads / source.sha256, offline)


def _remote(source: Source, sha256: str, folder: Path, offline: bool) -> LocalSource:
    """The model and its external data files in `folder`, named as the model names them, each checked against its
    pin. A file already there and matching is not fetched again, so a failed download resumes at the file it stopped."""
    hf = source.url.startswith("hf://")
    url = hf_to_https(source.url) if hf else source.url
    model = folder / _file_name(url)
    _fetch(url, model, sha256, offline, hf, source.size)
    pins = dict(source.external_sha256)
    locations = external_locations(load_header(model, external=False))
    check_external_locations(locations, model)
    unpinned = []
    for location in locations:
        dest = folder / location
        _fetch(beside(url, location), dest, pins.get(location), offline, hf)
        if location not in pins:
            unpinned.append(f'"{location}" = "{sha256_file(dest)}"')
    if unpinned:
        raise SourceError(
            f"{source.url}: its external data is not pinned in the recipe (downloaded: {', '.join(unpinned)})",
            hint="check those digests against the publisher's, then add external_sha256 = { ... } beside sha256",
        )
    # every file was just checked against its pin: the source's digest is made of those, not hashed again (GBs)
    known = {
        model.resolve(): sha256,
        **{(folder / location).resolve(): pins[location] for location in locations},
    }
    return LocalSource(model, source_digest(model, known))


def _file_name(url: str) -> str:
    """The file's own name, never a path: an escaped `%2F..%2F` in the URL stays inside the download folder."""
    name = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path).replace("\\", "/")).name
    if name in ("", ".", ".."):
        name = "model"
    return name if name.endswith(".onnx") else f"{name}.onnx"


def _fetch(url: str, dest: Path, sha256: str | None, offline: bool, hf: bool, size: int | None = None) -> None:
    if dest.is_file() and (sha256 is None or sha256_file(dest) == sha256):
        return
    if offline:
        raise OfflineError(
            f"{url} is not downloaded and ENGINEFARM_OFFLINE is set",
            hint="unset ENGINEFARM_OFFLINE once to download it",
        )
    download(url, dest, hf=hf, size=size)
    if sha256 is not None and sha256_file(dest) != sha256:
        dest.unlink(missing_ok=True)
        raise SourceError(
            f"{url} does not match its sha256 in the recipe",
            hint="the remote file changed: verify it, then update the pin",
        )


def source_digest(path: Path, known: dict[Path, str] | None = None) -> str:
    """The model file's sha256, or with external data one digest over it and each data file's. `known`: resolved
    path → sha256 of files already verified, which are not read again."""
    known = known or {}

    def digest(p: Path) -> str:
        return known.get(p.resolve()) or sha256_file(p)

    main = digest(path)
    data_files = check_external_data(load_header(path), path)
    if not data_files:
        return main
    import hashlib

    extra = {str(p.relative_to(path.resolve().parent)): digest(p) for p in data_files}
    return hashlib.sha256(canonical_json({"onnx": main, "external": extra})).hexdigest()
