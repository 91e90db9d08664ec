"""Model sources: local files, or https:// and hf:// downloads pinned by sha256."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from enginefarm.cache.atomic import atomic_writer, sha256_file
from enginefarm.cache.keys import canonical_json
from enginefarm.errors import OfflineError, SourceError

from .onnx_io import check_external_data, load_header
from .recipe import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalSource:
    path: Path
    digest: str  # covers the .onnx file and any external data files


def hf_to_https(url: str) -> str:
    """hf://org/repo/path/in/repo@rev → the Hub's resolve URL."""
    rest = url[len("hf://"):]
    rest, _, rev = rest.partition("@")
    parts = rest.split("/")
    if len(parts) < 3:
        raise SourceError(f"{url}: expected hf://org/repo/path[@revision]")
    return f"https://huggingface.co/{parts[0]}/{parts[1]}/resolve/{rev or 'main'}/{'/'.join(parts[2:])}"


def materialize(source: Source, downloads: Path, *, offline: bool = False) -> LocalSource:
    """A verified local copy of the source. Raises SourceError on a missing file or a digest mismatch."""
    if source.local is not None:
        path = source.local
        if not path.is_file():
            raise SourceError(f"source {path} not found")
        if source.sha256 and sha256_file(path) != source.sha256:
            raise SourceError(f"source {path} does not match its sha256 in the recipe", hint="the file changed: re-check it, then update sha256")
        return LocalSource(path, source_digest(path))
    assert source.sha256, "remote sources are required to carry sha256 by the recipe parser"
    dest = downloads / f"{source.sha256}.onnx"
    if dest.is_file() and sha256_file(dest) == source.sha256:
        return LocalSource(dest, source_digest(dest))
    if offline:
        raise OfflineError(f"{source.url} is not downloaded and ENGINEFARM_OFFLINE is set", hint="unset ENGINEFARM_OFFLINE once to download it")
    url = hf_to_https(source.url) if source.url.startswith("hf://") else source.url
    log.info("downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_writer(dest) as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(f"cannot download {url}: {exc}", hint="check the URL and your network") from None
    if sha256_file(dest) != source.sha256:
        dest.unlink(missing_ok=True)
        raise SourceError(f"{url} does not match its sha256 in the recipe", hint="the remote file changed: verify it, then update sha256")
    return LocalSource(dest, source_digest(dest))


def source_digest(path: Path) -> str:
    main = sha256_file(path)
    data_files = check_external_data(load_header(path), path)
    if not data_files:
        return main
    import hashlib

    extra = {str(p.relative_to(path.resolve().parent)): sha256_file(p) for p in data_files}
    return hashlib.sha256(canonical_json({"onnx": main, "external": extra})).hexdigest()
