"""A catalog recipe's source files on disk: downloaded resumably, verified against their pins as they arrive, and
refused before use when they differ; `lock` records the pins of the files a recipe leaves unlocked.

A file downloads into `<folder>/<sha256>/<name>.part` and is renamed when whole and matching; a `.part` left by an
interrupted download resumes with an HTTP Range request (the bytes already there are hashed first). A file that grows
past its pinned size, or ends with another digest, is deleted and refused."""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from enginefarm.errors import ConfigError, OfflineError, SourceError

from .catalog import CatalogRecipe, PinnedFile, lock_path
from .downloads import _http_error, hf_to_https, hf_token, paced, source_limits, stall_timeout

log = logging.getLogger(__name__)
CHUNK = 1 << 20


def in_ci() -> bool:
    """CI=true, as GitHub Actions and most CI services set it."""
    return os.environ.get("CI", "").lower() == "true"


def check_locked(recipe: CatalogRecipe) -> None:
    """In CI, a remote source without its sha256 and size is refused: what a build uses must be known beforehand."""
    if in_ci() and recipe.unlocked:
        names = ", ".join(f.url for f in recipe.unlocked[:3]) + (" …" if len(recipe.unlocked) > 3 else "")
        raise ConfigError(
            f"{recipe.path}: {len(recipe.unlocked)} source file(s) are not locked (CI=true): {names}",
            hint=f"run `enginefarm lock {recipe.path}` on a machine with network, then commit "
            f"{lock_path(recipe.path).name}",
        )


def fetch_all(recipe: CatalogRecipe, folder: Path, *, offline: bool = False) -> dict[str, Path]:
    """Every source file of `recipe`, verified, by its path in the recipe (CHECKPOINT or a folder path)."""
    check_locked(recipe)
    return {f.path: fetch_file(f, folder, offline=offline)[0] for f in recipe.files}


def fetch_file(file: PinnedFile, folder: Path, *, offline: bool = False) -> tuple[Path, PinnedFile]:
    """`file` under `folder` (downloaded unless already there and matching), and the file with its pins as found."""
    name = Path(file.url.split("@")[0]).name or "file"
    if file.pinned:
        assert file.sha256 is not None
        dest = folder / file.sha256 / name
        if dest.is_file() and dest.stat().st_size == file.size:  # verified when it was renamed into place
            return dest, file
    else:
        dest = folder / "unlocked" / hashlib.sha256(file.url.encode()).hexdigest()[:16] / name
    if offline:
        raise OfflineError(
            f"{file.url} is not downloaded and ENGINEFARM_OFFLINE is set",
            hint="unset ENGINEFARM_OFFLINE to download it",
        )
    sha256, size = _download(file, dest)
    if not file.pinned:
        log.warning("%s is not locked: downloaded %d bytes, sha256 %s", file.url, size, sha256)
    return dest, replace(file, sha256=sha256, size=size)


def _download(file: PinnedFile, dest: Path) -> tuple[str, int]:
    hf = file.url.startswith("hf://")
    url = hf_to_https(file.url) if hf else file.url
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    have = part.stat().st_size if part.is_file() else 0
    if file.size is not None and have > file.size:
        part.unlink()
        have = 0
    if have:
        with part.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    request = urllib.request.Request(url, headers={"User-Agent": "enginefarm"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    token = hf_token() if hf else None
    if token:
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    log.info("downloading %s%s", url, f" from byte {have}" if have else "")
    try:
        limits = source_limits()  # the HTTP store's deadline, rate floor and stall timeout
        with urllib.request.urlopen(request, timeout=stall_timeout(limits)) as response:
            if have and response.status != 206:  # the server ignored the range: start over
                digest, have = hashlib.sha256(), 0
            with part.open("ab" if have else "wb") as out:
                for chunk in paced(response, file.url, limits):
                    have += len(chunk)
                    if file.size is not None and have > file.size:
                        out.close()
                        part.unlink()
                        raise SourceError(
                            f"{file.url} is larger than its pinned {file.size} bytes: refused",
                            hint="the remote file changed: verify it, then update the pin",
                        )
                    digest.update(chunk)
                    out.write(chunk)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and file.size is not None and have == file.size:
            pass  # the whole file was already there: checked below
        else:
            raise _http_error(url, exc.code, hf, token is not None) from None
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(
            f"cannot download {url}: {getattr(exc, 'reason', exc)} ({have} bytes kept, the next try resumes)",
            hint="check the URL and your network",
        ) from None
    sha256 = digest.hexdigest()
    if file.pinned and (sha256 != file.sha256 or have != file.size):
        part.unlink()
        raise SourceError(
            f"{file.url} does not match its pin (got {have} bytes, sha256 {sha256}; pinned {file.size} bytes, "
            f"{file.sha256}): refused",
            hint="the remote file changed or the pin is wrong: verify it against the publisher's, then update the pin",
        )
    os.replace(part, dest)
    return sha256, have


def lock(recipe: CatalogRecipe, folder: Path) -> list[PinnedFile]:
    """Download each unlocked file of `recipe` into `folder` and record its sha256 and size in the lock file beside
    the recipe (entries already there are kept). Returns the files locked now."""
    done = [fetch_file(f, folder)[1] for f in recipe.unlocked]
    if not done:
        return []
    path = lock_path(recipe.path)
    import tomllib

    entries = tomllib.loads(path.read_text()).get("files", {}) if path.is_file() else {}
    entries.update({f.url: {"sha256": f.sha256, "size": f.size} for f in done})
    lines = [
        f"# {recipe.path.name}'s source files, as `enginefarm lock` downloaded them: sha256 and size in bytes.",
        "# Check them against the publisher's where it publishes digests; a build verifies every file against them.",
    ]
    for url in sorted(entries):
        lines += ["", f'[files."{url}"]', f'sha256 = "{entries[url]["sha256"]}"', f"size = {entries[url]['size']}"]
    path.write_text("\n".join(lines) + "\n")
    return done
