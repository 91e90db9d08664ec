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
from collections.abc import Iterator
from pathlib import Path

from enginefarm.cache import workdirs
from enginefarm.cache.stores.ranged import Limits, Pace
from enginefarm.errors import SourceError

log = logging.getLogger(__name__)

HUB = "https://huggingface.co"
TIMEOUT = 60  # seconds without a byte before a download is given up
UNPINNED_CAP = 64 << 30  # bytes a source may have with no size pinned and no Content-Length (the largest: T5-XXL 19 GB)


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


def source_limits() -> Limits:
    """The HTTP store's limits (ENGINEFARM_HTTP_DEADLINE, ENGINEFARM_HTTP_MIN_RATE), for recipe sources too."""
    from enginefarm.settings import load_settings

    settings = load_settings()
    return Limits(deadline_s=settings.http_deadline_s, min_rate=settings.http_min_rate)


def download(url: str, dest: Path, *, hf: bool, size: int | None = None, limits: Limits | None = None) -> None:
    """`url` to `dest`, whole or not at all (written beside it, renamed when complete), under the HTTP store's
    `limits`: a deadline for the whole file, a rate floor, a stall timeout, and at most `size` bytes (the recipe's
    pin; else the Content-Length, else UNPINNED_CAP). A leftover of a killed download beside `dest` is removed."""
    limits = limits or source_limits()
    request = urllib.request.Request(url, headers={"User-Agent": "enginefarm"})
    token = hf_token() if hf else None
    if token:
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    log.info("downloading %s", url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for left in workdirs.leftovers(dest.parent, f".{dest.name}"):  # their owner was killed: nothing resumes them
        left.unlink(missing_ok=True)
    tmp = workdirs.unique_name(dest.parent, f".{dest.name}", ".incomplete")
    stall = stall_timeout(limits)
    try:
        with urllib.request.urlopen(request, timeout=stall) as response, open(tmp, "wb") as out:
            declared = str(response.headers.get("Content-Length") or "")
            if size is not None and declared.isdigit() and int(declared) != size:
                raise _size_error(url, f"is {declared} bytes", size)
            cap = size if size is not None else int(declared) if declared.isdigit() else UNPINNED_CAP
            got = _paced_copy(response, out, url, cap, size is not None, limits)
            if size is not None and got != size:
                raise _size_error(url, f"ended at {got} bytes", size)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400 and exc.headers is not None and exc.headers.get("Location"):
            raise SourceError(  # urllib follows http(s) redirects only: a file:// or ftp:// one arrives here
                f"cannot download {url}: it redirects to {exc.headers['Location'][:200]}, which is not https://",
                hint="sources are fetched over http(s) only; use the file's own URL",
            ) from None
        raise _http_error(url, exc.code, hf, token is not None) from None
    except TimeoutError:
        raise SourceError(
            f"cannot download {url}: no data for {stall:.0f} s (the server stalls)",
            hint="try again later (ENGINEFARM_HTTP_DEADLINE and ENGINEFARM_HTTP_MIN_RATE tune the limits)",
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise SourceError(
            f"cannot download {url}: {getattr(exc, 'reason', exc)}", hint="check the URL and your network"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _size_error(url: str, what: str, size: int) -> SourceError:
    return SourceError(
        f"{url} {what}, not its pinned size of {size} bytes: refused",
        hint="the remote file changed or the pin is wrong: verify it, then update size and sha256",
    )


def _paced_copy(response, out, url: str, cap: int, pinned: bool, limits: Limits) -> int:
    """Copy the body to `out` a socket read at a time (the checks run even on a trickle); the bytes copied."""
    got = 0
    for chunk in paced(response, url, limits, cap):
        got += len(chunk)
        if got > cap:
            if pinned:
                raise SourceError(
                    f"{url} is larger than its pinned size of {cap} bytes: refused",
                    hint="the remote file changed or the pin is wrong: verify it, then update size and sha256",
                )
            raise SourceError(
                f"{url} is larger than {cap >> 20} MiB (its Content-Length, or the cap for a source with no size "
                "pinned): refused",
                hint="pin its size in the recipe (size = BYTES beside sha256)",
            )
        out.write(chunk)
    return got


def paced(response, url: str, limits: Limits, most: int | None = None) -> Iterator[bytes]:
    """The body's chunks, one socket read each, under `limits`: past the deadline or below the rate floor over a
    window, a one-line SourceError (the stall timeout is the socket's: `stall_timeout`). With `most`, no read goes
    past `most` + 1 bytes in all (the caller sees an overrun without reading an endless body)."""
    pace = Pace(limits, url, error=SourceError)
    reader = getattr(response, "read1", None) or response.read
    while chunk := reader(1 << 20 if most is None else max(1, min(1 << 20, most + 1 - pace.got))):
        yield chunk
        pace.add(len(chunk))


def stall_timeout(limits: Limits) -> float:
    """Seconds a socket read may wait for a byte: the rate window, at most TIMEOUT."""
    return min(TIMEOUT, limits.window_s)


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
