"""Downloading a remote model source: https:// or hf://, with the external data files beside the .onnx.

The Hub is reached at HF_ENDPOINT (default https://huggingface.co), as huggingface_hub does. A token, for gated and
private repositories, is read from HF_TOKEN (or HUGGING_FACE_HUB_TOKEN), else from the file `huggingface-cli login`
writes ($HF_HOME/token, HF_HOME defaulting to ~/.cache/huggingface). It is sent to the Hub only: the Hub answers a
large file with a redirect to its CDN, which gets no Authorization header."""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from enginefarm.cache.atomic import atomic_writer
from enginefarm.errors import SourceError

log = logging.getLogger(__name__)

HUB = "https://huggingface.co"
TIMEOUT = 60  # seconds without a byte before a download is given up


def hf_to_https(url: str) -> str:
    """hf://org/repo/path/in/repo@rev → the Hub's resolve URL."""
    rest = url[len("hf://") :]
    rest, _, rev = rest.partition("@")
    parts = rest.split("/")
    if len(parts) < 3 or not all(parts):
        raise SourceError(f"{url}: expected hf://org/repo/path[@revision]")
    path = urllib.parse.quote("/".join(parts[2:]))
    return f"{hub()}/{parts[0]}/{parts[1]}/resolve/{urllib.parse.quote(rev or 'main', safe='')}/{path}"


def hub() -> str:
    return os.environ.get("HF_ENDPOINT", HUB).rstrip("/")


def hf_token() -> str | None:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    try:
        return (home / "token").read_text().strip() or None
    except OSError:
        return None


def beside(url: str, location: str) -> str:
    """The URL of an external data file named `location` relative to the model at `url`."""
    folder = url.rsplit("/", 1)[0]
    return f"{folder}/{urllib.parse.quote(location)}"


def download(url: str, dest: Path, *, hf: bool) -> None:
    """`url` to `dest`, whole or not at all (written beside it, renamed when complete)."""
    request = urllib.request.Request(url, headers={"User-Agent": "enginefarm"})
    token = hf_token() if hf else None
    if token:
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    log.info("downloading %s", url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response, atomic_writer(dest) as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise _http_error(url, exc.code, hf, token is not None) from None
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(
            f"cannot download {url}: {getattr(exc, 'reason', exc)}", hint="check the URL and your network"
        ) from None


def _http_error(url: str, code: int, hf: bool, had_token: bool) -> SourceError:
    if hf and code in (401, 403):
        if had_token:
            return SourceError(
                f"cannot download {url}: HTTP {code}, the token has no access to this repository",
                hint="accept the model's license on its Hub page with the token's account, or use another token",
            )
        return SourceError(
            f"cannot download {url}: HTTP {code}, a gated or private repository",
            hint="accept its license on the Hub, then set HF_TOKEN (or run `huggingface-cli login`)",
        )
    if code == 404:
        return SourceError(
            f"cannot download {url}: HTTP 404, not found", hint="check the organization, repository, path and @revision"
        )
    return SourceError(f"cannot download {url}: HTTP {code}", hint="check the URL and your network")
